"""bfloat16 pipelines: equal to the same layers unpipelined in bfloat16,
float32 master weights, slots and checkpoints, weight casts once per cell
and step on the cell's device."""

from typing import Any, List

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core import base_layer

from tests import bfloat16_transparency
from tests.pipeline import pipeline_models as models

def _FfnPipeline(k: int, m: int, **kwargs):
  layers, shape = models.FfnLayers(dim=16)
  return models.Pipeline(layers, shape, k, m, fprop_dtype=bfloat16_transparency.DTYPE, **kwargs), shape


def _Grid(slow_except):
  return [pytest.param(k, m, id=f'{k}-{m}',
                       marks=() if (k, m) in slow_except else pytest.mark.slow)
          for k in (1, 2, 4) for m in (1, 4)]


# make test runs three (K, M) of the ffn stack and two of the Transformer's
# (K=1 M=4 ran longest; the ffn has it); make test-slow the rest.
@pytest.mark.parametrize('k,m', _Grid({(1, 1), (2, 4), (4, 4)}))
def test_ffn_bfloat16_pipeline_equals_unpipelined(k, m):
  pipe, shape = _FfnPipeline(k, m)
  x = tf.random.stateless_normal(shape, [1, 2])
  bfloat16_transparency.CheckBf16Transparent(pipe, [x], m)


@pytest.mark.parametrize('k,m', _Grid({(2, 1), (4, 4)}))
def test_transformer_bfloat16_pipeline_equals_unpipelined(k, m):
  pipe = models.TransformerStackPipeline(k, m, fprop_dtype=bfloat16_transparency.DTYPE)
  bfloat16_transparency.CheckBf16Transparent(
      pipe, list(models.TransformerInputs(5)), m,
      loss_fn=models.TokenLoss(models.TransformerLabels(5)))


def test_variables_slots_and_checkpoints_stay_float32(tmp_path):
  pipe, shape = _FfnPipeline(2, 4)
  x = tf.random.stateless_normal(shape, [1, 2])
  opt = tf.compat.v1.train.AdamOptimizer(1e-3)
  variables = list(pipe.trainable_variables)
  step = models.TrainStep(pipe, 0, bfloat16_transparency.Float32Loss)

  @tf.function(autograph=False)
  def Train(x):
    _, loss, grads = step(x)
    opt.apply_gradients(zip(grads[:len(variables)], variables))
    return loss

  before = [v.numpy() for v in variables]
  Train(x)
  assert any(not np.array_equal(b, v.numpy()) for b, v in zip(before, variables))
  for v in pipe.variables:
    assert v.dtype == tf.float32, v.name
  slots = [opt.get_slot(v, n) for v in variables for n in opt.get_slot_names()]
  assert slots and all(s.dtype == tf.float32 for s in slots)
  path = tf.train.Checkpoint(model=pipe, optimizer=opt).save(str(tmp_path / 'ckpt'))
  dtypes = tf.train.load_checkpoint(path).get_variable_to_dtype_map()
  floats = {k: d for k, d in dtypes.items() if d.is_floating}
  assert len(floats) >= len(variables) * 3  # weights and Adam's two slots
  assert all(d == tf.float32 for d in floats.values()), floats


def _CellBodies(graph_def) -> List[Any]:
  return [f for f in graph_def.library.function
          if '_forward' in f.signature.name or '_backward' in f.signature.name]


@pytest.mark.parametrize('stack', ['ffn', 'transformer'])
def test_weight_casts_once_per_cell_and_step_on_cell_device(stack):
  devices = ['CPU:5', 'CPU:2', 'CPU:7', 'CPU:1']
  if stack == 'ffn':
    pipe, shape = _FfnPipeline(4, 4, devices=devices)
    specs = [tf.TensorSpec(shape)]
  else:
    pipe = models.TransformerStackPipeline(4, 4, fprop_dtype=bfloat16_transparency.DTYPE,
                                           devices=devices)
    specs = [tf.TensorSpec(x.shape, x.dtype) for x in models.TransformerInputs(0)]
  loss_fn = (bfloat16_transparency.Float32Loss if stack == 'ffn' else
             models.TokenLoss(models.TransformerLabels(0)))
  graph_def = models.TrainStep(pipe, 0, loss_fn).get_concrete_function(
      *specs).graph.as_graph_def()
  nodes = {n.name: n for n in graph_def.node}
  casts_per_read = {}
  for n in graph_def.node:
    if n.op == 'Cast' and n.attr['DstT'].type == bfloat16_transparency.DTYPE.as_datatype_enum:
      source = nodes[n.input[0].split(':')[0].lstrip('^')]
      while source.op == 'Identity':
        source = nodes[source.input[0].split(':')[0]]
      if source.op == 'ReadVariableOp':
        casts_per_read.setdefault(source.name, []).append(n)
  # Every trainable weight but the norms' (float32: core/precision) is cast
  # once in the step, on its cell's device.
  expected_devices = sorted(
      pipe.devices[k].index for k, cell in enumerate(pipe.cells)
      for layer, name in _Weights(cell) if layer.ThetaDtype(name) == bfloat16_transparency.DTYPE)
  assert expected_devices and all(len(c) == 1 for c in casts_per_read.values())
  got = sorted(tf.DeviceSpec.from_string(c[0].device).device_index
               for c in casts_per_read.values())
  assert got == expected_devices
  # Inside the cells' traced functions no weight is cast again: the theta
  # arguments come first (flat cell theta), and no Cast from float32 reads
  # one (dropout's masks cast the int64 step seed, which is theta too).
  for f in _CellBodies(graph_def):
    k = int(f.signature.name.split('cell_')[1].split('_')[0])
    num_theta = len(tf.nest.flatten(pipe.cells[k].theta))
    theta_args = {a.name for a in f.signature.input_arg[:num_theta]}
    for n in f.node_def:
      if n.op == 'Cast' and n.attr['SrcT'].type == tf.float32.as_datatype_enum:
        assert n.input[0].split(':')[0] not in theta_args, (f.signature.name, n.name)


def _Weights(layer: base_layer.BaseLayer) -> List[Any]:
  """(owning layer, name) of every variable of `layer`, recursively."""
  out: List[Any] = []
  layer.MapTheta(layer.vars, lambda owner, name, v: out.append((owner, name)))
  return out
