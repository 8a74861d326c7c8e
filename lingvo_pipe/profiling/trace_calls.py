"""Function calls of one profiled step, read from a TF profiler XSpace.

TensorFlow 2.21's CPU profiler (host plane '/host:CPU' of the .xplane.pb,
one line per thread) records no function names and no device on events:

- A call of a traced function is a 'FunctionRun' event nested (same thread,
  in time) in 'PartitionedCallOp', in 'ExecutorState::ProcessAsync::Start'
  (stat 'name': the caller's node), in 'ExecutorState::Process' of the
  calling executor (stats 'id': its step id, '_c': its flow id, i.e. one
  device's partition of the graph). FunctionRun's 'id' is the step id of the
  call's own executor.
- Every kernel of a function body is an event '<node name>:<op type>' nested
  in an 'ExecutorState::Process' event whose 'id' is that call's step id.
- '_Send' kernels carry 'key' = '<src device>;...;<dst device>;...', which
  names the device of the partition that sends.
- A call of an XLA-compiled function (jit_compile) has no FunctionRun and
  no per-op events: the PartitionedCall kernel runs the compiled program
  itself, an event '<platform>Executable::ExecuteAsyncOnStream' (on the CPU
  'CpuExecutable::...') nested in 'ExecutorState::ProcessAsync::Start'
  (stat 'kernel_type': 'PartitionedCall') in the calling executor's
  'ExecutorState::Process'. Its XLA thunks, when the profiler records them,
  are HLO instruction names, some on other threads.

A micro-batch whose activations a cell keeps runs its forward and backward
as ops of the step's own graph, not as calls: cell_runner builds them under
the name scopes below, which the kernels' node names carry. The gradient
tape names most gradient ops 'gradient_tape/<forward op name>', so those of
a kept backward may also carry the forward's scope, after 'gradient_tape/'.
TF numbers repeated scopes ('kept_forward', 'kept_forward_1', ...) in the
order they are built, so a device that keeps several micro-batches (1F1B's
last cell) has one scope per micro-batch: its n-th kept backward scope is
the backward of its n-th kept forward scope, as a cell's kept micro-batches
are built in the same order forward and backward.
"""

import dataclasses
import glob
import os
import re
from typing import Any, Dict, Iterator, List, Optional, Tuple

from lingvo_pipe.pipeline.cell import scope_names


@dataclasses.dataclass
class Event:
  """One trace event on one thread; `parent` is the event enclosing it."""
  start_ps: int
  end_ps: int
  name: str
  stats: Dict[str, Any]
  parent: Optional['Event'] = None

  def Ancestor(self, name: str) -> Optional['Event']:
    """The nearest enclosing event called `name`, if any."""
    event = self.parent
    while event is not None and event.name != name:
      event = event.parent
    return event


KEPT_FORWARD_SCOPE = scope_names.KEPT_FORWARD_SCOPE
KEPT_BACKWARD_SCOPE = scope_names.KEPT_BACKWARD_SCOPE
# A name scope segment naming one of those scopes (TF may append _N).
_KEPT_SEGMENT = re.compile(rf'({KEPT_FORWARD_SCOPE}|{KEPT_BACKWARD_SCOPE})(?:_\d+)?')
WEIGHT_GRADIENTS_SCOPE = scope_names.WEIGHT_GRADIENTS_SCOPE
ALL_REDUCE_SCOPE = scope_names.ALL_REDUCE_SCOPE


@dataclasses.dataclass
class Call:
  """One outermost function call (`compiled`: one run of an XLA program), or
  the kernels of one kept micro-batch's forward or backward on one
  partition (`scope` then names which): who ran it and what ran."""
  step: Tuple[int, int]  # step id and loop iteration of the calling executor
  partition: int  # flow id of the calling executor (one device's partition)
  events: List[Event] = dataclasses.field(default_factory=list)
  scope: Optional[str] = None
  compiled: bool = False  # an XLA program, with no per-op events

  def Span(self) -> Tuple[int, int]:
    """(first start, last end) of the call's events, in picoseconds. An
    executor's Process event can outlast the call's last kernel and done
    callback (its thread goes on to the caller's ready ops, or is
    preempted), so it counts for the start only."""
    return (min(e.start_ps for e in self.events),
            max(e.end_ps for e in self.events if e.name != _PROCESS))

  def Ops(self) -> List[Tuple[str, 'Event']]:
    """(node name, event) of every kernel that ran in the call."""
    return [(e.name.split(':')[0], e) for e in self.events if _IsOp(e)]


_PROCESS = 'ExecutorState::Process'
_ASYNC_START = 'ExecutorState::ProcessAsync::Start'
_XLA_RUN_SUFFIX = 'Executable::ExecuteAsyncOnStream'


