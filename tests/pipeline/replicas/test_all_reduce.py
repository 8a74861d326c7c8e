"""all_reduce: replicas' gradients summed by TensorFlow's collectives, with
keys that belong to their owner."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.pipeline.replicas import all_reduce

DEVICES = ['/device:CPU:0', '/device:CPU:1']


def _Grads(r):
  return [tf.fill([2, 3], float(r + 1)), None, tf.constant([r], tf.int32)]


def test_sums_each_dtype_for_every_replica_and_keeps_none():
  summed = all_reduce.Sum([_Grads(0), _Grads(1)], DEVICES, all_reduce.Collectives(DEVICES))
  for row in summed:
    np.testing.assert_array_equal(row[0].numpy(), np.full([2, 3], 3.0))
    assert row[1] is None
    np.testing.assert_array_equal(row[2].numpy(), [1])


def test_each_owner_has_its_own_group_keys_and_instance_keys():
  """Two pipelines over the same devices reduce in groups of their own, so
  their instance keys, each counted from 1, never meet in one group."""
  a, b = all_reduce.Collectives(DEVICES), all_reduce.Collectives(DEVICES)
  devices = tuple(DEVICES)
  assert a.GroupKey(devices) == a.GroupKey(devices) != b.GroupKey(devices)
  assert a.GroupKey(devices[::-1]) not in (a.GroupKey(devices), b.GroupKey(devices))
  assert [a.InstanceKey(), a.InstanceKey(), b.InstanceKey()] == [1, 2, 1]
  assert a.OrderingToken(DEVICES[0]) is a.OrderingToken(DEVICES[0])
  with pytest.raises(ValueError, match='CPU:2'):
    a.OrderingToken('/device:CPU:2')
  for keys in (a, b):  # both reduce, alternately, in one process
    summed = all_reduce.Sum([_Grads(0), _Grads(1)], DEVICES, keys)
    np.testing.assert_array_equal(summed[1][0].numpy(), np.full([2, 3], 3.0))
