"""KerasLayer: a Keras model pipelined equals the Keras model itself.

Outputs, loss and gradients of a PipeliningLayer made by KerasLayers from a
keras.Sequential (Dense, LayerNormalization, an activation, a block of
MultiHeadAttention) equal those of `model(x)` under a GradientTape, for
K in {1, 2, 4}, M in {1, 4}, fill-drain (loss outside and inside) and
1F1B, remat on and off; a Keras BatchNormalization trains as GPipe's batch
norm; weights go Keras -> pipeline -> Keras; and each refusal says what it
refuses and the fix.
"""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core import eval_mode
from lingvo_pipe.core.layers import dropout
from lingvo_pipe.core.layers import keras_layer
from lingvo_pipe.core.layers import keras_models
from lingvo_pipe.core.layers import normalization
from lingvo_pipe.core.layers.keras_refusals import KerasLayerError
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.schedules.built_in import ScheduleKind

from tests.core.layers.keras_examples import AttentionBlock, ChainModel, DIM, TIME

keras = tf.keras
BATCH = 8
# float32 values of order 1 pass through attention and layer norms; a
# micro-batch runs smaller matmuls (oneDNN blocks them differently), so sums
# round differently by up to ~1e-6 absolute (1.2e-6 seen once in CI). A wrong
# micro-batch or gradient is off by 1e-3 or more.
RTOL, ATOL = 1e-5, 1e-5


def _Pipeline(model, k: int, m: int, **kwargs) -> gpipe.PipeliningLayer:
  pipe = gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=keras_models.KerasLayers(model, [None, TIME, DIM]),
      num_partitions=k, num_micro_batches=m, input_shapes=[[BATCH, TIME, DIM]],
      **kwargs).Instantiate()
  keras_models.CopyWeightsFromKeras(pipe, model)
  return pipe


def _Input(seed: int = 0) -> tf.Tensor:
  return tf.random.stateless_normal([BATCH, TIME, DIM], [seed, 1])


def _Loss(y: tf.Tensor) -> tf.Tensor:
  return tf.reduce_mean(tf.square(y))


def _MicroLoss(out: tf.Tensor) -> tf.Tensor:
  """A micro-batch's term of _Loss of the model's [BATCH, TIME, 4] outputs."""
  return tf.reduce_sum(tf.square(out)) / (BATCH * TIME * 4)


def _KerasVariables(pipe, model):
  """Each variable of the pipeline, and the Keras weight it stands for."""
  pairs = []
  for ours, theirs in zip(pipe.layers, model.layers):
    pairs += list(zip(ours.KerasOrderedVariables(), theirs.weights))
  return pairs


def _AssertClose(actual, expected, what):
  np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=RTOL,
                             atol=ATOL, err_msg=what)


def _Grid():
  """(K, M, schedule, loss inside, remat): every case, a diagonal in
  `make test` covering each K, M, schedule and remat policy."""
  fast = {(1, 1, 'gpipe', 'NONE'), (2, 1, 'gpipe', 'PER_CELL'),
          (4, 4, 'gpipe_inside', 'NONE'), (2, 4, '1f1b', 'PER_CELL')}
  cases = []
  for k in (1, 2, 4):
    for m in (1, 4):
      for sched in ('gpipe', 'gpipe_inside', '1f1b'):
        for remat in ('NONE', 'PER_CELL'):
          cases.append(pytest.param(
              k, m, sched, remat, id=f'K{k}-M{m}-{sched}-{remat}',
              marks=() if (k, m, sched, remat) in fast else pytest.mark.slow))
  return cases


