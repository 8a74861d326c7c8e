"""The hook by which a caller takes projections' weight gradients as factors.

The layer library knows nothing of who calls it. A caller that wants the
weight gradient x^T dy of some projections as the factor pair (x, dy)
instead of the product (the pipeline does, to multiply them once per step)
traces the layers inside `Collecting(collector)`; a projection asks
`Current()` whether its weight is claimed and, if so, records its factors
there instead of computing the product.
"""

import contextlib
import contextvars
from typing import Iterator, Optional, Protocol, TypeVar

import tensorflow as tf


class WeightGradCollector(Protocol):
  """What a projection asks of the active collector."""

  def Claim(self, w: tf.Tensor, rows: Optional[int]) -> Optional[int]:
    """The index under which to record the factors of `w`'s gradient for a
    product of `rows` rows by `w`, or None to compute the gradient as usual."""

  def Record(self, index: int, a: tf.Tensor, b: tf.Tensor) -> None:
    """Adds the factor pair whose product a^T b is part of the gradient."""


_current: contextvars.ContextVar[Optional[WeightGradCollector]] = (
    contextvars.ContextVar('weight_grad_collector', default=None))

C = TypeVar('C', bound=WeightGradCollector)


@contextlib.contextmanager
def Collecting(collector: C) -> Iterator[C]:
  """Makes `collector` the one projections traced inside ask."""
  token = _current.set(collector)
  try:
    yield collector
  finally:
    _current.reset(token)


def Current() -> Optional[WeightGradCollector]:
  """The collector of the innermost `Collecting`, or None."""
  return _current.get()
