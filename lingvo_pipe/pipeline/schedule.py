"""Pipeline schedules as pure generators: which cell runs which micro-batch when.

GPipe's fill-drain schedule for K=3 cells and M=4 micro-batches. Forward
clock t runs micro-batch m = t - k on cell k:

    clock    0    1    2    3    4    5
    cell 0   F0   F1   F2   F3
    cell 1        F0   F1   F2   F3
    cell 2             F0   F1   F2   F3

then the backward drains in reverse; backward clock t runs micro-batch
m = M-1 - (t - (K-1-k)) on cell k:

    clock    0    1    2    3    4    5
    cell 2   B3   B2   B1   B0
    cell 1        B3   B2   B1   B0
    cell 0             B3   B2   B1   B0

The idle share of each device (the bubble) is (K-1)/(M+K-1).
No TensorFlow here: the pipeline emits its graph in this order.
"""

import dataclasses
import enum
from typing import Iterator, List


class ScheduleKind(enum.Enum):
  """Which pipeline schedule to run."""
  GPIPE = 'gpipe'  # all forwards (fill), then all backwards (drain)


class Phase(enum.Enum):
  FORWARD = 'forward'
  BACKWARD = 'backward'


@dataclasses.dataclass(frozen=True)
class Task:
  """Cell `cell` runs `phase` of micro-batch `micro_batch` at `clock`."""
  clock: int
  cell: int
  micro_batch: int
  phase: Phase


def _CheckSizes(num_cells: int, num_micro_batches: int) -> None:
  if num_cells < 1 or num_micro_batches < 1:
    raise ValueError(f'A schedule needs num_cells >= 1 and num_micro_batches '
                     f'>= 1; got num_cells={num_cells}, '
                     f'num_micro_batches={num_micro_batches}.')


def ForwardClockCycles(num_cells: int,
                       num_micro_batches: int) -> Iterator[List[Task]]:
  """Yields, per forward clock cycle, the tasks that run in it."""
  _CheckSizes(num_cells, num_micro_batches)
  for t in range(num_micro_batches + num_cells - 1):
    yield [Task(t, k, t - k, Phase.FORWARD) for k in range(num_cells)
           if 0 <= t - k < num_micro_batches]


def BackwardClockCycles(num_cells: int,
                        num_micro_batches: int) -> Iterator[List[Task]]:
  """Yields, per backward clock cycle, the tasks that run in it."""
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
  """All tasks of one phase of a schedule, in execution order."""
  if kind != ScheduleKind.GPIPE:
    raise ValueError(f'Unknown schedule {kind!r}; use ScheduleKind.GPIPE.')
  cycles = (ForwardClockCycles if phase == Phase.FORWARD else
            BackwardClockCycles)(num_cells, num_micro_batches)
  return [task for cycle in cycles for task in cycle]


def BubbleFraction(num_cells: int, num_micro_batches: int) -> float:
  """The idle share of each device in a fill-drain schedule."""
  _CheckSizes(num_cells, num_micro_batches)
  return (num_cells - 1) / (num_micro_batches + num_cells - 1)
