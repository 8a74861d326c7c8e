"""Pre-LayerNorm Transformer layers: encoder (or decoder-only) and decoder."""

from typing import Any, Callable, Dict, Optional, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core import precision
from lingvo_pipe.core.layers import activations
from lingvo_pipe.core.layers import attention
from lingvo_pipe.core.layers import dropout
from lingvo_pipe.core.layers import linear
from lingvo_pipe.core.layers import normalization
from lingvo_pipe.core.nested_map import NestedMap


class _PreLnTransformerBase(base_layer.BaseLayer):
  """Residual blocks x + dropout(body(layer_norm(x))) with shared params.

  Each block NAME owns children NAME_ln (LayerNorm), NAME (the body) and
  NAME_dropout (DropoutLayer). Subclasses list their attention blocks in
  _ATTENTION_BLOCKS; a feed-forward block 'ffn' always comes last.
  """

  _ATTENTION_BLOCKS: Tuple[str, ...] = ()

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 0, 'Model dimension D of inputs and outputs.')
    p.Define('num_heads', 1, 'Attention heads; must divide atten_hidden_dim.')
    p.Define('atten_hidden_dim', 0, 'Projected dimension of the attention '
             'over all heads; 0: input_dim.')
    p.Define('hidden_dim', 0, 'Hidden dimension of the feed-forward block.')
    p.Define('activation', activations.Activation.RELU,
             'Activation of the feed-forward hidden layer.')
    p.Define('residual_keep_prob', 1.0, 'Keep probability of the dropout on '
             'each block\'s output before the residual add; 1.0: none.')
    p.Define('ln_epsilon', 1e-6, 'Epsilon of the layer norms.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    for name, child in self._ChildParams(self.params).items():
      self.CreateChild(name, child)

  @classmethod
  def _ChildParams(
      cls, params: hyperparams.Params) -> Dict[str, hyperparams.Params]:
    """The children's params by name, in creation order."""
    if params.input_dim <= 0 or params.hidden_dim <= 0:
      raise ValueError(f'{cls.__name__} {params.name!r} needs input_dim > 0 '
                       f'and hidden_dim > 0 (the feed-forward width), got '
                       f'input_dim={params.input_dim}, '
                       f'hidden_dim={params.hidden_dim}.')
    d = params.input_dim
    bodies = {
        name: attention.MultiHeadedAttention.Params().Set(
            input_dim=d, hidden_dim=params.atten_hidden_dim,
            num_heads=params.num_heads) for name in cls._ATTENTION_BLOCKS
    }
    bodies['ffn'] = linear.FeedForwardLayer.Params().Set(
        input_dim=d, hidden_dim=params.hidden_dim,
        activation=params.activation)
    children = {}
    for name, body in bodies.items():
      children[f'{name}_ln'] = normalization.LayerNorm.Params().Set(
          input_dim=d, epsilon=params.ln_epsilon)
      children[name] = body
      # Attention takes batch-major inputs, so examples are axis 0.
      children[f'{name}_dropout'] = dropout.DropoutLayer.Params().Set(
          keep_prob=params.residual_keep_prob, example_axis=0)
    # FPropMeta reads these before CreateChild would copy them.
    for child in children.values():
      child.Set(dtype=params.dtype, fprop_dtype=params.fprop_dtype)
    return children

  def _Block(self, theta: NestedMap, name: str, x: tf.Tensor,
             body: Callable[[base_layer.BaseLayer, NestedMap, tf.Tensor],
                            tf.Tensor]) -> tf.Tensor:
    """x + dropout(body(layer, layer_theta, layer_norm(x))) of block `name`."""
    ln, drop = f'{name}_ln', f'{name}_dropout'
    x = precision.CastFloat(x, self.fprop_dtype)
    normed = getattr(self, ln).FProp(theta[ln], x)
    out = body(getattr(self, name), theta[name], normed)
    return x + getattr(self, drop).FProp(theta[drop], out)

  def _FeedForward(self, theta: NestedMap, x: tf.Tensor) -> tf.Tensor:
    return self._Block(theta, 'ffn', x, lambda l, t, y: l.FProp(t, y))

  @classmethod
  def _Meta(cls, params: hyperparams.Params, input_shape: Any,
            atten_shapes: Dict[str, tuple]) -> layer_meta.LayerMeta:
    """Sums the blocks' metadata; atten_shapes[name] are the key, value and
    paddings shapes of attention block `name` (its query is the input)."""
    children = cls._ChildParams(params)
    shape = tf.TensorShape(input_shape)
    size = tf.as_dtype(params.fprop_dtype or params.dtype).size
    n = layer_meta.NumElements(shape)
    residual_add = layer_meta.LayerMeta(out_shapes=(shape,), flops=n,
                                        act_bytes=n * size)
    total = layer_meta.LayerMeta(out_shapes=(shape,))
    for name in cls._ATTENTION_BLOCKS + ('ffn',):
      extra = atten_shapes.get(name, ())
      for child, shapes in ((f'{name}_ln', ()), (name, extra),
                            (f'{name}_dropout', ())):
        p = children[child]
        total += p.cls.FPropMeta(p, shape, *shapes)
      total += residual_add
    return total


class TransformerEncoderLayer(_PreLnTransformerBase):
  """Pre-LN Transformer encoder layer: self-attention, then feed-forward.

  x = x + dropout(self_atten(ln(x))); y = x + dropout(ffn(ln(x))). With
  p.causal the self-attention is causal and the layer is a decoder-only
  language model layer.
  """

  _ATTENTION_BLOCKS = ('self_atten',)

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('causal', False, 'If True, position t attends only to <= t.')
    return p

  def FProp(self, theta: NestedMap, inputs: tf.Tensor,
            paddings: Optional[tf.Tensor] = None) -> tf.Tensor:
    """Encodes inputs.

    Args:
      theta: the layer's theta.
      inputs: [B, T, D].
      paddings: optional [B, T]; 1.0 marks a padded position, which is not
        attended to.

    Returns:
      The output, [B, T, D].
    """
    causal = self.params.causal
    x = self._Block(theta, 'self_atten', inputs,
                    lambda l, t, y: l.FProp(t, y, y, y, paddings, causal))
    return self._FeedForward(theta, x)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, input_shape: Any,
                paddings_shape: Any = None) -> layer_meta.LayerMeta:
    """Costs for inputs [B, T, D] in training (dropout active)."""
    return cls._Meta(params, input_shape, {
        'self_atten': (input_shape, input_shape, paddings_shape)})


