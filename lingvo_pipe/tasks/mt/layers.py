"""A pipelined Transformer encoder-decoder (the paper's translation family).

Every layer maps the carried tuple (source, source paddings, target, target
paddings) to the same tuple: the embedding fills both sequences, encoder
layers rewrite the source, decoder layers rewrite the target while
attending to the source, and the softmax ends it. So any partition into
cells works, and encoder and decoder layers may share a cell. The labels
reach the loss beside the pipeline (lm_layers.TokenLoss), never the cells.
"""

from typing import Any, List

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core.layers import embedding
from lingvo_pipe.core.layers import transformer
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline import pipelined_model
from lingvo_pipe.pipeline.schedules.schedule import ScheduleKind
from lingvo_pipe.tasks.lm import layers as lm_layers


class Seq2SeqEmbeddingStage(base_layer.BaseLayer):
  """(src ids, src paddings, tgt ids, tgt paddings) -> embeddings of both
  sequences (one shared table) plus positions, the paddings unchanged."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('vocab_size', 0, 'Vocabulary size (shared by both sides).')
    p.Define('model_dim', 0, 'Embedding dimension.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    self.CreateChild('tokens', lm_layers.TokenEmbeddingStage.Params().Set(
        vocab_size=p.vocab_size, model_dim=p.model_dim))

  def FProp(self, theta: NestedMap, src_ids: tf.Tensor, src_paddings: tf.Tensor,
            tgt_ids: tf.Tensor, tgt_paddings: tf.Tensor) -> tuple:
    src, _ = self.tokens.FProp(theta.tokens, src_ids, src_paddings)
    tgt, _ = self.tokens.FProp(theta.tokens, tgt_ids, tgt_paddings)
    return src, src_paddings, tgt, tgt_paddings

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, *shapes: Any) -> layer_meta.LayerMeta:
    tokens = lm_layers.TokenEmbeddingStage.Params().Set(
        vocab_size=params.vocab_size, model_dim=params.model_dim, dtype=params.dtype)
    src = tokens.cls.FPropMeta(tokens, shapes[0], shapes[1])
    tgt = tokens.cls.FPropMeta(tokens, shapes[2], shapes[3])
    out = (src.out_shapes[0], tf.TensorShape(shapes[1]), tgt.out_shapes[0],
           tf.TensorShape(shapes[3]))
    return layer_meta.LayerMeta(out, src.flops + tgt.flops, src.param_bytes,
                                src.act_bytes + tgt.act_bytes)


class DecoderStage(base_layer.BaseLayer):
  """Rewrites the target with a TransformerDecoderLayer attending to the
  source; the rest of the carried tuple passes through."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('decoder', transformer.TransformerDecoderLayer.Params(),
             'The decoder layer.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    self.CreateChild('decoder', self.params.decoder)

  def FProp(self, theta: NestedMap, src: tf.Tensor, src_paddings: tf.Tensor,
            tgt: tf.Tensor, tgt_paddings: tf.Tensor) -> tuple:
    tgt = self.decoder.FProp(theta.decoder, tgt, src, src_paddings, tgt_paddings)
    return src, src_paddings, tgt, tgt_paddings

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, *shapes: Any) -> layer_meta.LayerMeta:
    dec = params.decoder.cls.FPropMeta(params.decoder, shapes[2], shapes[0],
                                       shapes[1], shapes[3])
    return layer_meta.LayerMeta(tuple(tf.TensorShape(s) for s in shapes),
                                dec.flops, dec.param_bytes, dec.act_bytes)


