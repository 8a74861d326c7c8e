"""The built-in schedules by kind, their clock tables and their bubble.

The schedules themselves are data (per device its actions); ClockTable
shows one with every action one clock long (simulate), as below, and
Bubble its idle share with F = I = W. F3 is the forward of micro-batch 3
on a cell, B3 its backward (I3 and W3 where it is split); '.' is idle.

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
round the devices v times. Micro-batches go in rounds of K: a device runs
the forwards of one round on its first cell, then on its second, and so on
(backwards take its cells in reverse). Any M runs: for M not a multiple of
K the rounds are max(1, M // K), as equal as they can be, larger first
(schedules/interleaved.py). Device d warms up with 2(K-d-1) + (v-1)K
forwards (all of them if M = K), then alternates as 1F1B does. A clock is
a cell of 1/v of the work, and the bubble is (K-1)/(vM+K-1) for M >= K
(more below: a device then waits for micro-batches). K=2, v=2, M=4 (cells 0 and 2 on dev 0; F1.2
is micro-batch 1 on cell 2):

    clock     0    1    2    3    4    5    6    7    8    9   10   11   12   13   14   15   16   17
    dev 0  F0.0 F1.0 F0.2 F1.2 F2.0 B0.2 F3.0 B1.2 F2.2 B0.0 F3.2 B1.0    . B2.2    . B3.2 B2.0 B3.0
    dev 1     . F0.1 F1.1 F0.3 B0.3 F1.3 B1.3 F2.1 B0.1 F3.1 B1.1 F2.3 B2.3 F3.3 B3.3 B2.1 B3.1    .

Clocks come from running each device's order with unit-time actions, each
action starting when its device is free and its inputs are ready: F(j, m)
after F(j-1, m); B(j, m) after F(j, m) and B(j+1, m).
"""

import functools

from lingvo_pipe.pipeline.schedules import actions
from lingvo_pipe.pipeline.schedules import built_in
from lingvo_pipe.pipeline.schedules import simulate
from lingvo_pipe.pipeline.schedules.built_in import ScheduleKind


def BubbleFraction(num_cells: int, num_micro_batches: int) -> float:
  """The idle share of each device in a fill-drain (or 1F1B) schedule."""
  if num_cells < 1 or num_micro_batches < 1:
    raise ValueError(f'A schedule needs num_cells >= 1 and num_micro_batches '
                     f'>= 1; got num_cells={num_cells}, '
                     f'num_micro_batches={num_micro_batches}.')
  return (num_cells - 1) / (num_micro_batches + num_cells - 1)


@functools.lru_cache(maxsize=256)
def Actions(kind: ScheduleKind, num_devices: int, num_micro_batches: int,
            cells_per_device: int = 1) -> actions.Schedule:
  """The actions of built-in schedule `kind` (built_in.Build; v as
  built_in.CellsPerDeviceParam reads it), built once per sizes: a
  Schedule never changes, and the tuner predicts many steps of each.

  Raises:
    TypeError, ValueError: naming the value and the fix, for sizes the
      schedule cannot run.
  """
  if not isinstance(kind, ScheduleKind):
    raise TypeError(f'kind must be a ScheduleKind, got {kind!r}.')
  return built_in.Build(kind, num_devices, num_micro_batches,
                        built_in.CellsPerDeviceParam(kind, cells_per_device))


def ClockTable(schedule: actions.Schedule) -> str:
  """The clock table of the module docstring: every action one clock, a
  row per device, a column per clock, each action's kind and micro-batch
  (F3, I3, W3, B3), and with several cells per device its cell (F3.2)."""
  timeline = simulate.Simulate(schedule, simulate.UNIT_COSTS).timeline
  several = any(c != d for c, d in enumerate(schedule.cell_devices))
  labels = {(t.device, int(t.start)): f'{t.action.kind.value}{t.action.micro}' + (
      f'.{t.action.cell}' if several else '')
            for row in timeline for t in row if t.action.kind != actions.ActionKind.REDUCE}
  width = max(len(x) for x in labels.values())
  clocks = range(max(c for _, c in labels) + 1)
  rows = ['clock  ' + ' '.join(f'{c:>{width}}' for c in clocks)]
  for d in range(schedule.num_devices):
    rows.append(f'dev {d:<2} ' + ' '.join(
        f'{labels.get((d, c), "."):>{width}}' for c in clocks))
  return '\n'.join(rows)


# F = I = W (B = I + W): the costs of every schedule's bubble (Bubble).
EQUAL_COSTS = simulate.Costs(forward=1.0, backward_input=1.0, backward_weight=1.0)


def Bubble(schedule: actions.Schedule) -> float:
  """The idle share of the devices running `schedule` with F = I = W
  (B = I + W): the bubble the planner, the profile's line and TensorBoard
  show for every schedule. (K-1)/(M+K-1) for fill-drain and 1F1B,
  (K-1)/(vM+K-1) for interleaved, about a third of 1F1B's for ZB-H1."""
  return simulate.Simulate(schedule, EQUAL_COSTS).bubble_fraction
