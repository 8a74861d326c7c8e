"""A tiny BaseLayer for the base_layer tests: y = x w + b."""

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import weights


class Affine(base_layer.BaseLayer):
  """y = x w + b, with b initialized to a constant."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('input_dim', 2, 'Input width.')
    p.Define('output_dim', 3, 'Output width.')
    return p

  def __init__(self, params):
    super().__init__(params)
    p = self.params
    self.CreateVariable('w', weights.WeightParams([p.input_dim, p.output_dim]))
    self.CreateVariable('b', weights.WeightParams(
        [p.output_dim], init=weights.WeightInit.Constant(0.5)))

  def FProp(self, theta, x):
    return tf.matmul(x, theta.w) + theta.b
