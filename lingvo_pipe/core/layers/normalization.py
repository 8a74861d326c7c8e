"""Normalization layers: LayerNorm and BatchNormLayer (micro-batch aware)."""

from typing import Any, List, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import eval_mode
from lingvo_pipe.core import float32_islands
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.core import precision
from lingvo_pipe.core import weights

# Forward FLOPs per element of a normalization in training: the mean (1 add),
# the variance (subtract, square, add) and the normalization
# (x - mean) * (scale * rsqrt(variance + epsilon)) + bias (3). Work per row or
# per channel (rsqrt, divisions by the count) is not counted.
_FLOPS_PER_ELEMENT = 7

# Ranks of the inputs BatchNormLayer accepts: [batch, dim] and
# [batch, height, width, dim].
_BATCH_NORM_RANKS = (2, 4)


def _Normalize(x: tf.Tensor, mean: Any, variance: Any, scale: Any, bias: Any,
               epsilon: float) -> tf.Tensor:
  """(x - mean) / sqrt(variance + epsilon) * scale + bias, broadcasting."""
  return (x - mean) * (scale * tf.math.rsqrt(variance + epsilon)) + bias


def _CheckParams(params: hyperparams.Params, dim_key: str) -> None:
  """Raises ValueError unless p.<dim_key> > 0 and p.epsilon > 0."""
  name = f'{params.cls.__name__} {params.name!r}'
  dim = params.Get(dim_key)
  if dim <= 0:
    raise ValueError(f'{name}: p.{dim_key} must be positive (the size of the '
                     f'normalized last dimension), got {dim}.')
  if params.epsilon <= 0:
    raise ValueError(f'{name}: p.epsilon must be positive (it keeps the '
                     f'division finite), got {params.epsilon}; e.g. 1e-6.')


def _CheckInputShape(params: hyperparams.Params, dim_key: str,
                     shape: Any, ranks: Sequence[int] = ()) -> tf.TensorShape:
  """Returns `shape` as a TensorShape; raises ValueError if it does not fit."""
  shape = tf.TensorShape(shape)
  name = f'{params.cls.__name__} {params.name!r}'
  if ranks and shape.rank not in ranks:
    raise ValueError(f'{name} takes channels-last inputs of rank '
                     f'{" or ".join(map(str, ranks))} ([batch, dim] or '
                     f'[batch, height, width, dim]); got shape {shape}.')
  if shape.rank is None or shape.rank < 1 or shape[-1] != params.Get(dim_key):
    raise ValueError(f'{name}: inputs of shape {shape} do not end in '
                     f'p.{dim_key} = {params.Get(dim_key)}; set p.{dim_key} to '
                     'the size of the last dimension.')
  return shape


def _NormMeta(params: hyperparams.Params, shape: tf.TensorShape,
              num_params: int, num_stats: int,
              island: bool = False) -> layer_meta.LayerMeta:
  """Metadata of a normalization of `shape` with `num_stats` means (and as
  many inverse standard deviations): act_bytes counts the output, the
  centered input and those statistics, what the backward pass needs: the
  output in the compute dtype, the rest float32 (core/precision) and, with
  a reduced compute dtype, the float32 copy of the input; or, for an
  `island` (float32_islands, under a reduced compute dtype), the input and
  the output in the compute dtype, the backward recomputing the rest."""
  n = layer_meta.NumElements(shape)
  size = tf.as_dtype(params.dtype).size
  compute_size = precision.ComputeDtype(params).size
  act_bytes = n * compute_size + (n + 2 * num_stats) * size
  if precision.IsReduced(params.fprop_dtype):
    act_bytes = 2 * n * compute_size if island else act_bytes + n * size
  return layer_meta.LayerMeta(
      out_shapes=(shape,), flops=_FLOPS_PER_ELEMENT * n,
      param_bytes=num_params * size, act_bytes=act_bytes)


