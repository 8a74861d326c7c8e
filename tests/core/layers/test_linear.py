"""Tests of ProjectionLayer and FeedForwardLayer against NumPy and plain TF."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core import layer_meta
from lingvo_pipe.core.layers import activations
from lingvo_pipe.core.layers import linear

from tests.core.layers import layer_checks

Activation = activations.Activation

_NUMPY_ACTIVATIONS = {
    Activation.NONE: lambda x: x,
    Activation.RELU: lambda x: np.maximum(x, 0.0),
    Activation.TANH: np.tanh,
}


def _Projection(input_dim=4, output_dim=3, **kwargs):
  layer = linear.ProjectionLayer.Params().Set(
      name='proj', input_dim=input_dim, output_dim=output_dim,
      **kwargs).Instantiate()
  _RandomizeBiases(layer)
  return layer


def _FeedForward(**kwargs):
  p = linear.FeedForwardLayer.Params().Set(name='ffn', input_dim=4, hidden_dim=6)
  layer = p.Set(**kwargs).Instantiate()
  _RandomizeBiases(layer)
  return layer


def _RandomizeBiases(layer):
  """Biases start at zero; make them nonzero so the forward checks see them."""
  rng = np.random.default_rng(7)
  for path, var in layer.vars.FlattenItems():
    if path.endswith('b'):
      var.assign(rng.normal(size=var.shape).astype(np.float32))


def _Inputs(shape):
  return np.random.default_rng(0).normal(size=shape).astype(np.float32)


def _Constants(layer):
  """The layer's variables as plain tensors (for the references)."""
  return layer.vars.Transform(lambda v: tf.constant(v.numpy()))


def _AssertAllClose(actual, expected):
  assert len(actual) == len(expected)
  for a, e in zip(actual, expected):
    np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=1e-5, atol=1e-6)


def _TfProjection(x, w, b, activation_fn):
  """Plain-TF reference: flatten to 2-D, matmul, add, restore the shape."""
  flat = tf.matmul(tf.reshape(x, [-1, w.shape[0]]), w)
  if b is not None:
    flat = flat + b
  out_shape = tf.concat([tf.shape(x)[:-1], [w.shape[1]]], 0)
  return activation_fn(tf.reshape(flat, out_shape))


# --- ProjectionLayer ----------------------------------------------------------


@pytest.mark.parametrize('shape', [(5, 4), (2, 3, 4), (2, 1, 3, 4)])
@pytest.mark.parametrize('activation', list(_NUMPY_ACTIVATIONS))
@pytest.mark.parametrize('has_bias', [True, False])
def test_projection_matches_numpy(shape, activation, has_bias):
  layer = _Projection(activation=activation, has_bias=has_bias)
  x = _Inputs(shape)
  w = layer.vars.w.numpy()
  expected = np.einsum('...i,io->...o', x, w)
  if has_bias:
    expected = expected + layer.vars.b.numpy()
  expected = _NUMPY_ACTIVATIONS[activation](expected)
  np.testing.assert_allclose(layer(tf.constant(x)).numpy(), expected,
                             rtol=1e-5, atol=1e-6)


def test_projection_variables():
  layer = linear.ProjectionLayer.Params().Set(
      name='proj', input_dim=4, output_dim=3).Instantiate()
  assert layer.vars.w.shape == (4, 3) and layer.vars.b.shape == (3,)
  np.testing.assert_array_equal(layer.vars.b.numpy(), np.zeros(3))
  assert np.any(layer.vars.w.numpy() != 0)
  no_bias = linear.ProjectionLayer.Params().Set(
      name='proj', input_dim=4, output_dim=3, has_bias=False).Instantiate()
  assert sorted(no_bias.vars) == ['w']


@pytest.mark.parametrize('has_bias', [True, False])
def test_projection_gradients(has_bias):
  layer = _Projection(activation=Activation.TANH, has_bias=has_bias)
  x = tf.constant(_Inputs((2, 3, 4)))
  got = layer_checks.Gradients(lambda t: layer.FProp(layer.theta, t), x,
                   list(layer.vars.Flatten()))
  ref = _Constants(layer)
  want = layer_checks.Gradients(
      lambda t: _TfProjection(t, ref.w, ref.get('b'), tf.tanh), x,
      list(ref.Flatten()))
  _AssertAllClose(got, want)


