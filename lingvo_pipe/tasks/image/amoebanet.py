"""AmoebaNet-D (Real et al., arXiv 1802.01548), the paper's image model, as a
sequence of pipelineable layers for CIFAR-sized images.

The genotype is the published AmoebaNet-D one, with the normal-cell concat
of TensorFlow's reference implementation ([0, 3, 4, 6]), which GPipe used.
Each cell maps (state, previous state) to (new state, state), so any
partition works.
"""

import enum
from typing import Any, List, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core.layers import activations
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.layers import conv
from lingvo_pipe.core.layers import linear
from lingvo_pipe.core.layers import normalization
from lingvo_pipe.core.layers import pooling
from lingvo_pipe.core.nested_map import NestedMap


class Op(enum.Enum):
  NONE = 'none'
  CONV_1X1 = 'conv_1x1'
  CONV_3X3 = 'conv_3x3'
  CONV_1X7_7X1 = 'conv_1x7_7x1'
  MAX_POOL_2X2 = 'max_pool_2x2'
  MAX_POOL_3X3 = 'max_pool_3x3'
  AVG_POOL_3X3 = 'avg_pool_3x3'


# (input state, operation) pairs; consecutive pairs are summed into a state.
NORMAL_OPERATIONS = ((1, Op.CONV_1X1), (1, Op.MAX_POOL_3X3), (1, Op.NONE),
                     (0, Op.CONV_1X7_7X1), (0, Op.CONV_1X1), (0, Op.CONV_1X7_7X1),
                     (2, Op.MAX_POOL_3X3), (2, Op.NONE), (1, Op.AVG_POOL_3X3),
                     (5, Op.CONV_1X1))
NORMAL_CONCAT = (0, 3, 4, 6)
REDUCTION_OPERATIONS = ((0, Op.MAX_POOL_2X2), (0, Op.MAX_POOL_3X3), (2, Op.NONE),
                        (1, Op.CONV_3X3), (2, Op.CONV_1X7_7X1), (2, Op.MAX_POOL_3X3),
                        (3, Op.NONE), (1, Op.MAX_POOL_2X2), (2, Op.AVG_POOL_3X3),
                        (3, Op.CONV_1X1))
REDUCTION_CONCAT = (4, 5, 6)


def _Conv(cin: int, cout: int, kh: int, kw: int, sh: int = 1, sw: int = 1):
  return conv.Conv2DLayer.Params().Set(filter_shape=(kh, kw, cin, cout),
                                       filter_stride=(sh, sw), has_bias=False)


def ReluConvBn(cin: int, cout: int, op: Op = Op.CONV_1X1, stride: int = 1):
  """ReLU, the op's convolutions (stride on the last), batch norm."""
  if op == Op.CONV_1X7_7X1:
    convs = [_Conv(cin, cout, 1, 7, 1, stride), _Conv(cout, cout, 7, 1, stride, 1)]
  else:
    k = 3 if op == Op.CONV_3X3 else 1
    convs = [_Conv(cin, cout, k, k, stride, stride)]
  return containers.SequentialLayer.Params().Set(sub=[
      activations.ActivationLayer.Params().Set(name='relu'), *convs,
      normalization.BatchNormLayer.Params().Set(name='bn', dim=cout, decay=0.9)])


def _OpParams(op: Op, channels: int, stride: int) -> hyperparams.Params:
  if op in (Op.CONV_1X1, Op.CONV_3X3, Op.CONV_1X7_7X1):
    return ReluConvBn(channels, channels, op, stride)
  if op == Op.NONE:
    if stride != 1:
      raise ValueError(f'Op.NONE cannot have stride {stride}.')
    return activations.ActivationLayer.Params().Set(
        activation=activations.Activation.NONE)
  window = 2 if op == Op.MAX_POOL_2X2 else 3
  kind = pooling.PoolingType.AVG if op == Op.AVG_POOL_3X3 else pooling.PoolingType.MAX
  return pooling.PoolingLayer.Params().Set(
      pooling_type=kind, window_shape=(window, window),
      window_stride=(stride, stride), padding=conv.Padding.SAME)


