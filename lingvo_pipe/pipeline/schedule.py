"""Pipeline schedules as pure generators: which cell runs which micro-batch when.

No TensorFlow here: the pipeline emits its graph in the order these give.
F3 is the forward of micro-batch 3 on a cell, B3 its backward; a clock is
one task's time (a forward and a backward count the same), '.' is idle.

GPIPE, fill-drain (Huang et al.): every forward, then every backward.
K=3 devices, M=4 micro-batches:

    clock   0  1  2  3  4  5  6  7  8  9 10 11
    dev 0  F0 F1 F2 F3  .  .  .  . B3 B2 B1 B0
    dev 1   . F0 F1 F2 F3  .  . B3 B2 B1 B0  .
    dev 2   .  . F0 F1 F2 F3 B3 B2 B1 B0  .  .

Cell k keeps M micro-batches' activations (or inputs, under remat) until
its drain. The bubble (idle share) is (K-1)/(M+K-1).

ONE_F_ONE_B (PipeDream-flush, Narayanan et al.): cell k runs K-k-1 warm-up
forwards, then alternates one forward and one backward, then cools down
with the remaining backwards. The same bubble, but cell k holds at most
K-k micro-batches in flight instead of M:

    clock   0  1  2  3  4  5  6  7  8  9 10 11
    dev 0  F0 F1 F2  .  . B0 F3 B1  . B2  . B3
    dev 1   . F0 F1  . B0 F2 B1 F3 B2  . B3  .
    dev 2   .  . F0 B0 F1 B1 F2 B2 F3 B3  .  .

INTERLEAVED (Megatron-LM's interleaved 1F1B, Narayanan et al. 2021): K
devices hold v cells each, cell j on device j mod K, so a micro-batch goes
round the devices v times. Micro-batches go in groups of K: a device runs
the forwards of one group on its first cell, then on its second, and so on
(backwards take its cells in reverse), so M must be a multiple of K.
Device d warms up with 2(K-d-1) + (v-1)K forwards (all of them if M = K),
then alternates as 1F1B does. A clock is a cell of 1/v of the work, and
the bubble is (K-1)/(vM+K-1). K=2, v=2, M=4 (cells 0 and 2 on dev 0; F1.2
is micro-batch 1 on cell 2):

    clock     0    1    2    3    4    5    6    7    8    9   10   11   12   13   14   15   16   17
    dev 0  F0.0 F1.0 F0.2 F1.2 F2.0 B0.2 F3.0 B1.2 F2.2 B0.0 F3.2 B1.0    . B2.2    . B3.2 B2.0 B3.0
    dev 1     . F0.1 F1.1 F0.3 B0.3 F1.3 B1.3 F2.1 B0.1 F3.1 B1.1 F2.3 B2.3 F3.3 B3.3 B2.1 B3.1    .

Clocks come from running each device's order with unit-time tasks, each
task starting when its device is free and its inputs are ready: F(j, m)
after F(j-1, m); B(j, m) after F(j, m) and B(j+1, m).
"""

import dataclasses
import enum
from typing import Dict, Iterator, List, Sequence, Set, Tuple

from lingvo_pipe.pipeline.schedules.built_in import ScheduleKind


class Phase(enum.Enum):
  FORWARD = 'forward'
  BACKWARD = 'backward'


@dataclasses.dataclass(frozen=True)
class Task:
  """Cell `cell` runs `phase` of micro-batch `micro_batch` at `clock` on
  device `device` (cell mod the number of devices)."""
  clock: int
  cell: int
  micro_batch: int
  phase: Phase
  device: int = -1

  def __post_init__(self) -> None:
    if self.device < 0:  # one cell per device unless said otherwise
      object.__setattr__(self, 'device', self.cell)

  @property
  def label(self) -> str:
    return f'{"F" if self.phase == Phase.FORWARD else "B"}{self.micro_batch}'


def _CheckSizes(num_cells: int, num_micro_batches: int) -> None:
  if num_cells < 1 or num_micro_batches < 1:
    raise ValueError(f'A schedule needs num_cells >= 1 and num_micro_batches '
                     f'>= 1; got num_cells={num_cells}, '
                     f'num_micro_batches={num_micro_batches}.')


def ForwardClockCycles(num_cells: int,
                       num_micro_batches: int) -> Iterator[List[Task]]:
  """Yields, per forward clock cycle of the fill, the tasks that run in it."""
  _CheckSizes(num_cells, num_micro_batches)
  for t in range(num_micro_batches + num_cells - 1):
    yield [Task(t, k, t - k, Phase.FORWARD) for k in range(num_cells)
           if 0 <= t - k < num_micro_batches]


def BackwardClockCycles(num_cells: int,
                        num_micro_batches: int) -> Iterator[List[Task]]:
  """Yields, per backward clock cycle of the drain, the tasks that run in it."""
  _CheckSizes(num_cells, num_micro_batches)
  last = num_cells - 1
  for t in range(num_micro_batches + num_cells - 1):
    tasks = []
    for k in reversed(range(num_cells)):
      step = t - (last - k)
      if 0 <= step < num_micro_batches:
        tasks.append(Task(t, k, num_micro_batches - 1 - step, Phase.BACKWARD))
    yield tasks


