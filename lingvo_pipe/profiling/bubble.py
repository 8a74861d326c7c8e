"""What a step's timeline measures: busy shares, the bubble, the all-reduce that no computation hides, and the bubble the simulator predicts from costs measured on it.

The measures read timeline.Intervals. The simulator's side: each cell's
forwards and backwards (RECOMPUTE and BACKWARD together) per micro-batch
give, as medians over micro-batches and replicas, the costs of its F and
of its B or I (simulate.Costs); a W costs its device's WEIGHT_GRADIENTS
time over the W actions the schedule gives it, a replica's on average.
The bubble to compare with is MeasuredBubble: of the same actions, so
without the deferred product after the last backward of a schedule with
no W.
"""

import statistics
from typing import Dict, List, Optional, Sequence, Tuple

from lingvo_pipe.pipeline.schedules import actions
from lingvo_pipe.pipeline.schedules import schedule
from lingvo_pipe.pipeline.schedules import simulate
from lingvo_pipe.profiling.timeline import Interval, Phase, Union


def NumCellsAndMicroBatches(intervals: Sequence[Interval]) -> Tuple[int, int]:
  """(K, M) of the step the intervals come from."""
  cells = {i.cell for i in intervals}
  micro = {i.micro_batch for i in intervals if i.micro_batch >= 0}
  return len(cells), len(micro)


def NumReplicas(intervals: Sequence[Interval]) -> int:
  """R of the step the intervals come from."""
  return len({i.replica for i in intervals})


def BusyFractions(intervals: Sequence[Interval]) -> Dict[str, float]:
  """Per device, its busy share between the first interval's start and the
  last interval's end (overlapping intervals count once)."""
  if not intervals:
    raise ValueError('No intervals: nothing to measure a bubble on.')
  span = _Span(intervals)
  by_device: Dict[str, List[Tuple[float, float]]] = {}
  for i in intervals:
    by_device.setdefault(i.device, []).append((i.start_us, i.end_us))
  fractions = {}
  for device, spans in sorted(by_device.items()):
    busy = sum(hi - lo for lo, hi in Union(spans))
    fractions[device] = busy / span if span > 0 else 1.0
  return fractions


def BubbleFraction(intervals: Sequence[Interval]) -> float:
  """Idle share of the cells' devices between the first interval's start
  and the last interval's end: 1 - busy time / (K * span); ALL_REDUCE
  left out (UnoverlappedAllReduceShare)."""
  busy = BusyFractions([i for i in intervals if i.phase != Phase.ALL_REDUCE])
  return 1.0 - sum(busy.values()) / len(busy)


def UnoverlappedAllReduceShare(intervals: Sequence[Interval]) -> float:
  """The share of the step (first interval's start to last interval's
  end) when some device runs an ALL_REDUCE and no device computes: the
  replicas' reduction that nothing hides. 0 without replicas."""
  reduce = Union([(i.start_us, i.end_us) for i in intervals if i.phase == Phase.ALL_REDUCE])
  if not reduce:
    return 0.0
  compute = Union([(i.start_us, i.end_us) for i in intervals if i.phase != Phase.ALL_REDUCE])
  alone = sum(hi - lo for lo, hi in reduce) - sum(
      max(0.0, min(hi, b) - max(lo, a)) for lo, hi in reduce for a, b in compute)
  span = _Span(intervals)
  return alone / span if span > 0 else 0.0


def _Span(intervals: Sequence[Interval]) -> float:
  """From the first interval's start to the last interval's end."""
  return max(i.end_us for i in intervals) - min(i.start_us for i in intervals)


def CellCallsBubbleFraction(intervals: Sequence[Interval]) -> float:
  """BubbleFraction of the cells' forwards and backwards alone: without the
  devices' WEIGHT_GRADIENTS, which the unit-time schedule does not model
  (a deferred product after the step's last backward is a serial tail)."""
  return BubbleFraction([i for i in intervals if i.micro_batch >= 0])


def ScheduleBubble(intervals: Sequence[Interval],
                   schedule_actions: Optional[actions.Schedule] = None) -> float:
  """The bubble the schedule predicts, schedule.Bubble of its actions
  (F = I = W, as the planner's), or without them fill-drain's
  (K-1)/(M+K-1) of the profiled K and M. The console's Summary and
  TensorBoard both show it."""
  if schedule_actions is None:
    return schedule.BubbleFraction(*NumCellsAndMicroBatches(intervals))
  return schedule.Bubble(schedule_actions)


