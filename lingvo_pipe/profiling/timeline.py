"""Pipeline timeline: per-device busy intervals of one step, from a TF profile.

The profile is read into function calls by trace_calls (which documents
what the trace holds). Cell calls are the outermost function calls, grouped
by the partition (device) that made them, plus the forward and backward of
each micro-batch a device keeps instead of recomputing, which run under
kept-scope names instead of as calls. Of the other calls on a device, the
ones that run the fewest distinct ops are the forwards (a backward reruns
part of the forward and adds gradient ops). Forwards in time order are
micro-batches 0..M-1, backwards M-1..0 (the GPipe order), unless the
schedule's actions are given: then a device's forwards and backwards in
time order are those of its row of the schedule (1F1B, interleaved, with
cells on the device). Devices are ordered by their first
call (device k+1 waits for device k), or, with replicas, named: each
replica runs the schedule on devices of its own, which the trace tells
apart by name only (their first calls interleave). A device's
weight-gradient work (accumulator reads and deferred weight-gradient
products, under scope_names.WEIGHT_GRADIENTS_SCOPE) is one WEIGHT_GRADIENTS
interval per run of it between the device's cell calls (a zero-bubble
step's W's, a tail after the last backward), from its first op to its
last: that work keeps the device busy, so the bubble does not count it as
idle. With replicas, a device's all-reduce of its cells' gradients
(scope_names.ALL_REDUCE_SCOPE) is an ALL_REDUCE interval likewise; the
bubble leaves it out (it waits on the other replicas more than it
computes), bubble.UnoverlappedAllReduceShare measures what of it no
computation hides.

Compiled cells (CellCompilation.XLA) show no ops: each compiled call is one
XLA program run. A device with compiled calls has its calls labelled by
position instead: its i-th call in time order runs the kind of its i-th
cell action in schedule order (fill-drain: M forwards, then M backwards), which
the control edges between a device's calls guarantee. A recomputing
backward is an uncompiled call (its accumulator updates) around a compiled
gradient, so it has ops; one where the schedule has a forward is rejected.

In a backward call, the ops named like ops of the cell's forward are its
recomputation: the backward function retraces the forward first, so those
names coincide, while gradient ops get other names (only some carry a
'gradient_tape/' prefix). RECOMPUTE lasts until the last such op ends,
BACKWARD from there to the end of the call.

Limits: the trace names no function, so cells are told apart by device,
not by their '<cell name>_forward' names; one pipeline per step (two
pipelines sharing devices break the fewest-ops rule), its replicas given
by their devices' names; gradient ops that run before the last recomputed
op ends count as RECOMPUTE; a trace of several steps is rejected; a loop
step (its actions are iterations of a tf.while_loop per device) is read
as an unrolled one given its schedule, and without it rejected (its
iterations look like several steps in one loop). Compiled cells:
recomputation runs inside the compiled gradient, so their backward is
one BACKWARD interval with no RECOMPUTE; an interval is the XLA
program's run, without the call's argument handling; the order rule needs a
device's calls in schedule order, which a device breaks only where an action
has nothing for the next to wait on (1F1B's first cell when no input is
differentiable: its next forward may run before its backward, mislabelling
both if both are compiled calls); compiled calls are recognised on the CPU
profiler of TF 2.21 (CpuExecutable), other platforms untested.
"""

import bisect
import dataclasses
import enum
import glob
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from absl import logging

from lingvo_pipe.pipeline.schedules import actions
from lingvo_pipe.profiling import call_phases
from lingvo_pipe.profiling import trace_calls
from lingvo_pipe.profiling.trace_calls import Call
from lingvo_pipe.profiling.trace_calls import LoadTrace  # part of this module's API


class Phase(enum.Enum):
  """What a device does for one (cell, micro-batch), or, WEIGHT_GRADIENTS
  and ALL_REDUCE, for its cells' step gradients after their last backward
  and their all-reduce over replicas (micro-batch -1)."""
  FORWARD = 'forward'
  RECOMPUTE = 'recompute'
  BACKWARD = 'backward'
  WEIGHT_GRADIENTS = 'weight_gradients'
  ALL_REDUCE = 'all_reduce'


