"""Spatial pooling on NHWC inputs: windowed (`PoolingLayer`) and global."""

import enum
from typing import Any

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core import precision
from lingvo_pipe.core.layers import conv
from lingvo_pipe.core.nested_map import NestedMap

Padding = conv.Padding


class PoolingType(enum.Enum):
  """How the values of a window are reduced."""
  MAX = 'MAX'
  AVG = 'AVG'  # mean over the window's elements inside the input (padding excluded)


def _CheckPoolingType(what: str, pooling_type: Any) -> PoolingType:
  if not isinstance(pooling_type, PoolingType):
    raise TypeError(f'{what}: pooling_type must be a PoolingType member '
                    f'(PoolingType.MAX or PoolingType.AVG), got {pooling_type!r}.')
  return pooling_type


class PoolingLayer(base_layer.BaseLayer):
  """Max or average pooling over windows of H and W; keeps N and C."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('pooling_type', PoolingType.MAX, 'A PoolingType member.')
    p.Define('window_shape', (2, 2), 'Window (height, width).')
    p.Define('window_stride', (2, 2), 'Strides (height, width).')
    p.Define('padding', Padding.VALID, 'A conv.Padding member.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    self._CheckParams(self.params)

  @classmethod
  def _CheckParams(cls, params: hyperparams.Params) -> str:
    """Validates params; returns the owner text for messages."""
    what = f'{cls.__name__} {params.name!r}'
    _CheckPoolingType(what, params.pooling_type)
    conv.CheckPositiveInts(what, 'window_shape', params.window_shape, 2)
    conv.CheckPositiveInts(what, 'window_stride', params.window_stride, 2)
    conv.CheckPadding(what, params.padding)
    return what

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    """Pools NHWC `inputs`; returns [N, out_h, out_w, C].

    Raises:
      ValueError: if the static rank is not 4 or a VALID window is larger
        than the input.
    """
    del theta  # No variables.
    p = self.params
    what = f'{type(self).__name__} {self.path!r}'
    shape = conv.CheckNHWC(what, inputs.shape)
    conv.SpatialOutputShape(what, shape, p.window_shape, p.window_stride,
                            p.padding, shape[3])
    pool = (tf.nn.max_pool2d
            if p.pooling_type == PoolingType.MAX else tf.nn.avg_pool2d)
    return pool(precision.CastFloat(inputs, self.fprop_dtype), ksize=list(p.window_shape),
                strides=list(p.window_stride), padding=p.padding.value)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> layer_meta.LayerMeta:
    """Costs 1 flop a window element at every output element; produces the
    output."""
    what = cls._CheckParams(params)
    shape = conv.CheckNHWC(what, input_shape)
    out_shape = conv.SpatialOutputShape(what, shape, params.window_shape,
                                        params.window_stride, params.padding,
                                        shape[3])
    outputs = layer_meta.NumElements(out_shape)
    window_h, window_w = params.window_shape
    return layer_meta.LayerMeta(
        out_shapes=(out_shape,), flops=outputs * window_h * window_w,
        act_bytes=layer_meta.Bytes([out_shape],
                                   params.fprop_dtype or params.dtype))


class GlobalPoolingLayer(base_layer.BaseLayer):
  """Max or average over H and W: NHWC -> [N, C]."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('pooling_type', PoolingType.AVG, 'A PoolingType member.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    _CheckPoolingType(f'GlobalPoolingLayer {self.params.name!r}',
                      self.params.pooling_type)

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    """Reduces NHWC `inputs` over H and W; returns [N, C].

    Raises:
      ValueError: if the static rank is not 4.
    """
    del theta  # No variables.
    p = self.params
    conv.CheckNHWC(f'GlobalPoolingLayer {self.path!r}', inputs.shape)
    reduce = (tf.reduce_max
              if p.pooling_type == PoolingType.MAX else tf.reduce_mean)
    return reduce(precision.CastFloat(inputs, self.fprop_dtype), axis=[1, 2])

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> layer_meta.LayerMeta:
    """Costs 1 flop an input element; produces the output."""
    what = f'GlobalPoolingLayer {params.name!r}'
    _CheckPoolingType(what, params.pooling_type)
    shape = conv.CheckNHWC(what, input_shape)
    out_shape = tf.TensorShape([shape[0], shape[3]])
    return layer_meta.LayerMeta(
        out_shapes=(out_shape,), flops=layer_meta.NumElements(shape),
        act_bytes=layer_meta.Bytes([out_shape],
                                   params.fprop_dtype or params.dtype))