def Schedule(kind: ScheduleKind, num_cells: int,
             num_micro_batches: int, phase: Phase) -> List[Task]:
  """All tasks of one phase of the fill-drain schedule, in execution order
  (the forward and backward of the GPipe step, which run apart)."""
  if kind != ScheduleKind.GPIPE:
    raise ValueError(f'Schedule() gives the phases of fill-drain only, got '
                     f'{kind!r}: for another schedule use Tasks(), which '
                     'interleaves both phases.')
  cycles = (ForwardClockCycles if phase == Phase.FORWARD else
            BackwardClockCycles)(num_cells, num_micro_batches)
  return [task for cycle in cycles for task in cycle]


def BubbleFraction(num_cells: int, num_micro_batches: int) -> float:
  """The idle share of each device in a fill-drain (or 1F1B) schedule."""
  _CheckSizes(num_cells, num_micro_batches)
  return (num_cells - 1) / (num_micro_batches + num_cells - 1)


# --- both phases, interleaved -------------------------------------------------

_Step = Tuple[Phase, int, int]  # (phase, cell, micro-batch) on one device


def CheckShape(kind: ScheduleKind, num_devices: int, num_micro_batches: int,
               cells_per_device: int = 1) -> None:
  """Raises ValueError naming the value and the fix unless the schedule can
  run K=num_devices devices with v=cells_per_device cells each and M
  micro-batches."""
  if not isinstance(kind, ScheduleKind):
    raise TypeError(f'kind must be a ScheduleKind, got {kind!r}.')
  _CheckSizes(num_devices, num_micro_batches)
  if cells_per_device < 1:
    raise ValueError(f'cells_per_device must be >= 1, got {cells_per_device}.')
  if kind == ScheduleKind.INTERLEAVED:
    if num_micro_batches % num_devices:
      raise ValueError(
          f'The interleaved schedule runs micro-batches in groups of K: '
          f'num_micro_batches={num_micro_batches} must be a multiple of the '
          f'number of devices K={num_devices}; use M='
          f'{num_micro_batches + (-num_micro_batches) % num_devices}.')
  elif cells_per_device != 1:
    raise ValueError(f'{kind.name} runs one cell per device, got '
                     f'cells_per_device={cells_per_device}; use '
                     'ScheduleKind.INTERLEAVED for several.')


def _GPipeOrder(device: int, num_micro: int) -> List[_Step]:
  return ([(Phase.FORWARD, device, m) for m in range(num_micro)] +
          [(Phase.BACKWARD, device, m) for m in reversed(range(num_micro))])


def _OneFOneBOrder(forwards: Sequence[Tuple[int, int]],
                   backwards: Sequence[Tuple[int, int]],
                   warm_up: int) -> List[_Step]:
  """`warm_up` forwards, then one forward and one backward in turn, then
  the remaining backwards; forwards and backwards as (cell, micro-batch)."""
  warm_up = min(warm_up, len(forwards))
  order = [(Phase.FORWARD, c, m) for c, m in forwards[:warm_up]]
  for i, (c, m) in enumerate(forwards[warm_up:]):
    order.append((Phase.FORWARD, c, m))
    order.append((Phase.BACKWARD,) + tuple(backwards[i]))  # type: ignore
  order += [(Phase.BACKWARD, c, m)
            for c, m in backwards[len(forwards) - warm_up:]]
  return order


