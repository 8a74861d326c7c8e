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
  """Stand-ins for tensors of `specs` whose values nobody reads (a loop
  writes them to an array's spare slot): empty along dimension 0, which
  Arrays leaves open, so they take no memory (a scalar's is allocated,
  not set)."""
  return [tf.zeros([0] + s.shape[1:].as_list(), s.dtype) if s.shape.rank
          else tf.raw_ops.Empty(shape=[], dtype=s.dtype) for s in specs]


def Arrays(specs: Sequence[tf.TensorSpec], size: int) -> List[tf.TensorArray]:
  """A TensorArray of `size` elements per spec, readable more than once,
  its elements' dimension 0 open (Unset); Read and Gathered restore it."""
  return [tf.TensorArray(s.dtype, size=size, element_shape=_Open(s.shape), infer_shape=False,
                         clear_after_read=False) for s in specs]


def _Open(shape: tf.TensorShape) -> tf.TensorShape:
  return tf.TensorShape([None] + shape[1:].as_list()) if shape.rank else shape


def Read(arrays: Sequence[tf.TensorArray], index: Any,
         specs: Sequence[tf.TensorSpec]) -> List[tf.Tensor]:
  """Element `index` of each of `arrays` (of Arrays(specs))."""
  elements = [a.read(index) for a in arrays]
  for x, s in zip(elements, specs):
    x.set_shape(s.shape)
  return elements


def Gathered(arrays: Sequence[tf.TensorArray], size: int,
             specs: Sequence[tf.TensorSpec]) -> List[tf.Tensor]:
  """Elements 0 .. size-1 of each of `arrays` (of Arrays(specs), their
  spare slots left out), stacked."""
  stacked = [a.gather(list(range(size))) for a in arrays]
  for x, s in zip(stacked, specs):
    x.set_shape([size] + s.shape.as_list())
  return stacked


def Stacked(nests: Sequence[Any], device: str) -> List[tf.Tensor]:
  """Per flat position of the nests (alike), their tensors stacked, on
  `device`."""
  with tf.device(device):
    return [tf.stack(list(column)) for column in zip(*[tf.nest.flatten(x) for x in nests])]


def Unstacked(arrays: Sequence[tf.TensorArray], size: int,
              specs: Sequence[tf.TensorSpec]) -> List[List[tf.Tensor]]:
  """Per array its elements 0 .. size-1 (Gathered, unstacked)."""
  return [tf.unstack(x, size) for x in Gathered(arrays, size, specs)]