@pytest.mark.parametrize('k,m,sched,remat', _Grid())
def test_pipelined_keras_model_equals_the_keras_model(k, m, sched, remat):
  keras.utils.set_random_seed(0)  # the same weights in every run and order
  model = ChainModel()
  schedule = ScheduleKind.ONE_F_ONE_B if sched == '1f1b' else ScheduleKind.GPIPE
  pipe = _Pipeline(model, k, m, schedule=schedule, remat=gpipe.RematPolicy[remat])
  assert len(pipe.CellLayerIndices()) == k
  x = _Input()
  pairs = _KerasVariables(pipe, model)
  ours, theirs = [p[0] for p in pairs], [p[1] for p in pairs]

  with tf.GradientTape() as tape:
    tape.watch(x)
    expected_y = model(x, training=True)
    expected_loss = _Loss(expected_y)
  expected_grads = tape.gradient(expected_loss, theirs + [x])

  with tf.GradientTape() as tape:
    tape.watch(x)
    if sched == 'gpipe':
      y = pipe.FProp(pipe.theta, x)
      loss = _Loss(y)
    else:
      loss, y = pipe.FPropWithLoss(pipe.theta, _MicroLoss, x)
  grads = tape.gradient(loss, ours + [x])

  _AssertClose(y, expected_y, 'outputs')
  _AssertClose(loss, expected_loss, 'loss')
  names = [v.name for v in ours] + ['input']
  for name, g, e in zip(names, grads, expected_grads):
    assert g is not None, name
    _AssertClose(g, e, name)


def test_in_a_graph_with_one_loop_per_device():
  """In a tf.function from loop_min_micro_batches the cells run as loops;
  still the Keras model's loss and gradients."""
  model = keras.Sequential([keras.Input((TIME, DIM)), AttentionBlock(name='block'),
                            keras.layers.Dense(4, name='out')])
  pipe = _Pipeline(model, 2, 4, schedule=ScheduleKind.ONE_F_ONE_B,
                   loop_min_micro_batches=2)
  x = _Input(1)
  pairs = _KerasVariables(pipe, model)
  ours, theirs = [p[0] for p in pairs], [p[1] for p in pairs]

  @tf.function(autograph=False)
  def Step(x):
    with tf.GradientTape() as tape:
      loss, _ = pipe.FPropWithLoss(pipe.theta, _MicroLoss, x)
    return loss, tape.gradient(loss, ours)

  loss, grads = Step(x)
  with tf.GradientTape() as tape:
    expected_loss = _Loss(model(x, training=True))
  _AssertClose(loss, expected_loss, 'loss')
  for var, g, e in zip(ours, grads, tape.gradient(expected_loss, theirs)):
    _AssertClose(g, e, var.name)


def test_variables_are_the_layer_trees_named_by_keras_paths(tmp_path):
  model = ChainModel()
  pipe = _Pipeline(model, 2, 1)
  names = {v.name for v in pipe.variables}
  assert {'pipe/dense/kernel:0', 'pipe/norm/gamma:0', 'pipe/block/mha__query__kernel:0',
          'pipe/block/norm__beta:0'} <= names, sorted(names)
  assert len(names) == len(model.weights)
  # The layout changes no name, and the checkpoint holds only these.
  assert {v.name for v in _Pipeline(model, 4, 1).variables} == names
  path = tf.train.Checkpoint(model=pipe).write(str(tmp_path / 'ckpt'))
  keys = [k for k, _ in tf.train.list_variables(path) if '_CHECKPOINTABLE' not in k]
  assert len(keys) == len(names), keys


def test_weights_round_trip_keras_pipeline_keras():
  model = ChainModel()
  pipe = _Pipeline(model, 2, 2)
  pairs = _KerasVariables(pipe, model)
  assert [(v.name, w.path) for v, w in keras_models.WeightPairs(pipe, model)] == [
      (v.name, w.path) for v, w in pairs]
  for ours, theirs in pairs:
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy(), err_msg=ours.name)
  x = _Input(2)
  with tf.GradientTape() as tape:  # one SGD step of the pipeline alone
    loss = _Loss(pipe.FProp(pipe.theta, x))
  for var, grad in zip(pipe.trainable_variables,
                       tape.gradient(loss, pipe.trainable_variables)):
    var.assign_sub(0.5 * grad)
  keras_models.CopyWeightsToKeras(pipe, model)
  for ours, theirs in _KerasVariables(pipe, model):
    np.testing.assert_array_equal(theirs.numpy(), ours.numpy(), err_msg=ours.name)
  with eval_mode.EvalMode():
    _AssertClose(model(x, training=False), pipe.FProp(pipe.theta, x), 'trained outputs')


