"""One simulator for a schedule as data: when each action runs, the bubble, and what each device holds.

`Simulate(schedule, costs, transfer_latency, concurrency)` validates the
schedule (so a deadlock raises validate's ValueError naming the stuck
action), then runs each device's actions in order, each starting when its
device is free and its inputs (`Schedule.Inputs`) have ended, plus
`transfer_latency` for an input from another device. Costs are per action
kind, uniform or per cell, estimated (FLOPs) or measured (a timeline), or
per action. By default the devices are separate machines; with a
`concurrency` c they share one machine's cores, c devices' worth: while n
are busy each runs at min(1, c / n) (logical devices on a CPU).

From the start and end of every action it gives:
- the step time (all devices start at 0; the step ends with the last
  action) and each device's busy and idle time; `bubble_fraction` is the
  idle share of all devices over the step;
- `span_bubble_fraction`: the largest idle share of a device within its
  own first-to-last span, the bubble when consecutive steps overlap (no
  step-wide synchronization, Qi et al. section 4);
- live micro-batches per device over time: activations from an F's start
  until its B or I ends, weight-gradient inputs from an I's end until its
  W ends, and their peaks (`peak_held` counts both).

Known figures it reproduces (tests/pipeline/schedules/test_simulate.py):
fill-drain and 1F1B with F = B idle (K-1)/(M+K-1); with F = I = W and
B = I + W, ZB-H1 idles (K-1)(F+I-W), a third of 1F1B's (K-1)(F+I+W)
(M >= K), and ZB-V's span bubble is 0 (M >= 2K-1).
"""

import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

from lingvo_pipe.pipeline.schedules import actions
from lingvo_pipe.pipeline.schedules import validate

PerCell = Union[float, Sequence[float]]
Kind = actions.ActionKind


@dataclasses.dataclass(frozen=True)
class Costs:
  """Time of each action kind: one number for every cell, or one per cell;
  `per_action` overrides it for the actions it names (e.g. each action's
  time measured on a timeline).

  backward (a whole B) defaults to backward_input + backward_weight.
  """
  forward: PerCell = 1.0
  backward_input: PerCell = 1.0
  backward_weight: PerCell = 1.0
  backward: Optional[PerCell] = None
  reduce: PerCell = 0.0
  per_action: Optional[Mapping[actions.Action, float]] = None

  def Of(self, action: actions.Action) -> float:
    """The time `action` takes."""
    if self.per_action is not None and action in self.per_action:
      return float(self.per_action[action])
    if action.kind == Kind.B:
      if self.backward is not None:
        return _Pick(self.backward, action.cell)
      return (_Pick(self.backward_input, action.cell) +
              _Pick(self.backward_weight, action.cell))
    field = {Kind.F: self.forward, Kind.I: self.backward_input,
             Kind.W: self.backward_weight, Kind.REDUCE: self.reduce}[action.kind]
    return _Pick(field, action.cell)

  def Check(self, num_cells: int) -> None:
    """Raises ValueError unless every per-cell list has num_cells entries."""
    for f in dataclasses.fields(self):
      value = getattr(self, f.name)
      if f.name == 'per_action':
        continue
      if value is not None and not isinstance(value, (int, float)) and (
          len(value) != num_cells):
        raise ValueError(f'Costs.{f.name} has {len(value)} entries but the '
                         f'schedule has {num_cells} cells; give one per cell '
                         'or a single number.')


# Every action one clock long: the clock tables (schedule.ClockTable).
UNIT_COSTS = Costs(forward=1.0, backward_input=1.0, backward_weight=1.0, backward=1.0)


def _Pick(value: PerCell, cell: int) -> float:
  return float(value) if isinstance(value, (int, float)) else float(value[cell])


@dataclasses.dataclass(frozen=True)
class Timed:
  """`action` ran on `device` from `start` to `end`."""
  device: int
  action: actions.Action
  start: float
  end: float


