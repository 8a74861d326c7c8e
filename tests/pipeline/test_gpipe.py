"""Transparency of PipeliningLayer: it equals the unpartitioned network."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core.layers import containers
from lingvo_pipe.pipeline import gpipe

from tests.pipeline import pipeline_models as models

RTOL, ATOL = 1e-5, 1e-6
GRID = [(k, m) for k in (1, 2, 4, 8) for m in (1, 2, 4, 8, 16)]


def _AssertClose(actual, expected):
  np.testing.assert_allclose(tf.convert_to_tensor(actual).numpy(),
                             tf.convert_to_tensor(expected).numpy(),
                             rtol=RTOL, atol=ATOL)


def _CheckTransparent(layers, input_shape, k, m, **kwargs):
  pipe = models.Pipeline(layers, input_shape, k, m, **kwargs)
  x = tf.random.stateless_normal(input_shape, [k, m])
  return pipe, _CheckPipeline(pipe, (x,), k, m)


def _CheckPipeline(pipe, inputs, k, m):
  assert pipe.num_cells == k
  ref = models.SequentialReference(pipe, inputs, m, step=7)
  y, loss, grads = models.TrainStep(pipe, step=7)(*inputs)
  tf.nest.map_structure(_AssertClose, y, ref['y'])
  _AssertClose(loss, ref['loss'])
  assert len(grads) == len(ref['grads'])
  for g, rg in zip(grads, ref['grads']):
    _AssertClose(g, rg)
  return ref


@pytest.mark.parametrize('k,m', GRID)
def test_convnet_with_batch_norm_and_dropout(k, m):
  layers, shape = models.ConvNetLayers(keep_prob=0.8)
  pipe, ref = _CheckTransparent(layers, shape, k, m)
  expected = models.ExpectedMovingAverages(pipe, ref['bn_inputs'])
  assert len(expected) == 2
  for cell in pipe.cells:
    for layer in cell.sub:
      if layer.path in expected:
        mean, var = expected[layer.path]
        _AssertClose(layer.moving_mean, mean)
        _AssertClose(layer.moving_variance, var)


@pytest.mark.parametrize('k,m', GRID)
def test_transformer_stack_with_dropout(k, m):
  pipe = models.TransformerStackPipeline(k, m)
  _CheckPipeline(pipe, models.TransformerInputs(seed=k * 100 + m), k, m)


@pytest.mark.parametrize('k,m', GRID)
def test_ffn_with_dropout(k, m):
  layers, shape = models.FfnLayers(keep_prob=0.7)
  _CheckTransparent(layers, shape, k, m)


@pytest.mark.parametrize('remat', list(gpipe.RematPolicy))
@pytest.mark.parametrize('m', [1, 4])
@pytest.mark.parametrize('remat_last', [False, True])
def test_every_remat_policy(remat, m, remat_last):
  """M=1 hands the weight gradients on; M=4 sums them in accumulators."""
  layers, shape = models.ConvNetLayers(keep_prob=0.8)
  _CheckTransparent(layers, shape, 4, m, remat=remat,
                    remat_last_micro_batch=remat_last)


@pytest.mark.parametrize('remat,remat_last,recomputing,forward_calls', [
    (gpipe.RematPolicy.PER_CELL, False, 3, 3), (gpipe.RematPolicy.PER_CELL, True, 4, 4),
    (gpipe.RematPolicy.PER_LAYER, False, 4, 4), (gpipe.RematPolicy.NONE, False, 0, 4)])
def test_which_micro_batches_are_recomputed(remat, remat_last, recomputing,
                                            forward_calls):
  """Per cell (K=2, M=4), the calls of backward functions (each recomputes
  a micro-batch) and of the forward function: PER_CELL keeps the last
  micro-batch's activations unless remat_last_micro_batch, and builds its
  forward in the step's graph."""
  layers, shape = models.FfnLayers()
  pipe = models.Pipeline(layers, shape, 2, 4, remat=remat,
                         remat_last_micro_batch=remat_last)
  graph_def = models.TrainStep(pipe, step=0).get_concrete_function(
      tf.TensorSpec(shape)).graph.as_graph_def()
  called = [n.attr['f'].func.name for n in graph_def.node if 'f' in n.attr]
  for cell in range(2):
    # Without remat TensorFlow derives '__backward_cell_k_forward_...'.
    forwards = [f for f in called if f'cell_{cell}_forward' in f and '__backward_' not in f]
    assert len([f for f in called if f'cell_{cell}_backward_' in f]) == recomputing, called
    assert len(forwards) == forward_calls, called


