"""float32_islands.Island: fn's value and gradients, with only the inputs
kept for the backward."""

import numpy as np
import tensorflow as tf

from lingvo_pipe.core import float32_islands


def _Norm(x, scale):
  x32 = tf.cast(x, tf.float32)
  mean, variance = tf.nn.moments(x32, axes=[-1], keepdims=True)
  return tf.cast((x32 - mean) * tf.math.rsqrt(variance + 1e-6) * scale, x.dtype)


def _ValueAndGrads(apply, x, scale):
  with tf.GradientTape() as tape:
    tape.watch([x, scale])
    y = apply(x, scale)
    loss = tf.reduce_sum(tf.cast(y, tf.float32) * tf.range(8, dtype=tf.float32))
  return [y] + tape.gradient(loss, [x, scale])


def test_value_and_gradients_are_those_of_fn():
  """The backward reruns the same float32 ops: equal up to the order in
  which the traced graph sums (a float32 rounding step)."""
  x = tf.cast(tf.random.stateless_normal([4, 8], [1, 2]), tf.bfloat16)
  scale = tf.random.stateless_uniform([8], [3, 4])
  plain = _ValueAndGrads(_Norm, x, scale)
  island = _ValueAndGrads(lambda *a: float32_islands.Island(_Norm, *a), x, scale)
  traced = tf.function(lambda x, s: _ValueAndGrads(
      lambda *a: float32_islands.Island(_Norm, *a), x, s))(x, scale)
  for want, eager, graph in zip(plain, island, traced):
    assert want.dtype == eager.dtype == graph.dtype
    for got in (eager, graph):
      np.testing.assert_allclose(tf.cast(got, tf.float32), tf.cast(want, tf.float32),
                                 rtol=1e-6, atol=1e-6)


def test_variables_and_non_floating_inputs():
  """A variable's value flows in as an input and gets its gradient; a
  boolean mask gets none."""
  scale = tf.Variable(tf.ones([3]))
  mask = tf.constant([True, False, True])
  x = tf.constant([[1.0, 2.0, 3.0]], tf.bfloat16)

  def Masked(x, scale, mask):
    return tf.cast(tf.where(mask, tf.cast(x, tf.float32) * scale, 0.0), x.dtype)

  with tf.GradientTape() as tape:
    tape.watch(x)
    y = float32_islands.Island(Masked, x, scale, mask)
    loss = tf.reduce_sum(tf.cast(y, tf.float32))
  dx, dscale = tape.gradient(loss, [x, scale])
  np.testing.assert_array_equal(tf.cast(y, tf.float32), [[1.0, 0.0, 3.0]])
  np.testing.assert_array_equal(tf.cast(dx, tf.float32), [[1.0, 0.0, 1.0]])
  np.testing.assert_array_equal(dscale, [1.0, 0.0, 3.0])