def test_projection_tf_function_equals_eager():
  layer = _Projection(activation=Activation.RELU)
  x = tf.constant(_Inputs((2, 3, 4)))
  traced = tf.function(lambda t: layer.FProp(layer.theta, t))
  np.testing.assert_allclose(traced(x).numpy(), layer(x).numpy(), rtol=1e-6)
  dynamic = traced.get_concrete_function(tf.TensorSpec([None, None, 4]))
  np.testing.assert_allclose(dynamic(x).numpy(), layer(x).numpy(), rtol=1e-6)


@pytest.mark.parametrize('shape', [(5, 4), (2, 3, 4)])
def test_project_last_dim_builds_no_shape_ops_for_static_shapes(shape):
  """Fewer ops per traced cell: each is instantiated again at every call."""
  w = tf.ones([4, 3])
  graph = tf.function(lambda t: linear.ProjectLastDim(t, w)).get_concrete_function(
      tf.TensorSpec(shape)).graph
  op_types = {op.type for op in graph.get_operations()}
  assert not op_types & {'Shape', 'StridedSlice', 'Pack', 'ConcatV2'}, op_types


@pytest.mark.parametrize('shape', [(5, 4), (2, 3, 4)])
def test_projection_meta_shapes(shape):
  layer = _Projection()
  meta = layer.FPropMeta(layer.params, tf.TensorShape(shape))
  assert meta.out_shapes == (layer(tf.constant(_Inputs(shape))).shape,)


def test_projection_meta_costs():
  p = linear.ProjectionLayer.Params().Set(
      name='proj', input_dim=4, output_dim=5, activation=Activation.RELU)
  meta = p.cls.FPropMeta(p, [2, 3, 4])
  # 6 rows: matmul 2*6*4*5 = 240, bias 30, relu 30.
  assert meta.flops == 300
  assert meta.param_bytes == (4 * 5 + 5) * 4
  # matmul, bias-add and relu outputs: 3 tensors of 30 floats.
  assert meta.act_bytes == 3 * 30 * 4
  plain = p.Copy().Set(has_bias=False, activation=Activation.NONE)
  meta = p.cls.FPropMeta(plain, [2, 3, 4])
  assert (meta.flops, meta.param_bytes, meta.act_bytes) == (240, 80, 120)
  # One deferrable product: 6 rows by the 4 x 5 fp32 weight.
  assert meta.projections == (layer_meta.Projection(6, 4, 5, 4),)


def test_projection_meta_dtypes():
  p = linear.ProjectionLayer.Params().Set(
      name='proj', input_dim=4, output_dim=5, has_bias=False,
      dtype=tf.float64, fprop_dtype=tf.bfloat16)
  meta = p.cls.FPropMeta(p, [3, 4])
  assert (meta.param_bytes, meta.act_bytes) == (20 * 8, 15 * 2)
  assert meta.projections == ()  # by a bfloat16 cast of the weight: nothing defers


def _ProjectionDims(input_dim, output_dim):
  return linear.ProjectionLayer.Params().Set(
      name='proj', input_dim=input_dim, output_dim=output_dim)


def _FeedForwardDims(input_dim, hidden_dim, output_dim):
  return linear.FeedForwardLayer.Params().Set(
      name='ffn', input_dim=input_dim, hidden_dim=hidden_dim,
      output_dim=output_dim)


@pytest.mark.parametrize('params,match', [
    (_ProjectionDims(0, 3), r"ProjectionLayer 'proj'.*input_dim=0, output_dim=3"),
    (_ProjectionDims(4, 0), r"ProjectionLayer 'proj'.*input_dim=4, output_dim=0"),
    (_ProjectionDims(-1, 3), r"ProjectionLayer 'proj'.*input_dim=-1, output_dim=3"),
    (_FeedForwardDims(0, 6, 0),
     r"FeedForwardLayer 'ffn'.*got input_dim=0, hidden_dim=6, output_dim=0"),
    (_FeedForwardDims(4, 0, 0),
     r"FeedForwardLayer 'ffn'.*got input_dim=4, hidden_dim=0, output_dim=0"),
    (_FeedForwardDims(4, 6, -1),
     r"FeedForwardLayer 'ffn'.*got input_dim=4, hidden_dim=6, output_dim=-1"),
])
def test_rejects_bad_dims(params, match):
  with pytest.raises(ValueError, match=match):
    params.Instantiate()
  with pytest.raises(ValueError, match=match):
    params.cls.FPropMeta(params, [2, 4])


