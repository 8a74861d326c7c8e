"""Placement: every op of cell k (forward, recompute, backward, gradient sum)
is on device k, and only boundary activations cross devices.

Reads the requested device of every op in the traced training step,
including function bodies; an op without a device in a function body runs
on the device of the op that calls the function.
"""

import re
from typing import Dict, List, Tuple

import pytest
import tensorflow as tf

from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.profiling import trace_calls

from tests.pipeline import pipeline_models as models

_CELL_FN = re.compile(r'cell_(\d+)_(forward|backward)')


def _Index(device: str) -> int:
  return tf.DeviceSpec.from_string(device).device_index


def _Walk(graph_def) -> Tuple[List[Tuple[str, str, str]], Dict[str, Tuple[int, str]]]:
  """(function, op, effective device) of every op in every function body
  reached from a cell function call, and {call op name: (cell, kind)}."""
  library = {f.signature.name: f for f in graph_def.library.function}
  placed, calls = [], {}

  def Visit(fn_name: str, device: str) -> None:
    for node in library[fn_name].node_def:
      effective = node.device or device
      placed.append((fn_name, node.name, effective))
      if 'f' in node.attr and node.attr['f'].func.name in library:
        Visit(node.attr['f'].func.name, effective)

  for node in graph_def.node:
    if 'f' in node.attr:
      fn_name = node.attr['f'].func.name
      match = _CELL_FN.search(fn_name)
      if match:
        calls[node.name] = (int(match.group(1)), match.group(2))
        assert node.device, f'call {node.name} of a cell function has no device'
        Visit(node.attr['f'].func.name, node.device)
  return placed, calls


# RematPolicy.NONE inlines every forward and backward (no cell calls):
# test_only_boundary_activations_cross_devices places its ops.
@pytest.mark.parametrize('remat', [gpipe.RematPolicy.PER_CELL, gpipe.RematPolicy.PER_LAYER])
def test_cell_ops_run_on_cell_devices(remat):
  k = 4
  layers, shape = models.ConvNetLayers()
  pipe = models.Pipeline(layers, shape, k, 4, remat=remat,
                         devices=[f'CPU:{i}' for i in (5, 2, 7, 1)])
  expected = [pipe.devices[c].index for c in range(k)]
  step = models.TrainStep(pipe, step=0)
  graph_def = step.get_concrete_function(tf.TensorSpec(shape)).graph.as_graph_def()
  placed, calls = _Walk(graph_def)
  kinds = {kind for _, kind in calls.values()}
  assert 'forward' in kinds
  assert 'backward' in kinds
  nodes = {n.name: n for n in graph_def.node}
  for name, (cell, _) in calls.items():
    assert _Index(nodes[name].device) == expected[cell], name
  for fn, op, device in placed:
    match = _CELL_FN.search(fn)
    if match:
      assert device and _Index(device) == expected[int(match.group(1))], (fn, op)
  # Gradient ops outside the cell functions, and the per-cell sums of
  # weight gradients over micro-batches, carry the cell's device.
  for node in graph_def.node:
    if node.op == 'AddN' or node.name.startswith('gradient'):
      producers = [i.lstrip('^').split(':')[0] for i in node.input]
      cells = {calls[p][0] for p in producers if p in calls}
      if cells:
        assert len(cells) == 1 and _Index(node.device) == expected[cells.pop()], node


@pytest.mark.parametrize('remat,remat_last', [
    (gpipe.RematPolicy.PER_CELL, False), (gpipe.RematPolicy.PER_CELL, True),
    (gpipe.RematPolicy.NONE, False)])
def test_only_boundary_activations_cross_devices(remat, remat_last):
  k, m = 3, 2
  layers, shape = models.FfnLayers()
  pipe = models.Pipeline(layers, shape, k, m, remat=remat,
                         remat_last_micro_batch=remat_last)
  cell_on = {pipe.devices[c].index: c for c in range(k)}
  step = models.TrainStep(pipe, step=0)
  graph_def = step.get_concrete_function(tf.TensorSpec(shape)).graph.as_graph_def()
  _, calls = _Walk(graph_def)
  nodes = {n.name: n for n in graph_def.node}
  kept = {}  # ops of the forward and backward of kept micro-batches
  for node in graph_def.node:
    kind = trace_calls.KeptScopeKind(node.name)
    if kind:
      kept[node.name] = (cell_on[_Index(node.device)], kind.split('_')[1])
  assert bool(kept) == (remat == gpipe.RematPolicy.NONE or not remat_last)
  tasks = {**calls, **kept}
  crossings = []
  for node in graph_def.node:
    for inp in node.input:
      src = inp.lstrip('^').split(':')[0]
      if (src in nodes and nodes[src].device and node.device and
          nodes[src].device != node.device):
        crossings.append((src, node.name))
  allowed = set()
  for (src_cell, src_kind) in [(c, kd) for c in range(k) for kd in ('forward', 'backward')]:
    for (dst_cell, dst_kind) in [(c, kd) for c in range(k) for kd in ('forward', 'backward')]:
      if src_kind == 'forward' and dst_cell == src_cell + 1:
        allowed.add((src_cell, src_kind, dst_cell, dst_kind))  # cell inputs
      if src_kind == 'backward' and dst_kind == 'backward' and dst_cell == src_cell - 1:
        allowed.add((src_cell, src_kind, dst_cell, dst_kind))  # input gradients
  consumers: Dict[str, List[str]] = {}
  for node in graph_def.node:
    for inp in node.input:
      consumers.setdefault(inp.lstrip('^').split(':')[0], []).append(node.name)

  def TasksFed(name: str) -> List[str]:
    """The cell calls or kept ops that `name` feeds, looking through
    Identity ops (the pipeline's gates that order a device's tasks) and
    StopGradient ops (the inputs of a recorded call)."""
    if name in tasks:
      return [name]
    assert nodes[name].op in ('Identity', 'StopGradient'), (name, nodes[name].op)
    return [c for n in consumers.get(name, []) for c in TasksFed(n)]

  assert crossings
  for src, dst in crossings:
    assert src in tasks, (src, dst)
    fed = TasksFed(dst)
    assert fed, (src, dst)
    for task in fed:
      assert tasks[src] + tasks[task] in allowed, (tasks[src], tasks[task])
