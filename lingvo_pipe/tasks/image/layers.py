"""A pipelined convnet classifier: the layers map images to logits, and
each micro-batch's cross entropy is taken with its own labels right after
the last cell (the labels never enter the cells), so every schedule trains
it."""

from typing import Any

import tensorflow as tf

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.layers import embedding
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline.pipelined_model import PipelinedModel
from lingvo_pipe.pipeline.schedules.schedule import ScheduleKind


class GPipeConvNetClassifier(PipelinedModel):
  """A pipelined sequential image classifier: `layers` map NHWC images to
  logits [batch, num_classes] and are split into cells; the mean softmax
  cross entropy is taken per micro-batch inside the pipeline, with the
  micro-batch's labels (PipeliningLayer.FPropWithLoss's loss_inputs).

  FProp(theta, images, labels) returns NestedMap(logits, per_example_loss,
  loss).
  """

  # Trains every schedule: FProp runs the pipeline through FPropWithLoss.
  PIPELINE_SCHEDULES = tuple(ScheduleKind)

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('layers', [], 'Layer params from images to [batch, num_classes] '
             'logits: layers that map a tuple to a tuple (CarryLayers where '
             'one carries more state than it uses).')
    p.Define('num_classes', 10, 'Number of classes.')
    p.Define('input_shape', None, 'Image batch shape [batch, h, w, c].')
    p.Define('label_smoothing', 0.0, 'Label smoothing.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    logits = self.FPropMeta(p, p.input_shape).out_shapes[0].logits
    if logits[-1] != p.num_classes:
      raise ValueError(f'The convnet layers must end in [batch, num_classes='
                       f'{p.num_classes}] logits, got {logits}.')

  @classmethod
  def PipelineParams(cls, p: hyperparams.Params) -> hyperparams.Params:
    if not p.layers or p.input_shape is None:
      raise ValueError(f'GPipeConvNetClassifier {p.name!r} needs p.layers '
                       f'({len(p.layers)} given) and p.input_shape '
                       f'({p.input_shape}).')
    return p.pipeline.Copy().Set(name='pipeline', layers=list(p.layers),
                                 input_shapes=[p.input_shape])

  def FProp(self, theta: NestedMap, images: tf.Tensor, labels: tf.Tensor) -> NestedMap:
    norm = tf.cast(tf.shape(labels)[0], tf.float32)
    loss, logits = self.pipeline.FPropWithLoss(
        theta.pipeline, lambda out, micro: tf.reduce_sum(self._CrossEntropy(out, micro)) / norm,
        images, loss_inputs=labels)
    return NestedMap(logits=logits, per_example_loss=self._CrossEntropy(logits, labels),
                     loss=loss)

  def _CrossEntropy(self, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    p = self.params
    logits = tf.cast(logits, tf.float32)
    targets = embedding.SmoothedTargets(tf.cast(labels, tf.int32), p.num_classes,
                                        p.label_smoothing, logits.dtype)
    return tf.nn.softmax_cross_entropy_with_logits(targets, logits)

  @classmethod
  def PipelineInputShapes(cls, images: Any, labels: Any = None) -> tuple:
    return (images,)

  @classmethod
  def OutputShapes(cls, *logits: tf.TensorShape) -> NestedMap:
    shape = tf.TensorShape(logits[0])
    if len(logits) != 1 or shape.rank != 2:
      raise ValueError(f'The convnet layers must end in one [batch, num_classes] logits '
                       f'tensor, got {list(logits)}.')
    return NestedMap(logits=shape, per_example_loss=shape[:1], loss=tf.TensorShape([]))
