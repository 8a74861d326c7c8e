"""Transparency of PipeliningLayer: it equals the unpartitioned network."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import eval_mode
from lingvo_pipe.pipeline import gpipe

from tests import transparency
from tests.pipeline import pipeline_models as models

_AssertClose = transparency.AssertClose
# The convnet (conv, batch norm, dropout: the cheapest model with every
# per-micro-batch behaviour) runs the whole grid in `make test`; the other
# models run KMGrid's diagonal there and the whole grid under the slow mark.
FULL_GRID = [(k, m) for k in models.KS for m in models.MS]


def _CheckTransparent(layers, input_shape, k, m, **kwargs):
  pipe = models.Pipeline(layers, input_shape, k, m, **kwargs)
  assert pipe.num_cells == k
  x = tf.random.stateless_normal(input_shape, [k, m])
  return pipe, transparency.CheckTransparent(pipe, (x,), m)


@pytest.mark.parametrize('k,m', FULL_GRID)
def test_convnet_with_batch_norm_and_dropout(k, m):
  layers, shape = models.ConvNetLayers(keep_prob=0.8)
  pipe, ref = _CheckTransparent(layers, shape, k, m)
  transparency.CheckMovingAverages(pipe, ref.bn_inputs)


# M=16 (micro-batches of one example) runs in make test on the ffn and conv
# stacks; the Transformer's took 42 s there.
@pytest.mark.parametrize('k,m', models.KMGrid(fast_ms=(1, 2, 4, 8)))
def test_transformer_stack_with_dropout(k, m):
  pipe = models.TransformerStackPipeline(k, m)
  assert pipe.num_cells == k
  seed = k * 100 + m
  transparency.CheckTransparent(pipe, models.TransformerInputs(seed), m,
                                loss_fn=models.TokenLoss(models.TransformerLabels(seed)))


@pytest.mark.parametrize('k,m', models.KMGrid())
def test_ffn_with_dropout(k, m):
  layers, shape = models.FfnLayers(keep_prob=0.7, num_layers=max(k, 4))
  _CheckTransparent(layers, shape, k, m)


# remat_last_micro_batch changes only PER_CELL; with the other policies
# it is checked to change nothing under the slow mark.
_REMAT_CASES = [pytest.param(remat, remat_last, id=f'{remat.name}-{remat_last}', marks=(
    pytest.mark.slow if remat_last and remat != gpipe.RematPolicy.PER_CELL else ()))
                for remat in gpipe.RematPolicy for remat_last in (False, True)]


@pytest.mark.parametrize('remat,remat_last', _REMAT_CASES)
@pytest.mark.parametrize('m', [1, 4])
def test_every_remat_policy(remat, m, remat_last):
  """M=1 hands the weight gradients on; M=4 sums them in accumulators."""
  layers, shape = models.ConvNetLayers(keep_prob=0.8)
  _CheckTransparent(layers, shape, 4, m, remat=remat,
                    remat_last_micro_batch=remat_last)


@pytest.mark.parametrize('remat,remat_last,recomputing,forward_calls', [
    (gpipe.RematPolicy.PER_CELL, False, 3, 3), (gpipe.RematPolicy.PER_CELL, True, 4, 4),
    (gpipe.RematPolicy.PER_LAYER, False, 4, 4), (gpipe.RematPolicy.NONE, False, 0, 0)])
def test_which_micro_batches_are_recomputed(remat, remat_last, recomputing,
                                            forward_calls):
  """Per cell (K=2, M=4), the calls of backward functions (each recomputes
  a micro-batch) and of the forward function: PER_CELL keeps the last
  micro-batch's activations unless remat_last_micro_batch, and builds its
  forward in the step's graph; NONE builds every forward there."""
  layers, shape = models.FfnLayers()
  pipe = models.Pipeline(layers, shape, 2, 4, remat=remat,
                         remat_last_micro_batch=remat_last)
  graph_def = models.TrainStep(pipe, step=0).get_concrete_function(
      tf.TensorSpec(shape)).graph.as_graph_def()
  called = [n.attr['f'].func.name for n in graph_def.node if 'f' in n.attr]
  for cell in range(2):
    forwards = [f for f in called if f'cell_{cell}_forward' in f]
    assert len([f for f in called if f'cell_{cell}_backward_' in f]) == recomputing, called
    assert len(forwards) == forward_calls, called


