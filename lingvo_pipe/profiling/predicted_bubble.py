"""The simulator against a profiled step: each cell's action costs measured on a timeline, and the bubble the simulator predicts from them.

A profiled step's intervals (timeline.Intervals) hold each cell's forward
and its backward (RECOMPUTE and BACKWARD together) per micro-batch; their
medians per cell are the costs of its F and of its B or I
(simulate.Costs). The timeline does not tell a split backward's W's apart
(they run under the device's WEIGHT_GRADIENTS scope), so the costs model
steps whose backwards do not split: remat NONE, where an I runs as a B
and its W is empty, or schedules of B's. The bubble to compare with is
timeline.CellCallsBubbleFraction, which measures the same cell calls.
"""

import statistics
from typing import Dict, List, Sequence, Tuple

from lingvo_pipe.pipeline import simulate
from lingvo_pipe.pipeline.schedules import actions
from lingvo_pipe.profiling.timeline import Interval, Phase


def MeasuredCosts(intervals: Sequence[Interval], num_cells: int) -> simulate.Costs:
  """Per cell the median time of its forwards and of its backwards (in
  microseconds); W costs nothing.

  Raises:
    ValueError: if a cell has no forward or no backward in `intervals`.
  """
  forwards: Dict[int, List[float]] = {}
  backwards: Dict[Tuple[int, int], float] = {}
  for i in intervals:
    if i.micro_batch < 0:
      continue
    duration = i.end_us - i.start_us
    if i.phase == Phase.FORWARD:
      forwards.setdefault(i.cell, []).append(duration)
    elif i.phase in (Phase.RECOMPUTE, Phase.BACKWARD):
      key = (i.cell, i.micro_batch)
      backwards[key] = backwards.get(key, 0.0) + duration
  per_cell: Dict[int, List[float]] = {}
  for (cell, _), duration in backwards.items():
    per_cell.setdefault(cell, []).append(duration)
  missing = [c for c in range(num_cells) if c not in forwards or c not in per_cell]
  if missing:
    raise ValueError(f'The timeline has no forward or no backward of cell {missing[0]} '
                     f'(of {num_cells}); profile a training step of the whole pipeline.')
  forward = [statistics.median(forwards[c]) for c in range(num_cells)]
  backward = [statistics.median(per_cell[c]) for c in range(num_cells)]
  return simulate.Costs(forward=forward, backward_input=backward, backward_weight=0.0,
                        backward=backward)


def PredictedBubble(schedule: actions.Schedule, intervals: Sequence[Interval]) -> float:
  """The simulator's bubble of `schedule` with the costs measured on
  `intervals` (MeasuredCosts)."""
  return simulate.Simulate(schedule, MeasuredCosts(intervals, schedule.num_cells)
                           ).bubble_fraction
