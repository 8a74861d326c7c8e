"""Example params and inputs of every layer class in lingvo_pipe, for the
conformance tests (test_conformance.py), and the classes exempt from them."""

import dataclasses
from typing import Any, Dict, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.layers import activations
from lingvo_pipe.core.layers import attention
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.layers import conv
from lingvo_pipe.core.layers import dropout
from lingvo_pipe.core.layers import embedding
from lingvo_pipe.core.layers import keras_layer
from lingvo_pipe.core.layers import linear
from lingvo_pipe.core.layers import normalization
from lingvo_pipe.core.layers import pooling
from lingvo_pipe.core.layers import transformer
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline import pipelined_model
from lingvo_pipe.pipeline.layout import cells
from lingvo_pipe.tasks.image import amoebanet
from lingvo_pipe.tasks.image import layers as image_layers
from lingvo_pipe.tasks.image import model as image_model
from lingvo_pipe.tasks.lm import layers as lm_layers
from lingvo_pipe.tasks.lm import model as lm_model
from lingvo_pipe.tasks.mt import layers as mt_layers
from lingvo_pipe.tasks.mt import model as mt_model


@dataclasses.dataclass(frozen=True)
class In:
  """An example input: normal floats, int32 ids below `vocab` (> 0), or
  zeros (paddings)."""
  shape: Tuple[int, ...]
  vocab: int = 0
  zeros: bool = False


def F(*shape: int) -> In:
  return In(shape)


def Ids(vocab: int, *shape: int) -> In:
  return In(shape, vocab=vocab)


def Pad(*shape: int) -> In:
  return In(shape, zeros=True)


@dataclasses.dataclass(frozen=True)
class Example:
  """Params of a layer and the inputs of its FProp (In leaves, possibly in
  a NestedMap). FPropMeta is checked unless `meta_exempt` says why it does
  not apply."""
  params: hyperparams.Params
  inputs: Tuple[Any, ...]
  meta_exempt: str = ''


def _P(cls: type, **kwargs: Any) -> hyperparams.Params:
  kwargs.setdefault('name', 'layer')
  return cls.Params().Set(**kwargs)


def _Proj(dim_in: int, dim_out: int) -> hyperparams.Params:
  return _P(linear.ProjectionLayer, input_dim=dim_in, output_dim=dim_out)


_TRANSFORMER = dict(input_dim=8, num_heads=2, atten_hidden_dim=8, hidden_dim=16,
                    residual_keep_prob=0.8)
_TASK = 'a task maps a batch to metrics; the planner reads its model\'s FPropMeta'
def _Pipelined(cls: type, **kwargs: Any) -> hyperparams.Params:
  """A PipelinedModel's params, K=2 and M=2."""
  p = _P(cls, **kwargs)
  p.pipeline.Set(num_partitions=2, num_micro_batches=2)
  return p


def _LmStack() -> hyperparams.Params:
  return _Pipelined(lm_layers.GPipeTransformerStack, vocab_size=16, model_dim=8,
                    num_heads=2, hidden_dim=16, num_layers=2, batch_size=4, seq_len=3,
                    residual_keep_prob=0.8)


def _Seq2Seq() -> hyperparams.Params:
  return _Pipelined(mt_layers.GPipeTransformerSeq2Seq, vocab_size=16, model_dim=8,
                    num_heads=2, hidden_dim=16, num_encoder_layers=1,
                    num_decoder_layers=1, batch_size=4, src_len=5, tgt_len=3)


def _Classifier() -> hyperparams.Params:
  layers = [_P(conv.Conv2DLayer, name='conv', filter_shape=(3, 3, 3, 4)),
            _P(pooling.GlobalPoolingLayer, name='pool'),
            _P(linear.ProjectionLayer, name='proj', input_dim=4, output_dim=5)]
  return _Pipelined(image_layers.GPipeConvNetClassifier, layers=layers, num_classes=5,
                    input_shape=[4, 6, 6, 3])


_SEQ2SEQ_STAGE_INPUTS = (F(2, 5, 8), Pad(2, 5), F(2, 3, 8), Pad(2, 3))
_LM_BATCH = NestedMap(ids=Ids(16, 4, 3), paddings=Pad(4, 3), labels=Ids(16, 4, 3))
_MT_INPUTS = (Ids(16, 4, 5), Pad(4, 5), Ids(16, 4, 3), Pad(4, 3), Ids(16, 4, 3))

