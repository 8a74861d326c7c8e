"""Records a profiled step's timeline: its intervals as a Chrome trace (timeline.json) and a Gantt chart (timeline.png), titled with the bubble summary."""

import json
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from lingvo_pipe.pipeline.schedules import actions
from lingvo_pipe.profiling import bubble
from lingvo_pipe.profiling import timeline
from lingvo_pipe.profiling.timeline import Interval, Phase


# The labels of a device's intervals of the whole step (micro-batch -1).
_STEP_LABELS = {Phase.WEIGHT_GRADIENTS: 'W', Phase.ALL_REDUCE: 'AR'}


def _EventName(interval: Interval) -> str:
  """'F3', 'R3', 'B3' (phase and micro-batch), 'W' for weight gradients,
  'AR' for the all-reduce."""
  if interval.micro_batch < 0:
    return _STEP_LABELS[interval.phase]
  return f'{interval.phase.value[0].upper()}{interval.micro_batch}'


def _Rows(intervals: Sequence[Interval]) -> Dict[Tuple[int, int], Tuple[int, str, str]]:
  """Per (replica, cell) its row (cells in order, replicas one after
  another), name ('cell_k', with replicas 'replica_r cell_k') and device."""
  cells = sorted({(i.replica, i.cell, i.device) for i in intervals})
  replicas = len({r for r, _, _ in cells}) > 1
  return {(r, c): (row, f'replica_{r} cell_{c}' if replicas else f'cell_{c}', device)
          for row, (r, c, device) in enumerate(cells)}


def WriteChromeTrace(intervals: Sequence[Interval], path: str,
                     schedule_actions: Optional[actions.Schedule] = None) -> None:
  """Writes a Chrome trace (Perfetto, chrome://tracing): one thread per
  cell (of each replica)."""
  events: List[Dict[str, Any]] = []
  rows = _Rows(intervals)
  for row, name, device in rows.values():
    events.append(dict(ph='M', name='thread_name', pid=0, tid=row,
                       args=dict(name=f'{name} ({device})')))
  for i in intervals:
    events.append(dict(
        ph='X', name=_EventName(i), cat=i.phase.value, ts=i.start_us,
        dur=i.end_us - i.start_us, pid=0, tid=rows[(i.replica, i.cell)][0],
        args=dict(micro_batch=i.micro_batch, phase=i.phase.value, device=i.device,
                  replica=i.replica)))
  with open(path, 'w') as f:
    json.dump(dict(traceEvents=events, displayTimeUnit='ms',
                   otherData=dict(summary=bubble.Summary(intervals, schedule_actions))), f)


def WriteGantt(intervals: Sequence[Interval], path: str,
               schedule_actions: Optional[actions.Schedule] = None) -> None:
  """Writes a PNG Gantt chart: row k is cell k (replicas one after
  another), micro-batches on the forward and backward bars, the Summary
  line as title."""
  # Imported here: matplotlib is slow to import and only this function needs it.
  from lingvo_pipe.profiling import gantt  # pylint: disable=g-import-not-at-top
  rows = _Rows(intervals)
  bars = [gantt.Bar(rows[(i.replica, i.cell)][0], i.start_us, i.end_us, i.phase.value,
                    {Phase.RECOMPUTE: '', **_STEP_LABELS}.get(i.phase, str(i.micro_batch)))
          for i in intervals]
  labels = [f'{name}\n{device.rsplit("/", 1)[-1]}' for _, name, device in sorted(rows.values())]
  gantt.Draw(labels, bars, path,
             title=f'Pipeline step timeline: {bubble.Summary(intervals, schedule_actions)}',
             kinds=[p.value for p in Phase])


def Record(step_fn: Callable[[], Any], out_dir: str, warmup: int = 1,
           schedule_actions: Optional[actions.Schedule] = None,
           replica_devices: Optional[Sequence[Sequence[str]]] = None) -> List[Interval]:
  """Profiles one step (timeline.ProfileIntervals) and writes
  out_dir/timeline.json and timeline.png.

  Args:
    step_fn: runs one training step (see timeline.Profile).
    out_dir: where the profile, timeline.json and timeline.png go.
    warmup: unprofiled calls of step_fn first.
    schedule_actions: the step's schedule (None: fill-drain, a cell per
      device), whose actions label the calls.
    replica_devices: with replicas, [replica][device] their devices' names
      (timeline.Intervals).

  Returns:
    The step's Intervals.
  """
  intervals = timeline.ProfileIntervals(step_fn, out_dir, warmup, schedule=schedule_actions,
                                       replica_devices=replica_devices)
  WriteChromeTrace(intervals, os.path.join(out_dir, 'timeline.json'), schedule_actions)
  WriteGantt(intervals, os.path.join(out_dir, 'timeline.png'), schedule_actions)
  return intervals