@pytest.mark.parametrize('remat', list(gpipe.RematPolicy))
def test_one_step_function_with_one_then_several_micro_batches(remat):
  """micro_batch_size=4: a batch of 4 is M=1 (gradients handed on), a batch
  of 16 retraces the same step function with M=4 (gradients summed in the
  accumulators, which take memory only then), then 4 again."""
  layers, shape = models.FfnLayers(keep_prob=1.0)
  pipe = gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, splits=[4], micro_batch_size=4,
      remat=remat).Instantiate()
  step = models.TrainStep(pipe, step=0)
  for batch in (4, 16, 4):
    x = tf.random.stateless_normal([batch, shape[1]], [batch, 1])
    ref = models.SequentialReference(pipe, (x,), batch // 4, step=0)
    _, loss, grads = step(x)
    _AssertClose(loss, ref['loss'])
    for g, rg in zip(grads, ref['grads']):
      _AssertClose(g, rg)


@pytest.mark.parametrize('m', [1, 4])
def test_equals_separately_built_network_on_whole_batch(m):
  """No dropout, no batch norm: micro-batching must not change anything,
  so the pipeline equals an independently built Sequential network."""
  layers, shape = models.FfnLayers(keep_prob=1.0)
  pipe = models.Pipeline(layers, shape, 4, m)
  ref = containers.SequentialLayer.Params().Set(name='ref', sub=layers).Instantiate()
  for v_ref, v_pipe in zip(ref.trainable_variables, pipe.trainable_variables):
    assert v_ref.shape == v_pipe.shape
    v_ref.assign(v_pipe)
  x = tf.random.stateless_normal(shape, [1, 2])
  with tf.GradientTape() as tape:
    tape.watch(x)
    loss = models.Loss(ref(x))
  ref_grads = tape.gradient(loss, list(ref.trainable_variables) + [x])
  _, pipe_loss, grads = models.TrainStep(pipe, step=0)(x)
  _AssertClose(pipe_loss, loss)
  for g, rg in zip(grads, ref_grads):
    _AssertClose(g, rg)


def test_dropout_differs_across_micro_batches_and_steps():
  layers, shape = models.FfnLayers(keep_prob=0.5)
  pipe = models.Pipeline(layers, shape, 2, 2)
  x = tf.ones(shape)
  y_step1 = models.TrainStep(pipe, step=1)(x)[0].numpy()
  y_step2 = models.TrainStep(pipe, step=2)(x)[0].numpy()
  half = shape[0] // 2
  assert not np.allclose(y_step1[:half], y_step1[half:])
  assert not np.allclose(y_step1, y_step2)


def test_eval_mode_is_forward_only_and_deterministic():
  layers, shape = models.ConvNetLayers(keep_prob=0.5)
  pipe = models.Pipeline(layers, shape, 2, 4)
  ref = containers.SequentialLayer.Params().Set(name='ref', sub=layers).Instantiate()
  for v_ref, v_pipe in zip(ref.variables, pipe.variables):
    v_ref.assign(v_pipe)
  x = tf.random.stateless_normal(shape, [3, 4])
  models.TrainStep(pipe, step=1)(x)  # traces the cells in training mode first
  for v_ref, v_pipe in zip(ref.variables, pipe.variables):
    v_ref.assign(v_pipe)
  with base_layer.EvalMode():
    eval_fn = tf.function(pipe.FProp, autograph=False)
    _AssertClose(eval_fn(pipe.theta, x), ref(x))
    _AssertClose(pipe(x), ref(x))


def test_tuple_inputs_split_and_broadcast():
  """A batch entry is split, a broadcast entry reaches every micro-batch."""

  class AddBias(base_layer.BaseLayer):

    def FProp(self, theta, x, bias):
      return x + bias, bias

    @classmethod
    def FPropMeta(cls, params, x_shape, bias_shape):
      from lingvo_pipe.core import layer_meta
      return layer_meta.LayerMeta((tf.TensorShape(x_shape), tf.TensorShape(bias_shape)))

  layers = [AddBias.Params().Set(name=f'add{i}') for i in range(4)]
  pipe = gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, num_partitions=2, num_micro_batches=4,
      input_shapes=[[8, 3], [3]], broadcast_inputs=[1], summed_outputs=[1]).Instantiate()
  x, bias = tf.zeros([8, 3]), tf.constant([1., 2., 3.])
  with tf.GradientTape() as tape:
    tape.watch([x, bias])
    y, b = pipe(x, bias)
    loss = tf.reduce_sum(y)
  _AssertClose(y, np.tile([4., 8., 12.], [8, 1]))
  _AssertClose(b, 4 * bias.numpy())  # summed outputs
  dx, dbias = tape.gradient(loss, [x, bias])
  _AssertClose(dx, np.ones([8, 3]))
  _AssertClose(dbias, [32., 32., 32.])


