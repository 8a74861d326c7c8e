"""Tests of LayerNorm and BatchNormLayer against NumPy and plain TF."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core import eval_mode
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.layers import normalization
from lingvo_pipe.core.nested_map import NestedMap

RTOL = 1e-5
ATOL = 1e-5


def _Rand(*shape, seed=0, loc=0.0):
  return (loc + np.random.RandomState(seed).randn(*shape)).astype(np.float32)


def _LayerNorm(dim=6, epsilon=1e-6):
  layer = normalization.LayerNorm.Params().Set(
      name='ln', input_dim=dim, epsilon=epsilon).Instantiate()
  layer.scale.assign(_Rand(dim, seed=1))
  layer.bias.assign(_Rand(dim, seed=2))
  return layer


def _BatchNorm(dim=3, decay=0.9, epsilon=1e-3):
  layer = normalization.BatchNormLayer.Params().Set(
      name='bn', dim=dim, decay=decay, epsilon=epsilon).Instantiate()
  layer.gamma.assign(_Rand(dim, seed=1))
  layer.beta.assign(_Rand(dim, seed=2))
  layer.moving_mean.assign(_Rand(dim, seed=3))
  layer.moving_variance.assign(1.0 + np.abs(_Rand(dim, seed=4)))
  return layer


def _NumpyNormalize(x, axes, scale, bias, epsilon):
  x = x.astype(np.float64)
  mean = x.mean(axis=axes, keepdims=True)
  var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
  return (x - mean) / np.sqrt(var + epsilon) * scale + bias


def _TfNormalize(x, axes, scale, bias, epsilon):
  """Plain-TF reference for gradients."""
  mean = tf.reduce_mean(x, axis=axes, keepdims=True)
  var = tf.reduce_mean(tf.square(x - mean), axis=axes, keepdims=True)
  return (x - mean) / tf.sqrt(var + epsilon) * scale + bias


def _CheckGradients(fn, ref_fn, x, variables):
  """Gradients of sum(y * w) for the layer and the reference agree."""
  x = tf.constant(x)
  w = tf.constant(_Rand(*x.shape, seed=9))
  grads = []
  for f in (fn, ref_fn):
    with tf.GradientTape() as tape:
      tape.watch(x)
      loss = tf.reduce_sum(f(x) * w)
    grads.append(tape.gradient(loss, [x] + variables))
  for got, want in zip(*grads):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# --- LayerNorm ---------------------------------------------------------------


def test_layer_norm_matches_numpy():
  layer = _LayerNorm()
  x = _Rand(2, 3, 6, loc=2.0)
  want = _NumpyNormalize(x, -1, layer.scale.numpy(), layer.bias.numpy(), 1e-6)
  np.testing.assert_allclose(layer(tf.constant(x)), want, rtol=RTOL, atol=ATOL)


def test_layer_norm_gradients_match_plain_tf():
  layer = _LayerNorm()
  _CheckGradients(
      layer, lambda x: _TfNormalize(x, [-1], layer.scale, layer.bias, 1e-6),
      _Rand(4, 6, loc=1.0), [layer.scale, layer.bias])


def test_layer_norm_function_equals_eager():
  layer = _LayerNorm()
  x = tf.constant(_Rand(3, 6))
  np.testing.assert_allclose(
      tf.function(layer.FProp)(layer.theta, x), layer(x), rtol=RTOL)


def test_layer_norm_meta():
  p = normalization.LayerNorm.Params().Set(name='ln', input_dim=6)
  meta = p.cls.FPropMeta(p, [2, 3, 6])
  out = _LayerNorm()(tf.zeros([2, 3, 6]))
  assert meta.out_shapes == (out.shape,)
  n, rows = 2 * 3 * 6, 2 * 3
  assert meta.flops == 7 * n
  assert meta.param_bytes == 2 * 6 * 4
  assert meta.act_bytes == (2 * n + 2 * rows) * 4


def test_layer_norm_rejects_wrong_last_dim():
  layer = _LayerNorm(dim=6)
  with pytest.raises(ValueError, match=r'do not end in p.input_dim = 6'):
    layer(tf.zeros([2, 5]))
  with pytest.raises(ValueError, match=r'do not end in p.input_dim = 6'):
    layer.FPropMeta(layer.params, [2, 5])


# --- BatchNormLayer ----------------------------------------------------------


@pytest.mark.parametrize('shape', [(8, 3), (2, 3, 2, 3)])
def test_batch_norm_training_uses_batch_statistics(shape):
  layer = _BatchNorm()
  before = layer.moving_mean.numpy(), layer.moving_variance.numpy()
  x = _Rand(*shape, loc=3.0)
  axes = tuple(range(len(shape) - 1))
  want = _NumpyNormalize(x, axes, layer.gamma.numpy(), layer.beta.numpy(), 1e-3)
  np.testing.assert_allclose(layer(tf.constant(x)), want, rtol=RTOL, atol=ATOL)
  np.testing.assert_array_equal(layer.moving_mean.numpy(), before[0])
  np.testing.assert_array_equal(layer.moving_variance.numpy(), before[1])


@pytest.mark.parametrize('shape', [(8, 3), (2, 3, 2, 3)])
def test_batch_norm_eval_uses_moving_averages(shape):
  layer = _BatchNorm()
  x = _Rand(*shape, loc=3.0)
  want = ((x - layer.moving_mean.numpy()) /
          np.sqrt(layer.moving_variance.numpy() + 1e-3) * layer.gamma.numpy() +
          layer.beta.numpy())
  with eval_mode.EvalMode():
    got = layer(tf.constant(x))
    got_fn = tf.function(layer.FProp)(layer.theta, tf.constant(x))
  np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(got_fn, want, rtol=RTOL, atol=ATOL)


def test_batch_norm_gradients_match_plain_tf():
  layer = _BatchNorm()
  assert not layer.moving_mean.trainable and not layer.moving_variance.trainable
  names = [v.name for v in layer.trainable_variables]
  assert names == ['bn/beta:0', 'bn/gamma:0']
  _CheckGradients(
      layer,
      lambda x: _TfNormalize(x, [0, 1, 2], layer.gamma, layer.beta, 1e-3),
      _Rand(2, 2, 3, 3, loc=1.0), [layer.gamma, layer.beta])


def test_batch_norm_function_equals_eager():
  layer = _BatchNorm()
  x = tf.constant(_Rand(5, 3))
  np.testing.assert_allclose(
      tf.function(layer.FProp)(layer.theta, x), layer(x), rtol=RTOL)


def _NumpyMovingAverages(layer, x, decay):
  x = x.reshape(-1, x.shape[-1]).astype(np.float64)
  mean, var = x.mean(axis=0), x.var(axis=0)
  return (decay * layer.moving_mean.numpy() + (1 - decay) * mean,
          decay * layer.moving_variance.numpy() + (1 - decay) * var)


@pytest.mark.parametrize('shape', [(8, 3), (4, 2, 3, 3)])
def test_updates_summed_over_halves_follow_whole_batch(shape):
  layer = _BatchNorm(decay=0.9)
  x = _Rand(*shape, loc=5.0)
  want_mean, want_var = _NumpyMovingAverages(layer, x, 0.9)
  halves = np.split(x, 2)
  outputs, updates = zip(*(layer.FPropWithUpdates(layer.theta, tf.constant(h))
                           for h in halves))
  axes = tuple(range(len(shape) - 1))
  for h, y in zip(halves, outputs):  # Each half uses its own statistics.
    want = _NumpyNormalize(h, axes, layer.gamma.numpy(), layer.beta.numpy(),
                           1e-3)
    np.testing.assert_allclose(y, want, rtol=RTOL, atol=ATOL)
  summed = tf.nest.map_structure(lambda a, b: a + b, *updates)
  assert float(summed.count) == x.size // 3
  layer.ApplyUpdates(summed)
  np.testing.assert_allclose(layer.moving_mean, want_mean, rtol=RTOL)
  np.testing.assert_allclose(layer.moving_variance, want_var, rtol=RTOL)


def test_updates_in_function_match_eager_numpy():
  layer = _BatchNorm(decay=0.5)
  x = _Rand(6, 3, loc=-2.0)
  want_mean, want_var = _NumpyMovingAverages(layer, x, 0.5)

  @tf.function
  def Step(x):
    _, updates = layer.FPropWithUpdates(layer.theta, x)
    return layer.ApplyUpdates(updates)

  Step(tf.constant(x))
  np.testing.assert_allclose(layer.moving_mean, want_mean, rtol=RTOL)
  np.testing.assert_allclose(layer.moving_variance, want_var, rtol=RTOL)


def test_updates_have_no_gradient_path():
  layer = _BatchNorm()
  x = tf.constant(_Rand(4, 3))
  with tf.GradientTape() as tape:
    tape.watch(x)
    _, updates = layer.FPropWithUpdates(layer.theta, x)
    total = tf.reduce_sum(updates.sum) + tf.reduce_sum(updates.sum_sq)
  assert tape.gradient(total, x) is None


def test_eval_mode_returns_no_updates():
  layer = _BatchNorm()
  before = layer.moving_mean.numpy()
  x = tf.constant(_Rand(4, 3))
  with eval_mode.EvalMode():
    y, updates = layer.FPropWithUpdates(layer.theta, x)
    np.testing.assert_allclose(y, layer(x), rtol=RTOL)
  assert updates == NestedMap()
  assert layer.ApplyUpdates(updates) == []
  np.testing.assert_array_equal(layer.moving_mean.numpy(), before)


def test_sequential_forwards_batch_norm_updates():
  bn = normalization.BatchNormLayer.Params().Set(dim=3, decay=0.9)
  seq = containers.SequentialLayer.Params().Set(
      name='seq', sub=[bn.Copy().Set(name='bn1'),
                       bn.Copy().Set(name='bn2')]).Instantiate()
  assert seq.HasUpdates() and normalization.BatchNormLayer.HAS_OWN_UPDATES
  x = _Rand(6, 3, loc=4.0)
  want_mean, want_var = _NumpyMovingAverages(seq.sub[0], x, 0.9)
  _, updates = seq.FPropWithUpdates(seq.theta, tf.constant(x))
  assert len(seq.ApplyUpdates(updates)) == 4
  np.testing.assert_allclose(seq.sub[0].moving_mean, want_mean, rtol=RTOL)
  np.testing.assert_allclose(seq.sub[0].moving_variance, want_var, rtol=RTOL)


def test_batch_norm_meta():
  p = normalization.BatchNormLayer.Params().Set(name='bn', dim=3)
  meta = p.cls.FPropMeta(p, [2, 4, 5, 3])
  out = _BatchNorm()(tf.zeros([2, 4, 5, 3]))
  assert meta.out_shapes == (out.shape,)
  n = 2 * 4 * 5 * 3
  assert meta.flops == 7 * n
  assert meta.param_bytes == 4 * 3 * 4
  assert meta.act_bytes == (2 * n + 2 * 3) * 4


_LN, _BN = normalization.LayerNorm, normalization.BatchNormLayer


@pytest.mark.parametrize('cls, kwargs, match', [
    (_LN, dict(input_dim=0), r'p.input_dim must be positive .* got 0'),
    (_LN, dict(input_dim=3, epsilon=0.0), 'epsilon must be positive'),
    (_BN, dict(dim=0), r'p.dim must be positive .* got 0'),
    (_BN, dict(dim=3, epsilon=-1.0), 'epsilon must be positive'),
    (_BN, dict(dim=3, decay=1.0), r'decay must be in \[0, 1\), got 1.0'),
])
def test_rejects_bad_params(cls, kwargs, match):
  p = cls.Params().Set(name='norm', **kwargs)
  with pytest.raises(ValueError, match=match):
    p.Instantiate()
  with pytest.raises(ValueError, match=match):
    p.cls.FPropMeta(p, [2, 3])


@pytest.mark.parametrize('shape, match', [
    ([2, 4, 3], r'rank 2 or 4 .*got shape \(2, 4, 3\)'),
    ([2, 4], r'do not end in p.dim = 3'),
])
def test_batch_norm_rejects_bad_inputs(shape, match):
  layer = _BatchNorm(dim=3)
  with pytest.raises(ValueError, match=match):
    layer(tf.zeros(shape))
  with pytest.raises(ValueError, match=match):
    layer.FPropMeta(layer.params, shape)
