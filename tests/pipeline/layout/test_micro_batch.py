"""Tests of splitting into micro-batches and merging back, and of M."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline import gpipe
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


def test_micro_batches_must_divide_batch():
  with pytest.raises(ValueError, match=r'num_micro_batches \(3\) must divide '
                     r'the batch size \(16\); try one of \[1, 2, 4, 8, 16\]'):
    micro_batch.CheckDivides(16, 3)
  with pytest.raises(ValueError, match=r'num_micro_batches \(0\)'):
    micro_batch.CheckDivides(16, 0)


def _Params(**kwargs):
  return gpipe.PipeliningLayer.Params().Set(name='pipe', **kwargs)


@pytest.mark.parametrize('kwargs,batch,m', [
    (dict(num_micro_batches=4), 16, 4),
    (dict(num_micro_batches=4), None, 4),
    (dict(micro_batch_size=4), 16, 4),
    (dict(micro_batch_size=4, num_micro_batches=2), 32, 8),
    (dict(micro_batch_size=4), None, None),
])
def test_num_micro_batches(kwargs, batch, m):
  assert micro_batch.NumMicroBatches(_Params(**kwargs), batch) == m


@pytest.mark.parametrize('kwargs,batch,match', [
    (dict(num_micro_batches=0), None, r'num_micro_batches \(0\) must be >= 1'),
    (dict(micro_batch_size=-1), 16, r'micro_batch_size \(-1\) > 0'),
    (dict(num_micro_batches=3), 16, r'num_micro_batches \(3\) must divide the batch size \(16\)'),
    (dict(micro_batch_size=5), 16,
     r'micro_batch_size \(5\) must divide the batch size \(16\); try one of \[1, 2, 4, 8, 16\]'),
])
def test_num_micro_batches_errors(kwargs, batch, match):
  with pytest.raises(ValueError, match=match):
    micro_batch.NumMicroBatches(_Params(**kwargs), batch)


@pytest.mark.parametrize('kwargs,batch,m', [
    (dict(num_micro_batches=4), 16, 4),  # of each replica's 8
    (dict(micro_batch_size=2), 16, 4),  # each replica's 8 in micro-batches of 2
    (dict(micro_batch_size=2), None, None),
])
def test_num_micro_batches_of_each_replica(kwargs, batch, m):
  assert micro_batch.NumMicroBatches(_Params(**kwargs), batch, replicas=2) == m


@pytest.mark.parametrize('kwargs,batch,match', [
    (dict(num_micro_batches=2), 10, r'num_replicas \(3\) must divide the batch size \(10\)'),
    (dict(num_micro_batches=4), 6,
     r"'pipe': with 3 replicas, each of 1/3 of the batch: num_micro_batches \(4\) must divide "
     r'the batch size \(2\); try one of \[1, 2\]'),
    (dict(micro_batch_size=4), 6, r'micro_batch_size \(4\) must divide the batch size \(2\)'),
])
def test_num_micro_batches_of_each_replica_errors(kwargs, batch, match):
  with pytest.raises(ValueError, match=match):
    micro_batch.NumMicroBatches(_Params(**kwargs), batch, replicas=3)


@pytest.mark.parametrize('kwargs,multiple', [
    (dict(num_micro_batches=4), 4),
    (dict(micro_batch_size=3), 3),
    (dict(micro_batch_size=3, num_micro_batches=2), 3),
])
def test_batch_multiple_is_what_sets_m(kwargs, multiple):
  """Decoders pad to it: with micro_batch_size M follows the batch, so a
  batch of any multiple of the size runs."""
  p = _Params(**kwargs)
  assert micro_batch.BatchMultiple(p) == multiple
  for batch in (multiple, 5 * multiple):
    micro_batch.NumMicroBatches(p, batch)


def test_batch_multiple_refuses_params_that_set_no_m():
  with pytest.raises(ValueError, match=r'num_micro_batches \(0\) must be >= 1'):
    micro_batch.BatchMultiple(_Params(num_micro_batches=0))
