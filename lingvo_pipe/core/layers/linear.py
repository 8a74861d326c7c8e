"""Dense layers: `ProjectionLayer` (affine map of the last dim) and `FeedForwardLayer`."""

import dataclasses
from typing import Any, List

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import custom_gradients
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core import precision
from lingvo_pipe.core.layers import activations
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.layers import shapes
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.core import weight_grad_deferral
from lingvo_pipe.core import weights

Activation = activations.Activation


def _CheckDims(params: hyperparams.Params) -> None:
  if params.input_dim <= 0 or params.output_dim <= 0:
    raise ValueError(f'ProjectionLayer {params.name!r} needs input_dim > 0 and '
                     f'output_dim > 0, got input_dim={params.input_dim}, '
                     f'output_dim={params.output_dim}.')
  activations.CheckActivation(params.activation,
                              f'ProjectionLayer {params.name!r}')


def _CheckInputShape(name: str, input_dim: int, shape: Any) -> tf.TensorShape:
  """Checks what is statically known of an input shape; returns it."""
  shape = tf.TensorShape(shape)
  if shape.rank is None:
    return shape
  if shape.rank < 2:
    raise ValueError(f'ProjectionLayer {name!r} needs inputs of rank >= 2 '
                     f'([..., input_dim={input_dim}]), got shape {shape}.')
  if shape[-1] is not None and shape[-1] != input_dim:
    raise ValueError(f'ProjectionLayer {name!r}: the input\'s last dim '
                     f'({shape[-1]}, shape {shape}) differs from input_dim '
                     f'({input_dim}); set input_dim = {shape[-1]} or fix the '
                     'input.')
  return shape


def AffineMeta(params: hyperparams.Params, out_shape: tf.TensorShape,
               num_weights: int) -> layer_meta.LayerMeta:
  """Cost of activation(x * w + b) where every output position (all dims of
  `out_shape` but the last) does one multiply-add with each weight.

  Counts 2 flops a multiply-add; if params.has_bias, 1 flop an output element
  for the bias; then the cost of params.activation (activations.
  ActivationMeta). The product, the biased sum and the activation each
  produce one tensor of `out_shape`. Parameters: `num_weights` plus, with a
  bias, out_shape[-1].

  Args:
    params: layer params with has_bias, activation, dtype and fprop_dtype.
    out_shape: the fully defined output shape.
    num_weights: the number of weights (not counting the bias).

  Returns:
    The LayerMeta of the layer.
  """
  outputs = layer_meta.NumElements(out_shape)
  positions = outputs // out_shape[-1]
  num_params = num_weights
  flops = 2 * positions * num_weights
  produced = outputs
  if params.has_bias:
    num_params += out_shape[-1]
    flops += outputs
    produced += outputs
  act_dtype = precision.ComputeDtype(params)
  affine = layer_meta.LayerMeta(
      out_shapes=(out_shape,), flops=flops,
      param_bytes=num_params * params.dtype.size,
      act_bytes=produced * act_dtype.size)
  return affine + activations.ActivationMeta(params.activation, out_shape,
                                             act_dtype)


