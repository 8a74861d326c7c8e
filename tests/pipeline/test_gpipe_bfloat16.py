"""bfloat16 pipelines: equal to the same layers unpipelined in bfloat16,
float32 master weights, slots and checkpoints, weight casts once per cell
and step on the cell's device."""

from typing import Any, List

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.pipeline import schedule

from tests import transparency
from tests.pipeline import pipeline_models as models

# bfloat16 keeps 8 significant bits (a relative step of 2^-8 = 0.0039). The
# pipeline runs the reference's casts and products, in the same order per
# micro-batch; what differs is how the float32 sums of the micro-batches'
# weight gradients and the once-per-step products of deferred factors
# (pipeline/deferred_grads.py: one bfloat16 product over all micro-batches
# instead of M) are rounded. So each tensor is compared to a few bfloat16
# steps of its own scale: |a - e| <= RTOL * |e| + ATOL * max|e|, where a
# gradient's scale is at least FLOOR of the largest gradient's.
RTOL, ATOL, FLOOR = 2e-2, 2e-2, 1e-2
# Gradients that are zero in exact arithmetic, so rounding noise on both
# sides: attention's key bias adds the same q.b to every logit of a query
# row, which the softmax ignores. Both must stay below NOISE of the largest
# gradient.
_ZERO_GRADIENTS = ('key_b',)
NOISE = 5e-2
_DTYPE = tf.bfloat16


def _AssertCloseBf16(actual: Any, expected: Any, what: str,
                     min_scale: float = 0.0) -> None:
  a = tf.cast(tf.convert_to_tensor(actual), tf.float32).numpy()
  e = tf.cast(tf.convert_to_tensor(expected), tf.float32).numpy()
  scale = max(float(np.max(np.abs(e))) if e.size else 0.0, min_scale)
  np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL * scale + 1e-7,
                             err_msg=what)


def _Float32Loss(outputs: Any) -> tf.Tensor:
  """models.Loss on float32 outputs: the loss is float32 (core/precision)."""
  if isinstance(outputs, tuple):
    return models.Loss(outputs)
  return models.Loss(tf.cast(outputs, tf.float32))


def _TrainStepWithFloat32Loss(pipe, step: int, num_micro: int):
  """models.TrainStepWithLoss with each micro-batch's term of _Float32Loss
  (a mean of squares over the whole batch) computed in float32."""
  variables = list(pipe.trainable_variables)

  @tf.function(autograph=False)
  def Step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      theta = base_layer.WithStepSeed(pipe.theta, [step, 0])
      micro_loss = lambda out: tf.reduce_sum(tf.square(tf.cast(out, tf.float32))) / float(
          x.shape.num_elements())
      loss, outputs = pipe.FPropWithLoss(theta, micro_loss, x)
    return outputs, loss, tape.gradient(loss, variables + [x])

  return Step


def _FfnPipeline(k: int, m: int, **kwargs):
  layers, shape = models.FfnLayers(dim=16)
  return models.Pipeline(layers, shape, k, m, fprop_dtype=_DTYPE, **kwargs), shape


def _CheckBf16Transparent(pipe, inputs: List[tf.Tensor], m: int,
                          loss_inside: bool = False) -> None:
  ref = transparency.Reference(pipe).TrainStep(inputs, m, 3, _Float32Loss)
  if loss_inside:
    y, loss, grads = _TrainStepWithFloat32Loss(pipe, 3, m)(*inputs)
  else:
    y, loss, grads = models.TrainStep(pipe, 3, _Float32Loss)(*inputs)
  for out in tf.nest.flatten(y):
    if out.dtype.is_floating and out.shape.rank:
      assert out.dtype in (_DTYPE, tf.float32), out.dtype
  tf.nest.map_structure(lambda a, e: _AssertCloseBf16(a, e, 'outputs'), y, ref.y)
  _AssertCloseBf16(loss, ref.loss, 'loss')
  sources = list(pipe.trainable_variables) + models.FloatInputs(inputs)
  assert len(grads) == len(ref.grads) == len(sources)
  floor = FLOOR * max(float(tf.reduce_max(tf.abs(tf.convert_to_tensor(g))))
                      for g in ref.grads if g is not None)
  for source, g, rg in zip(sources, grads, ref.grads):
    name = getattr(source, 'name', 'float input')
    if g is not None:
      assert g.dtype == source.dtype, (name, g.dtype)
    if name.split('/')[-1].split(':')[0] in _ZERO_GRADIENTS:
      for noise in (g, rg):
        assert float(tf.reduce_max(tf.abs(noise))) <= NOISE * floor / FLOOR, name
      continue
    _AssertCloseBf16(tf.zeros_like(source) if g is None else g,
                     tf.zeros_like(source) if rg is None else rg,
                     f'gradient of {name}', floor)