@pytest.mark.parametrize('remat', list(gpipe.RematPolicy))
def test_one_step_function_with_one_then_several_micro_batches(remat):
  """micro_batch_size=4: a batch of 4 is M=1 (gradients handed on), a batch
  of 16 retraces the same step function with M=4 (gradients summed in the
  accumulators, which take memory only then), then 4 again."""
  layers, shape = models.FfnLayers(keep_prob=1.0)
  pipe = gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, splits=[2], micro_batch_size=4,
      remat=remat).Instantiate()
  step = models.TrainStep(pipe, step=0)
  for batch in (4, 16, 4):
    x = tf.random.stateless_normal([batch, shape[1]], [batch, 1])
    transparency.CheckTransparent(pipe, (x,), batch // 4, step=0, train_step=step)


@pytest.mark.parametrize('m', [1, 4])
def test_equals_separately_built_network_on_whole_batch(m):
  """No dropout, no batch norm: micro-batching must not change anything,
  so the pipeline equals its layers applied to the whole batch at once."""
  layers, shape = models.FfnLayers(keep_prob=1.0)
  pipe = models.Pipeline(layers, shape, 4, m)
  x = tf.random.stateless_normal(shape, [1, 2])
  transparency.CheckTransparent(pipe, (x,), num_micro=1, step=0)


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
  x = tf.random.stateless_normal(shape, [3, 4])
  models.TrainStep(pipe, step=1)(x)  # traces the cells in training mode first
  ref = transparency.Reference(pipe)  # with the updated moving averages
  with eval_mode.EvalMode():
    expected = ref.Forward((x,), num_micro=1, step=1)
    eval_fn = tf.function(pipe.FProp, autograph=False)
    _AssertClose(eval_fn(pipe.theta, x), expected)
    _AssertClose(pipe(x), expected)


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
  # The reference sums its outputs without a batch dimension over the
  # micro-batches, as a pipeline must.
  transparency.CheckTransparent(
      pipe, (x, tf.constant(0.0)), m, loss_fn=lambda out: tf.reduce_mean(out[0]) + out[1],
      eager=True)


def test_micro_batch_size_and_time_major_inputs():
  """batch_dim=1 splits [time, batch, dim] inputs along the batch, and
  micro_batch_size=4 of 16 examples makes M=4."""
  from lingvo_pipe.core.layers import linear
  layers = [linear.ProjectionLayer.Params().Set(name=f'p{i}', input_dim=8, output_dim=8)
            for i in range(4)]
  pipe = gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, num_partitions=2, micro_batch_size=4, batch_dim=1,
      input_shapes=[[3, 16, 8]]).Instantiate()
  x = tf.random.stateless_normal([3, 16, 8], [8, 9])
  tasks = _FirstCellInputShapes(pipe, replica=0)
  transparency.CheckTransparent(pipe, (x,), 4, loss_fn=tf.reduce_sum, eager=True)
  assert tasks == [tf.TensorShape([3, 4, 8])] * 4


def _TimeMajorDropoutPipeline(**dropout_kwargs):
  from lingvo_pipe.core.layers import dropout
  from lingvo_pipe.core.layers import linear
  layers = [linear.ProjectionLayer.Params().Set(name='p0', input_dim=8, output_dim=8),
            dropout.DropoutLayer.Params().Set(name='drop', keep_prob=0.5, **dropout_kwargs),
            linear.ProjectionLayer.Params().Set(name='p1', input_dim=8, output_dim=8)]
  return gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, num_partitions=2, num_micro_batches=4, batch_dim=1,
      input_shapes=[[3, 16, 8]]).Instantiate()


def test_a_time_major_pipeline_refuses_dropout_without_its_example_axis():
  """Left at 0, the masks of [time, batch, dim] inputs would be drawn per
  time step, and change with M."""
  with pytest.raises(ValueError, match=r"splits its batch along batch_dim=1, but DropoutLayers "
                     r"\['pipe/drop'\] leave example_axis unset .* set their "
                     r'example_axis to 1 where their inputs are time-major'):
    _TimeMajorDropoutPipeline()


def test_time_major_dropout_with_its_example_axis_does_not_change_with_m():
  """example_axis=1: the pipeline at M=4 equals the reference at M=4, whose
  outputs equal its own at M=1 (the whole batch)."""
  pipe = _TimeMajorDropoutPipeline(example_axis=1)
  x = tf.random.stateless_normal([3, 16, 8], [8, 11])
  transparency.CheckTransparent(pipe, (x,), 4, loss_fn=tf.reduce_sum, eager=True)
  reference = transparency.Reference(pipe)
  transparency.AssertClose(reference.Forward((x,), 4, step=7),
                           reference.Forward((x,), 1, step=7), 'M=4 against M=1')


def _FirstCellInputShapes(pipe, replica):
  """The shapes of the first input of each forward of the replica's first
  cell, appended as they run."""
  shapes = []
  runner = pipe._replica_runners[replica][0]
  original = runner.Forward

  def Counting(theta, inputs, *args, **kwargs):
    shapes.append(inputs[0].shape)
    return original(theta, inputs, *args, **kwargs)

  runner.Forward = Counting
  return shapes


def test_micro_batch_size_with_replicas_cuts_each_replicas_batch():
  """With R=2 of 16 examples, micro_batch_size=4 makes M=2 micro-batches of
  4 in each replica (not M=4 of 2), the step equal to one pipeline's."""
  layers, shape = models.FfnLayers()
  pipe = models.Pipeline(layers, shape, 2, 1, micro_batch_size=4, num_replicas=2)
  x = tf.random.stateless_normal(shape, [8, 10])
  tasks = _FirstCellInputShapes(pipe, replica=1)
  transparency.CheckTransparent(pipe, (x,), 4, eager=True)
  assert tasks == [tf.TensorShape([4] + shape[1:])] * 2


def test_micro_batches_must_divide_each_replicas_batch_at_build():
  layers, shape = models.FfnLayers()
  with pytest.raises(ValueError, match=r'with 2 replicas, each of 1/2 of the batch: '
                     r'num_micro_batches \(16\) must divide the batch size \(8\)'):
    models.Pipeline(layers, shape, 2, 16, num_replicas=2)


def test_micro_batch_size_must_divide_batch():
  layers, shape = models.FfnLayers()
  with pytest.raises(ValueError, match=r'micro_batch_size \(5\) must divide the batch size \(16\)'):
    models.Pipeline(layers, shape, 2, 1, micro_batch_size=5)