class TransformerDecoderLayer(_PreLnTransformerBase):
  """Pre-LN Transformer decoder layer: causal self-attention, attention on
  the encoder outputs, then feed-forward; each block as in the encoder."""

  _ATTENTION_BLOCKS = ('self_atten', 'cross_atten')

  def FProp(self, theta: NestedMap, inputs: tf.Tensor, aux_vecs: tf.Tensor,
            aux_paddings: Optional[tf.Tensor],
            paddings: Optional[tf.Tensor] = None) -> tf.Tensor:
    """Decodes inputs, attending to the encoder outputs.

    Args:
      theta: the layer's theta.
      inputs: [B, T, D], the target sequence.
      aux_vecs: [B, S, D], the encoder outputs.
      aux_paddings: [B, S] or None; 1.0 marks a padded source position.
      paddings: optional [B, T]; 1.0 marks a padded target position.

    Returns:
      The output, [B, T, D].
    """
    x = self._Block(theta, 'self_atten', inputs,
                    lambda l, t, y: l.FProp(t, y, y, y, paddings, True))
    x = self._Block(
        theta, 'cross_atten', x,
        lambda l, t, y: l.FProp(t, y, aux_vecs, aux_vecs, aux_paddings))
    return self._FeedForward(theta, x)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, input_shape: Any,
                aux_shape: Any, aux_paddings_shape: Any = None,
                paddings_shape: Any = None) -> layer_meta.LayerMeta:
    """Costs for inputs [B, T, D] and encoder outputs [B, S, D] in training."""
    return cls._Meta(params, input_shape, {
        'self_atten': (input_shape, input_shape, paddings_shape),
        'cross_atten': (aux_shape, aux_shape, aux_paddings_shape)})
