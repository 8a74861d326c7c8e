"""Tests of activations: each Activation against NumPy, ActivationLayer, meta."""

import math

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core.layers import activations
from lingvo_pipe.core.nested_map import NestedMap

Activation = activations.Activation

_ERF = np.vectorize(math.erf)


def _Sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _Phi(x):
  return 0.5 * (1.0 + _ERF(x / math.sqrt(2.0)))


# (value, derivative) of every activation, in NumPy.
_REFERENCES = {
    Activation.NONE: (lambda x: x, np.ones_like),
    Activation.RELU: (lambda x: np.maximum(x, 0.0),
                      lambda x: (x > 0).astype(x.dtype)),
    Activation.RELU6: (lambda x: np.minimum(np.maximum(x, 0.0), 6.0),
                       lambda x: ((x > 0) & (x < 6)).astype(x.dtype)),
    Activation.GELU: (lambda x: x * _Phi(x),
                      lambda x: _Phi(x) + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)),
    Activation.TANH: (np.tanh, lambda x: 1.0 - np.tanh(x)**2),
    Activation.SIGMOID: (_Sigmoid, lambda x: _Sigmoid(x) * (1.0 - _Sigmoid(x))),
    Activation.SWISH: (lambda x: x * _Sigmoid(x),
                       lambda x: _Sigmoid(x) * (1.0 + x * (1.0 - _Sigmoid(x)))),
}

# Hand-written planning costs per element (see activations.FLOPS_PER_ELEMENT).
_FLOPS = {Activation.NONE: 0, Activation.RELU: 1, Activation.RELU6: 2,
          Activation.GELU: 5, Activation.TANH: 5, Activation.SIGMOID: 4,
          Activation.SWISH: 5}


def _Inputs(shape=(2, 3, 5)):
  # Spread over [-8, 8] so RELU6 saturates; away from the kinks at 0 and 6.
  x = np.random.default_rng(0).uniform(-8.0, 8.0, shape).astype(np.float32)
  return np.where(np.abs(x) < 0.1, 0.5, np.where(np.abs(x - 6) < 0.1, 5.5, x))


def _Layer(activation):
  return activations.ActivationLayer.Params().Set(
      name='act', activation=activation).Instantiate()


def test_every_member_has_a_reference_and_a_cost():
  assert set(_REFERENCES) == set(Activation)
  assert set(activations.FLOPS_PER_ELEMENT) == set(Activation)


@pytest.mark.parametrize('activation', list(Activation))
def test_layer_matches_numpy(activation):
  x = _Inputs()
  out = _Layer(activation).FProp(NestedMap(), tf.constant(x))
  np.testing.assert_allclose(out.numpy(), _REFERENCES[activation][0](x),
                             rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('activation', list(Activation))
def test_gradient_matches_numpy_derivative(activation):
  x = tf.constant(_Inputs())
  upstream = np.random.default_rng(1).normal(size=x.shape).astype(np.float32)
  layer = _Layer(activation)
  with tf.GradientTape() as tape:
    tape.watch(x)
    loss = tf.reduce_sum(layer(x) * upstream)
  expected = upstream * _REFERENCES[activation][1](x.numpy())
  np.testing.assert_allclose(tape.gradient(loss, x).numpy(), expected,
                             rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('activation', [Activation.GELU, Activation.RELU6])
def test_tf_function_equals_eager(activation):
  layer = _Layer(activation)
  x = tf.constant(_Inputs())
  traced = tf.function(lambda t: layer.FProp(layer.theta, t))(x)
  np.testing.assert_array_equal(traced.numpy(), layer(x).numpy())


@pytest.mark.parametrize('activation', list(Activation))
def test_meta(activation):
  p = activations.ActivationLayer.Params().Set(name='act', activation=activation)
  meta = p.cls.FPropMeta(p, tf.TensorShape([2, 3, 5]))
  assert meta.out_shapes == (_Layer(activation)(tf.constant(_Inputs())).shape,)
  assert meta.flops == 30 * _FLOPS[activation]
  assert meta.param_bytes == 0
  # NONE returns its input: it produces no tensor.
  assert meta.act_bytes == (0 if activation == Activation.NONE else 30 * 4)


def test_meta_uses_fprop_dtype():
  p = activations.ActivationLayer.Params().Set(
      name='act', activation=Activation.TANH, fprop_dtype=tf.bfloat16)
  assert p.cls.FPropMeta(p, [4, 8]).act_bytes == 32 * 2


def test_params_text_round_trip():
  p = activations.ActivationLayer.Params().Set(name='act',
                                               activation=Activation.SWISH)
  q = activations.ActivationLayer.Params().FromText(p.ToText())
  assert q == p and q.activation is Activation.SWISH


def test_layer_rejects_non_member():
  p = activations.ActivationLayer.Params().Set(name='act', activation=None)
  with pytest.raises(TypeError, match=r"ActivationLayer 'act'.*Activation member"):
    p.Instantiate()
  with pytest.raises(TypeError, match=r"ActivationLayer 'act'.*got None"):
    p.cls.FPropMeta(p, [2, 3])


def test_apply_and_meta_reject_strings():
  with pytest.raises(TypeError, match=r"Activation member.*got 'relu' of type str"):
    activations.ApplyActivation('relu', tf.zeros([2]))
  with pytest.raises(TypeError, match=r"ActivationMeta.*got 'relu'"):
    activations.ActivationMeta('relu', [2], tf.float32)


def test_params_reject_strings():
  with pytest.raises(TypeError, match=r"'activation'.*Activation"):
    activations.ActivationLayer.Params().Set(activation='relu')
