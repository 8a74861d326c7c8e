"""2-D convolutions on NHWC inputs: plain, depthwise and separable."""

import enum
import math
from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core import precision
from lingvo_pipe.core.layers import activations
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.layers import linear
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.core import weights

Activation = activations.Activation


class Padding(enum.Enum):
  """TensorFlow's padding algorithms for sliding windows."""
  SAME = 'SAME'    # out = ceil(in / stride); zeros around, the extra one after
  VALID = 'VALID'  # out = ceil((in - window + 1) / stride); no padding


def CheckPositiveInts(what: str, key: str, value: Any, length: int) -> Tuple[int, ...]:
  """Returns `value` as a tuple of `length` positive ints.

  Args:
    what: the owner of the value, for the error message (e.g. "Conv2DLayer 'c'").
    key: the param name, for the error message.
    value: the value to check.
    length: the required length.

  Raises:
    ValueError: if `value` is not `length` positive ints.
  """
  ok = (isinstance(value, (list, tuple)) and len(value) == length and
        all(isinstance(v, int) and not isinstance(v, bool) and v > 0
            for v in value))
  if not ok:
    raise ValueError(f'{what}: {key} must be {length} positive ints, got '
                     f'{value!r}.')
  return tuple(value)


def CheckPadding(what: str, padding: Any) -> Padding:
  """Returns `padding` if it is a Padding member.

  Raises:
    TypeError: otherwise.
  """
  if not isinstance(padding, Padding):
    raise TypeError(f'{what}: padding must be a Padding member (Padding.SAME or '
                    f'Padding.VALID), got {padding!r}.')
  return padding


def CheckNHWC(what: str, shape: Any, channels: Optional[int] = None) -> tf.TensorShape:
  """Checks what is statically known of an NHWC input shape; returns it.

  Raises:
    ValueError: if the rank is known and not 4, or the channel dim is known
      and differs from `channels` (when given).
  """
  shape = tf.TensorShape(shape)
  if shape.rank is None:
    return shape
  if shape.rank != 4:
    raise ValueError(f'{what} needs NHWC inputs of rank 4, got shape {shape}.')
  if channels is not None and shape[3] is not None and shape[3] != channels:
    raise ValueError(f'{what}: the input has {shape[3]} channels (shape '
                     f'{shape}) but the filter expects {channels}; fix '
                     'filter_shape[2] or the input.')
  return shape