class LayerNorm(base_layer.BaseLayer):
  """Layer normalization (Ba et al., 2016) over the last dimension.

  y = (x - mean) / sqrt(variance + epsilon) * scale + bias, with the mean and
  (biased) variance of each example's last dimension. It keeps no
  statistics, so train and eval behave alike. The statistics and the
  normalization are float32 whatever fprop_dtype is (core/precision), and
  so are scale and bias as FProp reads them; y is in the compute dtype.
  """

  def ThetaDtype(self, name: str) -> tf.DType:
    """Float32 (params.dtype): the layer computes in it."""
    del name
    return tf.as_dtype(self.params.dtype)

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 0, 'Size of the last (normalized) dimension.')
    p.Define('epsilon', 1e-6, 'Added to the variance before the square root.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    _CheckParams(p, 'input_dim')
    self.CreateVariable('scale', weights.WeightParams(
        [p.input_dim], init=weights.WeightInit.Constant(1.0)))
    self.CreateVariable('bias', weights.WeightParams(
        [p.input_dim], init=weights.WeightInit.Constant(0.0)))

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    """Normalizes `inputs` [..., input_dim] over its last dimension.

    Raises:
      ValueError: if the last dimension is not p.input_dim.
    """
    _CheckInputShape(self.params, 'input_dim', inputs.shape)
    dtype = self.ThetaDtype('scale')

    def Normalized(inputs, scale, bias):
      x = precision.CastFloat(inputs, dtype)
      mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
      y = _Normalize(x, mean, variance, precision.CastFloat(scale, dtype),
                     precision.CastFloat(bias, dtype), self.params.epsilon)
      return precision.CastFloat(y, self.fprop_dtype)

    if precision.IsReduced(self.fprop_dtype):
      return float32_islands.Island(Normalized, inputs, theta.scale, theta.bias)
    return Normalized(inputs, theta.scale, theta.bias)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> layer_meta.LayerMeta:
    _CheckParams(params, 'input_dim')
    shape = _CheckInputShape(params, 'input_dim', input_shape)
    rows = layer_meta.NumElements(shape) // params.input_dim
    return _NormMeta(params, shape, 2 * params.input_dim, rows, island=True)


class BatchNormLayer(base_layer.BaseLayer):
  """Batch normalization (Ioffe & Szegedy, 2015) of channels-last inputs.

  Inputs are [batch, dim] or [batch, height, width, dim]; statistics are
  taken per channel over all other dimensions. In training the layer
  normalizes with the mean and (biased) variance of the batch it is given;
  in eval (eval_mode.EvalMode) with the moving averages moving_mean and
  moving_variance (non-trainable variables).

  Why statistics are returned rather than assigned: a GPipe pipeline splits
  a mini-batch into micro-batches, and the paper's rule is that training
  normalizes each micro-batch with its own statistics while the moving
  averages follow the statistics of the whole mini-batch. An assignment in
  FProp would update the averages once per micro-batch (and again whenever a
  cell is recomputed). So FProp assigns nothing; FPropWithUpdates also
  returns additive sufficient statistics per channel (count, sum, sum_sq),
  which the pipeline sums over micro-batches; ApplyUpdates turns the sums
  into the mini-batch's mean and variance and updates each moving average
  once: moving = decay * moving + (1 - decay) * statistic. With a single
  micro-batch this is ordinary batch norm.

  The statistics, the normalization, gamma, beta and the moving averages
  are float32 whatever fprop_dtype is (core/precision): a moving average
  moves by (1 - decay) of its value per step, which bfloat16 rounds away.
  The outputs are in the compute dtype.

  The sums are formed from each micro-batch's two-pass mean and variance
  (count * mean and count * (variance + mean^2)), never from squares of raw
  values accumulated one by one; combining them still loses precision when
  |mean| is many orders of magnitude above the standard deviation.
  """

  HAS_OWN_UPDATES = True

  def ThetaDtype(self, name: str) -> tf.DType:
    """Float32 (params.dtype): the layer computes in it."""
    del name
    return tf.as_dtype(self.params.dtype)

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('dim', 0, 'Number of channels (the last dimension).')
    p.Define('decay', 0.999, 'Decay of the moving averages, in [0, 1).')
    p.Define('epsilon', 1e-3, 'Added to the variance before the square root.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    _CheckBatchNormParams(p)
    statistic = ['non_trainable']
    for name, value, collections in (('gamma', 1.0, None), ('beta', 0.0, None),
                                     ('moving_mean', 0.0, statistic),
                                     ('moving_variance', 1.0, statistic)):
      self.CreateVariable(name, weights.WeightParams(
          [p.dim], init=weights.WeightInit.Constant(value),
          collections=collections))

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    """Normalizes `inputs` per channel; assigns nothing.

    Raises:
      ValueError: if the rank is not 2 or 4 or the last dimension is not p.dim.
    """
    return self._Forward(theta, inputs)[0]

  def FPropWithUpdates(self, theta: NestedMap,
                       inputs: tf.Tensor) -> Tuple[tf.Tensor, NestedMap]:
    """Returns (FProp outputs, statistics of this batch for ApplyUpdates).

    The statistics are NestedMap(count, sum, sum_sq): the number of values
    per channel (a scalar), and per channel their sum and sum of squares.
    Statistics of several batches may be added. In eval mode the map is
    empty: nothing is to be updated.
    """
    outputs, mean, variance = self._Forward(theta, inputs)
    if eval_mode.IsEvalMode():
      return outputs, NestedMap()
    mean, variance = tf.stop_gradient(mean), tf.stop_gradient(variance)
    per_channel = tf.size(inputs, out_type=tf.int64) // self.params.dim
    count = tf.cast(per_channel, mean.dtype)
    return outputs, NestedMap(count=count, sum=count * mean,
                              sum_sq=count * (variance + tf.square(mean)))

  def ApplyUpdates(self, updates: NestedMap) -> List[Any]:
    """Updates the moving averages once from (summed) FPropWithUpdates
    statistics; returns the assign results ([] for empty statistics)."""
    if not updates:
      return []
    mean = updates.sum / updates.count
    variance = tf.maximum(updates.sum_sq / updates.count - tf.square(mean), 0.0)
    return [self._MoveAverage(self.moving_mean, mean),
            self._MoveAverage(self.moving_variance, variance)]

  def _MoveAverage(self, average: tf.Variable, value: tf.Tensor) -> Any:
    decay = self.params.decay
    return average.assign(decay * average + (1.0 - decay) * value)

  def _Forward(self, theta: NestedMap,
               inputs: tf.Tensor) -> Tuple[tf.Tensor, Any, Any]:
    """Returns (outputs, mean, variance) with the statistics it used."""
    p = self.params
    shape = _CheckInputShape(p, 'dim', inputs.shape, _BATCH_NORM_RANKS)
    dtype = self.ThetaDtype('gamma')
    theta = precision.CastFloats(theta, dtype)
    x = precision.CastFloat(inputs, dtype)
    if eval_mode.IsEvalMode():
      mean, variance = theta.moving_mean, theta.moving_variance
    else:
      mean, variance = tf.nn.moments(x, axes=list(range(shape.rank - 1)))
    outputs = _Normalize(x, mean, variance, theta.gamma, theta.beta,
                         p.epsilon)
    return precision.CastFloat(outputs, self.fprop_dtype), mean, variance

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> layer_meta.LayerMeta:
    """Metadata of a training step (eval normalizes with 3 FLOPs/element)."""
    _CheckBatchNormParams(params)
    shape = _CheckInputShape(params, 'dim', input_shape, _BATCH_NORM_RANKS)
    return _NormMeta(params, shape, 4 * params.dim, params.dim)


def _CheckBatchNormParams(params: hyperparams.Params) -> None:
  _CheckParams(params, 'dim')
  if not 0.0 <= params.decay < 1.0:
    raise ValueError(f'BatchNormLayer {params.name!r}: p.decay must be in '
                     f'[0, 1), got {params.decay}; e.g. 0.999.')
