"""Where Lingvo's GPipe step runs: graph sizes, ops per device, loop intervals.

Pure functions of TF1 protos (GraphDef, RunMetadata); the peer's bench.py
calls them in Lingvo's venv, so nothing here imports lingvo_pipe.
"""

from typing import Dict, FrozenSet, List, Set, Tuple

_MATMUL_MARKERS = ('MatMul', 'Einsum')  # MatMul, BatchMatMulV2, _FusedMatMul, ...


def GraphStats(graph_def) -> Dict[str, int]:
  """Main-graph nodes, library functions and the nodes inside them (where
  Lingvo's recurrent loop bodies live)."""
  functions = graph_def.library.function
  return dict(graph_nodes=len(graph_def.node), library_functions=len(functions),
              library_function_nodes=sum(len(f.node_def) for f in functions))


def ShortDevice(name: str) -> str:
  """'/job:localhost/replica:0/task:0/device:CPU:2' -> 'CPU:2'."""
  if '/device:CPU:' in name:
    return 'CPU:' + name.rsplit(':', 1)[1]
  return name or '?'


def IsBackward(node_name: str) -> bool:
  name = node_name.lower()
  return 'grad' in name or 'bak' in name or 'backward' in name


def _OpType(timeline_label: str) -> str:
  """'node = OpType(input, ...)' -> 'OpType'."""
  try:
    return timeline_label.split(' = ', 1)[1].split('(', 1)[0].strip()
  except IndexError:
    return ''


def RuntimePlacement(run_metadata) -> Tuple[Dict[str, int], Dict[str, List[str]]]:
  """From the step_stats of a FULL_TRACE run: executed top-level ops per
  device, and per device the 'fwd|bwd start-end' (ms from the step's start)
  of each functional While loop.

  TF 2.21's Session leaves the ops inside function bodies (Lingvo's
  recurrent loops) out of step_stats; StaticMatMulPlacement covers those.
  """
  devices = [d for d in run_metadata.step_stats.dev_stats if '/device:CPU:' in d.device]
  starts = [ns.all_start_micros for d in devices for ns in d.node_stats]
  t_min = min(starts) if starts else 0
  total: Dict[str, int] = {}
  loops: Dict[str, List[str]] = {}
  for dev in devices:
    short = ShortDevice(dev.device)
    for ns in dev.node_stats:
      total[short] = total.get(short, 0) + 1
      if _OpType(ns.timeline_label) == 'While':
        start = (ns.all_start_micros - t_min) / 1e3
        end = start + ns.all_end_rel_micros / 1e3
        kind = 'bwd' if IsBackward(ns.node_name) else 'fwd'
        loops.setdefault(short, []).append(f'{kind} {start:.1f}-{end:.1f}')
  return (dict(sorted(total.items())),
          {k: sorted(v, key=lambda x: x[:3]) for k, v in sorted(loops.items())})


def StaticMatMulPlacement(partition_graphs, library) -> Dict[str, object]:
  """MatMul-type ops of the executed (post-Grappler) graph per device, split
  into 'fwd' and 'bwd' (reached from a main-graph node named 'gradients...').

  The roots are the nodes of the run's partition graphs, each with the
  device the placer chose. From them the count follows every function they
  call (While body and cond, If branches, PartitionedCall, direct calls); a
  node in a function runs on its own device if it names one, else on its
  caller's. Counts are per definition: a loop body counts once, not once
  per iteration. Functions that cannot be found are counted under
  'unresolved_functions'.
  """
  lib = {f.signature.name: f for f in library.function}
  counts: Dict[str, Dict[str, int]] = {}
  missing: Set[str] = set()

  def Add(device: str, kind: str) -> None:
    per_kind = counts.setdefault(ShortDevice(device), {})
    per_kind[kind] = per_kind.get(kind, 0) + 1

  def Resolve(name: str):
    # Grappler specializes functions ('<fn>_specialized_for_<caller>...');
    # the copy lives only in the runtime library, so count the original.
    if name in lib:
      return name
    base = name.split('_specialized_for_')[0]
    return base if base in lib else None

  def Callees(node) -> List[str]:
    names = [node.op]
    for attr in node.attr.values():
      if attr.HasField('func'):
        names.append(attr.func.name)
      if attr.HasField('list'):
        names.extend(f.name for f in attr.list.func)
    resolved = [Resolve(n) for n in names]
    missing.update(n for n, r in zip(names[1:], resolved[1:]) if r is None)
    return [r for r in resolved if r]

  def Walk(function: str, device: str, kind: str, stack: FrozenSet[str]) -> None:
    if function in stack:
      return
    for node in lib[function].node_def:
      node_device = node.device or device
      if any(m in node.op for m in _MATMUL_MARKERS):
        Add(node_device, kind)
      for callee in Callees(node):
        Walk(callee, node_device, kind, stack | {function})

  for graph in partition_graphs:
    for f in graph.library.function:
      lib.setdefault(f.signature.name, f)
    for node in graph.node:
      kind = 'bwd' if node.name.startswith('gradients') else 'fwd'
      if any(m in node.op for m in _MATMUL_MARKERS):
        Add(node.device, kind)
      for callee in Callees(node):
        Walk(callee, node.device, kind, frozenset())
  result: Dict[str, object] = dict(sorted(counts.items()))
  if missing:
    result['unresolved_functions'] = len(missing)
  return result