@dataclasses.dataclass(frozen=True)
class Interval:
  """Cell `cell` of replica `replica` on `device` runs `phase` of
  `micro_batch` in [start, end), its own kernels for `busy_us` of it
  (None: all of it). An inlined (kept) action's interval can hold other
  actions' kernels: its own that nothing waits for (bias gradients,
  accumulator additions) run late."""
  cell: int
  device: str
  micro_batch: int
  phase: Phase
  start_us: float
  end_us: float
  busy_us: Optional[float] = None
  replica: int = 0

  @property
  def work_us(self) -> float:
    """How long the action ran: its kernels' time, else its interval."""
    return self.end_us - self.start_us if self.busy_us is None else self.busy_us


def Profile(step_fn: Callable[[], Any], logdir: str, warmup: int = 1) -> str:
  """Runs `step_fn` `warmup` times, then once under the TF profiler.

  Args:
    step_fn: runs one training step (e.g. `lambda: step(x)` of a tf.function).
    logdir: the profile goes to logdir/plugins/profile/<run>/ (TensorBoard's
      layout).
    warmup: unprofiled calls first, so tracing is not in the profile.

  Returns:
    The path of the .xplane.pb written.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  for _ in range(warmup):
    _Materialize(tf, step_fn())
  tf.profiler.experimental.start(logdir)
  try:
    _Materialize(tf, step_fn())
  finally:
    tf.profiler.experimental.stop()
  paths = glob.glob(os.path.join(logdir, 'plugins', 'profile', '*', '*.xplane.pb'))
  if not paths:
    raise ValueError(f'The profiler wrote no .xplane.pb under {logdir!r}.')
  return max(paths, key=os.path.getmtime)


def _Materialize(tf: Any, outputs: Any) -> None:
  """Waits for the step's results (a no-op for synchronous eager calls)."""
  tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, 'numpy') else t, outputs)


def Intervals(space: Any, schedule: Optional[actions.Schedule] = None,
              replica_devices: Optional[Sequence[Sequence[str]]] = None
              ) -> List[Interval]:
  """The pipeline's busy intervals in one profiled step, sorted by start.

  Args:
    space: an XSpace (see LoadTrace) of exactly one pipelined training step.
    schedule: the step's schedule, whose actions label each device's
      calls; None: one cell per device in fill-drain order.
    replica_devices: with replicas, [replica][device] the names of each
      replica's devices in pipeline order (plan.Plan.DeviceNames); None:
      one replica, its devices in the order of their first calls.

  Returns:
    Per cell and micro-batch a FORWARD interval, and a BACKWARD one preceded
    by a RECOMPUTE one when the backward reran forward ops; per device its
    WEIGHT_GRADIENTS and ALL_REDUCE intervals (micro-batch -1, on the
    device's first cell, one per run between its cell calls) when the
    trace has its weight-gradient work and its all-reduce; times in
    microseconds from the start of the first cell call.

  Raises:
    ValueError: no cell calls in the trace, or calls that do not form one
      GPipe step (several steps, a device whose forward and backward calls
      differ in number, cells with different numbers of micro-batches), or
      on devices other than replica_devices.
  """
  events = trace_calls.HostEvents(space)
  calls = trace_calls.OutermostCalls(events) + trace_calls.KeptScopeCalls(events)
  if not calls:
    raise ValueError('The trace has no pipeline cell events (no function calls '
                     'made by PartitionedCall ops); profile a step of a '
                     'PipeliningLayer whose cells are not inlined.')
  steps = {c.step[0] for c in calls}
  if len(steps) > 1:
    raise ValueError(f'The trace holds {len(steps)} steps with pipeline cell '
                     'calls; profile exactly one.')
  iterations = len({c.step[1] for c in calls})
  if iterations > 1 and schedule is None:
    raise ValueError(f'The cell calls run in {iterations} loop iterations: a loop '
                     f'step (a clock an iteration) or {iterations} steps in one '
                     'loop; pass the step\'s schedule to tell them apart, or profile '
                     'exactly one step with steps_per_loop=1.')
  by_partition: Dict[int, List[Call]] = {}
  for call in sorted(calls, key=lambda c: c.Span()[0]):
    by_partition.setdefault(call.partition, []).append(call)
  # A device's first call is a forward (a backward needs its forward's
  # outputs or output gradient): device k+1 starts after device k.
  in_order = sorted(by_partition.values(), key=lambda cs: cs[0].Span()[0])
  devices = trace_calls.PartitionDevices(events)
  places = _Places([devices.get(cs[0].partition) for cs in in_order], replica_devices)
  cells = [call_phases.Split(c, call_phases.DevicePhases(schedule, k, len(c)))
           for c, (_, k) in zip(in_order, places)]
  if len({len(forwards) for forwards, _ in cells}) != 1:
    raise ValueError(f'Forward calls per device are {[len(f) for f, _ in cells]}; '
                     'the cells of one pipeline step run M each.')
  origin = min(c.Span()[0] for c in calls)
  num_devices = len(replica_devices[0]) if replica_devices else len(cells)
  labels = _Labels(schedule, num_devices, len(cells[0][0]))
  intervals: List[Interval] = []
  first_cell = {}  # partition -> its device's first cell, device and replica
  for i, ((forwards, backwards), (r, k)) in enumerate(zip(cells, places)):
    device = devices.get(forwards[0].partition, f'partition {i}')
    intervals += _CellIntervals(labels[k], device, forwards, backwards, origin, r)
    first_cell[forwards[0].partition] = (min(c for c, _ in labels[k][0]), device, r)
  call_starts = {p: [c.Span()[0] for c in cs] for p, cs in by_partition.items()}
  for scope, phase in ((trace_calls.WEIGHT_GRADIENTS_SCOPE, Phase.WEIGHT_GRADIENTS),
                       (trace_calls.ALL_REDUCE_SCOPE, Phase.ALL_REDUCE)):
    for call in trace_calls.ScopeCalls(events, scope):
      if call.partition in first_cell and call.step[0] in steps:
        cell, device, r = first_cell[call.partition]
        for start, end in _Runs(call, call_starts[call.partition]):
          intervals.append(Interval(cell, device, -1, phase, (start - origin) / 1e6,
                                    (end - origin) / 1e6, replica=r))
  return sorted(intervals, key=lambda i: (i.start_us, i.replica, i.cell))