class _ScaleWithAuxLoss(base_layer.BaseLayer):
  """(x, aux) -> (x * w, aux + mean(x^2)): a per-cell loss term carried
  along with the activations."""

  def __init__(self, params):
    super().__init__(params)
    from lingvo_pipe.core import weights
    self.CreateVariable('w', weights.WeightParams([3], init=weights.WeightInit.Uniform(1.0)))

  def FProp(self, theta, x, aux):
    return x * theta.w, aux + tf.reduce_mean(tf.square(x))

  @classmethod
  def FPropMeta(cls, params, x_shape, aux_shape):
    from lingvo_pipe.core import layer_meta
    return layer_meta.LayerMeta((tf.TensorShape(x_shape), tf.TensorShape(aux_shape)))


@pytest.mark.parametrize('m', [1, 4])
def test_auxiliary_loss_terms_are_summed_over_micro_batches(m):
  layers = [_ScaleWithAuxLoss.Params().Set(name=f'aux{i}') for i in range(4)]
  pipe = gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, num_partitions=4, num_micro_batches=m,
      input_shapes=[[8, 3], []], broadcast_inputs=[1], summed_outputs=[1]).Instantiate()
  x = tf.random.stateless_normal([8, 3], [5, 6])
  variables = list(pipe.trainable_variables)

  def Loss(y, aux):
    return tf.reduce_mean(y) + aux

  with tf.GradientTape() as tape:
    y, aux = pipe(x, tf.constant(0.0))
    loss = Loss(y, aux)
  grads = tape.gradient(loss, variables)
  with tf.GradientTape() as tape:  # reference: per micro-batch, plain autodiff
    ys, aux_ref = [], 0.0
    for xm in tf.split(x, m):
      h, a = xm, 0.0
      for layer in [l for c in pipe.cells for l in c.sub]:
        h, a = layer.FProp(layer.theta, h, a)
      ys.append(h)
      aux_ref += a
    ref_loss = Loss(tf.concat(ys, 0), aux_ref)
  _AssertClose(aux, aux_ref)
  _AssertClose(loss, ref_loss)
  for g, rg in zip(grads, tape.gradient(ref_loss, variables)):
    _AssertClose(g, rg)


def test_micro_batch_size_and_time_major_inputs():
  """batch_dim=1 splits [time, batch, dim] inputs along the batch, and
  micro_batch_size=4 of 16 examples makes M=4."""
  from lingvo_pipe.core.layers import linear
  layers = [linear.ProjectionLayer.Params().Set(name=f'p{i}', input_dim=8, output_dim=8)
            for i in range(4)]
  pipe = gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, num_partitions=2, micro_batch_size=4, batch_dim=1,
      input_shapes=[[3, 16, 8]]).Instantiate()
  ref = containers.SequentialLayer.Params().Set(name='ref', sub=layers).Instantiate()
  for v_ref, v_pipe in zip(ref.variables, pipe.variables):
    v_ref.assign(v_pipe)
  x = tf.random.stateless_normal([3, 16, 8], [8, 9])
  tasks = []
  original = pipe._runners[0].Forward

  def Counting(theta, inputs, *args, **kwargs):
    tasks.append(inputs[0].shape)
    return original(theta, inputs, *args, **kwargs)

  pipe._runners[0].Forward = Counting
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(x)
    y, y_ref = pipe(x), ref(x)
  assert tasks == [tf.TensorShape([3, 4, 8])] * 4
  _AssertClose(y, y_ref)
  _AssertClose(tape.gradient(y, x), tape.gradient(y_ref, x))


def test_micro_batch_size_must_divide_batch():
  layers, shape = models.FfnLayers()
  with pytest.raises(ValueError, match=r'micro_batch_size \(5\) must divide the batch size \(16\)'):
    models.Pipeline(layers, shape, 2, 1, micro_batch_size=5)