def _MatMulByTransposed(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
  """a [n, k] times b [m, k] transposed -> [n, m].

  BatchMatMulV2 with adj_y: in TF 2.21 on CPU (oneDNN), MatMul with
  transpose_b runs several times slower (docs/benchmarks/profiles.md).
  """
  return tf.raw_ops.BatchMatMulV2(x=a, y=b, adj_y=True)


def _Claim(x: tf.Tensor, w: tf.Tensor):
  """(collector, index of w) if w's gradient is deferred, else (None, None)."""
  collector = weight_grad_deferral.Current()
  index = collector.Claim(w, x.shape[0]) if collector is not None else None
  return (collector, index) if index is not None else (None, None)


@custom_gradients.CustomGradient
def _MatMul(x: tf.Tensor, w: tf.Tensor):
  """x [n, i] @ w [i, o], whose input gradient avoids MatMul(transpose_b);
  its weight gradient x^T dy may be deferred (weight_grad_deferral)."""
  collector, index = _Claim(x, w)

  def Grad(dy):
    dx = _MatMulByTransposed(dy, w)
    if collector is not None:
      collector.Record(index, x, dy)
      return dx, None
    return dx, tf.matmul(x, dy, transpose_a=True)

  return tf.matmul(x, w), Grad


@custom_gradients.CustomGradient
def _MatMulTransposed(x: tf.Tensor, w: tf.Tensor):
  """x [n, i] @ w [o, i] transposed, without MatMul(transpose_b); its
  weight gradient dy^T x may be deferred (weight_grad_deferral)."""
  collector, index = _Claim(x, w)

  def Grad(dy):
    dx = tf.matmul(dy, w)
    if collector is not None:
      collector.Record(index, dy, x)
      return dx, None
    return dx, tf.matmul(dy, x, transpose_a=True)

  return _MatMulByTransposed(x, w), Grad


def ProjectLastDim(x: tf.Tensor, w: tf.Tensor, transpose_w: bool = False) -> tf.Tensor:
  """x [..., i] times w [i, o] (or w [o, i] with transpose_w) -> [..., o].

  A reshape to two dims and one matrix product: in TF 2.21 on CPU, einsum
  with an ellipsis runs far slower (docs/benchmarks/profiles.md). Static
  dims build no shape ops (shapes.Dim).
  """
  x = tf.convert_to_tensor(x)
  matmul = _MatMulTransposed if transpose_w else _MatMul
  if x.shape.rank == 2:
    return matmul(x, w)
  out_dim = w.shape[0] if transpose_w else w.shape[-1]
  flat = matmul(tf.reshape(x, [-1, shapes.Dim(x, -1)]), w)
  if x.shape.rank is None:
    return tf.reshape(flat, tf.concat([tf.shape(x)[:-1], [out_dim]], axis=0))
  leading = [shapes.Dim(x, i) for i in range(x.shape.rank - 1)]
  return tf.reshape(flat, leading + [out_dim])


class ProjectionLayer(base_layer.BaseLayer):
  """y = activation(x @ w + b), applied to the last dim of x (rank >= 2).

  Variables: 'w' [input_dim, output_dim] (p.params_init) and, if p.has_bias,
  'b' [output_dim] (zeros).
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 0, 'Size of the input\'s last dim.')
    p.Define('output_dim', 0, 'Size of the output\'s last dim.')
    p.Define('has_bias', True, 'If True, adds a bias b [output_dim].')
    p.Define('activation', Activation.NONE, 'An Activation applied last.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    _CheckDims(p)
    self.CreateVariable('w', weights.WeightParams([p.input_dim, p.output_dim]))
    if p.has_bias:
      self.CreateVariable('b', weights.WeightParams(
          [p.output_dim], init=weights.WeightInit.Constant(0.0)))

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    """Projects `inputs` [..., input_dim] to [..., output_dim], in the
    compute dtype (fprop_dtype): inputs and weights are cast to it.

    Raises:
      ValueError: if the static rank is < 2 or the last dim is not input_dim.
    """
    p = self.params
    _CheckInputShape(self.path, p.input_dim, inputs.shape)
    dtype = self.fprop_dtype
    out = ProjectLastDim(precision.CastFloat(inputs, dtype),
                         precision.CastFloat(theta.w, dtype))
    if p.has_bias:
      out += precision.CastFloat(theta.b, dtype)
    return activations.ApplyActivation(p.activation, out)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> layer_meta.LayerMeta:
    """Costs (see AffineMeta): 2 * rows * input_dim * output_dim flops for
    the matmul, plus the bias and the activation; the product is a
    deferrable Projection unless it computes in another dtype."""
    _CheckDims(params)
    shape = _CheckInputShape(params.name, params.input_dim, input_shape)
    out_shape = shape[:-1].concatenate([params.output_dim])
    meta = AffineMeta(params, out_shape, params.input_dim * params.output_dim)
    if precision.ComputeDtype(params) != params.dtype:
      return meta  # The product is by a cast of the weight: nothing defers.
    rows = layer_meta.NumElements(shape[:-1])
    return dataclasses.replace(meta, projections=(layer_meta.Projection(
        rows, params.input_dim, params.output_dim, params.dtype.size),))


class FeedForwardLayer(base_layer.BaseLayer):
  """Two projections: fc1(fc0(x)), fc0 with p.activation, fc1 without.

  Children: 'fc0' (input_dim -> hidden_dim) and 'fc1' (hidden_dim ->
  output_dim, or input_dim when output_dim is 0).
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 0, 'Size of the input\'s last dim.')
    p.Define('hidden_dim', 0, 'Size of the hidden layer.')
    p.Define('output_dim', 0, 'Size of the output\'s last dim; 0: input_dim.')
    p.Define('activation', Activation.RELU, 'Activation of the hidden layer.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    fc0, fc1 = self._ChildParams(self.params)
    self.CreateChild('fc0', fc0)
    self.CreateChild('fc1', fc1)

  @classmethod
  def _ChildParams(cls, params: hyperparams.Params) -> List[hyperparams.Params]:
    """Validates params; returns the params of fc0 and fc1."""
    if params.input_dim <= 0 or params.hidden_dim <= 0 or params.output_dim < 0:
      raise ValueError(
          f'FeedForwardLayer {params.name!r} needs input_dim > 0, hidden_dim '
          f'> 0 and output_dim >= 0 (0: input_dim), got input_dim='
          f'{params.input_dim}, hidden_dim={params.hidden_dim}, output_dim='
          f'{params.output_dim}.')
    output_dim = params.output_dim or params.input_dim
    dims = [(params.input_dim, params.hidden_dim, params.activation),
            (params.hidden_dim, output_dim, Activation.NONE)]
    return [
        ProjectionLayer.Params().Set(
            name=f'fc{i}', dtype=params.dtype, fprop_dtype=params.fprop_dtype,
            input_dim=d_in, output_dim=d_out, activation=act)
        for i, (d_in, d_out, act) in enumerate(dims)
    ]

  def FProp(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    hidden = self.fc0.FProp(theta.fc0, inputs)
    return self.fc1.FProp(theta.fc1, hidden)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                input_shape: Any) -> layer_meta.LayerMeta:
    return containers.ChainMeta(cls._ChildParams(params), (input_shape,))
