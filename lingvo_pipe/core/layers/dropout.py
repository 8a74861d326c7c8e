"""DropoutLayer: masks that are a pure function of step seed and layer path."""

import hashlib
import math
from typing import Any, List, Optional, Set

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import eval_mode
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.core import precision
from lingvo_pipe.core import step_seeds


class DropoutLayer(base_layer.BaseLayer):
  """Inverted dropout: keeps each value with probability keep_prob and
  scales the kept ones by 1 / keep_prob, so the expected output is the input.
  Identity in eval mode (eval_mode.EvalMode) and for keep_prob = 1.

  The mask is a pure function of the global step, the layer's path,
  p.random_seed and each example's index in the global batch, drawn with
  stateless random ops: theta.step_seed is [global step, index of the
  inputs' first example] (step_seeds.WithStepSeed). Each example's values
  come from its own run of Philox counters, so the mask of examples i..j
  is the same whether they arrive in one batch or split into micro-batches
  or replicas: M, R, K and the schedule change no mask. Recomputing a
  pipeline cell reproduces its forward's mask, every step draws new masks,
  and two dropout layers draw different ones.

  A value is kept where 32 random bits (Philox), read as an int32, fall
  below the threshold round(keep_prob * 2^32) - 2^31. The bits are the same
  under XLA (jit_compile) and TensorFlow's kernels, while their conversion
  to floats in [0, 1) is not, so a compiled pipeline cell draws the same
  mask as an uncompiled one (pipeline/layout/cell_compilation.py).
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
    p.Define('example_axis', None, 'The axis of the inputs that indexes '
             'examples: masks are drawn per example along it. None: 0, '
             "except in a time-major PipeliningLayer (batch_dim=1), which "
             'refuses None: 1 where the inputs are time-major like the '
             "pipeline's, 0 where a cell made them batch-major.")
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
    if p.keep_prob == 1.0 or eval_mode.IsEvalMode():
      return inputs
    keep = tf.cast(self._KeepBits(theta, inputs, dims) < _KeepThreshold(p.keep_prob),
                   inputs.dtype)
    return inputs * (keep * (1.0 / p.keep_prob))

  def _KeepBits(self, theta: NestedMap, inputs: tf.Tensor,
                dims: Set[int]) -> tf.Tensor:
    """Random int32 bits of the mask's shape (1 along broadcast dims).

    Example e of the global batch reads Philox counters e*G .. e*G + G - 1
    (low words; G counters of 4 values each hold one example's mask
    values), so the bits of examples first..first+n-1 are one draw from
    counter first*G.
    """
    rank, axis = inputs.shape.rank, self.params.example_axis or 0
    if rank is None or not 0 <= axis < rank:
      raise ValueError(f'DropoutLayer {self.path!r}: p.example_axis={axis} is '
                       f'not an axis of its inputs of rank {rank}.')
    # Python ints where the shape is static (the usual case): fewer ops.
    shape: List[Any] = inputs.shape.as_list()
    if None in shape:
      dynamic = tf.shape(inputs, out_type=tf.int64)
      shape = [dynamic[i] if d is None else d for i, d in enumerate(shape)]
    noise = [1 if i in dims else shape[i] for i in range(rank)]
    order = [axis] + [i for i in range(rank) if i != axis]  # examples first
    per_example = math.prod(noise[i] for i in order[1:])
    counters = (per_example + 3) // 4
    step_seed = tf.cast(theta[step_seeds.KEY], tf.int64)
    # Philox's key is the global step and the counters' high word names the
    # layer, so every (step, layer, example) has a run of counters of its
    # own. Set here rather than mixed by fold_in (two fold_ins were ~50 ops a
    # call to trace) or by StatelessRandomGetKeyCounter (which mixes
    # differently under XLA). words: [step, first example's counter, layer].
    words = tf.concat([step_seed * [1, 0 if axis in dims else counters],
                       tf.constant([self._LayerWord()], tf.int64)], 0)
    key, counter = tf.split(tf.bitcast(words, tf.uint64), [1, 2])
    bits = tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=tf.stack([noise[axis] * counters * 4]), key=key, counter=counter,
        alg=_PHILOX, dtype=tf.int32)
    bits = tf.reshape(bits, [noise[axis], counters * 4])
    if not isinstance(per_example, int) or per_example % 4:
      bits = bits[:, :per_example]
    if rank != 2:  # at rank 2, [examples, per example] is the mask's shape
      bits = tf.reshape(bits, [noise[i] for i in order])
    return tf.transpose(bits, [order.index(i) for i in range(rank)]) if axis else bits

  def _LayerWord(self) -> int:
    """The counters' high word of this layer: a 64-bit hash of its path and
    p.random_seed (as an int64)."""
    name = f'{self.path}\0{self.params.random_seed or 0}'.encode('utf-8')
    return int.from_bytes(hashlib.blake2b(name, digest_size=8).digest(), 'little',
                          signed=True)

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


def UnsetExampleAxes(layer: base_layer.BaseLayer) -> List[str]:
  """The paths of the DropoutLayers in `layer` (itself included) that drop
  values with example_axis left None."""
  return [l.path for l in layer.Walk() if isinstance(l, DropoutLayer)
          and l.params.keep_prob < 1.0 and l.params.example_axis is None]


# The RNG of the masks (its number in the raw ops), named rather than
# auto-selected: XLA's choice of algorithm may differ from TensorFlow's kernels'.
_PHILOX = 1


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