def _InterleavedOrder(device: int, num_devices: int, num_micro: int,
                      cells_per_device: int) -> List[_Step]:
  """Megatron-LM's order: the i-th forward of a device is micro-batch
  (i // Kv) K + i % K on its chunk (i // K) % v; backwards take the chunks
  in reverse."""
  k, v = num_devices, cells_per_device
  group = k * v

  def Step(i: int, backward: bool) -> Tuple[int, int]:
    chunk = (i // k) % v
    if backward:
      chunk = v - 1 - chunk
    return chunk * k + device, (i // group) * k + i % k

  total = num_micro * v
  forwards = [Step(i, False) for i in range(total)]
  backwards = [Step(i, True) for i in range(total)]
  warm_up = total if num_micro == k and v > 1 else (
      2 * (k - device - 1) + (v - 1) * k)
  return _OneFOneBOrder(forwards, backwards, warm_up)


def DeviceOrders(kind: ScheduleKind, num_devices: int, num_micro_batches: int,
                 cells_per_device: int = 1) -> List[List[_Step]]:
  """Per device, the (phase, cell, micro-batch) it runs, in order."""
  CheckShape(kind, num_devices, num_micro_batches, cells_per_device)
  k, m = num_devices, num_micro_batches
  if kind == ScheduleKind.GPIPE:
    return [_GPipeOrder(d, m) for d in range(k)]
  if kind == ScheduleKind.ONE_F_ONE_B:
    return [_OneFOneBOrder([(d, i) for i in range(m)], [(d, i) for i in range(m)],
                           k - d - 1) for d in range(k)]
  return [_InterleavedOrder(d, k, m, cells_per_device) for d in range(k)]


def _Clocks(orders: List[List[_Step]], num_cells: int) -> Dict[_Step, int]:
  """Start clock of every step, running each device's order with unit-time
  steps, each when its device is free and its inputs are done."""
  done: Dict[_Step, int] = {}  # step -> clock it ends
  position = [0] * len(orders)
  free = [0] * len(orders)
  remaining = sum(len(o) for o in orders)
  while remaining:
    progressed = False
    for d, order in enumerate(orders):
      while position[d] < len(order):
        phase, cell, m = order[position[d]]
        if phase == Phase.FORWARD:
          needs = [(Phase.FORWARD, cell - 1, m)] if cell else []
        else:
          needs = [(Phase.FORWARD, cell, m)] + (
              [(Phase.BACKWARD, cell + 1, m)] if cell + 1 < num_cells else [])
        if any(n not in done for n in needs):
          break
        start = max([free[d]] + [done[n] for n in needs])
        done[order[position[d]]] = start + 1
        free[d] = start + 1
        position[d] += 1
        remaining -= 1
        progressed = True
    if not progressed:
      stuck = {d: order[position[d]] for d, order in enumerate(orders)
               if position[d] < len(order)}
      raise ValueError(f'The schedule deadlocks: each device waits, at '
                       f'{stuck} (device: (phase, cell, micro-batch)).')
  return {step: end - 1 for step, end in done.items()}


def Tasks(kind: ScheduleKind, num_devices: int, num_micro_batches: int,
          cells_per_device: int = 1) -> List[Task]:
  """Every forward and backward of a training step, in an order the graph
  can be emitted in: by clock, then device (a task's inputs end at an
  earlier clock, and each device's tasks come in its schedule's order).

  Args:
    kind: the ScheduleKind.
    num_devices: K.
    num_micro_batches: M (a multiple of K for INTERLEAVED).
    cells_per_device: v, cells per device (INTERLEAVED only); cell j runs
      on device j mod K.

  Raises:
    ValueError: for sizes the schedule cannot run (CheckShape).
  """
  orders = DeviceOrders(kind, num_devices, num_micro_batches, cells_per_device)
  clocks = _Clocks(orders, num_devices * cells_per_device)
  tasks = [Task(clocks[step], step[1], step[2], step[0], d)
           for d, order in enumerate(orders) for step in order]
  return sorted(tasks, key=lambda t: (t.clock, t.device))


def ClockTable(tasks: Sequence[Task]) -> str:
  """The clock table of the module docstring: a row per device, a column
  per clock; with several cells per device a task reads F<m>.<cell>."""
  num_devices = max(t.device for t in tasks) + 1
  several = any(t.cell != t.device for t in tasks)
  labels = {(t.device, t.clock): t.label + (f'.{t.cell}' if several else '')
            for t in tasks}
  width = max(len(x) for x in labels.values())
  clocks = range(max(t.clock for t in tasks) + 1)
  rows = ['clock  ' + ' '.join(f'{c:>{width}}' for c in clocks)]
  for d in range(num_devices):
    rows.append(f'dev {d:<2} ' + ' '.join(
        f'{labels.get((d, c), "."):>{width}}' for c in clocks))
  return '\n'.join(rows)


def MeasuredBubble(tasks: Sequence[Task]) -> float:
  """The idle share of the devices over the schedule's clocks (unit-time
  tasks): 1 - busy / (devices x clocks)."""
  num_devices = max(t.device for t in tasks) + 1
  clocks = max(t.clock for t in tasks) + 1
  return 1.0 - len(tasks) / (num_devices * clocks)


def PeakInFlight(tasks: Sequence[Task]) -> List[int]:
  """Per cell, the most micro-batches whose forward has run and whose
  backward has not: the activations (or, under remat, the inputs) it keeps
  at once."""
  num_cells = max(t.cell for t in tasks) + 1
  alive, peak = [0] * num_cells, [0] * num_cells
  for t in sorted(tasks, key=lambda t: (t.clock, t.device)):
    alive[t.cell] += 1 if t.phase == Phase.FORWARD else -1
    peak[t.cell] = max(peak[t.cell], alive[t.cell])
  return peak


def KeptForwards(tasks: Sequence[Task]) -> Set[Tuple[int, int]]:
  """(cell, micro-batch) of every forward that its own backward follows
  next on its device: under per-cell remat these keep their activations
  (remat.Decide), since recomputing would restore them at once."""
  by_device: Dict[int, List[Task]] = {}
  for t in sorted(tasks, key=lambda t: (t.clock, t.device)):
    by_device.setdefault(t.device, []).append(t)
  kept = set()
  for order in by_device.values():
    for a, b in zip(order, order[1:]):
      if (a.phase == Phase.FORWARD and b.phase == Phase.BACKWARD and
          (a.cell, a.micro_batch) == (b.cell, b.micro_batch)):
        kept.add((a.cell, a.micro_batch))
  return kept