# Per layer class, one or more examples.
EXAMPLES: Dict[type, Tuple[Example, ...]] = {
    activations.ActivationLayer: (
        Example(_P(activations.ActivationLayer, activation=activations.Activation.GELU),
                (F(2, 3),)),),
    attention.MultiHeadedAttention: (
        Example(_P(attention.MultiHeadedAttention, input_dim=8, hidden_dim=8, num_heads=2),
                (F(2, 3, 8), F(2, 4, 8), F(2, 4, 8), Pad(2, 4))),),
    containers.SequentialLayer: (
        Example(_P(containers.SequentialLayer, sub=[
            _Proj(4, 5), _P(activations.ActivationLayer, name='act')]), (F(2, 4),)),),
    containers.RepeatLayer: (
        Example(_P(containers.RepeatLayer, body=_Proj(4, 4), repeat=2), (F(2, 4),)),),
    containers.ResidualLayer: (
        Example(_P(containers.ResidualLayer, body=_Proj(4, 4)), (F(2, 4),)),),
    conv.Conv2DLayer: (
        Example(_P(conv.Conv2DLayer, filter_shape=(3, 3, 2, 4), filter_stride=(2, 2)),
                (F(2, 5, 5, 2),)),),
    conv.DepthwiseConv2DLayer: (
        Example(_P(conv.DepthwiseConv2DLayer, filter_shape=(3, 3, 2, 2),
                   padding=conv.Padding.VALID), (F(2, 5, 5, 2),)),),
    conv.SeparableConv2DLayer: (
        Example(_P(conv.SeparableConv2DLayer, filter_shape=(3, 3, 2, 4),
                   depth_multiplier=2), (F(2, 5, 5, 2),)),),
    dropout.DropoutLayer: (
        Example(_P(dropout.DropoutLayer, keep_prob=0.5), (F(2, 3),)),),
    embedding.EmbeddingLayer: (
        Example(_P(embedding.EmbeddingLayer, vocab_size=10, embedding_dim=4),
                (Ids(10, 2, 3),)),),
    embedding.SoftmaxLayer: (
        Example(_P(embedding.SoftmaxLayer, input_dim=4, num_classes=6, label_smoothing=0.1),
                (F(2, 3, 4), Ids(6, 2, 3))),),
    linear.ProjectionLayer: (Example(_Proj(4, 3), (F(2, 4),)),),
    keras_layer.KerasLayer: (Example(_P(keras_layer.KerasLayer, factory=tf.keras.layers.LayerNormalization,
                                        input_shapes=[[None, 4]]), (F(2, 4),)),),
    linear.FeedForwardLayer: (
        Example(_P(linear.FeedForwardLayer, input_dim=4, hidden_dim=8), (F(2, 3, 4),)),),
    normalization.LayerNorm: (
        Example(_P(normalization.LayerNorm, input_dim=4), (F(2, 4),)),),
    normalization.BatchNormLayer: (
        Example(_P(normalization.BatchNormLayer, dim=3), (F(2, 4, 4, 3),)),),
    pooling.PoolingLayer: (
        Example(_P(pooling.PoolingLayer, pooling_type=pooling.PoolingType.AVG,
                   padding=conv.Padding.SAME, window_shape=(3, 3)), (F(2, 5, 5, 3),)),),
    pooling.GlobalPoolingLayer: (
        Example(_P(pooling.GlobalPoolingLayer), (F(2, 4, 4, 3),)),),
    transformer.TransformerEncoderLayer: (
        Example(_P(transformer.TransformerEncoderLayer, causal=True, **_TRANSFORMER),
                (F(2, 3, 8), Pad(2, 3))),),
    transformer.TransformerDecoderLayer: (
        Example(_P(transformer.TransformerDecoderLayer, **_TRANSFORMER),
                (F(2, 3, 8), F(2, 4, 8), Pad(2, 4), Pad(2, 3))),),
    gpipe.PipeliningLayer: (
        Example(_P(gpipe.PipeliningLayer, layers=[
            _P(linear.ProjectionLayer, name=f'p{i}', input_dim=8, output_dim=8)
            for i in range(4)], num_partitions=2, num_micro_batches=2,
                   input_shapes=[[4, 8]]), (F(4, 8),)),),
    pipelined_model.CarryLayer: (
        Example(_P(pipelined_model.CarryLayer, body=_Proj(4, 6)), (F(2, 4), F(2, 3))),),
    amoebanet.FactorizedReduce: (
        Example(_P(amoebanet.FactorizedReduce, cin=4, cout=6), (F(2, 4, 4, 4),)),),
    amoebanet.AmoebaCell: (
        Example(_P(amoebanet.AmoebaCell, channels_prev_prev=8, channels_prev=8,
                   channels=8), (F(2, 4, 4, 8), F(2, 4, 4, 8))),
        Example(_P(amoebanet.AmoebaCell, channels_prev_prev=4, channels_prev=8,
                   channels=8, reduction=True, reduction_prev=True),
                (F(2, 4, 4, 8), F(2, 8, 8, 4)))),
    amoebanet.Stem: (Example(_P(amoebanet.Stem, channels=4), (F(2, 8, 8, 3),)),),
    amoebanet.Head: (
        Example(_P(amoebanet.Head, channels=8, num_classes=5),
                (F(2, 4, 4, 8), F(2, 4, 4, 8))),),
    image_layers.GPipeConvNetClassifier: (
        Example(_Classifier(), (F(4, 6, 6, 3), Ids(5, 4))),),
    image_model.ImageClassificationTask: (
        Example(_P(image_model.ImageClassificationTask, classifier=_Classifier()),
                (NestedMap(images=F(4, 6, 6, 3), labels=Ids(5, 4)),), meta_exempt=_TASK),),
    lm_layers.TokenEmbeddingStage: (
        Example(_P(lm_layers.TokenEmbeddingStage, vocab_size=10, model_dim=4),
                (Ids(10, 2, 3), Pad(2, 3))),),
    lm_layers.SoftmaxStage: (
        Example(_P(lm_layers.SoftmaxStage, softmax=_P(embedding.SoftmaxLayer, input_dim=4,
                                                     num_classes=10)),
                (F(2, 3, 4), Pad(2, 3))),),
    lm_layers.GPipeTransformerStack: (
        Example(_LmStack(), (Ids(16, 4, 3), Pad(4, 3), Ids(16, 4, 3))),),
    lm_model.LanguageModelTask: (
        Example(_P(lm_model.LanguageModelTask, stack=_LmStack()), (_LM_BATCH,),
                meta_exempt=_TASK),),
    mt_layers.Seq2SeqEmbeddingStage: (
        Example(_P(mt_layers.Seq2SeqEmbeddingStage, vocab_size=6, model_dim=8),
                (Ids(6, 2, 5), Pad(2, 5), Ids(6, 2, 3), Pad(2, 3))),),
    mt_layers.DecoderStage: (
        Example(_P(mt_layers.DecoderStage, decoder=_P(
            transformer.TransformerDecoderLayer, **_TRANSFORMER)), _SEQ2SEQ_STAGE_INPUTS),),
    mt_layers.Seq2SeqSoftmaxStage: (
        Example(_P(mt_layers.Seq2SeqSoftmaxStage, softmax=_P(
            embedding.SoftmaxLayer, input_dim=8, num_classes=6)), _SEQ2SEQ_STAGE_INPUTS),),
    mt_layers.GPipeTransformerSeq2Seq: (
        Example(_Seq2Seq(), _MT_INPUTS),),
    mt_model.TranslationTask: (
        Example(_P(mt_model.TranslationTask, model=_Seq2Seq()), (NestedMap(
            src_ids=Ids(16, 4, 5), src_paddings=Pad(4, 5), tgt_ids=Ids(16, 4, 3),
            tgt_paddings=Pad(4, 3), labels=Ids(16, 4, 3)),), meta_exempt=_TASK),),
}

# Layer classes without examples, and why.
EXEMPT: Dict[type, str] = {
    base_layer.BaseLayer: 'the abstract base: no FProp',
    conv._BaseConv2DLayer: 'abstract: its subclasses define _Convolve',
    transformer._PreLnTransformerBase: 'abstract: its subclasses define FProp',
    pipelined_model.PipelinedModel: 'abstract: its subclasses define PipelineParams',
    cells.CellView: 'a view of a PipeliningLayer\'s layers, built by it (its tests)',
}