def _Grid(slow_except):
  return [pytest.param(k, m, id=f'{k}-{m}',
                       marks=() if (k, m) in slow_except else pytest.mark.slow)
          for k in (1, 2, 4) for m in (1, 4)]


# make test runs three (K, M) of each stack; make test-slow the rest.
@pytest.mark.parametrize('k,m', _Grid({(1, 1), (2, 4), (4, 4)}))
def test_ffn_bfloat16_pipeline_equals_unpipelined(k, m):
  pipe, shape = _FfnPipeline(k, m)
  x = tf.random.stateless_normal(shape, [1, 2])
  _CheckBf16Transparent(pipe, [x], m)


@pytest.mark.parametrize('k,m', _Grid({(1, 4), (2, 1), (4, 4)}))
def test_transformer_bfloat16_pipeline_equals_unpipelined(k, m):
  pipe = models.TransformerStackPipeline(k, m, fprop_dtype=_DTYPE)
  _CheckBf16Transparent(pipe, list(models.TransformerInputs(5)), m)


# Each other way to run a training step casts the weights as FProp's
# unrolled GPipe step does: 1F1B and interleaved stages (the loss inside),
# the tick loop and the scheduled loop, and replicas (cast before the copies
# to other replicas).
@pytest.mark.parametrize('kwargs,loss_inside', [
    (dict(schedule=schedule.ScheduleKind.ONE_F_ONE_B), True),
    (dict(schedule=schedule.ScheduleKind.INTERLEAVED, cells_per_device=2), True),
    (dict(loop_min_micro_batches=2), False),
    (dict(schedule=schedule.ScheduleKind.ONE_F_ONE_B, loop_min_micro_batches=2), True),
    (dict(schedule=schedule.ScheduleKind.INTERLEAVED, cells_per_device=2,
          loop_min_micro_batches=2), True),
    (dict(num_replicas=2), False),
], ids=['1f1b', 'interleaved', 'tick_loop', '1f1b_loop', 'interleaved_loop', 'replicas'])
def test_ffn_bfloat16_other_steps_equal_unpipelined(kwargs, loss_inside):
  k = 4 if 'cells_per_device' in kwargs else 2
  pipe, shape = _FfnPipeline(k, 2, **kwargs)
  x = tf.random.stateless_normal(shape, [1, 2])
  # Replica r's micro-batch m draws the dropout mask of micro-batch r*M + m.
  _CheckBf16Transparent(pipe, [x], 2 * kwargs.get('num_replicas', 1), loss_inside)


def test_variables_slots_and_checkpoints_stay_float32(tmp_path):
  pipe, shape = _FfnPipeline(2, 4)
  x = tf.random.stateless_normal(shape, [1, 2])
  opt = tf.compat.v1.train.AdamOptimizer(1e-3)
  variables = list(pipe.trainable_variables)
  step = models.TrainStep(pipe, 0, _Float32Loss)

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
    pipe = models.TransformerStackPipeline(4, 4, fprop_dtype=_DTYPE,
                                           devices=devices)
    specs = [tf.TensorSpec(x.shape, x.dtype) for x in models.TransformerInputs(0)]
  graph_def = models.TrainStep(pipe, 0, _Float32Loss).get_concrete_function(
      *specs).graph.as_graph_def()
  nodes = {n.name: n for n in graph_def.node}
  casts_per_read = {}
  for n in graph_def.node:
    if n.op == 'Cast' and n.attr['DstT'].type == _DTYPE.as_datatype_enum:
      source = nodes[n.input[0].split(':')[0].lstrip('^')]
      while source.op == 'Identity':
        source = nodes[source.input[0].split(':')[0]]
      if source.op == 'ReadVariableOp':
        casts_per_read.setdefault(source.name, []).append(n)
  # Every trainable weight but the norms' (float32: core/precision) is cast
  # once in the step, on its cell's device.
  expected_devices = sorted(
      pipe.devices[k].index for k, cell in enumerate(pipe.cells)
      for layer, name in _Weights(cell) if layer.ThetaDtype(name) == _DTYPE)
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