@dataclasses.dataclass(frozen=True)
class Simulation:
  """What Simulate() predicts; per-device tuples are indexed by device.

  live[d] lists (time, activations, weight-gradient inputs) held on device
  d after each change.
  """
  timeline: Tuple[Tuple[Timed, ...], ...]
  step_time: float
  busy: Tuple[float, ...]
  live: Tuple[Tuple[Tuple[float, int, int], ...], ...]

  @property
  def idle(self) -> Tuple[float, ...]:
    return tuple(self.step_time - b for b in self.busy)

  @property
  def bubble_fraction(self) -> float:
    return sum(self.idle) / (len(self.busy) * self.step_time)

  @property
  def span_idle(self) -> Tuple[float, ...]:
    return tuple(row[-1].end - row[0].start - b if row else 0.0
                 for row, b in zip(self.timeline, self.busy))

  @property
  def span_bubble_fraction(self) -> float:
    return max(i / (row[-1].end - row[0].start) if row else 0.0
               for row, i in zip(self.timeline, self.span_idle))

  @property
  def peak_activations(self) -> Tuple[int, ...]:
    return tuple(max((a for _, a, _ in row), default=0) for row in self.live)

  @property
  def peak_weight_inputs(self) -> Tuple[int, ...]:
    return tuple(max((w for _, _, w in row), default=0) for row in self.live)

  @property
  def peak_held(self) -> Tuple[int, ...]:
    return tuple(max((a + w for _, a, w in row), default=0) for row in self.live)

  def CellPeaks(self, num_cells: int) -> Tuple[Tuple[int, int], ...]:
    """Per cell (however cells share devices), the most micro-batches whose
    activations it holds at once and the most whose weight-gradient inputs
    it holds: the planner's memory of each cell."""
    by_cell: List[List[Timed]] = [[] for _ in range(num_cells)]
    for row in self.timeline:
      for t in row:
        by_cell[t.action.cell].append(t)
    return tuple((max((a for _, a, _ in live), default=0), max((w for _, _, w in live), default=0))
                 for live in (_Live(timed) for timed in by_cell))

  def Summary(self) -> Dict[str, object]:
    """The figures as plain JSON-ready values."""
    return dict(step_time=self.step_time, busy=list(self.busy),
                idle=list(self.idle), bubble_fraction=self.bubble_fraction,
                span_bubble_fraction=self.span_bubble_fraction,
                peak_activations=list(self.peak_activations),
                peak_weight_inputs=list(self.peak_weight_inputs),
                peak_held=list(self.peak_held))


@dataclasses.dataclass
class _Running:
  """An action under way since `start`, `left` of its `cost` to do;
  `slowed` once it ran below full speed."""
  action: actions.Action
  start: float
  cost: float
  left: float
  slowed: bool = False

  def End(self, now: float, rate: float) -> float:
    """When it ends if it runs at `rate` from `now` (exactly start + cost if
    it never slowed)."""
    return self.start + self.cost if not self.slowed and rate == 1.0 else now + self.left / rate


def _Times(schedule: actions.Schedule, costs: Costs, transfer_latency: float,
           concurrency: Optional[float]) -> Dict[actions.Action, Timed]:
  """Start and end of every action of a valid schedule, event by event:
  each device starts its next action when it is free and the action's
  inputs have arrived; while n devices are busy each runs at
  min(1, concurrency / n) (always 1 if `concurrency` is None)."""
  timed: Dict[actions.Action, Timed] = {}
  heads = [0] * schedule.num_devices
  running: Dict[int, _Running] = {}
  now, remaining = 0.0, sum(len(row) for row in schedule.devices)
  while remaining:
    arrivals = []
    for d, row in enumerate(schedule.devices):
      if d in running or heads[d] == len(row):
        continue
      a = row[heads[d]]
      inputs = schedule.Inputs(a)
      if any(x not in timed for x in inputs):
        continue
      ready = max([timed[x].end + (transfer_latency if timed[x].device != d else 0.0)
                   for x in inputs], default=0.0)
      if ready <= now:
        running[d] = _Running(a, now, costs.Of(a), costs.Of(a))
      else:
        arrivals.append(ready)
    rate = min(1.0, concurrency / len(running)) if concurrency and running else 1.0
    ends = {d: r.End(now, rate) for d, r in running.items()}
    then = min(list(ends.values()) + arrivals)
    for d, r in list(running.items()):
      if ends[d] == then:
        timed[r.action] = Timed(d, r.action, r.start, then)
        heads[d] += 1
        remaining -= 1
        del running[d]
      else:
        r.left -= (then - now) * rate
        r.slowed = r.slowed or rate < 1.0
    now = then
  return timed