def LoadNewestTrace(logdir: str) -> Any:
  """The XSpace of the newest .xplane.pb anywhere under `logdir` (a
  profiler logdir, e.g. a pipeline_bench --timeline_dir)."""
  paths = glob.glob(os.path.join(logdir, '**', '*.xplane.pb'), recursive=True)
  if not paths:
    raise ValueError(f'No .xplane.pb under {logdir!r}; profile a step into it '
                     '(e.g. pipeline_bench --timeline_dir) first.')
  return LoadTrace(max(paths, key=os.path.getmtime))


def LoadTrace(path: str) -> Any:
  """Reads an .xplane.pb into an XSpace proto (TensorFlow's own xplane_pb2)."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  space = xplane_pb2.XSpace()
  with open(path, 'rb') as f:
    space.ParseFromString(f.read())
  return space


def HostEvents(space: Any) -> List[Event]:
  """The host plane's events, each linked to the event enclosing it.

  Args:
    space: an XSpace proto (see LoadTrace).

  Returns:
    Every event of every thread of the '/host:CPU' plane, stats by name.

  Raises:
    ValueError: the trace has no host plane.
  """
  planes = [p for p in space.planes if p.name == '/host:CPU']
  if not planes:
    raise ValueError(f'No /host:CPU plane in the trace (planes: '
                     f'{[p.name for p in space.planes]}).')
  plane = planes[0]
  stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
  events = []
  for line in plane.lines:
    base = line.timestamp_ns * 1000
    on_line = []
    for e in line.events:
      stats = {}
      for s in e.stats:
        kind = s.WhichOneof('value')
        value = getattr(s, kind)
        stats[stat_names[s.metadata_id]] = (stat_names[value] if kind == 'ref_value'
                                            else value)
      start = base + e.offset_ps
      on_line.append(Event(start, start + e.duration_ps,
                           plane.event_metadata[e.metadata_id].name, stats))
    _Nest(on_line)
    events += on_line
  return events


def _Nest(events: List[Event]) -> None:
  """Sets `parent` of events of one thread from their time containment."""
  events.sort(key=lambda e: (e.start_ps, -e.end_ps))
  stack: List[Event] = []
  for event in events:
    while stack and stack[-1].end_ps < event.end_ps:
      stack.pop()
    event.parent = stack[-1] if stack else None
    stack.append(event)


def _IsOp(event: Event) -> bool:
  """A kernel event '<node>:<type>', run directly by an executor."""
  return (event.parent is not None and event.parent.name == _PROCESS
          and ':' in event.name and '::' not in event.name)


def OutermostCalls(events: List[Event]) -> List[Call]:
  """Function calls made by PartitionedCall ops that no such call contains
  (a pipeline's cell calls), each with every event of its executor and of
  the calls nested in it (e.g. per-layer recomputation, a compiled gradient),
  and the compiled calls (CompiledCalls) that no such call contains."""
  runs: Dict[int, Tuple[int, int, int]] = {}  # step id -> caller's step, iter, flow
  for e in events:
    caller = e.Ancestor(_PROCESS)
    if e.name == 'FunctionRun' and e.Ancestor('PartitionedCallOp') and caller:
      runs[e.stats['id']] = (caller.stats['id'], caller.stats.get('iter_num', 0),
                             caller.stats['_c'])

  def Root(step_id: int) -> int:
    while runs[step_id][0] in runs:
      step_id = runs[step_id][0]
    return step_id

  calls = {i: Call((caller, it), flow) for i, (caller, it, flow) in runs.items()
           if caller not in runs}
  for e in events:
    owner = e.stats.get('id')
    if owner is None or e.name not in (_PROCESS, 'FunctionRun', 'ExecutorDoneCallback'):
      process = e.Ancestor(_PROCESS)
      owner = process.stats.get('id') if process else None
    if owner in runs:
      calls[Root(owner)].events.append(e)
  compiled = [c for c in CompiledCalls(events) if c.step[0] not in runs]
  return list(calls.values()) + compiled


def CompiledCalls(events: List[Event]) -> List[Call]:
  """Each run of an XLA-compiled function by a PartitionedCall kernel, as a
  Call of the executor that ran the kernel, whose one event is the run of
  the compiled program (its span: the program's execution)."""
  calls = []
  for e in events:
    start = e.parent
    if (not e.name.endswith(_XLA_RUN_SUFFIX) or start is None or
        start.name != _ASYNC_START or start.parent is None or
        start.parent.name != _PROCESS):
      continue
    process = start.parent
    calls.append(Call((process.stats['id'], process.stats.get('iter_num', 0)),
                      process.stats['_c'], [e], compiled=True))
  return calls


def KeptScope(node_name: str) -> Optional[Tuple[str, str]]:
  """(kind, scope segment) if the node belongs to a kept micro-batch's
  forward or backward, else None: kind is KEPT_FORWARD_SCOPE or
  KEPT_BACKWARD_SCOPE, the segment the first kept scope in the name (e.g.
  'kept_forward_2'; a gradient op 'gradient_tape/kept_forward_2/...' is of
  kind KEPT_BACKWARD_SCOPE with segment 'kept_forward_2')."""
  scopes = node_name.split('/')[:-1]
  for i, segment in enumerate(scopes):
    match = _KEPT_SEGMENT.fullmatch(segment)
    if match:
      kind = (KEPT_BACKWARD_SCOPE if 'gradient_tape' in scopes[:i]
              else match.group(1))
      return kind, segment
  return None


def KeptScopeKind(node_name: str) -> Optional[str]:
  """KEPT_FORWARD_SCOPE or KEPT_BACKWARD_SCOPE if the node belongs to a kept
  micro-batch's forward or backward, else None."""
  kept = KeptScope(node_name)
  return kept[0] if kept else None


def _ScopeNumber(segment: str) -> int:
  """The number TF appended to a repeated scope: 'kept_forward' 0,
  'kept_forward_3' 3."""
  _, _, number = segment.rpartition('_')
  return int(number) if number.isdigit() else 0


def _PartitionOps(events: List[Event]) -> Iterator[Tuple[Tuple[int, int], int, str, Event]]:
  """(step and loop iteration, partition, node name, event) of each kernel a
  partition's own executor ran, transfers (_Send, _Recv) left out: they
  also run in the dead last iteration of a loop."""
  for e in events:
    if not _IsOp(e) or e.name.endswith((':_Send', ':_Recv')):
      continue
    process = e.parent
    if process is not None:
      step = (process.stats['id'], process.stats.get('iter_num', 0))
      yield step, process.stats['_c'], e.name.split(':')[0], e


def ScopeCalls(events: List[Event], scope: str) -> List[Call]:
  """Per step (and loop iteration) and partition, the kernels its own
  executor ran under name scope `scope` (or `scope`_N), as one Call with
  `scope` set; transfers left out. WEIGHT_GRADIENTS_SCOPE: a cell's step
  gradients after its last backward; ALL_REDUCE_SCOPE: the replicas'
  all-reduce of its gradients."""
  segment = re.compile(rf'{scope}(?:_\d+)?')
  calls: Dict[Tuple[Tuple[int, int], int], Call] = {}
  for step, partition, node, e in _PartitionOps(events):
    if any(segment.fullmatch(s) for s in node.split('/')[:-1]):
      calls.setdefault((step, partition), Call(step, partition, scope=scope)).events.append(e)
  return list(calls.values())


def KeptScopeCalls(events: List[Event]) -> List[Call]:
  """Per step (and loop iteration), partition and kept micro-batch, the
  kernels the partition's own executor ran for its forward and for its
  backward, each as one Call with `scope` set (KEPT_FORWARD_SCOPE,
  KEPT_BACKWARD_SCOPE); transfers (_Send, _Recv) left out. A partition's
  n-th kept backward scope joins the backward of its n-th kept forward
  scope (see the module docstring)."""
  groups: Dict[Tuple[Tuple[int, int], int, str, str], List[Event]] = {}
  for step, partition, node, e in _PartitionOps(events):
    kept = KeptScope(node)
    if kept is not None:
      groups.setdefault((step, partition) + kept, []).append(e)
  segments: Dict[Tuple[Tuple[int, int], int, bool], List[str]] = {}
  for step, partition, _, segment in groups:
    own = segments.setdefault(
        (step, partition, segment.startswith(KEPT_BACKWARD_SCOPE)), [])
    if segment not in own:
      own.append(segment)
  calls: Dict[Tuple[Tuple[int, int], int, str, str], Call] = {}
  for (step, partition, kind, segment), ops in groups.items():
    if segment.startswith(KEPT_BACKWARD_SCOPE):
      # The n-th kept backward scope -> the n-th kept forward scope.
      n = sorted(segments[(step, partition, True)], key=_ScopeNumber).index(segment)
      forwards = sorted(segments.get((step, partition, False), []), key=_ScopeNumber)
      segment = forwards[n] if n < len(forwards) else segment
    key = (step, partition, kind, segment)
    calls.setdefault(key, Call(step, partition, scope=kind)).events.extend(ops)
  return list(calls.values())


def PartitionDevices(events: List[Event]) -> Dict[int, str]:
  """Device name per executor flow id, from the keys of the _Send it ran."""
  devices: Dict[int, str] = {}
  for e in events:
    if e.name.endswith(':_Send') and 'key' in e.stats and e.parent is not None:
      devices[e.parent.stats['_c']] = str(e.stats['key']).split(';')[0]
  return devices
