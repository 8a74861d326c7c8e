"""Tests of Conv2DLayer, DepthwiseConv2DLayer and SeparableConv2DLayer."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core.layers import activations
from lingvo_pipe.core.layers import conv

from tests.core.layers import layer_checks

Activation = activations.Activation
Padding = conv.Padding

# (input shape, filter shape, stride, padding). The first pads unevenly (SAME
# adds its extra row and column after), the second drops a VALID remainder.
_CONFIGS = [
    ((2, 6, 5, 3), (3, 2, 3, 2), (2, 1), Padding.SAME),
    ((1, 5, 6, 2), (3, 3, 2, 3), (2, 2), Padding.VALID),
    ((2, 4, 4, 3), (1, 1, 3, 2), (1, 1), Padding.SAME),
]


def _Build(cls, filter_shape, stride, padding, **kwargs):
  layer = cls.Params().Set(
      name='conv', filter_shape=filter_shape, filter_stride=stride,
      padding=padding, **kwargs).Instantiate()
  rng = np.random.default_rng(7)
  for path, var in layer.vars.FlattenItems():
    if path.endswith('b'):  # Zero at init; nonzero so the checks see it.
      var.assign(rng.normal(size=var.shape).astype(np.float32))
  return layer


def _Inputs(shape):
  return np.random.default_rng(0).normal(size=shape).astype(np.float32)


# --- NumPy references (loops over output positions) ---------------------------


def _Pad(x, window, stride, padding):
  """Pads NHWC x as TensorFlow does: SAME puts the odd pixel after."""
  if padding == Padding.VALID:
    return x
  pads = [(0, 0)]
  for size, k, s in zip(x.shape[1:3], window, stride):
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    pads.append((total // 2, total - total // 2))
  return np.pad(x, pads + [(0, 0)])


def _NumpySlide(x, w, stride, padding, combine):
  """out[:, i, j] = combine(window of x at (i, j), w)."""
  x = _Pad(x, w.shape[:2], stride, padding)
  kh, kw = w.shape[:2]
  out_h = (x.shape[1] - kh) // stride[0] + 1
  out_w = (x.shape[2] - kw) // stride[1] + 1
  rows = []
  for i in range(out_h):
    row = []
    for j in range(out_w):
      window = x[:, i * stride[0]:i * stride[0] + kh, j * stride[1]:j * stride[1] + kw]
      row.append(combine(window, w))
    rows.append(np.stack(row, 1))
  return np.stack(rows, 1)


def _NumpyConv(x, w, stride, padding):
  return _NumpySlide(x, w, stride, padding,
                     lambda win, f: np.einsum('nabc,abco->no', win, f))


def _NumpyDepthwise(x, w, stride, padding):
  return _NumpySlide(x, w, stride, padding, lambda win, f: np.einsum(
      'nabc,abcm->ncm', win, f).reshape(win.shape[0], -1))


# --- plain-TF references (patches and einsum) for gradients -------------------


def _Patches(x, window, stride, padding):
  """[N, out_h, out_w, kh, kw, C] windows of x."""
  patches = tf.image.extract_patches(
      x, [1, window[0], window[1], 1], [1, stride[0], stride[1], 1],
      [1, 1, 1, 1], padding.value)
  return tf.reshape(patches, tf.concat(
      [tf.shape(patches)[:3], [window[0], window[1], x.shape[3]]], 0))


def _TfConv(x, w, stride, padding):
  return tf.einsum('nhwabc,abco->nhwo', _Patches(x, w.shape[:2], stride, padding), w)


def _TfDepthwise(x, w, stride, padding):
  out = tf.einsum('nhwabc,abcm->nhwcm', _Patches(x, w.shape[:2], stride, padding), w)
  return tf.reshape(out, tf.concat([tf.shape(out)[:3], [-1]], 0))


def _CheckGradients(layer, reference, x_shape):
  """Compares gradients of the layer and of reference(x, constant vars)."""
  x = tf.constant(_Inputs(x_shape))
  got = layer_checks.Gradients(lambda t: layer.FProp(layer.theta, t), x,
                   list(layer.vars.Flatten()))
  ref_vars = layer.vars.Transform(lambda v: tf.constant(v.numpy()))
  want = layer_checks.Gradients(lambda t: reference(t, ref_vars), x, list(ref_vars.Flatten()))
  assert len(got) == len(want)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-5)


# --- Conv2DLayer and DepthwiseConv2DLayer -------------------------------------


@pytest.mark.parametrize('x_shape,filter_shape,stride,padding', _CONFIGS)
def test_conv_matches_numpy(x_shape, filter_shape, stride, padding):
  layer = _Build(conv.Conv2DLayer, filter_shape, stride, padding,
                 activation=Activation.RELU)
  x = _Inputs(x_shape)
  v = layer.vars
  expected = np.maximum(
      _NumpyConv(x, v.w.numpy(), stride, padding) + v.b.numpy(), 0.0)
  np.testing.assert_allclose(layer(tf.constant(x)).numpy(), expected,
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('x_shape,filter_shape,stride,padding', _CONFIGS)
def test_depthwise_matches_numpy(x_shape, filter_shape, stride, padding):
  layer = _Build(conv.DepthwiseConv2DLayer, filter_shape, stride, padding)
  x = _Inputs(x_shape)
  v = layer.vars
  expected = _NumpyDepthwise(x, v.w.numpy(), stride, padding) + v.b.numpy()
  assert v.b.shape == (filter_shape[2] * filter_shape[3],)
  np.testing.assert_allclose(layer(tf.constant(x)).numpy(), expected,
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('has_bias', [True, False])
def test_conv_gradients(has_bias):
  x_shape, filter_shape, stride, padding = _CONFIGS[0]
  layer = _Build(conv.Conv2DLayer, filter_shape, stride, padding,
                 has_bias=has_bias, activation=Activation.TANH)
  assert sorted(layer.vars) == (['b', 'w'] if has_bias else ['w'])

  def Reference(x, v):
    out = _TfConv(x, v.w, stride, padding)
    return tf.tanh(out + v.b if has_bias else out)

  _CheckGradients(layer, Reference, x_shape)


def test_depthwise_gradients():
  x_shape, filter_shape, stride, padding = _CONFIGS[1]
  layer = _Build(conv.DepthwiseConv2DLayer, filter_shape, stride, padding,
                 activation=Activation.SIGMOID)
  _CheckGradients(
      layer, lambda x, v: tf.sigmoid(_TfDepthwise(x, v.w, stride, padding) + v.b),
      x_shape)


@pytest.mark.parametrize('cls', [conv.Conv2DLayer, conv.DepthwiseConv2DLayer,
                                 conv.SeparableConv2DLayer])
def test_tf_function_equals_eager(cls):
  x_shape, filter_shape, stride, padding = _CONFIGS[0]
  layer = _Build(cls, filter_shape, stride, padding, activation=Activation.RELU)
  x = tf.constant(_Inputs(x_shape))
  traced = tf.function(lambda t: layer.FProp(layer.theta, t))
  np.testing.assert_allclose(traced(x).numpy(), layer(x).numpy(), rtol=1e-6)


# (input size, window, stride): SAME gives ceil(in / s), VALID
# (in - k) // s + 1.
_SIZES = [(7, 2, 3), (7, 3, 2), (4, 4, 1), (5, 1, 2), (6, 3, 4)]


@pytest.mark.parametrize('size,window,stride', _SIZES)
@pytest.mark.parametrize('padding', list(Padding))
@pytest.mark.parametrize('cls', [conv.Conv2DLayer, conv.DepthwiseConv2DLayer,
                                 conv.SeparableConv2DLayer])
def test_meta_shapes_follow_tensorflow(cls, size, window, stride, padding):
  filter_shape, strides = (window, 2, 2, 3), (stride, 1)
  x_shape = (1, size, 3, 2)
  p = cls.Params().Set(name='conv', filter_shape=filter_shape,
                       filter_stride=strides, padding=padding)
  meta = cls.FPropMeta(p, tf.TensorShape(x_shape))
  out = p.Instantiate()(tf.constant(_Inputs(x_shape)))
  assert meta.out_shapes == (out.shape,)
  if padding == Padding.SAME:
    assert out.shape[1] == -(-size // stride)
  else:
    assert out.shape[1] == (size - window) // stride + 1


def test_conv_meta_costs():
  p = conv.Conv2DLayer.Params().Set(
      name='conv', filter_shape=(3, 2, 3, 4), filter_stride=(2, 1),
      activation=Activation.RELU)
  meta = p.cls.FPropMeta(p, [2, 6, 5, 3])
  assert meta.out_shapes == (tf.TensorShape([2, 3, 5, 4]),)
  # 30 positions x 72 multiply-adds, + 120 bias adds + 120 relus.
  assert meta.flops == 2 * 30 * 72 + 120 + 120
  assert meta.param_bytes == (72 + 4) * 4
  assert meta.act_bytes == 3 * 120 * 4  # conv, bias-add and relu outputs


def test_depthwise_meta_costs():
  p = conv.DepthwiseConv2DLayer.Params().Set(
      name='conv', filter_shape=(3, 2, 3, 2), filter_stride=(2, 1))
  meta = p.cls.FPropMeta(p, [2, 6, 5, 3])
  assert meta.out_shapes == (tf.TensorShape([2, 3, 5, 6]),)
  assert meta.flops == 2 * 30 * 36 + 180
  assert meta.param_bytes == (36 + 6) * 4
  assert meta.act_bytes == 2 * 180 * 4


# --- SeparableConv2DLayer ------------------------------------------------------


def _Separable(**kwargs):
  return _Build(conv.SeparableConv2DLayer, (3, 2, 3, 4), (2, 1), Padding.SAME,
                depth_multiplier=2, activation=Activation.RELU, **kwargs)


def test_separable_children():
  layer = _Separable()
  v = layer.vars
  assert [n for n, _ in layer.Children()] == ['depthwise', 'pointwise']
  assert v.depthwise.w.shape == (3, 2, 3, 2) and 'b' not in v.depthwise
  assert v.pointwise.w.shape == (1, 1, 6, 4) and v.pointwise.b.shape == (4,)


def test_separable_matches_numpy():
  layer = _Separable()
  x = _Inputs((2, 6, 5, 3))
  v = layer.vars
  hidden = _NumpyDepthwise(x, v.depthwise.w.numpy(), (2, 1), Padding.SAME)
  out = np.einsum('nhwc,co->nhwo', hidden, v.pointwise.w.numpy()[0, 0])
  expected = np.maximum(out + v.pointwise.b.numpy(), 0.0)
  np.testing.assert_allclose(layer(tf.constant(x)).numpy(), expected,
                             rtol=1e-5, atol=1e-5)


def test_separable_gradients():
  layer = _Separable()

  def Reference(x, v):
    hidden = _TfDepthwise(x, v.depthwise.w, (2, 1), Padding.SAME)
    return tf.nn.relu(_TfConv(hidden, v.pointwise.w, (1, 1), Padding.SAME) +
                      v.pointwise.b)

  _CheckGradients(layer, Reference, (2, 6, 5, 3))


def test_separable_meta_costs():
  p = _Separable().params
  meta = p.cls.FPropMeta(p, [2, 6, 5, 3])
  assert meta.out_shapes == (tf.TensorShape([2, 3, 5, 4]),)
  # depthwise: 30 positions x 36; pointwise: 30 x 24, + bias 120 + relu 120.
  assert meta.flops == 2 * 30 * 36 + 2 * 30 * 24 + 120 + 120
  assert meta.param_bytes == (36 + 24 + 4) * 4
  assert meta.act_bytes == (180 + 3 * 120) * 4


# --- validation -----------------------------------------------------------------


@pytest.mark.parametrize('cls', [conv.Conv2DLayer, conv.DepthwiseConv2DLayer,
                                 conv.SeparableConv2DLayer])
@pytest.mark.parametrize('key,value,error,match', [
    ('filter_shape', (0, 0, 0, 0), ValueError,
     r'filter_shape must be 4 positive ints, got \(0, 0, 0, 0\)'),
    ('filter_shape', (3, 3, 2), ValueError,
     r'filter_shape must be 4 positive ints, got \(3, 3, 2\)'),
    ('filter_stride', (1, 0), ValueError,
     r'filter_stride must be 2 positive ints, got \(1, 0\)'),
    ('padding', None, TypeError, 'padding must be a Padding member'),
    ('activation', None, TypeError, 'activation must be an Activation member'),
])
def test_rejects_bad_params(cls, key, value, error, match):
  p = cls.Params().Set(name='conv', filter_shape=(3, 3, 2, 2))
  p.Set(**{key: value})
  with pytest.raises(error, match=rf"{cls.__name__} 'conv': {match}"):
    p.Instantiate()
  with pytest.raises(error, match=rf"{cls.__name__} 'conv': {match}"):
    p.cls.FPropMeta(p, [1, 5, 5, 2])


def test_separable_rejects_bad_multiplier():
  p = conv.SeparableConv2DLayer.Params().Set(
      name='conv', filter_shape=(3, 3, 2, 2), depth_multiplier=0)
  with pytest.raises(ValueError, match=r"'conv': depth_multiplier must be >= 1, got 0"):
    p.Instantiate()


@pytest.mark.parametrize('cls', [conv.Conv2DLayer, conv.DepthwiseConv2DLayer])
def test_rejects_bad_inputs(cls):
  layer = _Build(cls, (3, 3, 2, 2), (1, 1), Padding.VALID)
  meta = lambda shape: layer.FPropMeta(layer.params, shape)
  for check in (lambda shape: layer(tf.zeros(shape)), meta):
    with pytest.raises(ValueError, match=r"'conv': the input has 3 channels "
                       r'\(shape \(1, 5, 5, 3\)\) but the filter expects 2'):
      check([1, 5, 5, 3])
    with pytest.raises(ValueError, match=r"'conv' needs NHWC inputs of rank 4, "
                       r'got shape \(5, 5, 2\)'):
      check([5, 5, 2])
    with pytest.raises(ValueError, match=r"'conv': window 3 is larger than the "
                       'input size 2 with VALID padding'):
      check([1, 2, 5, 2])


def test_separable_rejects_wrong_channels():
  layer = _Separable()
  with pytest.raises(ValueError, match=r"'conv/depthwise': the input has 2 channels"):
    layer(tf.zeros([1, 4, 4, 2]))


def test_params_text_round_trip():
  p = conv.Conv2DLayer.Params().Set(
      name='conv', filter_shape=(3, 3, 2, 2), padding=Padding.VALID)
  q = conv.Conv2DLayer.Params().FromText(p.ToText())
  assert q == p and q.padding is Padding.VALID