def test_a_keras_layer_class_as_factory_survives_params_text():
  """A Keras layer class whose arguments all have defaults is a factory
  params text can hold; each instance starts from the same values, a pure
  function of the variable paths (LayerNormalization's ones and zeros)."""
  p = keras_layer.KerasLayer.Params().Set(
      name='norm', factory=keras.layers.LayerNormalization, input_shapes=[[None, DIM]])
  assert p.cls.Params().FromText(p.ToText()) == p
  first, second = p.Instantiate(), p.Instantiate()
  assert sorted(v.name for v in first.variables) == ['norm/beta:0', 'norm/gamma:0']
  np.testing.assert_array_equal(first.gamma.numpy(), np.ones([DIM]))
  np.testing.assert_array_equal(first.beta.numpy(), np.zeros([DIM]))
  np.testing.assert_array_equal(second.gamma.numpy(), first.gamma.numpy())
  dense = keras_layer.KerasLayer.Params().Set(name='proj', factory=lambda: keras.layers.Dense(4),
                                              input_shapes=[[None, DIM]])
  a, b = dense.Instantiate(), dense.Instantiate()
  np.testing.assert_array_equal(a.kernel.numpy(), b.kernel.numpy())  # Xavier, by path
  assert a.keras_layer is not b.keras_layer


def test_a_keras_model_class_is_a_factory_params_text_holds():
  """KerasLayers of a model class name the class and each layer; the
  params survive text, and the pipeline computes the class's SharedModel."""
  layers = keras_models.KerasLayers(ChainModel, [None, TIME, DIM])
  assert [(p.factory, p.model_layer) for p in layers[:2]] == [
      (ChainModel, 'dense'), (ChainModel, 'norm')]
  p = gpipe.PipeliningLayer.Params().Set(name='pipe', layers=layers, num_partitions=2,
                                         input_shapes=[[BATCH, TIME, DIM]])
  assert p.cls.Params().FromText(p.ToText()) == p
  pipe = p.Instantiate()
  shared = keras_layer.SharedModel(ChainModel)
  assert shared is keras_layer.SharedModel(ChainModel)
  assert pipe.layers[0].keras_layer is shared.get_layer('dense')
  keras_models.CopyWeightsFromKeras(pipe, ChainModel)
  x = _Input(4)
  _AssertClose(pipe.FProp(pipe.theta, x), shared(x), 'outputs')


class _Unbuilt(keras.Sequential):

  def __init__(self):
    super().__init__([keras.layers.Dense(4, name='dense')])


def test_refuses_model_classes_it_cannot_take_naming_them():
  with pytest.raises(KerasLayerError, match=r'_Unbuilt makes an unbuilt model.*keras.Input'):
    keras_models.KerasLayers(_Unbuilt, [None, DIM])
  missing = keras_layer.KerasLayer.Params().Set(name='x', factory=ChainModel,
                                                model_layer='dense_9')
  with pytest.raises(KerasLayerError, match=r"KerasLayer 'x'.*no layer 'dense_9'.*'dense_1'"):
    missing.Instantiate()
  not_a_model = missing.Copy().Set(factory=keras.layers.Dense)
  with pytest.raises(TypeError, match=r'Dense.*is not a Keras model class'):
    not_a_model.Instantiate()


def test_fprop_meta_from_keras_shapes_and_weights():
  model = ChainModel()
  layers = keras_models.KerasLayers(model, [None, TIME, DIM])
  dense = layers[0]
  meta = dense.cls.FPropMeta(dense, tf.TensorShape([BATCH, TIME, DIM]))
  rows = BATCH * TIME
  assert meta.out_shapes == (tf.TensorShape([BATCH, TIME, 16]),)
  assert meta.flops == 2 * rows * DIM * 16 + rows * 16
  assert meta.param_bytes == (DIM * 16 + 16) * 4
  assert meta.act_bytes == rows * 16 * 4
  block = layers[3]
  assert block.cls.FPropMeta(block, tf.TensorShape([2, TIME, DIM])).out_shapes == (
      tf.TensorShape([2, TIME, DIM]),)
  with pytest.raises(ValueError, match=r"KerasLayer 'dense'.*does not take inputs"):
    dense.cls.FPropMeta(dense, tf.TensorShape([BATCH, TIME, DIM + 1]))


