"""Tests LayerMeta arithmetic and the shape/byte helpers used for planning."""

import dataclasses

import pytest
import tensorflow as tf

from lingvo_pipe.core import layer_meta


def test_num_elements():
  assert layer_meta.NumElements([2, 3, 4]) == 24
  assert layer_meta.NumElements(tf.TensorShape([5])) == 5
  assert layer_meta.NumElements([]) == 1
  assert layer_meta.NumElements([3, 0]) == 0


@pytest.mark.parametrize('shape', [[None, 3], [2, None], None,
                                   tf.TensorShape(None)])
def test_num_elements_unknown_dims_raise(shape):
  with pytest.raises(ValueError, match=r'is not fully defined; planning needs '
                     r'concrete input shapes'):
    layer_meta.NumElements(shape)


def test_bytes():
  assert layer_meta.Bytes([[2, 3]], tf.float32) == 24
  assert layer_meta.Bytes([[2, 3], [4]], tf.float32) == 40
  assert layer_meta.Bytes([[2, 3]], tf.bfloat16) == 12
  assert layer_meta.Bytes([[2, 3]], 'float64') == 48
  assert layer_meta.Bytes([], tf.float32) == 0


def test_bytes_unknown_dims_raise():
  with pytest.raises(ValueError, match=r'Shape \(2, None\) is not fully defined'):
    layer_meta.Bytes([[4], [2, None]], tf.float32)


def test_shapes():
  shapes = layer_meta.Shapes([2, 3], (4,), tf.TensorShape([1]))
  assert shapes == (tf.TensorShape([2, 3]), tf.TensorShape([4]),
                    tf.TensorShape([1]))
  assert all(isinstance(s, tf.TensorShape) for s in shapes)


def test_addition_sums_costs_and_keeps_later_shapes():
  a = layer_meta.LayerMeta(layer_meta.Shapes([2, 8]), flops=10, param_bytes=100,
                           act_bytes=64)
  b = layer_meta.LayerMeta(layer_meta.Shapes([2, 4]), flops=7, param_bytes=20,
                           act_bytes=32)
  total = a + b
  assert total == layer_meta.LayerMeta(layer_meta.Shapes([2, 4]), flops=17,
                                       param_bytes=120, act_bytes=96)
  assert (b + a).out_shapes == a.out_shapes
  assert a.flops == 10  # Operands are unchanged.


def test_addition_of_empty_meta_is_identity_on_costs():
  start = layer_meta.LayerMeta(layer_meta.Shapes([3]))
  a = layer_meta.LayerMeta(layer_meta.Shapes([5]), 1, 2, 3)
  assert start + a == a
  assert (start.flops, start.param_bytes, start.act_bytes) == (0, 0, 0)


def test_addition_with_other_types_raises():
  a = layer_meta.LayerMeta(layer_meta.Shapes([3]), 1, 2, 3)
  for other in (1, None, (1, 2)):
    with pytest.raises(TypeError):
      _ = a + other
  with pytest.raises(TypeError):
    sum([a, a])  # sum starts at 0.


def test_layer_meta_is_frozen():
  a = layer_meta.LayerMeta(layer_meta.Shapes([3]), 1, 2, 3)
  with pytest.raises(dataclasses.FrozenInstanceError):
    a.flops = 5
