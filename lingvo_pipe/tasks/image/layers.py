"""A pipelined convnet classifier: labels travel with the activations and
the last cell takes the softmax cross entropy."""

from typing import Any

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core.layers import embedding
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline.pipelined_model import CarryLayer
from lingvo_pipe.pipeline.pipelined_model import PipelinedModel


class GPipeConvNetClassifier(PipelinedModel):
  """A pipelined sequential image classifier: `layers` map NHWC images to
  logits [batch, num_classes] and are split into cells; labels travel with
  the activations and the last cell takes the softmax cross entropy.

  FProp(theta, images, labels) returns NestedMap(logits, per_example_loss,
  loss).
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('layers', [], 'Layer params from images to [batch, num_classes] '
             'logits: single-tensor layers, or CarryLayers for layers that '
             'carry more state (the labels always travel last).')
    p.Define('num_classes', 10, 'Number of classes.')
    p.Define('input_shape', None, 'Image batch shape [batch, h, w, c].')
    p.Define('label_smoothing', 0.0, 'Label smoothing.')
    return p

  @classmethod
  def PipelineParams(cls, p: hyperparams.Params) -> hyperparams.Params:
    if not p.layers or p.input_shape is None:
      raise ValueError(f'GPipeConvNetClassifier {p.name!r} needs p.layers '
                       f'({len(p.layers)} given) and p.input_shape '
                       f'({p.input_shape}).')
    layers = [lp if lp.cls is CarryLayer else
              CarryLayer.Params().Set(name=lp.name or f'layer_{i}', body=lp)
              for i, lp in enumerate(p.layers)]
    layers.append(CarryLayer.Params().Set(
        name='xent', num_body_inputs=2, body=_XentLayer.Params().Set(
            num_classes=p.num_classes, label_smoothing=p.label_smoothing)))
    return p.pipeline.Copy().Set(name='pipeline', layers=layers,
                                 input_shapes=[p.input_shape, p.input_shape[:1]])

  def FProp(self, theta: NestedMap, images: tf.Tensor, labels: tf.Tensor) -> NestedMap:
    logits_and_loss, _ = self.pipeline.FProp(theta.pipeline, images, labels)
    logits, per_example = logits_and_loss[..., :-1], logits_and_loss[..., -1]
    return NestedMap(logits=logits, per_example_loss=per_example,
                     loss=tf.reduce_mean(per_example))

  @classmethod
  def OutputShapes(cls, logits_and_loss: tf.TensorShape, labels: tf.TensorShape
                   ) -> NestedMap:
    batch, width = logits_and_loss
    return NestedMap(logits=tf.TensorShape([batch, width - 1]),
                     per_example_loss=tf.TensorShape([batch]), loss=tf.TensorShape([]))


class _XentLayer(base_layer.BaseLayer):
  """(logits, labels) -> [batch, num_classes + 1]: the logits with the
  per-example cross entropy appended (one tensor, so it carries labels)."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('num_classes', 10, 'Number of classes.')
    p.Define('label_smoothing', 0.0, 'Label smoothing.')
    return p

  def FProp(self, theta: NestedMap, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    p = self.params
    targets = embedding.SmoothedTargets(tf.cast(labels, tf.int32), p.num_classes,
                                        p.label_smoothing, logits.dtype)
    xent = tf.nn.softmax_cross_entropy_with_logits(targets, logits)
    return tf.concat([logits, xent[:, None]], axis=1)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, logits_shape: Any,
                labels_shape: Any) -> layer_meta.LayerMeta:
    shape = tf.TensorShape(logits_shape)
    if shape.rank != 2 or shape[1] != params.num_classes:
      raise ValueError(f'The convnet layers must end in [batch, num_classes='
                       f'{params.num_classes}] logits, got {shape}.')
    out = tf.TensorShape([shape[0], shape[1] + 1])
    return layer_meta.LayerMeta((out,), flops=6 * layer_meta.NumElements(shape),
                                act_bytes=layer_meta.Bytes([out, shape], params.dtype))
