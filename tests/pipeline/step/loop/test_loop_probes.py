"""loop_probes: how a backward's deferred factor pairs flatten into a loop's
arrays (one per factor, or packed per dtype for an I's W) and back."""

import numpy as np
import tensorflow as tf

from lingvo_pipe.pipeline.step.loop import loop_probes


def _Spec(*shape, dtype=tf.float32):
  return tf.TensorSpec(shape, dtype)


# Weight 0 defers one pair (x [2,3], dy [2,5]); weight 2 two pairs, one of
# them bfloat16.
LAYOUT = [(0, [_Spec(2, 3), _Spec(2, 5)]),
          (2, [_Spec(2, 4), _Spec(2, 6), _Spec(2, 4, dtype=tf.bfloat16),
               _Spec(2, 6, dtype=tf.bfloat16)])]


def _Values(leading=()):
  flat = [spec for _, specs in LAYOUT for spec in specs]
  return [tf.cast(tf.reshape(tf.range(np.prod(list(leading) + s.shape.as_list())) + 10 * k,
                             list(leading) + s.shape.as_list()), s.dtype)
          for k, s in enumerate(flat)]


def test_factor_specs_an_array_each_or_one_vector_per_dtype():
  flat = loop_probes.FactorSpecs(LAYOUT, packed=False)
  assert flat == [s for _, specs in LAYOUT for s in specs]
  packed = loop_probes.FactorSpecs(LAYOUT, packed=True)
  assert packed == [_Spec(8 + 12, dtype=tf.bfloat16), _Spec(6 + 10 + 8 + 12)]


def test_packed_factors_come_back_as_each_weights_pairs():
  """An I's factors, packed per dtype as FlatBackward does, are read back
  by its W as the pairs of each weight, in order."""
  values = _Values()
  packed = [tf.concat([tf.reshape(v, [-1]) for v in values if v.dtype == spec.dtype], 0)
            for spec in loop_probes.FactorSpecs(LAYOUT, packed=True)]
  pairs = loop_probes.Pairs(packed, LAYOUT, packed=True)
  assert sorted(pairs) == [0, 2] and [len(pairs[0]), len(pairs[2])] == [1, 2]
  expected = {0: [(values[0], values[1])], 2: [(values[2], values[3]), (values[4], values[5])]}
  for i, weight_pairs in expected.items():
    for (a, b), (ea, eb) in zip(pairs[i], weight_pairs):
      np.testing.assert_array_equal(a, ea)
      np.testing.assert_array_equal(b, eb)


def test_gathered_factors_of_m_micro_batches_have_their_rows_concatenated():
  """A B's arrays, gathered after the loop ([M, rows, ...]), give each
  weight one pair whose rows are micro-batch 0's, then 1's, ...: one
  product for the step."""
  m = 3
  values = _Values(leading=(m,))
  pairs = loop_probes.Pairs(values, LAYOUT, packed=False)
  a, b = pairs[0][0]
  assert a.shape == [m * 2, 3] and b.shape == [m * 2, 5]
  np.testing.assert_array_equal(a, tf.concat(tf.unstack(values[0]), 0))