class Seq2SeqSoftmaxStage(base_layer.BaseLayer):
  """(src, src paddings, tgt, tgt paddings) -> (float32 logits, weights) of
  the target (lm_layers.SoftmaxStage)."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('softmax', embedding.SoftmaxLayer.Params(), 'SoftmaxLayer params.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    self.CreateChild('softmax', lm_layers.SoftmaxStage.Params().Set(
        softmax=self.params.softmax))

  def FProp(self, theta: NestedMap, src: tf.Tensor, src_paddings: tf.Tensor,
            tgt: tf.Tensor, tgt_paddings: tf.Tensor) -> tuple:
    return self.softmax.FProp(theta.softmax, tgt, tgt_paddings)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, *shapes: Any) -> layer_meta.LayerMeta:
    stage = lm_layers.SoftmaxStage.Params().Set(softmax=params.softmax)
    return stage.cls.FPropMeta(stage, shapes[2], shapes[3])


class GPipeTransformerSeq2Seq(pipelined_model.PipelinedModel):
  """Pipelined encoder-decoder: embedding, encoder layers, decoder layers,
  softmax. FProp(theta, src_ids, src_paddings, tgt_ids, tgt_paddings,
  labels), all [batch, time], returns NestedMap(logits, per_token_loss,
  weights, loss)."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('vocab_size', 256, 'Vocabulary size (shared).')
    p.Define('model_dim', 64, 'Model dimension.')
    p.Define('num_heads', 4, 'Attention heads.')
    p.Define('hidden_dim', 256, 'Feed-forward hidden dimension.')
    p.Define('num_encoder_layers', 2, 'Encoder layers.')
    p.Define('num_decoder_layers', 2, 'Decoder layers.')
    p.Define('residual_keep_prob', 1.0, 'Keep probability of residual dropout.')
    p.Define('label_smoothing', 0.0, 'Label smoothing of the softmax.')
    p.Define('batch_size', 8, 'Batch size (for partitioning by FLOPs).')
    p.Define('src_len', 32, 'Source length.')
    p.Define('tgt_len', 32, 'Target length.')
    return p

  @classmethod
  def PipelineParams(cls, p: hyperparams.Params) -> hyperparams.Params:
    dims = dict(input_dim=p.model_dim, num_heads=p.num_heads,
                atten_hidden_dim=p.model_dim, hidden_dim=p.hidden_dim,
                residual_keep_prob=p.residual_keep_prob)
    layers: List[hyperparams.Params] = [Seq2SeqEmbeddingStage.Params().Set(
        name='embedding', vocab_size=p.vocab_size, model_dim=p.model_dim)]
    layers += [pipelined_model.CarryLayer.Params().Set(
        name=f'encoder_{i}', num_body_inputs=2,
        body=transformer.TransformerEncoderLayer.Params().Set(**dims))
               for i in range(p.num_encoder_layers)]
    layers += [DecoderStage.Params().Set(
        name=f'decoder_{i}',
        decoder=transformer.TransformerDecoderLayer.Params().Set(**dims))
               for i in range(p.num_decoder_layers)]
    layers.append(Seq2SeqSoftmaxStage.Params().Set(
        name='softmax', softmax=embedding.SoftmaxLayer.Params().Set(
            input_dim=p.model_dim, num_classes=p.vocab_size,
            label_smoothing=p.label_smoothing)))
    src, tgt = [p.batch_size, p.src_len], [p.batch_size, p.tgt_len]
    return p.pipeline.Copy().Set(name='pipeline', layers=layers,
                                 input_shapes=[src, src, tgt, tgt])

  # Trains every schedule: FProp runs the pipeline through FPropWithLoss.
  PIPELINE_SCHEDULES = tuple(ScheduleKind)

  def FProp(self, theta: NestedMap, src_ids: tf.Tensor, src_paddings: tf.Tensor,
            tgt_ids: tf.Tensor, tgt_paddings: tf.Tensor, labels: tf.Tensor) -> NestedMap:
    return lm_layers.TokenLoss(self.pipeline, theta.pipeline,
                               self.pipeline.layers[-1].softmax.softmax, tgt_paddings,
                               labels, src_ids, src_paddings, tgt_ids, tgt_paddings)

  @classmethod
  def PipelineInputShapes(cls, *input_shapes: Any) -> tuple:
    return input_shapes[:4]  # the labels reach only the loss

  @classmethod
  def OutputShapes(cls, logits: tf.TensorShape, weights: tf.TensorShape) -> NestedMap:
    return lm_layers.TokenLossShapes(logits, weights)