def Summary(intervals: Sequence[Interval],
            schedule_actions: Optional[actions.Schedule] = None) -> str:
  """One line: K, M, R with replicas, measured bubble (of the whole step,
  and of the cell calls alone) and the ScheduleBubble: the theoretical
  (K-1)/(M+K-1), or with the schedule's actions its own."""
  k, m = NumCellsAndMicroBatches(intervals)
  replicas = NumReplicas(intervals)
  r = f' R={replicas}' if replicas > 1 else ''
  measured = (f'measured {BubbleFraction(intervals):.3f} (cell calls alone '
              f'{CellCallsBubbleFraction(intervals):.3f})')
  predicted = ScheduleBubble(intervals, schedule_actions)
  if schedule_actions is None:
    return f'K={k} M={m}{r} bubble: {measured}, theoretical (K-1)/(M+K-1) = {predicted:.3f}'
  return (f'K={schedule_actions.num_devices} M={m}{r} ({k} cells) bubble: {measured}, '
          f'schedule (F = I = W) {predicted:.3f}')


def MeasuredCosts(intervals: Sequence[Interval], schedule_actions: actions.Schedule,
                  per_action: bool = False) -> simulate.Costs:
  """Per cell the median time of its forwards and of its backwards, and
  its device's WEIGHT_GRADIENTS time over the device's W actions (0
  without W actions; over replicas, the mean), in microseconds; with
  `per_action` also each F's, B's and I's own time in replica 0
  (Costs.per_action: a replay of the step). An action's time is
  Interval.work_us (an inlined one's kernel time).

  Raises:
    ValueError: if a cell has no forward or no backward in `intervals`.
  """
  num_cells = schedule_actions.num_cells
  forwards: Dict[int, List[float]] = {}
  backwards: Dict[Tuple[int, int, Optional[int]], float] = {}  # (replica, cell, micro-batch)
  times: Dict[actions.Action, float] = {}
  for i in intervals:
    if i.phase == Phase.FORWARD:
      forwards.setdefault(i.cell, []).append(i.work_us)
      if i.replica == 0:
        times[actions.Action(actions.ActionKind.F, i.cell, i.micro_batch)] = i.work_us
    elif i.phase in (Phase.RECOMPUTE, Phase.BACKWARD):
      key = (i.replica, i.cell, i.micro_batch)
      backwards[key] = backwards.get(key, 0.0) + i.work_us
  per_cell: Dict[int, List[float]] = {}
  for (_, cell, _), duration in backwards.items():
    per_cell.setdefault(cell, []).append(duration)
  missing = [c for c in range(num_cells) if c not in forwards or c not in per_cell]
  if missing:
    raise ValueError(f'The timeline has no forward or no backward of cell {missing[0]} '
                     f'(of {num_cells}); profile a training step of the whole pipeline.')
  backward = [statistics.median(per_cell[c]) for c in range(num_cells)]
  num_replicas = NumReplicas(intervals)
  weight = [0.0] * num_cells
  for d, row in enumerate(schedule_actions.devices):
    num_w = sum(a.kind == actions.ActionKind.W for a in row)
    cells = [c for c in range(num_cells) if schedule_actions.cell_devices[c] == d]
    if num_w:
      w_time = sum(i.end_us - i.start_us for i in intervals
                   if i.phase == Phase.WEIGHT_GRADIENTS and i.cell in cells)
      for c in cells:
        weight[c] = w_time / (num_w * num_replicas)
  for row in schedule_actions.devices:
    for a in row:
      if a.kind in (actions.ActionKind.B, actions.ActionKind.I):
        times[a] = backwards[(0, a.cell, a.micro_batch)]
  return simulate.Costs(forward=[statistics.median(forwards[c]) for c in range(num_cells)],
                        backward_input=backward, backward_weight=weight, backward=backward,
                        per_action=times if per_action else None)


def MeasuredBubble(intervals: Sequence[Interval], schedule_actions: actions.Schedule
                   ) -> float:
  """The bubble of the schedule's actions on `intervals`: with W actions
  of the whole step but its all-reduce (BubbleFraction), else of the cell
  calls alone (CellCallsBubbleFraction)."""
  if any(a.kind == actions.ActionKind.W for row in schedule_actions.devices for a in row):
    return BubbleFraction(intervals)
  return CellCallsBubbleFraction(intervals)


def PredictedBubble(intervals: Sequence[Interval], schedule_actions: actions.Schedule,
                    per_action: bool = False) -> float:
  """The simulator's bubble of the schedule with the costs measured on
  `intervals` (MeasuredCosts): per cell, or with `per_action` each
  action's own (what remains between the two is the simulator's model
  of the step: dependencies, one action at a time per device)."""
  return simulate.Simulate(schedule_actions, MeasuredCosts(
      intervals, schedule_actions, per_action)).bubble_fraction
