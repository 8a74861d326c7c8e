"""Static shapes where known, so traced layers build no shape ops."""

from typing import Any

import tensorflow as tf


def Dim(x: tf.Tensor, i: int) -> Any:
  """Dim i of x: an int when static, else a scalar tensor. Static dims build
  no shape ops, which every call of a traced cell instantiates again (see
  docs/benchmarks.md, time to first step)."""
  return x.shape[i] if x.shape[i] is not None else tf.shape(x)[i]