def test_projection_rejects_wrong_last_dim():
  layer = _Projection(input_dim=4)
  match = r"'proj'.*last dim \(5, shape \(2, 5\)\) differs from input_dim \(4\)"
  with pytest.raises(ValueError, match=match):
    layer(tf.zeros([2, 5]))
  with pytest.raises(ValueError, match=match):
    tf.function(lambda t: layer.FProp(layer.theta, t))(tf.zeros([2, 5]))
  with pytest.raises(ValueError, match=match):
    layer.FPropMeta(layer.params, [2, 5])


def test_projection_rejects_rank_1():
  layer = _Projection(input_dim=4)
  match = r"'proj' needs inputs of rank >= 2.*got shape \(4,\)"
  with pytest.raises(ValueError, match=match):
    layer(tf.zeros([4]))
  with pytest.raises(ValueError, match=match):
    layer.FPropMeta(layer.params, [4])


def test_projection_meta_needs_defined_shape():
  layer = _Projection(input_dim=4)
  with pytest.raises(ValueError, match='not fully defined'):
    layer.FPropMeta(layer.params, [None, 4])


# --- FeedForwardLayer ---------------------------------------------------------


@pytest.mark.parametrize('output_dim,expected_dim', [(0, 4), (2, 2)])
def test_feedforward_matches_numpy(output_dim, expected_dim):
  layer = _FeedForward(output_dim=output_dim)
  x = _Inputs((2, 3, 4))
  v = layer.vars
  hidden = np.maximum(x @ v.fc0.w.numpy() + v.fc0.b.numpy(), 0.0)
  expected = hidden @ v.fc1.w.numpy() + v.fc1.b.numpy()
  out = layer(tf.constant(x))
  assert out.shape == (2, 3, expected_dim)
  np.testing.assert_allclose(out.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_feedforward_children():
  layer = _FeedForward(activation=Activation.TANH)
  assert [n for n, _ in layer.Children()] == ['fc0', 'fc1']
  assert layer.fc0.params.activation == Activation.TANH
  assert layer.fc1.params.activation == Activation.NONE
  assert layer.vars.fc0.w.shape == (4, 6) and layer.vars.fc1.w.shape == (6, 4)


def test_feedforward_gradients():
  layer = _FeedForward(output_dim=3)
  x = tf.constant(_Inputs((2, 3, 4)))
  got = layer_checks.Gradients(lambda t: layer.FProp(layer.theta, t), x,
                   list(layer.vars.Flatten()))
  ref = _Constants(layer)

  def Reference(t):
    hidden = _TfProjection(t, ref.fc0.w, ref.fc0.b, tf.nn.relu)
    return _TfProjection(hidden, ref.fc1.w, ref.fc1.b, tf.identity)

  _AssertAllClose(got, layer_checks.Gradients(Reference, x, list(ref.Flatten())))


def test_feedforward_tf_function_equals_eager():
  layer = _FeedForward()
  x = tf.constant(_Inputs((5, 4)))
  traced = tf.function(lambda t: layer.FProp(layer.theta, t))(x)
  np.testing.assert_allclose(traced.numpy(), layer(x).numpy(), rtol=1e-6)


def test_feedforward_meta():
  p = linear.FeedForwardLayer.Params().Set(
      name='ffn', input_dim=4, hidden_dim=6, output_dim=3)
  meta = p.cls.FPropMeta(p, [5, 4])
  layer = p.Instantiate()
  assert meta.out_shapes == (layer(tf.zeros([5, 4])).shape,)
  # fc0: matmul 2*5*4*6 + bias 30 + relu 30; fc1: 2*5*6*3 + bias 15.
  assert meta.flops == 240 + 30 + 30 + 180 + 15
  assert meta.param_bytes == (4 * 6 + 6 + 6 * 3 + 3) * 4
  assert meta.act_bytes == (30 * 3 + 15 * 2) * 4


def test_feedforward_rejects_wrong_last_dim():
  layer = _FeedForward()
  with pytest.raises(ValueError, match=r"'ffn/fc0'.*last dim \(3, .*input_dim \(4\)"):
    layer(tf.zeros([2, 3]))
