"""Tests of PoolingLayer and GlobalPoolingLayer against NumPy loops."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core.layers import conv
from lingvo_pipe.core.layers import pooling

Padding = conv.Padding
PoolingType = pooling.PoolingType

# (input shape, window, stride, padding). The first pads unevenly (SAME adds
# the extra row and column after), the second drops a VALID remainder, the
# third has overlapping windows.
_CONFIGS = [
    ((2, 6, 5, 3), (3, 2), (2, 1), Padding.SAME),
    ((1, 5, 5, 2), (2, 2), (2, 2), Padding.VALID),
    ((1, 4, 4, 2), (3, 3), (1, 1), Padding.SAME),
]


def _Inputs(shape, seed=0):
  return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


def _Start(size, window, stride, padding):
  """(output size, offset of the first window) as TensorFlow pads."""
  if padding == Padding.VALID:
    return (size - window) // stride + 1, 0
  out = -(-size // stride)
  return out, -(max((out - 1) * stride + window - size, 0) // 2)


def _NumpyPool(x, pooling_type, window, stride, padding, upstream_seed=1):
  """Returns (pooled x, d sum(pooled * upstream) / dx), by loops.

  Windows are clipped to the input: padding never wins a max and never
  counts in an average.
  """
  (out_h, top), (out_w, left) = (
      _Start(x.shape[1], window[0], stride[0], padding),
      _Start(x.shape[2], window[1], stride[1], padding))
  out = np.zeros((x.shape[0], out_h, out_w, x.shape[3]), np.float32)
  upstream = _Inputs(out.shape, upstream_seed)
  grad = np.zeros_like(x)
  for i in range(out_h):
    for j in range(out_w):
      r0, c0 = top + i * stride[0], left + j * stride[1]
      rows = slice(max(r0, 0), min(r0 + window[0], x.shape[1]))
      cols = slice(max(c0, 0), min(c0 + window[1], x.shape[2]))
      win = x[:, rows, cols, :]
      g = upstream[:, i, j][:, None, None, :]
      if pooling_type == PoolingType.MAX:
        out[:, i, j] = win.max(axis=(1, 2))
        grad[:, rows, cols] += g * (win == out[:, i, j][:, None, None, :])
      else:
        out[:, i, j] = win.mean(axis=(1, 2))
        grad[:, rows, cols] += g / (win.shape[1] * win.shape[2])
  return out, grad


def _Pool(pooling_type, window, stride, padding):
  return pooling.PoolingLayer.Params().Set(
      name='pool', pooling_type=pooling_type, window_shape=window,
      window_stride=stride, padding=padding).Instantiate()


def _LayerOutputAndGradient(layer, x, upstream_seed=1):
  x = tf.constant(x)
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = layer.FProp(layer.theta, x)
    loss = tf.reduce_sum(y * _Inputs(y.shape, upstream_seed))
  return y.numpy(), tape.gradient(loss, x).numpy()


@pytest.mark.parametrize('pooling_type', list(PoolingType))
@pytest.mark.parametrize('x_shape,window,stride,padding', _CONFIGS)
def test_pooling_matches_numpy(pooling_type, x_shape, window, stride, padding):
  layer = _Pool(pooling_type, window, stride, padding)
  x = _Inputs(x_shape)
  out, grad = _LayerOutputAndGradient(layer, x)
  want_out, want_grad = _NumpyPool(x, pooling_type, window, stride, padding)
  np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('pooling_type', list(PoolingType))
def test_global_pooling_matches_numpy(pooling_type):
  layer = pooling.GlobalPoolingLayer.Params().Set(
      name='pool', pooling_type=pooling_type).Instantiate()
  x = _Inputs((2, 4, 5, 3))
  out, grad = _LayerOutputAndGradient(layer, x)
  # A window as large as the input is a global pool.
  want_out, want_grad = _NumpyPool(x, pooling_type, (4, 5), (1, 1), Padding.VALID)
  np.testing.assert_allclose(out, want_out[:, 0, 0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('pooling_type', list(PoolingType))
def test_tf_function_equals_eager(pooling_type):
  x = tf.constant(_Inputs(_CONFIGS[0][0]))
  for layer in (_Pool(pooling_type, *_CONFIGS[0][1:]),
                pooling.GlobalPoolingLayer.Params().Set(
                    name='pool', pooling_type=pooling_type).Instantiate()):
    traced = tf.function(lambda t, l=layer: l.FProp(l.theta, t))
    np.testing.assert_allclose(traced(x).numpy(), layer(x).numpy(), rtol=1e-6)


@pytest.mark.parametrize('x_shape,window,stride,padding', _CONFIGS)
def test_meta_shapes(x_shape, window, stride, padding):
  layer = _Pool(PoolingType.AVG, window, stride, padding)
  meta = layer.FPropMeta(layer.params, tf.TensorShape(x_shape))
  assert meta.out_shapes == (layer(tf.zeros(x_shape)).shape,)


def test_meta_costs():
  p = _Pool(PoolingType.MAX, (3, 2), (2, 1), Padding.SAME).params
  meta = p.cls.FPropMeta(p, [2, 6, 5, 3])
  assert meta.out_shapes == (tf.TensorShape([2, 3, 5, 3]),)
  assert meta.flops == 90 * 6  # 6 window elements per output element
  assert (meta.param_bytes, meta.act_bytes) == (0, 90 * 4)


def test_global_meta():
  p = pooling.GlobalPoolingLayer.Params().Set(name='pool')
  meta = p.cls.FPropMeta(p, [2, 4, 5, 3])
  assert meta.out_shapes == (p.Instantiate()(tf.zeros([2, 4, 5, 3])).shape,)
  assert (meta.flops, meta.param_bytes, meta.act_bytes) == (120, 0, 6 * 4)


@pytest.mark.parametrize('key,value,error,match', [
    ('pooling_type', None, TypeError, 'pooling_type must be a PoolingType member'),
    ('window_shape', (0, 2), ValueError,
     r'window_shape must be 2 positive ints, got \(0, 2\)'),
    ('window_stride', (2,), ValueError,
     r'window_stride must be 2 positive ints, got \(2,\)'),
    ('padding', None, TypeError, 'padding must be a Padding member'),
])
def test_rejects_bad_params(key, value, error, match):
  p = pooling.PoolingLayer.Params().Set(name='pool', **{key: value})
  with pytest.raises(error, match=f"PoolingLayer 'pool': {match}"):
    p.Instantiate()
  with pytest.raises(error, match=f"PoolingLayer 'pool': {match}"):
    p.cls.FPropMeta(p, [1, 4, 4, 2])


def test_rejects_bad_inputs():
  layer = _Pool(PoolingType.MAX, (3, 3), (1, 1), Padding.VALID)
  for check in (lambda s: layer(tf.zeros(s)),
                lambda s: layer.FPropMeta(layer.params, s)):
    with pytest.raises(ValueError, match=r"PoolingLayer 'pool' needs NHWC inputs "
                       r'of rank 4, got shape \(4, 4\)'):
      check([4, 4])
    with pytest.raises(ValueError, match=r"'pool': window 3 is larger than the "
                       'input size 2 with VALID padding'):
      check([1, 4, 2, 1])


def test_global_rejects_bad_params_and_inputs():
  p = pooling.GlobalPoolingLayer.Params().Set(name='pool', pooling_type=None)
  with pytest.raises(TypeError, match="GlobalPoolingLayer 'pool': pooling_type"):
    p.Instantiate()
  with pytest.raises(TypeError, match="GlobalPoolingLayer 'pool': pooling_type"):
    p.cls.FPropMeta(p, [1, 4, 4, 2])
  layer = p.Set(pooling_type=PoolingType.MAX).Instantiate()
  match = r"GlobalPoolingLayer 'pool' needs NHWC inputs of rank 4, got shape \(2, 3\)"
  with pytest.raises(ValueError, match=match):
    layer(tf.zeros([2, 3]))
  with pytest.raises(ValueError, match=match):
    layer.FPropMeta(layer.params, [2, 3])
