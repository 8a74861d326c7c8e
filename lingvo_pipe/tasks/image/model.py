"""An image classification task over a pipelined convnet classifier."""

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.tasks.image import layers as image_layers


class ImageClassificationTask(base_layer.BaseLayer):
  """FProp(theta, batch) -> NestedMap(loss, accuracy, num_examples)."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('classifier', image_layers.GPipeConvNetClassifier.Params(),
             'The pipelined classifier.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    self.CreateChild('classifier', self.params.classifier)

  def FProp(self, theta: NestedMap, batch: NestedMap) -> NestedMap:
    out = self.classifier.FProp(theta.classifier, batch.images, batch.labels)
    predictions = tf.argmax(out.logits, -1, output_type=tf.int32)
    accuracy = tf.reduce_mean(tf.cast(tf.equal(predictions, batch.labels), tf.float32))
    return NestedMap(loss=out.loss, accuracy=accuracy,
                     num_examples=tf.cast(tf.size(batch.labels), tf.float32))
