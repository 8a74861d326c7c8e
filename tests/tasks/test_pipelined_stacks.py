"""Tests of the ready-made pipelined stacks."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core.layers import linear
from lingvo_pipe.core import step_seeds
from lingvo_pipe.pipeline.schedules.schedule import ScheduleKind
from lingvo_pipe.tasks.image import layers as image_layers
from lingvo_pipe.tasks.lm import layers as lm_layers
from lingvo_pipe.tasks.mt import layers as mt_layers

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


def _Classifier(schedule):
  layers, shape = models.ConvNetLayers(keep_prob=0.8)
  layers[-1] = linear.ProjectionLayer.Params().Set(name='proj', input_dim=4, output_dim=10)
  p = image_layers.GPipeConvNetClassifier.Params().Set(
      name='net', layers=layers, num_classes=10, input_shape=shape, label_smoothing=0.1)
  p.pipeline.Set(num_partitions=3, num_micro_batches=4, schedule=schedule)
  images = tf.random.stateless_normal(shape, [1, 1])
  labels = tf.random.stateless_uniform([shape[0]], [1, 2], 0, 10, tf.int32)
  return p.Instantiate(), (images, labels)


def _Seq2Seq(schedule):
  p = mt_layers.GPipeTransformerSeq2Seq.Params().Set(
      name='mt', vocab_size=16, model_dim=8, num_heads=2, hidden_dim=16,
      num_encoder_layers=1, num_decoder_layers=2, residual_keep_prob=0.8,
      batch_size=models.BATCH, src_len=4, tgt_len=4)
  p.pipeline.Set(num_partitions=2, num_micro_batches=4, schedule=schedule)
  ids, paddings = models.TransformerInputs(3)
  return p.Instantiate(), (ids, paddings, ids, paddings, models.TransformerLabels(3))


@pytest.mark.parametrize('build,schedule', [(_Classifier, ScheduleKind.ONE_F_ONE_B),
                                            (_Seq2Seq, ScheduleKind.ZB_H1)])
def test_labels_reach_the_loss_under_any_schedule(build, schedule):
  """The classifier and the translation model take their labels beside the
  pipeline (loss_inputs): under 1F1B and ZB-H1 their loss and gradients
  equal fill-drain's with the same weights."""
  results = []
  for kind in (ScheduleKind.GPIPE, schedule):
    model, inputs = build(kind)
    if results:
      for v, value in zip(model.trainable_variables, results[0][2]):
        v.assign(value)

    @tf.function(autograph=False)
    def Step(model=model, inputs=inputs):
      with tf.GradientTape() as tape:
        loss = model.FProp(step_seeds.WithStepSeed(model.theta, [1, 0]), *inputs).loss
      return loss, tape.gradient(loss, model.trainable_variables)

    loss, grads = Step()
    results.append((loss, grads, [v.numpy() for v in model.trainable_variables]))
  transparency.AssertClose(results[1][0], results[0][0], 'loss')
  for g1, g0 in zip(results[1][1], results[0][1]):
    transparency.AssertClose(g1, g0, 'gradient')
