"""Tests of splitting into micro-batches and merging back (the micro-batch contract)."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline.layout import micro_batch


def test_split_batch_inputs_and_broadcast_declared_ones():
  x = tf.reshape(tf.range(24.), [6, 4])
  pos = tf.range(4.)
  rows = micro_batch.Contract(0, broadcast_inputs=[1]).SplitInputs((x, pos), 3)
  assert len(rows) == 3
  np.testing.assert_array_equal(rows[1][0], x[2:4])
  for r in rows:
    assert r[1] is pos


def test_split_time_major():
  x = tf.zeros([5, 8, 2])
  rows = micro_batch.Contract(1).SplitInputs((x,), 4)
  assert rows[0][0].shape == (5, 2, 2)


def test_split_shapes():
  contract = micro_batch.Contract(0, broadcast_inputs=['1'])
  shapes = (tf.TensorShape([8, 3]), tf.TensorShape([8]))
  assert contract.SplitShapes(shapes, 4) == (tf.TensorShape([2, 3]), tf.TensorShape([8]))


def test_merge_outputs_and_input_gradients():
  a, b = tf.ones([2, 3]), 2 * tf.ones([2, 3])
  contract = micro_batch.Contract(0, broadcast_inputs=[1], summed_outputs=[1])
  merged = contract.MergeOutputs([(a, tf.constant(1.)), (b, tf.constant(2.))], 2)
  assert merged[0].shape == (4, 3)
  assert float(merged[1]) == 3.0
  micro_inputs = (tf.zeros([2, 3]), tf.zeros([3]))
  grads = contract.MergeInputGrads(micro_inputs, [[a, a[0]], [b, b[0]]])
  assert grads[0].shape == (4, 3)
  np.testing.assert_array_equal(grads[1], [3., 3., 3.])
  assert contract.MergeInputGrads(micro_inputs, [[None, a[0]], [None, b[0]]])[0] is None


def test_summed_output_gradient_reaches_every_micro_batch_whole():
  contract = micro_batch.Contract(0, summed_outputs=[1])
  dy, daux = tf.reshape(tf.range(8.), [4, 2]), tf.constant(5.)
  rows = contract.SplitOutputGrads((tf.zeros([2, 2]), tf.zeros([])), [dy, daux], 2)
  np.testing.assert_array_equal(rows[1][0], dy[2:])
  assert rows[0][1] is daux and rows[1][1] is daux


def test_leaf_paths_follow_tf_nest_order():
  inputs = (tf.zeros([2]), NestedMap(x=1, a_mask=2, enc=[3, NestedMap(ids=4)]))
  paths = micro_batch.LeafPaths(inputs)
  assert paths == ['0', '1.a_mask', '1.enc.0', '1.enc.1.ids', '1.x']
  assert tf.nest.flatten(inputs)[1:] == [2, 3, 4, 1]


@pytest.mark.parametrize('entries,paths', [([], ()), ([1, '0.mask'], ('1', '0.mask')),
                                           ((2,), ('2',))])
def test_check_paths(entries, paths):
  assert micro_batch.CheckPaths(entries, 'broadcast_inputs') == paths


@pytest.mark.parametrize('bad', [[-1], [True], [1.5], ['x'], ['1.'], ['1..a'], ['01'],
                                 [1, '1'], 1])
def test_check_paths_rejects_malformed_entries(bad):
  with pytest.raises(ValueError, match='broadcast_inputs'):
    micro_batch.CheckPaths(bad, 'broadcast_inputs')
