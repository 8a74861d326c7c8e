"""An image classification task over a pipelined convnet classifier: it
trains and evaluates, decodes (classifies the dev split's images, with
their accuracy) and exports images -> logits and classes."""

from typing import Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.tasks import decoding
from lingvo_pipe.tasks.image import layers as image_layers


class ImageClassificationTask(base_layer.BaseLayer, decoding.DecodingTask):
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

  def _Logits(self, theta: NestedMap, images: tf.Tensor) -> tf.Tensor:
    """The classifier's logits of `images` (its loss, which the labels only
    feed, is not read)."""
    no_labels = tf.zeros(tf.shape(images)[:1], tf.int32)
    return self.classifier.FProp(theta.classifier, images, no_labels).logits

  def Decode(self, theta: NestedMap, batch: NestedMap) -> NestedMap:
    """The most likely class of each image (in eval mode: the decoder's)."""
    return NestedMap(classes=self.ServingFunction(theta, images=batch.images)['classes'])

  def PromptBatch(self, text: str) -> NestedMap:
    raise ValueError('An image task classifies the dev split\'s images; --decode_prompt '
                     f'gives text ({text!r}), which it cannot classify: leave it unset.')

  def PostProcessDecode(self, batch: NestedMap,
                        decoded: NestedMap) -> List[decoding.DecodedExample]:
    """Each image's class; its source is its shape, its reference the label."""
    shape = 'x'.join(str(d) for d in np.shape(batch.images)[1:])
    return [decoding.DecodedExample(source=f'image {shape}', output=str(int(c)),
                                    reference=str(int(label)))
            for c, label in zip(decoded.classes, batch.labels)]

  def DecodeMetrics(self, examples: Sequence[decoding.DecodedExample]) -> Dict[str, float]:
    """The accuracy of the decoded classes."""
    return {'accuracy': float(np.mean([e.output == e.reference for e in examples]))}

  def ServingSignature(self) -> Tuple[Dict[str, tf.TensorSpec], str]:
    shape = list(self.params.classifier.input_shape)
    return ({'images': tf.TensorSpec(shape, tf.float32, name='images')},
            f'logits [batch, {self.params.classifier.num_classes}], classes [batch] '
            '(the most likely class)')

  def ServingFunction(self, theta: NestedMap, **inputs: tf.Tensor) -> Dict[str, tf.Tensor]:
    logits = self._Logits(theta, inputs['images'])
    return {'logits': logits, 'classes': tf.argmax(logits, -1, output_type=tf.int32)}
