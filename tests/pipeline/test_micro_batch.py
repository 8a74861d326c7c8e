"""Tests of splitting into micro-batches and merging back."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.pipeline import micro_batch


def test_split_batch_entries_and_broadcast_others():
  x = tf.reshape(tf.range(24.), [6, 4])
  pos = tf.range(4.)
  rows = micro_batch.Split([x, pos], 3, batch_dim=0)
  assert len(rows) == 3
  np.testing.assert_array_equal(rows[1][0], x[2:4])
  for r in rows:
    assert r[1] is pos


def test_split_time_major():
  x = tf.zeros([5, 8, 2])
  rows = micro_batch.Split([x], 4, batch_dim=1)
  assert rows[0][0].shape == (5, 2, 2)


def test_concat_and_input_gradients():
  a, b = tf.ones([2, 3]), 2 * tf.ones([2, 3])
  merged = micro_batch.Concat([[a, tf.constant(1.)], [b, tf.constant(2.)]], 0)
  assert merged[0].shape == (4, 3)
  assert float(merged[1]) == 3.0
  x, bias = tf.zeros([4, 3]), tf.zeros([3])
  grads = micro_batch.MergeInputGradients([x, bias], [[a, a[0]], [b, b[0]]], 0)
  assert grads[0].shape == (4, 3)
  np.testing.assert_array_equal(grads[1], [3., 3., 3.])


def test_micro_batches_must_divide_batch():
  with pytest.raises(ValueError, match=r'num_micro_batches \(3\) must divide '
                     r'the batch size \(16\); try one of \[1, 2, 4, 8, 16\]'):
    micro_batch.Split([tf.zeros([16, 2])], 3, batch_dim=0)
  with pytest.raises(ValueError, match=r'num_micro_batches \(0\)'):
    micro_batch.CheckDivides(16, 0)