def test_a_functional_chain_and_a_list_of_layers():
  inputs = keras.Input((TIME, DIM))
  hidden = keras.layers.Dense(16, activation='relu')(inputs)
  model = keras.Model(inputs, keras.layers.Dense(DIM)(hidden))
  pipe = _Pipeline(model, 2, 2)
  x = _Input(3)
  _AssertClose(pipe.FProp(pipe.theta, x), model(x), 'functional chain')
  unbuilt = [keras.layers.Dense(5), keras.layers.LayerNormalization()]
  layers = keras_models.KerasLayers(unbuilt, [None, DIM])
  assert [p.name for p in layers] == [l.name for l in unbuilt]
  assert layers[1].input_shapes == [[None, 5]]


def test_a_keras_dropout_becomes_the_projects_dropout():
  model = keras.Sequential([keras.Input((TIME, DIM)), keras.layers.Dense(DIM),
                            keras.layers.Dropout(0.25, noise_shape=(None, 1, DIM)),
                            keras.layers.Dense(4)])
  layers = keras_models.KerasLayers(model, [None, TIME, DIM])
  drop = layers[1]
  assert drop.cls is dropout.DropoutLayer
  assert (drop.keep_prob, drop.noise_shape_broadcast_dims) == (0.75, [1])
  pipe = _Pipeline(model, 2, 2)
  x = _Input(4)
  with eval_mode.EvalMode():
    _AssertClose(pipe.FProp(pipe.theta, x), model(x, training=False), 'eval outputs')


def _ConvNet(trainable_norm: bool = True) -> keras.Sequential:
  return keras.Sequential([
      keras.Input((4, 4, 3)),
      keras.layers.Conv2D(8, 3, padding='same', name='conv'),
      keras.layers.BatchNormalization(momentum=0.9, trainable=trainable_norm, name='bn'),
      keras.layers.Activation('relu', name='relu'),
      keras.layers.GlobalAveragePooling2D(name='pool'),
      keras.layers.Dense(4, name='out'),
  ])


@pytest.mark.parametrize('m', [1, 4])
def test_a_keras_batch_norm_becomes_the_projects_batch_norm(m):
  """Each micro-batch is normalized with its own statistics (GPipe's rule:
  the Keras model called on each micro-batch), the moving averages follow
  the whole batch's once per step (at M=1 exactly as Keras's own update),
  and they go back into the Keras model."""
  model = _ConvNet()
  layers = keras_models.KerasLayers(model, [None, 4, 4, 3])
  bn = layers[1]
  assert bn.cls is normalization.BatchNormLayer
  assert (bn.dim, bn.decay, bn.epsilon) == (8, 0.9, 1e-3)
  pipe = gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, num_partitions=2, num_micro_batches=m,
      input_shapes=[[BATCH, 4, 4, 3]]).Instantiate()
  keras_models.CopyWeightsFromKeras(pipe, model)
  x = tf.random.stateless_normal([BATCH, 4, 4, 3], [5, 1])
  conv_out = model.layers[0](x)
  moving = [0.1 * tf.reduce_mean(conv_out, [0, 1, 2]),
            0.9 + 0.1 * tf.math.reduce_variance(conv_out, [0, 1, 2])]

  with tf.GradientTape() as tape:
    tape.watch(x)
    expected_y = tf.concat([model(part, training=True) for part in tf.split(x, m)], 0)
    expected_loss = _Loss(expected_y)
  expected_grads = tape.gradient(expected_loss, model.trainable_weights)
  if m == 1:  # Keras's own update, from the one batch
    moving = [model.layers[1].moving_mean, model.layers[1].moving_variance]
  with tf.GradientTape() as tape:
    y = pipe.FProp(pipe.theta, x)
    loss = _Loss(y)
  grads = tape.gradient(loss, pipe.trainable_variables)

  _AssertClose(y, expected_y, 'outputs')
  _AssertClose(loss, expected_loss, 'loss')
  by_path = {'/'.join(v.path.split('/')[-2:]): g  # layer/weight
             for v, g in zip(model.trainable_weights, expected_grads)}
  ours = dict(zip([v.name for v in pipe.trainable_variables], grads))
  for path, name in [('conv/kernel', 'pipe/conv/kernel:0'), ('bn/gamma', 'pipe/bn/gamma:0'),
                     ('bn/beta', 'pipe/bn/beta:0'), ('out/kernel', 'pipe/out/kernel:0')]:
    _AssertClose(ours[name], by_path[path], path)
  bn_layer = pipe.layers[1]
  _AssertClose(bn_layer.moving_mean, moving[0], 'moving mean')
  _AssertClose(bn_layer.moving_variance, moving[1], 'moving variance')
  keras_models.CopyWeightsToKeras(pipe, model)
  _AssertClose(model.layers[1].moving_mean, moving[0], 'moving mean back in Keras')
  with eval_mode.EvalMode():
    _AssertClose(pipe.FProp(pipe.theta, x), model(x, training=False), 'eval outputs')


