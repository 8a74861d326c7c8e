"""DropoutLayer: masks that are a pure function of step seed and layer path."""

import zlib
from typing import Any, Optional, Set

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import precision
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core.nested_map import NestedMap


class DropoutLayer(base_layer.BaseLayer):
  """Inverted dropout: keeps each value with probability keep_prob and
  scales the kept ones by 1 / keep_prob, so the expected output is the input.
  Identity in eval mode (base_layer.EvalMode) and for keep_prob = 1.

  The mask is a pure function of theta.step_seed (set by the caller with
  base_layer.WithStepSeed, e.g. to [global_step, micro_batch]), the layer's
  path and p.random_seed, drawn with stateless random ops. So recomputing a
  pipeline cell reproduces the forward pass's mask exactly, every step and
  micro-batch draws a new mask, and two dropout layers draw different ones.

  A value is kept where 32 random bits (Philox), read as an int32, fall
  below the threshold round(keep_prob * 2^32) - 2^31. The bits are the same
  under XLA (jit_compile) and TensorFlow's kernels, while their conversion
  to floats in [0, 1) is not, so a compiled pipeline cell draws the same
  mask as an uncompiled one (pipeline/cell_compilation.py).
  """

  USES_STEP_SEED = True

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('keep_prob', 1.0, 'Probability of keeping a value, in (0, 1]; '
             '1.0: the layer is the identity.')
    p.Define('noise_shape_broadcast_dims', None,
             'Dims along which one mask value is shared (e.g. [1] for the '
             'time axis of [batch, time, dim]); None: a value per element.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    _CheckKeepProb(self.params)

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    """Returns `inputs` with dropout applied (identity in eval mode).

    Raises:
      ValueError: if a broadcast dim is out of range for the inputs' rank.
    """
    p = self.params
    inputs = precision.CastFloat(tf.convert_to_tensor(inputs), self.fprop_dtype)
    dims = _BroadcastDims(p, inputs.shape.rank)
    if p.keep_prob == 1.0 or base_layer.IsEvalMode():
      return inputs
    full_shape = tf.shape(inputs)
    broadcast = tf.constant([i in dims for i in range(inputs.shape.rank)],
                            dtype=tf.bool)
    noise_shape = tf.where(broadcast, tf.ones_like(full_shape), full_shape)
    bits = tf.random.stateless_uniform(noise_shape, self._MaskSeed(theta),
                                       minval=None, maxval=None,
                                       dtype=tf.int32, alg=_ALG)
    keep = tf.cast(bits < _KeepThreshold(p.keep_prob), inputs.dtype)
    return inputs * (keep * (1.0 / p.keep_prob))

  def _MaskSeed(self, theta: NestedMap) -> tf.Tensor:
    """The stateless seed of this layer's mask for theta.step_seed."""
    step_seed = tf.cast(theta[base_layer.STEP_SEED_KEY], tf.int64)
    path_hash = zlib.crc32(self.path.encode('utf-8'))
    seed = tf.random.experimental.stateless_fold_in(step_seed, path_hash,
                                                    alg=_ALG)
    return tf.random.experimental.stateless_fold_in(
        seed, self.params.random_seed or 0, alg=_ALG)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> layer_meta.LayerMeta:
    """Metadata in training: per mask value a comparison and a scaling, per
    element one multiply; act_bytes counts the output and the scaled mask.
    Nothing is produced when keep_prob is 1."""
    _CheckKeepProb(params)
    shape = tf.TensorShape(input_shape)
    dims = _BroadcastDims(params, shape.rank)
    if params.keep_prob == 1.0:
      return layer_meta.LayerMeta(out_shapes=(shape,))
    n = layer_meta.NumElements(shape)
    mask = layer_meta.NumElements(
        [1 if i in dims else d for i, d in enumerate(shape.as_list())])
    return layer_meta.LayerMeta(
        out_shapes=(shape,), flops=2 * mask + n,
        act_bytes=(n + mask) * precision.ComputeDtype(params).size)


# The RNG of the masks, named rather than auto-selected: XLA's choice of
# algorithm may differ from TensorFlow's kernels'.
_ALG = 'philox'


def _KeepThreshold(keep_prob: float) -> tf.Tensor:
  """The int32 below which uniform 32-bit values are kept with probability
  keep_prob (to within 2^-32)."""
  return tf.constant(round(keep_prob * 2**32) - 2**31, tf.int32)


def _CheckKeepProb(params: hyperparams.Params) -> None:
  if not 0.0 < params.keep_prob <= 1.0:
    raise ValueError(f'DropoutLayer {params.name!r}: p.keep_prob must be in '
                     f'(0, 1], got {params.keep_prob}; 1.0 disables dropout.')


def _BroadcastDims(params: hyperparams.Params, rank: Optional[int]) -> Set[int]:
  """The non-negative broadcast dims for inputs of `rank`.

  Raises:
    ValueError: if the rank is unknown or a dim is outside [-rank, rank).
  """
  dims = params.noise_shape_broadcast_dims or []
  if not dims:
    return set()
  if rank is None or any(not -rank <= d < rank for d in dims):
    raise ValueError(f'DropoutLayer {params.name!r}: '
                     f'p.noise_shape_broadcast_dims = {list(dims)} must index '
                     f'dims of the inputs, which have rank {rank}.')
  return {d % rank for d in dims}
