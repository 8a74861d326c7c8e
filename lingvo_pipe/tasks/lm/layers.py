"""A GPipe Transformer stack: embedding in the first cell, softmax in the last.

The paddings travel with the activations (CarryLayer), so any partition
into cells works; the labels never enter the cells: each micro-batch's
share of the weighted cross entropy is taken inside the pipeline, right
after the last cell's forward, from its logits and that micro-batch's
labels (PipeliningLayer.FPropWithLoss's loss_inputs), so every schedule
trains it.
"""

import math
from typing import Any, List

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core.layers import embedding
from lingvo_pipe.core.layers import transformer
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.core import precision
from lingvo_pipe.core import weights
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.pipelined_model import CarryLayer
from lingvo_pipe.pipeline.pipelined_model import PipelinedModel
from lingvo_pipe.pipeline.schedules.schedule import ScheduleKind


def Positions(length: int, dim: int, dtype: tf.DType) -> tf.Tensor:
  """Sinusoidal position encodings [length, dim] (Vaswani et al., 2017)."""
  pos = tf.range(length, dtype=tf.float32)[:, None]
  i = tf.range(dim // 2, dtype=tf.float32)[None, :]
  angle = pos / tf.pow(10000.0, 2.0 * i / dim)
  enc = tf.concat([tf.sin(angle), tf.cos(angle)], axis=1)
  if dim % 2:
    enc = tf.pad(enc, [[0, 0], [0, 1]])
  return tf.cast(enc, dtype)


class TokenEmbeddingStage(base_layer.BaseLayer):
  """(ids, paddings) -> (embeddings * sqrt(d) + positions, paddings): the
  first layer of a GPipe Transformer stack."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('vocab_size', 0, 'Vocabulary size.')
    p.Define('model_dim', 0, 'Embedding dimension.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    self.CreateChild('emb', embedding.EmbeddingLayer.Params().Set(
        vocab_size=p.vocab_size, embedding_dim=p.model_dim, scale_sqrt_depth=True,
        params_init=weights.WeightInit.Gaussian(1.0 / math.sqrt(p.model_dim))))

  def FProp(self, theta: NestedMap, ids: tf.Tensor, paddings: tf.Tensor) -> tuple:
    x = self.emb.FProp(theta.emb, ids)
    x += Positions(ids.shape[1], self.params.model_dim, x.dtype)[None]
    return x, paddings

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, ids_shape: Any,
                paddings_shape: Any) -> layer_meta.LayerMeta:
    ids_shape = tf.TensorShape(ids_shape)
    out = ids_shape.concatenate([params.model_dim])
    n = layer_meta.NumElements(out)
    return layer_meta.LayerMeta(
        (out, tf.TensorShape(paddings_shape)),
        flops=2 * n, param_bytes=params.vocab_size * params.model_dim *
        tf.as_dtype(params.dtype).size, act_bytes=layer_meta.Bytes([out, out], params.fprop_dtype or params.dtype))


class SoftmaxStage(base_layer.BaseLayer):
  """(x, paddings) -> (float32 logits, weights = 1 - paddings): the last
  layer of a GPipe Transformer stack; TokenLoss takes the cross entropy."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('softmax', embedding.SoftmaxLayer.Params(), 'SoftmaxLayer params.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    self.CreateChild('softmax', self.params.softmax)

  def FProp(self, theta: NestedMap, x: tf.Tensor, paddings: tf.Tensor) -> tuple:
    return precision.Float32(self.softmax.Logits(theta.softmax, x)), 1.0 - paddings

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, x_shape: Any,
                paddings_shape: Any) -> layer_meta.LayerMeta:
    sm = params.softmax.cls.FPropMeta(params.softmax, x_shape, paddings_shape)
    return layer_meta.LayerMeta((sm.out_shapes[0].logits, tf.TensorShape(paddings_shape)),
                                sm.flops, sm.param_bytes, sm.act_bytes)