class FactorizedReduce(base_layer.BaseLayer):
  """Halves height and width: ReLU, two stride-2 1x1 convs (the second on
  the input shifted by one pixel), concatenated, batch norm."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('cin', 0, 'Input channels.')
    p.Define('cout', 0, 'Output channels (even).')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    half = p.cout // 2
    self.CreateChild('conv_a', _Conv(p.cin, half, 1, 1, 2, 2))
    self.CreateChild('conv_b', _Conv(p.cin, p.cout - half, 1, 1, 2, 2))
    self.CreateChild('bn', normalization.BatchNormLayer.Params().Set(dim=p.cout, decay=0.9))

  def FPropWithUpdates(self, theta: NestedMap, x: tf.Tensor) -> Tuple[tf.Tensor, NestedMap]:
    x = tf.nn.relu(x)
    shifted = tf.pad(x[:, 1:, 1:, :], [[0, 0], [0, 1], [0, 1], [0, 0]])
    y = tf.concat([self.conv_a.FProp(theta.conv_a, x),
                   self.conv_b.FProp(theta.conv_b, shifted)], axis=-1)
    y, updates = self.bn.FPropWithUpdates(theta.bn, y)
    return y, NestedMap(bn=updates)

  def FProp(self, theta: NestedMap, x: tf.Tensor) -> tf.Tensor:
    return self.FPropWithUpdates(theta, x)[0]

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, shape: Any) -> layer_meta.LayerMeta:
    half = params.cout // 2
    a = _Conv(params.cin, half, 1, 1, 2, 2)
    b = _Conv(params.cin, params.cout - half, 1, 1, 2, 2)
    ma, mb = a.cls.FPropMeta(a, shape), b.cls.FPropMeta(b, shape)
    out = ma.out_shapes[0][:-1].concatenate([params.cout])
    bn = normalization.BatchNormLayer.Params().Set(dim=params.cout)
    mbn = bn.cls.FPropMeta(bn, out)
    return layer_meta.LayerMeta((out,), ma.flops + mb.flops + mbn.flops,
                                ma.param_bytes + mb.param_bytes + mbn.param_bytes,
                                ma.act_bytes + mb.act_bytes + mbn.act_bytes)


class AmoebaCell(base_layer.BaseLayer):
  """A normal or reduction cell: (s1, s2) -> (concat of chosen states, s1)."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('channels_prev_prev', 0, 'Channels of s2.')
    p.Define('channels_prev', 0, 'Channels of s1.')
    p.Define('channels', 0, 'Channels of every operation.')
    p.Define('reduction', False, 'A reduction cell (halves height and width).')
    p.Define('reduction_prev', False, 'Whether the previous cell reduced.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    self.CreateChild('reduce1', ReluConvBn(p.channels_prev, p.channels))
    self.CreateChild('reduce2', _Reduce2(p))
    self.CreateChildren('ops', [_OpParams(op, p.channels, _Stride(p, index))
                                for index, op in _Genotype(p)[0]])

  def FPropWithUpdates(self, theta: NestedMap, s1: tf.Tensor,
                       s2: tf.Tensor) -> Tuple[tuple, NestedMap]:
    operations, concat = _Genotype(self.params)
    h1, u1 = self.reduce1.FPropWithUpdates(theta.reduce1, s1)
    h2, u2 = self.reduce2.FPropWithUpdates(theta.reduce2, s2)
    states, op_updates = [h1, h2], []
    for i in range(0, len(operations), 2):
      summed = 0
      for j in (i, i + 1):
        out, upd = self.ops[j].FPropWithUpdates(theta.ops[j], states[operations[j][0]])
        summed += out
        op_updates.append(upd)
      states.append(summed)
    new = tf.concat([states[i] for i in concat], axis=-1)
    return (new, s1), NestedMap(reduce1=u1, reduce2=u2, ops=op_updates)

  def FProp(self, theta: NestedMap, s1: tf.Tensor, s2: tf.Tensor) -> tuple:
    return self.FPropWithUpdates(theta, s1, s2)[0]

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, s1_shape: Any,
                s2_shape: Any) -> layer_meta.LayerMeta:
    operations, concat = _Genotype(params)
    r1 = containers.ChainMeta([ReluConvBn(params.channels_prev, params.channels)], (s1_shape,))
    r2p = _Reduce2(params)
    r2 = r2p.cls.FPropMeta(r2p, s2_shape)
    total = layer_meta.LayerMeta((), r1.flops + r2.flops, r1.param_bytes + r2.param_bytes,
                                 r1.act_bytes + r2.act_bytes)
    shapes = [r1.out_shapes[0], r2.out_shapes[0]]
    for i in range(0, len(operations), 2):
      for index, op in operations[i:i + 2]:
        opp = _OpParams(op, params.channels, _Stride(params, index))
        total = total + opp.cls.FPropMeta(opp, shapes[index])
      shapes.append(total.out_shapes[0])
    out = shapes[concat[0]][:-1].concatenate([params.channels * len(concat)])
    return layer_meta.LayerMeta((out, tf.TensorShape(s1_shape)), total.flops,
                                total.param_bytes,
                                total.act_bytes + layer_meta.Bytes([out], params.dtype))