def test_a_frozen_keras_batch_norm_stays_a_keras_layer_that_only_reads():
  model = _ConvNet(trainable_norm=False)
  layers = keras_models.KerasLayers(model, [None, 4, 4, 3])
  assert layers[1].cls is keras_layer.KerasLayer
  pipe = gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, num_partitions=2, num_micro_batches=2,
      input_shapes=[[BATCH, 4, 4, 3]]).Instantiate()
  keras_models.CopyWeightsFromKeras(pipe, model)
  x = tf.random.stateless_normal([BATCH, 4, 4, 3], [6, 1])
  _AssertClose(pipe.FProp(pipe.theta, x), model(x, training=True), 'outputs')
  assert not any('bn/' in v.name for v in pipe.trainable_variables)


class _DropoutBlock(keras.layers.Layer):

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.dense = keras.layers.Dense(DIM, name='dense')
    self.drop = keras.layers.Dropout(0.1, name='drop')

  def call(self, x, training=None):
    return self.drop(self.dense(x), training=training)


class _BatchNormBlock(keras.layers.Layer):

  def __init__(self, **kwargs):
    super().__init__(**kwargs)
    self.dense = keras.layers.Dense(DIM, name='dense')
    self.bn = keras.layers.BatchNormalization(name='bn')

  def call(self, x, training=None):
    return self.bn(self.dense(x), training=training)


class _Counter(keras.layers.Layer):
  """Counts its calls in a non-trainable weight."""

  def build(self, input_shape):
    self.calls = self.add_weight(shape=(), initializer='zeros', trainable=False,
                                 name='calls')

  def call(self, x):
    self.calls.assign_add(1.0)
    return x


class _AddsLoss(keras.layers.Layer):

  def call(self, x):
    self.add_loss(tf.reduce_sum(x))
    return x


