"""The tensors a training-step loop carries (loop_executor): specs of a
nest, zeros, unset tensors, TensorArrays of specs."""

from typing import Any, List, Sequence

import tensorflow as tf


def Specs(nest: Any) -> List[tf.TensorSpec]:
  """The TensorSpec of each tensor of `nest`, flat."""
  return [tf.TensorSpec(t.shape, t.dtype) for t in tf.nest.flatten(nest)]


def Zeros(specs: Sequence[tf.TensorSpec]) -> List[tf.Tensor]:
  return [tf.zeros(s.shape, s.dtype) for s in specs]


def Unset(specs: Sequence[tf.TensorSpec]) -> List[tf.Tensor]:
  """Tensors of `specs` whose values nobody reads (a loop writes them to a
  spare slot): allocated, not set, and never folded into constants, which
  would hold their memory between steps as zeros do."""
  return [tf.raw_ops.Empty(shape=s.shape.as_list(), dtype=s.dtype) for s in specs]


def Arrays(specs: Sequence[tf.TensorSpec], size: int) -> List[tf.TensorArray]:
  """A TensorArray of `size` elements per spec, readable more than once."""
  return [tf.TensorArray(s.dtype, size=size, element_shape=s.shape,
                         clear_after_read=False) for s in specs]


def Stacked(nests: Sequence[Any], device: str) -> List[tf.Tensor]:
  """Per flat position of the nests (alike), their tensors stacked, on
  `device`."""
  with tf.device(device):
    return [tf.stack(list(column)) for column in zip(*[tf.nest.flatten(x) for x in nests])]


def Unstacked(array: tf.TensorArray, size: int) -> List[tf.Tensor]:
  """Elements 0 .. size-1 of `array` (its spare slots left out)."""
  return tf.unstack(array.gather(list(range(size))), size)
