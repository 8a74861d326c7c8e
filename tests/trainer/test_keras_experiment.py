"""from_keras.KerasConvNetCifar: a Keras model class is an experiment the
trainer trains, evaluates, checkpoints, decodes and exports like any
other, and its trained checkpoint goes back into the Keras model."""

import numpy as np
import tensorflow as tf

from lingvo_pipe import model_registry
from lingvo_pipe.core import eval_mode
from lingvo_pipe.core.layers import keras_models
from model_params import from_keras
from trainer import decoder
from trainer import experiment_params
from trainer import export
from trainer import loop

KEY = 'from_keras.KerasConvNetCifar'


def _Trainer(logdir):
  params = experiment_params.ExperimentParams(model_registry.GetExperiment(KEY))
  experiment_params.ApplyOverrides(params, 'trainer.steps_per_loop=10; trainer.eval_steps=2; '
                                   'trainer.decode_steps=2')
  return loop.Trainer(params, str(logdir), log=lambda _: None)


def test_trains_and_hands_the_checkpoint_back_to_keras(tmp_path):
  trainer = _Trainer(tmp_path)
  before = trainer.Eval('dev')['loss']
  trainer.Train(30)
  assert trainer.Eval('dev')['loss'] < 0.8 * before

  restored = _Trainer(tmp_path)
  assert restored.Restore().endswith('ckpt-30')
  model = from_keras.KerasConvNet()  # a new Keras model, not the shared one
  keras_models.CopyWeightsToKeras(restored.task, model)
  images = tf.random.stateless_uniform([from_keras.KerasConvNetCifar.BATCH_SIZE,
                                        from_keras.IMAGE_SIZE, from_keras.IMAGE_SIZE, 3],
                                       [1, 2])
  labels = tf.zeros([images.shape[0]], tf.int32)
  classifier = restored.task.classifier
  with eval_mode.EvalMode():
    ours = classifier.FProp(restored.task.theta.classifier, images, labels).logits
  keras_logits = model(images, training=False).numpy()
  np.testing.assert_allclose(keras_logits, ours.numpy(), rtol=1e-5, atol=1e-5)

  # Decoding classifies the dev batches evaluation reads (eval_steps =
  # decode_steps): the same accuracy. The export serves Keras's logits.
  decoded = decoder.Decoder(restored, log=lambda _: None).Run()
  assert decoded['accuracy'] == restored.Eval('dev')['accuracy']
  serve = tf.saved_model.load(export.Export(restored)).signatures['serving_default']
  served = serve(images=images[:5])
  np.testing.assert_allclose(served['logits'].numpy(), keras_logits[:5], rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(served['classes'].numpy(), np.argmax(keras_logits[:5], -1))