def _Refusals():
  """(name, layers, the message's pattern)."""
  return {
      'dropout_inside_a_block': (
          lambda: [_DropoutBlock(name='block')],
          r"Keras layer 'drop' \(Dropout\) draws random numbers from a Keras "
          r"SeedGenerator.*use lingvo_pipe's dropout.DropoutLayer"),
      'gaussian_noise': (
          lambda: [keras.layers.GaussianNoise(0.1, name='noise')],
          r"KerasLayer 'noise'.*\(GaussianNoise\) draws random numbers"),
      'batch_norm_inside_a_block': (
          lambda: [_BatchNormBlock(name='block')],
          r"'bn' \(BatchNormalization\) updates its moving statistics.*put it in the "
          r'chain itself.*or freeze it'),
      'batch_norm_renorm': (
          lambda: [keras.layers.BatchNormalization(renorm=True, name='bn')],
          r"Keras BatchNormalization 'bn' sets \['renorm'\].*build it with the defaults"),
      'batch_norm_mixed_precision': (
          lambda: [keras.layers.BatchNormalization(dtype='mixed_bfloat16', name='bn')],
          r"Keras BatchNormalization 'bn' has the dtype policy 'mixed_bfloat16'.*float32 "
          r'only'),
      'batch_norm_regularizer': (
          lambda: [keras.layers.BatchNormalization(gamma_regularizer='l2', name='bn')],
          r"Keras BatchNormalization 'bn' has regularizers \['gamma_regularizer'\]"),
      'batch_norm_on_an_inner_axis': (
          lambda: [keras.layers.BatchNormalization(axis=1, name='bn')],
          r"Keras BatchNormalization 'bn' normalizes axis 1.*move the channels last"),
      'stateful_rnn': (
          lambda: [keras.layers.SimpleRNN(4, stateful=True, name='rnn')],
          r"'rnn' \(SimpleRNN\) is stateful.*stateful=False"),
      'mixed_precision': (
          lambda: [keras.layers.Dense(4, dtype='mixed_bfloat16', name='half')],
          r"'half' \(Dense\) has the dtype policy 'mixed_bfloat16'.*float32 only"),
      'mask': (
          lambda: [keras.layers.Masking(name='masking')],
          r"'masking' \(Masking\) makes a mask.*pass paddings as an input"),
      'regularizer': (
          lambda: [keras.layers.Dense(4, kernel_regularizer='l2', name='reg')],
          r"'reg' \(Dense\) has regularizers \['kernel_regularizer'\]"),
  }


@pytest.mark.parametrize('case', list(_Refusals()))
def test_refuses_state_it_cannot_honour_naming_the_layer_and_the_fix(case):
  make, pattern = _Refusals()[case]
  with pytest.raises(KerasLayerError, match=pattern):
    keras_models.KerasLayers(make(), [BATCH, TIME, DIM])


@pytest.mark.parametrize('layer,pattern', [
    (_Counter(name='counter'), r"'counter' \(_Counter\) assigns its non-trainable "
     r"weights \['calls'\] in call"),
    (_AddsLoss(name='adds'), r"'adds' \(_AddsLoss\) adds 1 loss\(es\) in call"),
], ids=['assigns_weights', 'adds_loss'])
def test_refuses_side_effects_in_call(layer, pattern):
  (p,) = keras_models.KerasLayers([layer], [None, DIM])
  built = p.Instantiate()
  with pytest.raises(KerasLayerError, match=pattern):
    built(tf.ones([2, DIM]))


def test_refuses_a_compute_dtype_other_than_float32():
  # The pipeline's check of its cells' shapes says which cell.
  with pytest.raises(ValueError, match=r"Cell 0 .*KerasLayer 'proj'.*fprop_dtype=bfloat16"
                     r'.*float32 only'):
    gpipe.PipeliningLayer.Params().Set(
        name='pipe', layers=keras_models.KerasLayers([keras.layers.Dense(4, name='proj')],
                                                    [None, DIM]),
        num_partitions=1, input_shapes=[[BATCH, DIM]],
        fprop_dtype=tf.bfloat16).Instantiate()


def test_refuses_models_that_are_not_chains_and_layers_given_as_factory():
  inputs = keras.Input((DIM,))
  hidden = keras.layers.Dense(DIM, name='branch')(inputs)
  residual = keras.Model(inputs, keras.layers.Add(name='add')([inputs, hidden]))
  with pytest.raises(KerasLayerError, match=r"is not a chain: layer 'add'.*wrap each "
                     'branching part'):
    keras_models.KerasLayers(residual, [None, DIM])

  class Subclassed(keras.Model):

    def __init__(self):
      super().__init__()
      self.dense = keras.layers.Dense(DIM)

    def call(self, x):
      return self.dense(x)

  with pytest.raises(TypeError, match='is not functional: its call order is not known'):
    keras_models.KerasLayers(Subclassed(), [None, DIM])
  dense = keras.layers.Dense(4)
  with pytest.raises(TypeError, match=r'set factory=lambda: layer'):
    keras_layer.BuiltKerasLayer(keras_layer.KerasLayer.Params().Set(name='d', factory=dense))
