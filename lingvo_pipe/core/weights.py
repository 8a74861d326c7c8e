"""Weight initializers and `WeightParams`, the description of one variable."""

import enum
import math
import zlib
from typing import Any, Optional, Sequence

import tensorflow as tf

from lingvo_pipe.core import hyperparams


class InitMethod(enum.Enum):
  """How a weight's initial value is drawn."""
  GAUSSIAN = 'gaussian'            # N(0, scale^2)
  UNIFORM = 'uniform'              # U(-scale, scale)
  XAVIER = 'xavier'                # U(-a, a), a = scale * sqrt(6 / (fan_in + fan_out))
  GAUSSIAN_SQRT_FAN_IN = 'gaussian_sqrt_fan_in'  # N(0, (scale / sqrt(fan_in))^2)
  CONSTANT = 'constant'            # scale everywhere


def _Init(method: InitMethod, scale: float) -> hyperparams.Params:
  p = hyperparams.Params()
  p.Define('method', method, 'An InitMethod.')
  p.Define('scale', float(scale), 'Scale of the initializer (see InitMethod).')
  return p


class WeightInit:
  """Factories for initializer params, as in Lingvo (`WeightInit.Xavier(1.0)`)."""

  @staticmethod
  def Gaussian(scale: float = 1.0) -> hyperparams.Params:
    return _Init(InitMethod.GAUSSIAN, scale)

  @staticmethod
  def Uniform(scale: float = 1.0) -> hyperparams.Params:
    return _Init(InitMethod.UNIFORM, scale)

  @staticmethod
  def Xavier(scale: float = 1.0) -> hyperparams.Params:
    return _Init(InitMethod.XAVIER, scale)

  @staticmethod
  def GaussianSqrtFanIn(scale: float = 1.0) -> hyperparams.Params:
    return _Init(InitMethod.GAUSSIAN_SQRT_FAN_IN, scale)

  @staticmethod
  def Constant(value: float = 0.0) -> hyperparams.Params:
    return _Init(InitMethod.CONSTANT, value)


def WeightParams(shape: Sequence[int],
                 init: Optional[hyperparams.Params] = None,
                 dtype: Optional[tf.DType] = None,
                 collections: Optional[Sequence[str]] = None) -> hyperparams.Params:
  """Describes a variable: shape, initializer (None: the layer's params_init),
  dtype (None: the layer's dtype) and collection names (e.g. 'non_trainable')."""
  p = hyperparams.Params()
  p.Define('shape', list(shape), 'Shape of the variable.')
  p.Define('init', init, 'Initializer params from WeightInit; None: layer default.')
  p.Define('dtype', dtype, 'Variable dtype; None: the layer dtype.')
  p.Define('collections', list(collections or []), 'Collection names.')
  return p


def _Fans(shape: Sequence[int]):
  """Fan-in and fan-out: the last dim is the output, the rest feed one unit."""
  if not shape:
    return 1, 1
  if len(shape) == 1:
    return shape[0], shape[0]
  receptive = math.prod(shape[:-2]) if len(shape) > 2 else 1
  return shape[-2] * receptive, shape[-1] * receptive


def PathSeed(path: str, random_seed: Optional[int]) -> tf.Tensor:
  """A stateless-RNG seed (shape [2], int64) from a variable path and a seed."""
  return tf.constant([zlib.crc32(path.encode('utf-8')), random_seed or 0],
                     dtype=tf.int64)


def InitialValue(init: hyperparams.Params, shape: Sequence[int],
                 dtype: tf.DType, seed: tf.Tensor) -> Any:
  """Returns the initial value of a variable, a pure function of `seed`."""
  shape = list(shape)
  method, scale = init.method, init.scale
  if method == InitMethod.CONSTANT:
    return tf.fill(shape, tf.constant(scale, dtype))
  fan_in, fan_out = _Fans(shape)
  if method == InitMethod.GAUSSIAN:
    return tf.random.stateless_normal(shape, seed, stddev=scale, dtype=dtype)
  if method == InitMethod.GAUSSIAN_SQRT_FAN_IN:
    return tf.random.stateless_normal(
        shape, seed, stddev=scale / math.sqrt(fan_in), dtype=dtype)
  if method == InitMethod.UNIFORM:
    limit = scale
  elif method == InitMethod.XAVIER:
    limit = scale * math.sqrt(6.0 / (fan_in + fan_out))
  else:
    raise ValueError(f'Unknown init method {method!r}; use an InitMethod.')
  return tf.random.stateless_uniform(shape, seed, -limit, limit, dtype=dtype)