def OutputSize(what: str, in_size: Optional[int], window: int, stride: int,
               padding: Padding) -> Optional[int]:
  """TensorFlow's output length of a sliding window along one dim.

  Returns None if `in_size` is None.

  Raises:
    ValueError: for VALID padding with a window larger than the input.
  """
  if in_size is None:
    return None
  if padding == Padding.SAME:
    return -(-in_size // stride)
  if window > in_size:
    raise ValueError(f'{what}: window {window} is larger than the input size '
                     f'{in_size} with VALID padding; use a smaller window or '
                     'Padding.SAME.')
  return (in_size - window) // stride + 1


def SpatialOutputShape(what: str, shape: tf.TensorShape, window: Sequence[int],
                       stride: Sequence[int], padding: Padding,
                       channels: Optional[int]) -> tf.TensorShape:
  """The NHWC output shape of a 2-D sliding window over an NHWC `shape`."""
  out_h = OutputSize(what, shape[1], window[0], stride[0], padding)
  out_w = OutputSize(what, shape[2], window[1], stride[1], padding)
  return tf.TensorShape([shape[0], out_h, out_w, channels])


def _DefineConvParams(p: hyperparams.Params, filter_doc: str) -> None:
  p.Define('filter_shape', (0, 0, 0, 0), filter_doc)
  p.Define('filter_stride', (1, 1), 'Strides (height, width).')
  p.Define('padding', Padding.SAME, 'A Padding member.')
  p.Define('has_bias', True, 'If True, adds a bias per output channel (zeros '
           'at init).')
  p.Define('activation', Activation.NONE, 'An Activation applied last.')


def _CheckConvParams(cls: type, params: hyperparams.Params) -> str:
  """Validates the params _DefineConvParams defines; returns the owner text."""
  what = f'{cls.__name__} {params.name!r}'
  CheckPositiveInts(what, 'filter_shape', params.filter_shape, 4)
  CheckPositiveInts(what, 'filter_stride', params.filter_stride, 2)
  CheckPadding(what, params.padding)
  activations.CheckActivation(params.activation, what)
  return what


class _BaseConv2DLayer(base_layer.BaseLayer):
  """A filter 'w' (p.filter_shape) slid over NHWC inputs, then an optional
  bias 'b' and an activation. Subclasses define the convolution op."""

  FILTER_DOC = ''

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    _DefineConvParams(p, cls.FILTER_DOC)
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    _CheckConvParams(type(self), p)
    self.CreateVariable('w', weights.WeightParams(p.filter_shape))
    if p.has_bias:
      self.CreateVariable('b', weights.WeightParams(
          [self.OutChannels(p)], init=weights.WeightInit.Constant(0.0)))

  @classmethod
  def OutChannels(cls, params: hyperparams.Params) -> int:
    """Number of output channels."""
    raise NotImplementedError(cls.__name__)

  def _Convolve(self, inputs: tf.Tensor, filters: tf.Tensor,
                strides: List[int]) -> tf.Tensor:
    raise NotImplementedError(type(self).__name__)

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    """Convolves NHWC `inputs`; returns [N, out_h, out_w, OutChannels].

    Raises:
      ValueError: if the static rank is not 4, the channels differ from
        filter_shape[2], or a VALID window is larger than the input.
    """
    p = self.params
    what = f'{type(self).__name__} {self.path!r}'
    shape = CheckNHWC(what, inputs.shape, p.filter_shape[2])
    SpatialOutputShape(what, shape, p.filter_shape[:2], p.filter_stride,
                       p.padding, self.OutChannels(p))
    stride_h, stride_w = p.filter_stride
    dtype = self.fprop_dtype
    out = self._Convolve(precision.CastFloat(inputs, dtype),
                         precision.CastFloat(theta.w, dtype),
                         [1, stride_h, stride_w, 1])
    if p.has_bias:
      out = tf.nn.bias_add(out, precision.CastFloat(theta.b, dtype))
    return activations.ApplyActivation(p.activation, out)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> layer_meta.LayerMeta:
    """Costs (see linear.AffineMeta): 2 * N * out_h * out_w *
    prod(filter_shape) flops for the convolution, plus the bias and the
    activation."""
    what = _CheckConvParams(cls, params)
    shape = CheckNHWC(what, input_shape, params.filter_shape[2])
    out_shape = SpatialOutputShape(what, shape, params.filter_shape[:2],
                                   params.filter_stride, params.padding,
                                   cls.OutChannels(params))
    return linear.AffineMeta(params, out_shape, math.prod(params.filter_shape))


class Conv2DLayer(_BaseConv2DLayer):
  """A 2-D convolution (tf.nn.conv2d) on NHWC inputs, plus bias and activation."""

  FILTER_DOC = 'Filter shape [height, width, in_channels, out_channels].'

  @classmethod
  def OutChannels(cls, params: hyperparams.Params) -> int:
    return params.filter_shape[3]

  def _Convolve(self, inputs: tf.Tensor, filters: tf.Tensor,
                strides: List[int]) -> tf.Tensor:
    return tf.nn.conv2d(inputs, filters, strides, self.params.padding.value)


class DepthwiseConv2DLayer(_BaseConv2DLayer):
  """A depthwise 2-D convolution: each input channel c is convolved with
  `multiplier` filters of its own; output channel c * multiplier + k."""

  FILTER_DOC = 'Filter shape [height, width, in_channels, multiplier].'

  @classmethod
  def OutChannels(cls, params: hyperparams.Params) -> int:
    return params.filter_shape[2] * params.filter_shape[3]

  def _Convolve(self, inputs: tf.Tensor, filters: tf.Tensor,
                strides: List[int]) -> tf.Tensor:
    padding = self.params.padding.value
    if strides[1] == strides[2]:
      return tf.nn.depthwise_conv2d(inputs, filters, strides, padding)
    # TensorFlow's CPU kernel refuses unequal strides unless oneDNN is on
    # (it is off on CPUs without AVX512-VNNI/BF16): pad as the strided window
    # does, slide at stride 1 and keep every stride-th row and column.
    if self.params.padding == Padding.SAME:
      inputs = tf.pad(inputs, [[0, 0], _SamePads(inputs, 1, filters.shape[0], strides[1]),
                               _SamePads(inputs, 2, filters.shape[1], strides[2]), [0, 0]])
    out = tf.nn.depthwise_conv2d(inputs, filters, [1, 1, 1, 1], 'VALID')
    return out[:, ::strides[1], ::strides[2], :]


def _SamePads(inputs: tf.Tensor, axis: int, window: int, stride: int) -> tf.Tensor:
  """[before, after]: the zeros SAME padding adds along `axis` (the extra one after)."""
  size = tf.shape(inputs)[axis]
  total = tf.maximum((-(-size // stride) - 1) * stride + window - size, 0)
  return tf.stack([total // 2, total - total // 2])


class SeparableConv2DLayer(base_layer.BaseLayer):
  """A depthwise convolution followed by a 1x1 (pointwise) convolution.

  Children: 'depthwise' (a DepthwiseConv2DLayer with the stride and padding,
  no bias, no activation) and 'pointwise' (a 1x1 Conv2DLayer with the bias
  and the activation).
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    _DefineConvParams(p, 'Filter shape [height, width, in_channels, '
                      'out_channels].')
    p.Define('depth_multiplier', 1, 'Depthwise filters per input channel.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    depthwise, pointwise = self._ChildParams(self.params)
    self.CreateChild('depthwise', depthwise)
    self.CreateChild('pointwise', pointwise)

  @classmethod
  def _ChildParams(cls, params: hyperparams.Params) -> List[hyperparams.Params]:
    """Validates params; returns the params of depthwise and pointwise."""
    what = _CheckConvParams(cls, params)
    multiplier = params.depth_multiplier
    if multiplier < 1:
      raise ValueError(f'{what}: depth_multiplier must be >= 1, got '
                       f'{multiplier}.')
    height, width, in_channels, out_channels = params.filter_shape
    inherited = dict(dtype=params.dtype, fprop_dtype=params.fprop_dtype)
    depthwise = DepthwiseConv2DLayer.Params().Set(
        name='depthwise', filter_shape=(height, width, in_channels, multiplier),
        filter_stride=params.filter_stride, padding=params.padding,
        has_bias=False, **inherited)
    pointwise = Conv2DLayer.Params().Set(
        name='pointwise',
        filter_shape=(1, 1, in_channels * multiplier, out_channels),
        has_bias=params.has_bias, activation=params.activation, **inherited)
    return [depthwise, pointwise]

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    hidden = self.depthwise.FProp(theta.depthwise, inputs)
    return self.pointwise.FProp(theta.pointwise, hidden)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> layer_meta.LayerMeta:
    return containers.ChainMeta(cls._ChildParams(params), (input_shape,))