def _Places(names: Sequence[Optional[str]],
            replica_devices: Optional[Sequence[Sequence[str]]]) -> List[Tuple[int, int]]:
  """(replica, device index in the replica) of each device with cell calls
  (`names` in the order of their first calls, None where the trace names
  none)."""
  if replica_devices is None:
    return [(0, k) for k in range(len(names))]
  where: Dict[Optional[str], Tuple[int, int]] = {
      name: (r, k) for r, row in enumerate(replica_devices) for k, name in enumerate(row)}
  if len(names) != len(where) or any(name not in where for name in names):
    raise ValueError(f'The trace has cell calls on devices {list(names)}; the '
                     f'replicas run on {[list(row) for row in replica_devices]}: '
                     'pass the profiled pipeline\'s plan.DeviceNames().')
  return [where[name] for name in names]


def _Runs(call: Call, cuts: List[int]) -> List[Tuple[int, int]]:
  """The spans of a scope call's kernels, one per section between the
  sorted `cuts` (its device's cell call starts, in ps): a zero-bubble
  step's W's between its other actions, one span for a tail after them."""
  runs: Dict[int, Tuple[int, int]] = {}  # section between cuts -> its span
  for e in call.events:
    section = bisect.bisect_right(cuts, e.start_ps)
    start, end = runs.get(section, (e.start_ps, e.end_ps))
    runs[section] = (min(start, e.start_ps), max(end, e.end_ps))
  return [runs[section] for section in sorted(runs)]


_Label = Tuple[int, int]  # (cell, micro-batch)


