"""LayerMeta: what a layer costs for given input shapes (Lingvo's FPropMeta)."""

import dataclasses
import math
from typing import Any, Iterable, Tuple

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class Projection:
  """A product rows x in_dim by a weight [in_dim, out_dim] of the layer
  whose weight gradient the pipeline may defer (linear.ProjectLastDim by
  the weight itself, not a cast of it): what the planner needs to apply
  deferred_grads' size rule. `bytes_per_element` is the weight's dtype size,
  also the factors' (the product runs in the weight's dtype)."""
  rows: int
  in_dim: int
  out_dim: int
  bytes_per_element: int


@dataclasses.dataclass(frozen=True)
class LayerMeta:
  """Planning metadata of one forward pass of a layer.

  Attributes:
    out_shapes: output shapes, a tuple of tf.TensorShape (or nested structures
      of them for layers with structured outputs).
    flops: forward floating-point operations (a multiply-add counts 2).
    param_bytes: bytes of the layer's variables.
    act_bytes: bytes of the activations the forward pass produces (what a
      backward pass without recomputation keeps alive).
    projections: the deferrable weight products (Projection) among them.
  """
  out_shapes: tuple
  flops: int = 0
  param_bytes: int = 0
  act_bytes: int = 0
  projections: Tuple[Projection, ...] = ()

  def __post_init__(self) -> None:
    if not isinstance(self.out_shapes, tuple):
      raise TypeError(f'LayerMeta.out_shapes must be a tuple, one entry per output '
                      f'(e.g. (tf.TensorShape([8, 16]),)), not {self.out_shapes!r}.')

  def __add__(self, other: 'LayerMeta') -> 'LayerMeta':
    """Sums costs; the output shapes are `other`'s (the later layer's)."""
    if not isinstance(other, LayerMeta):
      return NotImplemented
    return LayerMeta(other.out_shapes, self.flops + other.flops,
                     self.param_bytes + other.param_bytes,
                     self.act_bytes + other.act_bytes,
                     self.projections + other.projections)


def NumElements(shape: Any) -> int:
  """Number of elements of a fully defined shape."""
  shape = tf.TensorShape(shape)
  if not shape.is_fully_defined():
    raise ValueError(f'Shape {shape} is not fully defined; planning needs '
                     'concrete input shapes (including the batch size).')
  return math.prod(shape.as_list())


def Bytes(shapes: Iterable[Any], dtype: tf.DType) -> int:
  """Total bytes of tensors of the given shapes and dtype."""
  return sum(NumElements(s) for s in shapes) * tf.as_dtype(dtype).size


def Shapes(*shapes: Any) -> tuple:
  """Normalizes shapes to a tuple of tf.TensorShape; the shapes of an input
  that is a NestedMap (or dict) are one of the same keys."""
  return tuple(_Shape(s) for s in shapes)


def _Shape(shape: Any) -> Any:
  if isinstance(shape, dict):
    return type(shape)((key, _Shape(value)) for key, value in shape.items())
  return tf.TensorShape(shape)
