"""The tensors a training-step loop carries (loop_executor):
specs of a nest, zeros and TensorArrays of specs, and rows gathered out of
an array once the loop ends."""

from typing import Any, List, Sequence

import tensorflow as tf


def Specs(nest: Any) -> List[tf.TensorSpec]:
  """The TensorSpec of each tensor of `nest`, flat."""
  return [tf.TensorSpec(t.shape, t.dtype) for t in tf.nest.flatten(nest)]


def Zeros(specs: Sequence[tf.TensorSpec]) -> List[tf.Tensor]:
  return [tf.zeros(s.shape, s.dtype) for s in specs]


def Arrays(specs: Sequence[tf.TensorSpec], size: int) -> List[tf.TensorArray]:
  """A TensorArray of `size` elements per spec, readable more than once."""
  return [tf.TensorArray(s.dtype, size=size, element_shape=s.shape,
                         clear_after_read=False) for s in specs]


def GatherRows(array: tf.TensorArray, indices: List[int]) -> tf.Tensor:
  """The 2-D elements at `indices`, their rows concatenated in that order
  (one gather, whatever the number of indices)."""
  stacked = array.gather(indices)
  return tf.reshape(stacked, [-1, stacked.shape[-1]])