def _Labels(schedule: Optional[actions.Schedule], num_devices: int,
            num_forwards: int) -> List[Tuple[List[_Label], List[_Label]]]:
  """Per device, the (cell, micro-batch) of its forwards and of its
  backwards (B or I) in time order: its row of the schedule."""
  if schedule is None:
    return [([(k, m) for m in range(num_forwards)],
             [(k, m) for m in reversed(range(num_forwards))])
            for k in range(num_devices)]
  if schedule.num_devices > num_devices:
    raise ValueError(f'The schedule has {schedule.num_devices} devices; the trace '
                     f'{num_devices}.')
  labels: List[Tuple[List[_Label], List[_Label]]] = [([], []) for _ in range(num_devices)]
  for d, row in enumerate(schedule.devices):
    for a in row:
      if a.kind == actions.ActionKind.F:
        labels[d][0].append((a.cell, a.micro))
      elif a.kind in actions.INPUT_BACKWARDS:
        labels[d][1].append((a.cell, a.micro))
  if any(len(f) != num_forwards for f, _ in labels):
    raise ValueError(f'The schedule runs {[len(f) for f, _ in labels]} forwards '
                     f'per device; the trace {num_forwards}: not one step of this '
                     'schedule (profile exactly one, with steps_per_loop=1).')
  return labels


def _CellIntervals(labels: Tuple[List[_Label], List[_Label]], device: str,
                   forwards: Sequence[Call], backwards: Sequence[Call],
                   origin_ps: int, replica: int) -> List[Interval]:
  """One device's forward intervals, then its recompute and backward
  intervals, labelled in time order by `labels` (_Labels), in microseconds
  from origin_ps."""
  forward_ops = {name for call in forwards for name, _ in call.Ops()}

  def Us(ps: int) -> float:
    return (ps - origin_ps) / 1e6

  def Busy(call: Call, start: int, end: int) -> Optional[float]:
    """An inlined call's kernel time in [start, end) in microseconds
    (None for a called function: its interval is its own)."""
    return None if call.scope is None else _UnionPs(call, start, end) / 1e6

  out = []
  for (cell, m), call in zip(labels[0], forwards):
    start, end = call.Span()
    out.append(Interval(cell, device, m, Phase.FORWARD, Us(start), Us(end),
                        Busy(call, start, end), replica))
  for (cell, m), call in zip(labels[1], backwards):
    start, end = call.Span()
    recomputed = [e.end_ps for name, e in call.Ops()
                  if name in forward_ops and not name.startswith('gradient_tape/')]
    if recomputed:
      split = max(recomputed)
      out.append(Interval(cell, device, m, Phase.RECOMPUTE, Us(start), Us(split),
                          Busy(call, start, split), replica))
      start = split
    out.append(Interval(cell, device, m, Phase.BACKWARD, Us(start), Us(end),
                        Busy(call, start, end), replica))
  return out


def _UnionPs(call: Call, start: int, end: int) -> float:
  """Picoseconds of [start, end) in which a kernel of `call` ran."""
  clipped = [(max(e.start_ps, start), min(e.end_ps, end)) for _, e in call.Ops()]
  return sum(hi - lo for lo, hi in Union([(lo, hi) for lo, hi in clipped if hi > lo]))


def Union(spans: List[Tuple[float, float]]) -> List[Tuple[float, float]]:
  """Disjoint spans covering exactly `spans`, sorted."""
  out: List[Tuple[float, float]] = []
  for lo, hi in sorted(spans):
    if out and lo <= out[-1][1]:
      out[-1] = (out[-1][0], max(out[-1][1], hi))
    else:
      out.append((lo, hi))
  return out


def ProfileIntervals(step_fn: Callable[[], Any], logdir: str, warmup: int = 1,
                     attempts: int = 3,
                     schedule: Optional[actions.Schedule] = None,
                     replica_devices: Optional[Sequence[Sequence[str]]] = None
                     ) -> List[Interval]:
  """Profiles one step (Profile) and returns its Intervals (of `schedule`
  and `replica_devices`: Intervals), profiling another step when a trace does
  not parse as one GPipe step: the profiler can lose a cell call's events
  (seen once, in a loaded test run: a device with one of its two calls).
  Raises Intervals' error of the last of `attempts` profiles."""
  if attempts < 1:
    raise ValueError(f'attempts must be >= 1, got {attempts}.')
  for attempt in range(attempts):
    try:
      return Intervals(LoadTrace(Profile(step_fn, logdir, 0 if attempt else warmup)),
                       schedule, replica_devices)
    except ValueError as e:
      error = e
      logging.warning('Profile %d of %d is not one GPipe step (%s)', attempt + 1,
                      attempts, e)
  raise error
