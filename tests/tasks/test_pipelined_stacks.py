"""Tests of the ready-made pipelined stacks."""

import numpy as np
import tensorflow as tf

from lingvo_pipe.core.layers import linear
from lingvo_pipe.tasks.image import layers as image_layers
from lingvo_pipe.tasks.lm import layers as lm_layers

from tests import transparency
from tests.pipeline import pipeline_models as models


def test_convnet_classifier_equals_its_layers_per_micro_batch():
  layers, shape = models.ConvNetLayers(keep_prob=1.0)
  layers[-1] = linear.ProjectionLayer.Params().Set(name='proj', input_dim=4, output_dim=10)
  p = image_layers.GPipeConvNetClassifier.Params().Set(
      name='net', layers=layers, num_classes=10, input_shape=shape, label_smoothing=0.1)
  p.pipeline.Set(num_partitions=3, num_micro_batches=4)
  net = p.Instantiate()
  assert net.pipeline.num_cells == 3
  images = tf.random.stateless_normal(shape, [1, 1])
  labels = tf.random.stateless_uniform([shape[0]], [1, 2], 0, 10, tf.int32)
  loss_fn = models.ClassifierLoss(labels, 10, 0.1)
  ref = transparency.CheckTransparent(net.pipeline, (images,), 4, loss_fn=loss_fn, eager=True)
  # The classifier returns its pipeline's logits and, as its loss, their
  # cross entropy with the label-smoothed targets, taken per micro-batch
  # inside the pipeline with each one's labels.
  out = net(images, labels)
  assert out.logits.shape == (shape[0], 10)
  transparency.AssertClose(out.logits, ref.y)
  transparency.AssertClose(out.loss, loss_fn(ref.y))
  transparency.AssertClose(tf.reduce_mean(out.per_example_loss), loss_fn(ref.y))


def test_transformer_stack_loss_ignores_padded_tokens():
  p = lm_layers.GPipeTransformerStack.Params().Set(
      name='lm', vocab_size=16, model_dim=8, num_heads=2, hidden_dim=16,
      num_layers=2, batch_size=4, seq_len=6)
  p.pipeline.Set(num_partitions=2, num_micro_batches=2)
  stack = p.Instantiate()
  ids = tf.random.stateless_uniform([4, 6], [3, 3], 0, 16, tf.int32)
  paddings = tf.constant([[0.] * 6, [0.] * 4 + [1.] * 2] * 2)
  out = stack(ids, paddings, ids)
  assert out.logits.shape == (4, 6, 16)
  expected = np.sum(out.per_token_loss.numpy() * (1 - paddings.numpy())) / 20
  transparency.AssertClose(out.loss, expected)