def _Live(row: Sequence[Timed]) -> Tuple[Tuple[float, int, int], ...]:
  """(time, activations, weight inputs) after each change among the actions
  of `row` (one device's, or one cell's); at equal times what ends is freed
  before what starts is allocated."""
  events: List[Tuple[float, int, int, int]] = []  # time, order, d_act, d_w
  for t in row:
    kind = t.action.kind
    if kind == Kind.F:
      events.append((t.start, 1, 1, 0))
    elif kind == Kind.B:
      events.append((t.end, 0, -1, 0))
    elif kind == Kind.I:
      events.append((t.end, 0, -1, 1))
    elif kind == Kind.W:
      events.append((t.end, 0, 0, -1))
  live, act, w = [], 0, 0
  for time, _, d_act, d_w in sorted(events):
    act, w = act + d_act, w + d_w
    live.append((time, act, w))
  return tuple(live)


def Simulate(schedule: actions.Schedule, costs: Costs = Costs(),
             transfer_latency: float = 0.0,
             concurrency: Optional[float] = None) -> Simulation:
  """Predicts when each action of `schedule` runs and what each device holds.

  Args:
    schedule: the actions per device.
    costs: time of each action kind (uniform or per cell).
    transfer_latency: added to an input that comes from another device.
    concurrency: None for devices that are separate machines; else the
      devices share that many devices' worth of compute (the cores of
      one machine): while n are busy, each runs at min(1, concurrency / n).

  Raises:
    ValueError: if the schedule cannot run (validate.Validate's message,
      naming the first broken action; deadlocks included), if a per-cell
      cost list does not have one entry per cell, or if `concurrency` is
      not > 0.
  """
  validate.Validate(schedule)
  costs.Check(schedule.num_cells)
  if concurrency is not None and not concurrency > 0:
    raise ValueError(f'concurrency must be > 0 (or None for separate machines), got '
                     f'{concurrency}.')
  timed = _Times(schedule, costs, transfer_latency, concurrency)
  timeline = tuple(tuple(timed[a] for a in row) for row in schedule.devices)
  step = max((t.end for row in timeline for t in row), default=0.0)
  busy = tuple(sum(t.end - t.start for t in row) for row in timeline)
  return Simulation(timeline, step, busy, tuple(_Live(row) for row in timeline))


def ClockTable(simulation: Simulation) -> str:
  """A row per device, a column per clock, each action's text at its start
  and '.' where the device idles; for costs that are whole clocks."""
  cells: Dict[Tuple[int, int], str] = {}
  for row in simulation.timeline:
    for t in row:
      if t.start != int(t.start) or t.end != int(t.end):
        raise ValueError(f'ClockTable needs whole-clock times; {t.action} runs '
                         f'from {t.start} to {t.end}. Use integer costs.')
      for clock in range(int(t.start), int(t.end)):
        cells[(t.device, clock)] = str(t.action) if clock == t.start else '~'
  width = max([len(x) for x in cells.values()] + [1])
  clocks = range(int(simulation.step_time))
  lines = ['clock  ' + ' '.join(f'{c:>{width}}' for c in clocks)]
  for d in range(len(simulation.timeline)):
    lines.append(f'dev {d:<2} ' + ' '.join(
        f'{cells.get((d, c), "."):>{width}}' for c in clocks))
  return '\n'.join(lines)
