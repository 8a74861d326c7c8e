"""Containers: Sequential, Repeat and a residual wrapper."""

import dataclasses
from typing import Any, List, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core import precision
from lingvo_pipe.core.nested_map import NestedMap


def AsTuple(outputs: Any) -> tuple:
  """A layer's outputs as the argument tuple of the next layer."""
  return outputs if isinstance(outputs, tuple) else (outputs,)


def UnwrapSingle(outputs: tuple) -> Any:
  return outputs[0] if len(outputs) == 1 else outputs


def ChainMeta(layer_params: List[hyperparams.Params],
              input_shapes: tuple) -> layer_meta.LayerMeta:
  """Sums the metadata of layers applied one after another."""
  total = layer_meta.LayerMeta(out_shapes=tuple(input_shapes))
  for p in layer_params:
    total = total + p.cls.FPropMeta(p, *total.out_shapes)
  return total


class SequentialLayer(base_layer.BaseLayer):
  """Applies sublayers one after another; a tuple output feeds as several
  inputs to the next layer."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('sub', [], 'Params of the sublayers, in order.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    if not self.params.sub:
      raise ValueError(f'SequentialLayer {self.params.name!r} has no sublayers; '
                       'set p.sub to a non-empty list of layer params.')
    self.CreateChildren('sub', self.params.sub)

  def FProp(self, theta: NestedMap, *inputs: Any) -> Any:
    outputs = inputs
    for layer, layer_theta in zip(self.sub, theta.sub):
      outputs = AsTuple(layer.FProp(layer_theta, *outputs))
    return UnwrapSingle(outputs)

  def FPropWithUpdates(self, theta: NestedMap, *inputs: Any) -> Tuple[Any, NestedMap]:
    outputs = inputs
    updates = []
    for layer, layer_theta in zip(self.sub, theta.sub):
      out, upd = layer.FPropWithUpdates(layer_theta, *outputs)
      outputs = AsTuple(out)
      updates.append(upd)
    return UnwrapSingle(outputs), NestedMap(sub=updates)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, *input_shapes: Any) -> layer_meta.LayerMeta:
    return ChainMeta(params.sub, input_shapes)


class RepeatLayer(SequentialLayer):
  """Applies `repeat` copies of one body layer (each with its own weights)."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('body', None, 'Params of the layer to repeat.')
    p.Define('repeat', 1, 'Number of copies of body.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    _CheckRepeat(params)
    params = params.Copy().Set(sub=[params.body] * params.repeat)
    super().__init__(params)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, *input_shapes: Any) -> layer_meta.LayerMeta:
    _CheckRepeat(params)
    return ChainMeta([params.body] * params.repeat, input_shapes)


def _CheckRepeat(params: hyperparams.Params) -> None:
  if params.body is None or params.repeat < 1:
    raise ValueError(f'RepeatLayer {params.name!r} needs p.body set and '
                     f'p.repeat >= 1 (got body={params.body is not None}, '
                     f'repeat={params.repeat}).')


class ResidualLayer(base_layer.BaseLayer):
  """out = x + body(x), for a body whose output has the input's shape."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('body', None, 'Params of the residual branch.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    if self.params.body is None:
      raise ValueError(f'ResidualLayer {self.params.name!r} needs p.body.')
    self.CreateChild('body', self.params.body)

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    """inputs + body(inputs), in the compute dtype (inputs are cast to it)."""
    inputs = precision.CastFloat(inputs, self.fprop_dtype)
    return inputs + self.body.FProp(theta.body, inputs)

  def FPropWithUpdates(self, theta: NestedMap, inputs: tf.Tensor) -> Tuple[Any, NestedMap]:
    inputs = precision.CastFloat(inputs, self.fprop_dtype)
    out, updates = self.body.FPropWithUpdates(theta.body, inputs)
    return inputs + out, NestedMap(body=updates)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, input_shape: Any) -> layer_meta.LayerMeta:
    body = params.body.cls.FPropMeta(params.body, input_shape)
    (out_shape,) = body.out_shapes
    if tf.TensorShape(out_shape) != tf.TensorShape(input_shape):
      raise ValueError(f'ResidualLayer {params.name!r}: body output shape '
                       f'{out_shape} differs from input shape {input_shape}.')
    n = layer_meta.NumElements(input_shape)
    return dataclasses.replace(
        body, out_shapes=(tf.TensorShape(input_shape),), flops=body.flops + n,
        act_bytes=body.act_bytes + layer_meta.Bytes(
            [input_shape], precision.ComputeDtype(params)))
