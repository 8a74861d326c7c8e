"""Token embedding lookup and the softmax output layer (optionally tied)."""

import math
from typing import Any

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core import precision
from lingvo_pipe.core.layers import linear
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.core import weights

# FLOPs per logit after the projection: log-softmax (max, subtract, exp, sum,
# subtract) and the cross entropy with the target distribution (multiply,
# sum). Work per row (log of the sum, the mean) is not counted.
_LOSS_FLOPS_PER_LOGIT = 7


def _CheckPositive(params: hyperparams.Params, *keys: str) -> None:
  for key in keys:
    if params.Get(key) <= 0:
      raise ValueError(f'{params.cls.__name__} {params.name!r}: p.{key} must '
                       f'be positive, got {params.Get(key)}.')


def _IntegerTensor(params: hyperparams.Params, what: str,
                   value: Any) -> tf.Tensor:
  """`value` as a tensor; raises TypeError unless its dtype is an integer."""
  value = tf.convert_to_tensor(value)
  if not value.dtype.is_integer:
    raise TypeError(f'{params.cls.__name__} {params.name!r}: {what} must be '
                    f'integer ids, got {value.dtype.name}; cast them, '
                    'e.g. with tf.cast(ids, tf.int32).')
  return value


class EmbeddingLayer(base_layer.BaseLayer):
  """Looks up rows of the embedding matrix emb [vocab_size, embedding_dim].

  FProp(theta, ids [...]) -> [..., embedding_dim] in the compute dtype
  (fprop_dtype; the rows of the matrix cast to it), multiplied by
  sqrt(embedding_dim) if p.scale_sqrt_depth (as in the Transformer). A tied
  SoftmaxLayer uses theta.emb as its output projection.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('vocab_size', 0, 'Number of rows (token ids 0..vocab_size-1).')
    p.Define('embedding_dim', 0, 'Size of each embedding vector.')
    p.Define('scale_sqrt_depth', False,
             'If True, outputs are multiplied by sqrt(embedding_dim).')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    _CheckPositive(p, 'vocab_size', 'embedding_dim')
    self.CreateVariable('emb', weights.WeightParams(
        [p.vocab_size, p.embedding_dim]))

  def FProp(self, theta: NestedMap, ids: Any) -> tf.Tensor:
    """Returns the embeddings of `ids` (integers in [0, vocab_size)).

    Raises:
      TypeError: if `ids` are not integers.
    """
    p = self.params
    outputs = tf.gather(precision.CastFloat(theta.emb, self.fprop_dtype),
                        _IntegerTensor(p, 'ids', ids))
    if p.scale_sqrt_depth:
      outputs *= math.sqrt(p.embedding_dim)
    return outputs

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params,
                ids_shape: Any) -> layer_meta.LayerMeta:
    """Metadata: act_bytes counts the gathered rows and, when scaling, the
    scaled copy (one multiply per element)."""
    _CheckPositive(params, 'vocab_size', 'embedding_dim')
    out_shape = tf.TensorShape(ids_shape).concatenate([params.embedding_dim])
    n = layer_meta.NumElements(out_shape)
    size = tf.as_dtype(params.dtype).size
    copies = 2 if params.scale_sqrt_depth else 1
    return layer_meta.LayerMeta(
        out_shapes=(out_shape,), flops=n if params.scale_sqrt_depth else 0,
        param_bytes=params.vocab_size * params.embedding_dim * size,
        act_bytes=copies * n * precision.ComputeDtype(params).size)


def SmoothedTargets(labels: tf.Tensor, num_classes: int, label_smoothing: float,
                    dtype: tf.DType) -> tf.Tensor:
  """One-hot targets with eps = label_smoothing spread uniformly:
  (1 - eps) * onehot + eps / num_classes."""
  off = label_smoothing / num_classes
  return tf.one_hot(labels, num_classes, on_value=1.0 - label_smoothing + off,
                    off_value=off, dtype=dtype)


class SoftmaxLayer(base_layer.BaseLayer):
  """Softmax output layer with a label-smoothed cross-entropy loss.

  Untied, logits = inputs @ w + b with its own w [input_dim, num_classes]
  and b [num_classes]. With p.tie_with_embedding the layer owns no
  variables: logits = inputs @ emb^T for the matrix emb
  [num_classes, input_dim] of an EmbeddingLayer, which the caller passes as
  theta.emb, so that one variable gets the gradients of both uses:

      out = softmax.FProp(NestedMap(emb=theta.embedding.emb), x, labels)

  With label smoothing eps the target distribution of label y is
  (1 - eps) * onehot(y) + eps / num_classes.

  The projection runs in the compute dtype (fprop_dtype); the logits are
  then cast to float32, and the log-softmax, the cross entropy and the loss
  are float32 whatever fprop_dtype is (core/precision): so are the logits
  and log_probs FProp returns.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('input_dim', 0, 'Size of the last dimension of the inputs.')
    p.Define('num_classes', 0, 'Number of classes (the vocabulary size when '
             'tied).')
    p.Define('label_smoothing', 0.0, 'Probability mass eps spread uniformly '
             'over all classes, in [0, 1).')
    p.Define('tie_with_embedding', False, 'If True, the layer has no weights '
             'and reads the embedding matrix from theta.emb (see the class '
             'docstring).')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    _CheckSoftmaxParams(p)
    if not p.tie_with_embedding:
      self.CreateVariable('w', weights.WeightParams(
          [p.input_dim, p.num_classes]))
      self.CreateVariable('b', weights.WeightParams(
          [p.num_classes], init=weights.WeightInit.Constant(0.0)))

  def Logits(self, theta: NestedMap, inputs: tf.Tensor) -> tf.Tensor:
    """Returns the logits [..., num_classes] of `inputs` [..., input_dim].

    Raises:
      ValueError: if the last dimension of `inputs` is not p.input_dim, or,
        when tied, theta.emb is missing or not [num_classes, input_dim].
    """
    p = self.params
    if inputs.shape[-1] != p.input_dim:
      raise ValueError(f'SoftmaxLayer {p.name!r}: inputs of shape '
                       f'{inputs.shape} do not end in p.input_dim = '
                       f'{p.input_dim}.')
    dtype = self.fprop_dtype
    inputs = precision.CastFloat(inputs, dtype)
    if not p.tie_with_embedding:
      return (linear.ProjectLastDim(inputs, precision.CastFloat(theta.w, dtype))
              + precision.CastFloat(theta.b, dtype))
    emb = theta.get('emb')
    expected = [p.num_classes, p.input_dim]
    if emb is None or emb.shape != expected:
      got = 'nothing' if emb is None else f'shape {emb.shape}'
      raise ValueError(
          f'SoftmaxLayer {p.name!r} is tied to an embedding: pass its matrix '
          f'{expected} as theta.emb, e.g. softmax.FProp(NestedMap('
          f'emb=theta.embedding.emb), x, labels); got {got}.')
    return linear.ProjectLastDim(inputs, precision.CastFloat(emb, dtype),
                                 transpose_w=True)

  def FProp(self, theta: NestedMap, inputs: tf.Tensor,
            labels: Any) -> NestedMap:
    """Returns NestedMap(logits, log_probs, per_example_loss, loss).

    Args:
      theta: the layer's theta (when tied, NestedMap(emb=...)).
      inputs: [..., input_dim].
      labels: integer class ids of shape inputs.shape[:-1], in
        [0, num_classes).

    Returns:
      logits and log_probs [..., num_classes]; per_example_loss [...], the
      cross entropy with the smoothed targets; loss, its mean.

    Raises:
      TypeError: if `labels` are not integers.
      ValueError: if the shapes do not fit (see Logits).
    """
    logits = precision.Float32(self.Logits(theta, inputs))
    log_probs = tf.nn.log_softmax(logits)
    per_example_loss = self.CrossEntropy(log_probs, labels)
    return NestedMap(logits=logits, log_probs=log_probs,
                     per_example_loss=per_example_loss,
                     loss=tf.reduce_mean(per_example_loss))

  def CrossEntropy(self, log_probs: tf.Tensor, labels: Any) -> tf.Tensor:
    """The cross entropy [...] of `log_probs` [..., num_classes] (the
    log-softmax of FProp's logits) with the smoothed targets of `labels`.

    Raises:
      TypeError: if `labels` are not integers.
      ValueError: if labels' shape is not log_probs' without its last dim.
    """
    p = self.params
    labels = _IntegerTensor(p, 'labels', labels)
    if not labels.shape.is_compatible_with(log_probs.shape[:-1]):
      raise ValueError(f'SoftmaxLayer {p.name!r}: labels of shape '
                       f'{labels.shape} must have the shape of the inputs '
                       f'without the last dim, {log_probs.shape[:-1]}.')
    targets = SmoothedTargets(labels, p.num_classes, p.label_smoothing,
                              log_probs.dtype)
    return -tf.reduce_sum(targets * log_probs, axis=-1)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, input_shape: Any,
                labels_shape: Any) -> layer_meta.LayerMeta:
    """Metadata: the projection (2 FLOPs per multiply-add, plus the bias
    when untied) and the loss; act_bytes counts the tensors of the output.

    Raises:
      ValueError: if labels_shape is not input_shape without its last dim.
    """
    _CheckSoftmaxParams(params)
    shape = tf.TensorShape(input_shape)
    labels_shape = tf.TensorShape(labels_shape)
    if shape[-1] != params.input_dim or labels_shape != shape[:-1]:
      raise ValueError(f'SoftmaxLayer {params.name!r}: inputs {shape} must '
                       f'end in p.input_dim = {params.input_dim} and labels '
                       f'{labels_shape} must be {shape[:-1]}.')
    rows = layer_meta.NumElements(labels_shape)
    logits = rows * params.num_classes
    flops = 2 * logits * params.input_dim + _LOSS_FLOPS_PER_LOGIT * logits
    param_bytes = 0
    size = tf.as_dtype(params.dtype).size
    if not params.tie_with_embedding:
      flops += logits
      param_bytes = (params.input_dim + 1) * params.num_classes * size
    # The loss side is float32 (class docstring); with a reduced compute
    # dtype the projection's logits come first in that dtype.
    act_bytes = (2 * logits + rows + 1) * max(size, 4)
    if precision.IsReduced(params.fprop_dtype):
      act_bytes += logits * precision.ComputeDtype(params).size
    logits_shape = labels_shape.concatenate([params.num_classes])
    out = NestedMap(logits=logits_shape, log_probs=logits_shape,
                    per_example_loss=labels_shape, loss=tf.TensorShape([]))
    return layer_meta.LayerMeta(
        out_shapes=(out,), flops=flops, param_bytes=param_bytes,
        act_bytes=act_bytes)


def _CheckSoftmaxParams(params: hyperparams.Params) -> None:
  _CheckPositive(params, 'input_dim', 'num_classes')
  if not 0.0 <= params.label_smoothing < 1.0:
    raise ValueError(f'SoftmaxLayer {params.name!r}: p.label_smoothing must '
                     f'be in [0, 1), got {params.label_smoothing}.')
