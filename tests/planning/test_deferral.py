"""deferral: which weight gradients a deferring backward takes once per
step, by cell/deferred_grads' size rule, against shares worked by hand."""

import tensorflow as tf

from lingvo_pipe.core.layers import activations
from lingvo_pipe.core.layers import linear
from lingvo_pipe.planning import deferral


def _Projection(name, in_dim, out_dim):
  return linear.ProjectionLayer.Params().Set(
      name=name, input_dim=in_dim, output_dim=out_dim, activation=activations.Activation.TANH)


def test_a_projection_defers_where_its_factors_are_no_bigger_than_its_weight():
  """On 64 rows at M=8 (8 a micro-batch): 512 -> 2048 has factors of
  64 x 2560 elements, fewer than its 512 x 2048 weight's, so its gradient
  defers: the layer's share is the weight's bytes over the weight's and
  the bias's. 2048 -> 32 has factors of 64 x 2080, more than its 2048 x 32
  weight: nothing of it defers."""
  layers = [_Projection('wide', 512, 2048), _Projection('narrow', 2048, 32)]
  wide = layers[0].cls.FPropMeta(layers[0], tf.TensorShape([8, 512]))
  narrow = layers[1].cls.FPropMeta(layers[1], *wide.out_shapes)
  assert deferral.Shares([wide, narrow], num_micro=8) == [512 * 2048 / (512 * 2048 + 2048), 0.0]
  assert deferral.Deferred(wide, 8) == list(wide.projections) and len(wide.projections) == 1
