"""Tests the weight initializers: limits, statistics, fans and seeding."""

import math

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core import weights

SEED = weights.PathSeed('model/layer/w', 7)


def _Value(init, shape, dtype=tf.float32, seed=SEED):
  return weights.InitialValue(init, shape, dtype, seed).numpy()


@pytest.mark.parametrize('shape,fan_in,fan_out', [
    ([60, 40], 60, 40),
    ([3, 3, 8, 16], 72, 144),   # conv: receptive field 3x3
    ([5, 20, 30], 100, 150),
    ([200], 200, 200),
])
@pytest.mark.parametrize('scale', [1.0, 0.5])
def test_xavier_limit(shape, fan_in, fan_out, scale):
  limit = scale * math.sqrt(6.0 / (fan_in + fan_out))
  v = _Value(weights.WeightInit.Xavier(scale), shape)
  assert v.shape == tuple(shape)
  assert np.abs(v).max() <= limit
  # Uniform on [-limit, limit]: the extremes are reached, variance limit^2/3.
  assert np.abs(v).max() > 0.97 * limit
  assert abs(v.mean()) < 0.05 * limit
  np.testing.assert_allclose(v.var(), limit**2 / 3, rtol=0.1)


def test_uniform_limit_and_variance():
  v = _Value(weights.WeightInit.Uniform(0.3), [100, 100])
  assert np.abs(v).max() <= 0.3 and np.abs(v).max() > 0.29
  np.testing.assert_allclose(v.var(), 0.3**2 / 3, rtol=0.05)


def test_gaussian_statistics():
  v = _Value(weights.WeightInit.Gaussian(0.02), [100, 100])
  assert abs(v.mean()) < 0.001
  np.testing.assert_allclose(v.std(), 0.02, rtol=0.05)


@pytest.mark.parametrize('shape,fan_in', [([400, 30], 400), ([2, 2, 25, 30], 100)])
def test_gaussian_sqrt_fan_in_statistics(shape, fan_in):
  v = _Value(weights.WeightInit.GaussianSqrtFanIn(2.0), shape)
  np.testing.assert_allclose(v.std(), 2.0 / math.sqrt(fan_in), rtol=0.05)


@pytest.mark.parametrize('dtype', [tf.float32, tf.float64, tf.bfloat16])
def test_constant(dtype):
  v = weights.InitialValue(weights.WeightInit.Constant(0.25), [3, 4], dtype, SEED)
  assert v.dtype == dtype
  assert (v.numpy().astype(np.float64) == 0.25).all()
  scalar = weights.InitialValue(weights.WeightInit.Constant(-1.0), [], dtype, SEED)
  assert scalar.shape == [] and float(scalar) == -1.0


@pytest.mark.parametrize('init', [
    weights.WeightInit.Xavier(), weights.WeightInit.Uniform(),
    weights.WeightInit.Gaussian(), weights.WeightInit.GaussianSqrtFanIn()])
@pytest.mark.parametrize('dtype', [tf.float64, tf.bfloat16])
def test_random_inits_honour_dtype(init, dtype):
  v = weights.InitialValue(init, [4, 5], dtype, SEED)
  assert v.dtype == dtype and v.shape == [4, 5]


@pytest.mark.parametrize('init', [
    weights.WeightInit.Xavier(), weights.WeightInit.Uniform(),
    weights.WeightInit.Gaussian(), weights.WeightInit.GaussianSqrtFanIn()])
def test_deterministic_by_seed(init):
  a = _Value(init, [8, 8])
  np.testing.assert_array_equal(a, _Value(init, [8, 8]))
  np.testing.assert_array_equal(
      a, _Value(init, [8, 8], seed=weights.PathSeed('model/layer/w', 7)))
  for other in (weights.PathSeed('model/layer/b', 7),
                weights.PathSeed('model/layer/w', 8),
                weights.PathSeed('model/layer/w', None)):
    assert not np.array_equal(a, _Value(init, [8, 8], seed=other))


def test_path_seed():
  seed = weights.PathSeed('a/b', None)
  assert seed.dtype == tf.int64 and seed.shape == [2]
  assert seed.numpy().tolist() == weights.PathSeed('a/b', 0).numpy().tolist()
  assert seed.numpy()[1] == 0
  assert weights.PathSeed('a/b', 5).numpy()[1] == 5
  assert weights.PathSeed('a/c', None).numpy()[0] != seed.numpy()[0]


def test_initial_value_is_pure_inside_tf_function():
  init = weights.WeightInit.Gaussian()

  @tf.function
  def Draw():
    return weights.InitialValue(init, [3, 3], tf.float32, SEED)

  np.testing.assert_array_equal(Draw().numpy(), Draw().numpy())
  np.testing.assert_array_equal(Draw().numpy(), _Value(init, [3, 3]))


def test_unknown_method_raises():
  init = weights.WeightInit.Xavier()
  init.Delete('method').Define('method', 'xavier', '')
  with pytest.raises(ValueError, match=r"Unknown init method 'xavier'; use an "
                     r'InitMethod'):
    weights.InitialValue(init, [2, 2], tf.float32, SEED)


def test_weight_params_defaults_and_fields():
  p = weights.WeightParams((2, 3))
  assert p.shape == [2, 3]
  assert p.init is None and p.dtype is None and p.collections == []
  q = weights.WeightParams([4], init=weights.WeightInit.Constant(1.0),
                           dtype=tf.float64, collections=('non_trainable',))
  assert q.init.method is weights.InitMethod.CONSTANT and q.init.scale == 1.0
  assert q.dtype == tf.float64 and q.collections == ['non_trainable']


def test_weight_init_factories():
  for factory, method in [
      (weights.WeightInit.Gaussian, weights.InitMethod.GAUSSIAN),
      (weights.WeightInit.Uniform, weights.InitMethod.UNIFORM),
      (weights.WeightInit.Xavier, weights.InitMethod.XAVIER),
      (weights.WeightInit.GaussianSqrtFanIn,
       weights.InitMethod.GAUSSIAN_SQRT_FAN_IN),
      (weights.WeightInit.Constant, weights.InitMethod.CONSTANT)]:
    p = factory(3)
    assert p.method is method
    assert p.scale == 3.0 and isinstance(p.scale, float)