def TokenLoss(pipeline: gpipe.PipeliningLayer, theta: NestedMap,
              softmax: embedding.SoftmaxLayer, paddings: tf.Tensor, labels: tf.Tensor,
              *inputs: tf.Tensor) -> NestedMap:
  """NestedMap(logits, per_token_loss, weights, loss) of a pipeline that
  ends in a SoftmaxStage, run on `inputs`: the loss is the mean cross
  entropy (of `softmax`'s targets) over the tokens `paddings` leaves,
  each micro-batch's share taken inside the pipeline from its logits and
  its labels (loss_inputs), so that any schedule trains it."""
  norm = tf.maximum(tf.reduce_sum(1.0 - paddings), 1.0)

  def MicroLoss(out: tuple, micro_labels: tf.Tensor) -> tf.Tensor:
    logits, weights = out
    per_token = softmax.CrossEntropy(tf.nn.log_softmax(logits), micro_labels)
    return tf.reduce_sum(per_token * weights) / norm

  loss, (logits, weights) = pipeline.FPropWithLoss(theta, MicroLoss, *inputs,
                                                   loss_inputs=labels)
  per_token = softmax.CrossEntropy(tf.nn.log_softmax(logits), labels)
  return NestedMap(logits=logits, per_token_loss=per_token, weights=weights, loss=loss)


def TokenLossShapes(logits: tf.TensorShape, weights: tf.TensorShape) -> NestedMap:
  """A token model's FProp output shapes (NestedMap(logits, per_token_loss,
  weights, loss)) from its softmax stage's."""
  return NestedMap(logits=logits, per_token_loss=weights, weights=weights,
                   loss=tf.TensorShape([]))


class GPipeTransformerStack(PipelinedModel):
  """A pipelined pre-LN Transformer language/sequence model: embedding in
  the first cell, `num_layers` Transformer layers, softmax in the last.

  FProp(theta, ids, paddings, labels) with [batch, time] inputs returns
  NestedMap(logits, per_token_loss, weights, loss).
  """

  # Trains every schedule: FProp runs the pipeline through FPropWithLoss
  # (read by the trainer's inspect_model planner).
  PIPELINE_SCHEDULES = tuple(ScheduleKind)

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('vocab_size', 256, 'Vocabulary size.')
    p.Define('model_dim', 64, 'Model dimension.')
    p.Define('num_heads', 4, 'Attention heads.')
    p.Define('hidden_dim', 256, 'Feed-forward hidden dimension.')
    p.Define('num_layers', 4, 'Number of Transformer layers.')
    p.Define('causal', True, 'Causal self-attention (a language model).')
    p.Define('residual_keep_prob', 1.0, 'Keep probability of residual dropout.')
    p.Define('label_smoothing', 0.0, 'Label smoothing of the softmax.')
    p.Define('batch_size', 8, 'Batch size (for partitioning by FLOPs).')
    p.Define('seq_len', 64, 'Sequence length.')
    return p

  @classmethod
  def PipelineParams(cls, p: hyperparams.Params) -> hyperparams.Params:
    """The PipeliningLayer params of the stack, layers and shapes filled in."""
    layers: List[hyperparams.Params] = [TokenEmbeddingStage.Params().Set(
        name='embedding', vocab_size=p.vocab_size, model_dim=p.model_dim)]
    for i in range(p.num_layers):
      layers.append(CarryLayer.Params().Set(
          name=f'layer_{i}', num_body_inputs=2,
          body=transformer.TransformerEncoderLayer.Params().Set(
              input_dim=p.model_dim, num_heads=p.num_heads,
              atten_hidden_dim=p.model_dim, hidden_dim=p.hidden_dim, causal=p.causal,
              residual_keep_prob=p.residual_keep_prob)))
    layers.append(SoftmaxStage.Params().Set(
        name='softmax', softmax=embedding.SoftmaxLayer.Params().Set(
            input_dim=p.model_dim, num_classes=p.vocab_size,
            label_smoothing=p.label_smoothing)))
    shape = [p.batch_size, p.seq_len]
    return p.pipeline.Copy().Set(name='pipeline', layers=layers,
                                 input_shapes=[shape, shape])

  def FProp(self, theta: NestedMap, ids: tf.Tensor, paddings: tf.Tensor,
            labels: tf.Tensor) -> NestedMap:
    return TokenLoss(self.pipeline, theta.pipeline, self.pipeline.layers[-1].softmax,
                     paddings, labels, ids, paddings)

  @classmethod
  def PipelineInputShapes(cls, ids: Any, paddings: Any, labels: Any) -> tuple:
    return ids, paddings

  @classmethod
  def OutputShapes(cls, logits: tf.TensorShape, weights: tf.TensorShape) -> NestedMap:
    return TokenLossShapes(logits, weights)
