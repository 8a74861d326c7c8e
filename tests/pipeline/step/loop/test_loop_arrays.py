"""loop_arrays: the arrays a loop step carries, written every iteration,
their spare slot taking the unset pieces."""

import numpy as np
import tensorflow as tf

from lingvo_pipe.pipeline.step.loop import loop_arrays

SPECS = [tf.TensorSpec([2, 3], tf.float32), tf.TensorSpec([], tf.int32)]


def test_unset_pieces_take_no_memory_and_keep_their_dtype():
  unset = loop_arrays.Unset(SPECS)
  assert unset[0].shape == [0, 3] and unset[0].dtype == tf.float32
  assert unset[1].shape == [] and unset[1].dtype == tf.int32


def test_written_elements_read_back_with_their_shape_and_the_spare_slot_left_out():
  """Three elements and an unset piece in the spare slot (index 3): Read
  restores each element's static shape (the arrays leave dimension 0
  open), Gathered and Unstacked give elements 0..2 only."""
  values = [[tf.fill([2, 3], float(i)), tf.constant(i)] for i in range(3)]

  @tf.function(autograph=False)
  def Roundtrip():
    arrays = loop_arrays.Arrays(SPECS, 4)
    for i, pieces in enumerate(values):
      arrays = [a.write(i, x) for a, x in zip(arrays, pieces)]
    arrays = [a.write(3, x) for a, x in zip(arrays, loop_arrays.Unset(SPECS))]
    read = loop_arrays.Read(arrays, tf.constant(1), SPECS)
    assert [x.shape for x in read] == [s.shape for s in SPECS]
    return read, loop_arrays.Gathered(arrays, 3, SPECS), loop_arrays.Unstacked(arrays, 3, SPECS)

  read, gathered, unstacked = Roundtrip()
  np.testing.assert_array_equal(read[0], np.ones([2, 3]))
  assert int(read[1]) == 1
  np.testing.assert_array_equal(gathered[0], np.stack([np.full([2, 3], i) for i in range(3)]))
  np.testing.assert_array_equal(gathered[1], [0, 1, 2])
  assert [int(x) for x in unstacked[1]] == [0, 1, 2]


def test_stacked_puts_each_flat_position_of_the_micro_batches_together():
  micro = [(tf.fill([2], float(m)), {'ids': tf.constant([m])}) for m in range(3)]
  stacked = loop_arrays.Stacked(micro, '/device:CPU:1')
  assert [x.shape for x in stacked] == [[3, 2], [3, 1]]
  np.testing.assert_array_equal(stacked[1], [[0], [1], [2]])
  assert stacked[0].device.endswith('CPU:1')
  assert loop_arrays.Specs(micro[0]) == [tf.TensorSpec([2]), tf.TensorSpec([1], tf.int32)]