def _Genotype(p: hyperparams.Params):
  return ((REDUCTION_OPERATIONS, REDUCTION_CONCAT) if p.reduction else
          (NORMAL_OPERATIONS, NORMAL_CONCAT))


def _Stride(p: hyperparams.Params, state_index: int) -> int:
  return 2 if p.reduction and state_index < 2 else 1


def _Reduce2(p: hyperparams.Params) -> hyperparams.Params:
  if p.reduction_prev:
    return FactorizedReduce.Params().Set(cin=p.channels_prev_prev, cout=p.channels)
  if p.channels_prev_prev != p.channels:
    return ReluConvBn(p.channels_prev_prev, p.channels)
  return activations.ActivationLayer.Params().Set(activation=activations.Activation.NONE)


class Stem(base_layer.BaseLayer):
  """images -> (x, x): a 3x3 convolution and batch norm, as both states."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('image_channels', 3, 'Input channels.')
    p.Define('channels', 0, 'Output channels.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    self.CreateChild('conv', _Conv(p.image_channels, p.channels, 3, 3))
    self.CreateChild('bn', normalization.BatchNormLayer.Params().Set(dim=p.channels, decay=0.9))

  def FPropWithUpdates(self, theta: NestedMap, images: tf.Tensor) -> Tuple[tuple, NestedMap]:
    x, updates = self.bn.FPropWithUpdates(theta.bn, self.conv.FProp(theta.conv, images))
    return (x, x), NestedMap(bn=updates)

  def FProp(self, theta: NestedMap, images: tf.Tensor) -> tuple:
    return self.FPropWithUpdates(theta, images)[0]

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, shape: Any) -> layer_meta.LayerMeta:
    meta = containers.ChainMeta([
        _Conv(params.image_channels, params.channels, 3, 3),
        normalization.BatchNormLayer.Params().Set(dim=params.channels)], (shape,))
    return layer_meta.LayerMeta(meta.out_shapes * 2, meta.flops, meta.param_bytes,
                                meta.act_bytes)


class Head(base_layer.BaseLayer):
  """(x, previous state) -> logits: ReLU, global average pool, projection."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('channels', 0, 'Input channels.')
    p.Define('num_classes', 10, 'Classes.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    self.CreateChild('proj', linear.ProjectionLayer.Params().Set(
        input_dim=p.channels, output_dim=p.num_classes))

  def FProp(self, theta: NestedMap, x: tf.Tensor, prev: tf.Tensor) -> tf.Tensor:
    del prev
    return self.proj.FProp(theta.proj, tf.reduce_mean(tf.nn.relu(x), axis=[1, 2]))

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, shape: Any, prev: Any) -> layer_meta.LayerMeta:
    proj = linear.ProjectionLayer.Params().Set(input_dim=params.channels,
                                               output_dim=params.num_classes)
    pooled = tf.TensorShape([tf.TensorShape(shape)[0], params.channels])
    meta = proj.cls.FPropMeta(proj, pooled)
    return meta + layer_meta.LayerMeta(meta.out_shapes, 2 * layer_meta.NumElements(shape))


def AmoebaNetDLayers(num_normal_cells: int, num_filters: int, num_classes: int,
                     image_channels: int = 3) -> List[hyperparams.Params]:
  """Stem, 3 stacks of `num_normal_cells` normal cells with a reduction cell
  between stacks, and the head: AmoebaNet-D(N=num_normal_cells,
  F=num_filters) for GPipeConvNetClassifier (each maps (state, previous
  state) on; the stem takes the images, the head makes the logits)."""
  if num_normal_cells < 1 or num_filters < 4 or num_filters % 4:
    raise ValueError(f'AmoebaNet-D needs num_normal_cells >= 1 and num_filters '
                     f'a positive multiple of 4; got {num_normal_cells}, {num_filters}.')
  channels = num_filters // 4
  layers = [Stem.Params().Set(name='stem', image_channels=image_channels,
                              channels=channels)]
  prev_prev = prev = channels
  reduction_prev = False
  for stack in range(3):
    kinds = ([True] if stack else []) + [False] * num_normal_cells
    for i, reduction in enumerate(kinds):
      channels *= 2 if reduction else 1
      cell = AmoebaCell.Params().Set(channels_prev_prev=prev_prev, channels_prev=prev,
                                     channels=channels, reduction=reduction,
                                     reduction_prev=reduction_prev)
      name = f'stack{stack}_reduction' if reduction else f'stack{stack}_normal{i}'
      layers.append(cell.Set(name=name))
      prev_prev, prev = prev, channels * len(_Genotype(cell)[1])
      reduction_prev = reduction
  layers.append(Head.Params().Set(name='head', channels=prev, num_classes=num_classes))
  return layers
