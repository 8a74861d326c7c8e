"""Multi-headed scaled dot-product attention over batch-major sequences."""

from typing import Any, Optional, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import float32_islands
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core import precision
from lingvo_pipe.core.layers import shapes
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.core import weights

# The input projections, each [input_dim, hidden_dim] plus a bias.
_INPUT_PROJECTIONS = ('query', 'key', 'value')
# Softmax cost per logit: exponent, sum and normalization.
_SOFTMAX_FLOPS_PER_LOGIT = 3


class MultiHeadedAttention(base_layer.BaseLayer):
  """Multi-headed attention: project, attend per head, merge, project back.

  Inputs are batch-major: query [B, T, D], key and value [B, S, D]. Query,
  key and value are projected to the hidden dim H, split into num_heads heads
  of H / num_heads, attended with scaled dot products, merged and projected
  back to D. Variables: query_w, key_w, value_w [D, H], post_w [H, D] and
  their biases query_b, key_b, value_b [H], post_b [D].
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 0, 'Dimension D of query, key, value and output.')
    p.Define('hidden_dim', 0, 'Projected dimension H over all heads; '
             '0: input_dim.')
    p.Define('num_heads', 1, 'Number of heads; must divide hidden_dim.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    d, h = _Dims(self.params)
    zeros = weights.WeightInit.Constant(0.0)
    for name in _INPUT_PROJECTIONS:
      self.CreateVariable(f'{name}_w', weights.WeightParams([d, h]))
      self.CreateVariable(f'{name}_b', weights.WeightParams([h], init=zeros))
    self.CreateVariable('post_w', weights.WeightParams([h, d]))
    self.CreateVariable('post_b', weights.WeightParams([d], init=zeros))

  def FProp(self, theta: NestedMap, query_vec: tf.Tensor, key_vec: tf.Tensor,
            value_vec: tf.Tensor, paddings: Optional[tf.Tensor] = None,
            causal: bool = False) -> tf.Tensor:
    """Attends from query_vec to key_vec/value_vec.

    Args:
      theta: the layer's variables.
      query_vec: [B, T, D].
      key_vec: [B, S, D].
      value_vec: [B, S, D].
      paddings: optional [B, S]; 1.0 marks a padded key position, which no
        query attends to.
      causal: if True, query position t attends only key positions <= t (for
        self-attention of a decoder).

    Returns:
      The output, [B, T, D].
    """
    return self.FPropWithProbs(theta, query_vec, key_vec, value_vec, paddings,
                               causal)[0]

  def FPropWithProbs(self, theta: NestedMap, query_vec: tf.Tensor,
                     key_vec: tf.Tensor, value_vec: tf.Tensor,
                     paddings: Optional[tf.Tensor] = None,
                     causal: bool = False) -> Tuple[tf.Tensor, tf.Tensor]:
    """As FProp; returns (output [B, T, D], probabilities [B, N, T, S]).

    Projections and products run in the compute dtype (fprop_dtype; the
    inputs are cast to it); the softmax over the logits runs in float32
    (core/precision) and its probabilities are cast back, and under a
    reduced compute dtype the backward recomputes it from the logits
    (float32_islands) instead of keeping its float32 output.
    """
    p = self.params
    _CheckLastDim(p, query_vec=query_vec.shape, key_vec=key_vec.shape,
                  value_vec=value_vec.shape)
    dtype = self.fprop_dtype
    query_vec, key_vec, value_vec = (precision.CastFloat(x, dtype) for x in
                                     (query_vec, key_vec, value_vec))
    _, h = _Dims(p)
    q = _SplitHeads(_Project(query_vec, theta.query_w, theta.query_b),
                    p.num_heads)
    k = _SplitHeads(_Project(key_vec, theta.key_w, theta.key_b), p.num_heads)
    v = _SplitHeads(_Project(value_vec, theta.value_w, theta.value_b),
                    p.num_heads)
    q *= (h // p.num_heads)**-0.5
    logits = tf.einsum('btnh,bsnh->bnts', q, k)
    allowed = _AllowedMask(paddings, causal, shapes.Dim(q, 1), shapes.Dim(k, 1))

    def Probabilities(logits):
      logits = precision.Float32(logits)
      if allowed is not None:
        logits = tf.where(allowed, logits, -0.7 * logits.dtype.max)
      return tf.cast(tf.nn.softmax(logits, axis=-1), dtype)

    probs = (float32_islands.Island(Probabilities, logits) if precision.IsReduced(dtype)
             else Probabilities(logits))
    context = tf.einsum('bnts,bsnh->btnh', probs, v)
    context = tf.reshape(context, [shapes.Dim(context, 0), shapes.Dim(context, 1), h])
    return _Project(context, theta.post_w, theta.post_b), probs

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, query_shape: Any,
                key_shape: Any = None, value_shape: Any = None,
                paddings_shape: Any = None) -> layer_meta.LayerMeta:
    """Costs for query [B, T, D] and key/value [B, S, D] (default: query's).

    Flops count the four projections (with bias adds), the query scaling,
    the logits and weighted sum (a multiply-add counts 2) and the softmax
    (3 per logit). Activation bytes count the projected query, key and
    value, the logits, the probabilities, the merged context and the output.
    """
    del paddings_shape  # Masking does not change the counted costs.
    d, h = _Dims(params)
    query_shape = tf.TensorShape(query_shape)
    key_shape = tf.TensorShape(query_shape if key_shape is None else key_shape)
    value_shape = tf.TensorShape(
        key_shape if value_shape is None else value_shape)
    _CheckLastDim(params, query_vec=query_shape, key_vec=key_shape,
                  value_vec=value_shape)
    q_rows = layer_meta.NumElements(query_shape[:-1])
    kv_rows = layer_meta.NumElements(key_shape[:-1])
    logits = q_rows * key_shape[1] * params.num_heads
    projections = ((q_rows + 2 * kv_rows) * (2 * d * h + h)
                   + q_rows * (2 * h * d + d))
    flops = (projections + q_rows * h + 2 * 2 * logits * (h // params.num_heads)
             + _SOFTMAX_FLOPS_PER_LOGIT * logits)
    act_dtype = tf.as_dtype(params.fprop_dtype or params.dtype)
    act_elements = (q_rows + 2 * kv_rows) * h + 2 * logits + q_rows * (h + d)
    num_params = 3 * (d * h + h) + h * d + d
    return layer_meta.LayerMeta(
        out_shapes=(query_shape,), flops=flops,
        param_bytes=num_params * tf.as_dtype(params.dtype).size,
        act_bytes=act_elements * act_dtype.size)


def _Dims(params: hyperparams.Params) -> Tuple[int, int]:
  """Validates the dimensions; returns (input_dim, hidden_dim)."""
  d = params.input_dim
  h = params.hidden_dim or d
  if d <= 0 or h < 0:
    raise ValueError(f'MultiHeadedAttention {params.name!r}: input_dim ({d}) '
                     f'must be positive and hidden_dim ({params.hidden_dim}) '
                     'non-negative (0 means input_dim).')
  if params.num_heads <= 0 or h % params.num_heads:
    raise ValueError(f'MultiHeadedAttention {params.name!r}: num_heads '
                     f'({params.num_heads}) must be positive and divide '
                     f'hidden_dim ({h}); pick a divisor of {h}.')
  return d, h


def _CheckLastDim(params: hyperparams.Params, **shapes: Any) -> None:
  """Raises ValueError unless each named shape is [batch, time, input_dim]."""
  for name, shape in shapes.items():
    shape = tf.TensorShape(shape)
    if shape.rank is None:
      continue
    if shape.rank != 3 or shape[-1] not in (None, params.input_dim):
      raise ValueError(f'MultiHeadedAttention {params.name!r}: {name} must be '
                       f'[batch, time, input_dim={params.input_dim}], got '
                       f'shape {shape}.')


def _Project(x: tf.Tensor, w: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
  """x @ w + b on the last dim, with the weights cast to x's dtype."""
  return tf.einsum('btd,dh->bth', x, tf.cast(w, x.dtype)) + tf.cast(b, x.dtype)


def _SplitHeads(x: tf.Tensor, num_heads: int) -> tf.Tensor:
  """[B, T, H] -> [B, T, N, H / N]."""
  head_dim = x.shape[-1] // num_heads
  return tf.reshape(x, [shapes.Dim(x, 0), shapes.Dim(x, 1), num_heads, head_dim])


def _AllowedMask(paddings: Optional[tf.Tensor], causal: bool, t: tf.Tensor,
                 s: tf.Tensor) -> Optional[tf.Tensor]:
  """Bools broadcastable to [B, N, T, S]: True where a query may attend."""
  allowed = None
  if paddings is not None:
    allowed = (paddings < 0.5)[:, tf.newaxis, tf.newaxis, :]
  if causal:
    not_future = tf.range(t)[:, tf.newaxis] >= tf.range(s)[tf.newaxis, :]
    allowed = not_future if allowed is None else tf.logical_and(allowed,
                                                                not_future)
  return allowed
