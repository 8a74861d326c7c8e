"""Helpers shared by the layer tests."""

import numpy as np
import tensorflow as tf


def Gradients(fn, x, variables):
  """d sum(fn(x) * upstream) / d [x] + variables, for a fixed upstream."""
  with tf.GradientTape() as tape:
    tape.watch([x] + variables)
    y = fn(x)
    upstream = np.random.default_rng(1).normal(size=y.shape).astype(np.float32)
    loss = tf.reduce_sum(y * upstream)
  return tape.gradient(loss, [x] + variables)
