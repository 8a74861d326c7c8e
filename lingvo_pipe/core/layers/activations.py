"""Elementwise activation functions: the `Activation` enum and `ActivationLayer`."""

import enum
from typing import Any

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core import precision
from lingvo_pipe.core.nested_map import NestedMap


class Activation(enum.Enum):
  """An elementwise nonlinearity."""
  NONE = 'none'        # identity
  RELU = 'relu'        # max(x, 0)
  RELU6 = 'relu6'      # min(max(x, 0), 6)
  GELU = 'gelu'        # x * Phi(x), exact (erf), not the tanh approximation
  TANH = 'tanh'
  SIGMOID = 'sigmoid'  # 1 / (1 + exp(-x))
  SWISH = 'swish'      # x * sigmoid(x) (also called SiLU)


_FUNCTIONS = {
    Activation.NONE: lambda x: x,
    Activation.RELU: tf.nn.relu,
    Activation.RELU6: tf.nn.relu6,
    Activation.GELU: lambda x: tf.nn.gelu(x, approximate=False),
    Activation.TANH: tf.tanh,
    Activation.SIGMOID: tf.sigmoid,
    Activation.SWISH: tf.nn.silu,
}

# Planning estimate of the floating-point operations per element: each
# arithmetic op, comparison or transcendental function (exp, erf) counts 1.
FLOPS_PER_ELEMENT = {
    Activation.NONE: 0,
    Activation.RELU: 1,     # max
    Activation.RELU6: 2,    # max, min
    Activation.GELU: 5,     # div, erf, add, mul, mul
    Activation.TANH: 5,     # mul, exp, sub, add, div
    Activation.SIGMOID: 4,  # neg, exp, add, div
    Activation.SWISH: 5,    # sigmoid, mul
}


def CheckActivation(activation: Any, what: str) -> Activation:
  """Returns `activation` if it is an Activation.

  Args:
    activation: the value to check.
    what: the owner of the value, for the error message (e.g. "layer 'fc'").

  Raises:
    TypeError: if `activation` is not an Activation member.
  """
  if not isinstance(activation, Activation):
    raise TypeError(f'{what}: activation must be an Activation member (e.g. '
                    f'Activation.RELU), got {activation!r} of type '
                    f'{type(activation).__name__}.')
  return activation


def ApplyActivation(activation: Activation, x: tf.Tensor) -> tf.Tensor:
  """Returns `activation` applied elementwise to `x` (NONE returns x itself).

  Raises:
    TypeError: if `activation` is not an Activation member.
  """
  return _FUNCTIONS[CheckActivation(activation, 'ApplyActivation')](x)


def ActivationMeta(activation: Activation, shape: Any,
                   dtype: tf.DType) -> layer_meta.LayerMeta:
  """Cost of applying `activation` to a tensor of `shape` and `dtype`.

  NONE costs nothing and produces no tensor; the others produce one tensor
  of the input's shape.

  Raises:
    TypeError: if `activation` is not an Activation member.
    ValueError: if `shape` is not fully defined.
  """
  CheckActivation(activation, 'ActivationMeta')
  n = layer_meta.NumElements(shape)
  produced = 0 if activation == Activation.NONE else n
  return layer_meta.LayerMeta(
      out_shapes=layer_meta.Shapes(shape),
      flops=n * FLOPS_PER_ELEMENT[activation],
      act_bytes=produced * tf.as_dtype(dtype).size)


class ActivationLayer(base_layer.BaseLayer):
  """Applies an Activation elementwise to an input of any shape."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('activation', Activation.RELU, 'An Activation member.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    CheckActivation(self.params.activation, f'ActivationLayer {self.params.name!r}')

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    del theta  # No variables.
    return ApplyActivation(self.params.activation,
                           precision.CastFloat(inputs, self.fprop_dtype))

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> layer_meta.LayerMeta:
    CheckActivation(params.activation, f'ActivationLayer {params.name!r}')
    return ActivationMeta(params.activation, input_shape,
                          params.fprop_dtype or params.dtype)
