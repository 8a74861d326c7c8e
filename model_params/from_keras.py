"""A Keras model as an experiment: the trainer trains, evaluates and
checkpoints it like any other.

The model is a Keras class (a keras.Sequential subclass that builds itself):
KerasLayers of the class gives the pipeline's layers, and their params
name the class and each layer, so the params text, overrides and
checkpoints work as for the project's own layers. After training,
`keras_models.CopyWeightsToKeras(task.classifier.pipeline,
KerasConvNet)` writes the trained weights into the class's SharedModel, to
save or serve with Keras.
"""

import tensorflow as tf

from lingvo_pipe import base_experiment
from lingvo_pipe.core import hyperparams
from lingvo_pipe import model_registry
from lingvo_pipe.core.layers import keras_models
from lingvo_pipe.pipeline.schedules import schedule
from lingvo_pipe.tasks.image import input_generator as image_input
from lingvo_pipe.tasks.image import model as image_model

keras = tf.keras
IMAGE_SIZE, NUM_CLASSES = 16, 10


class KerasConvNet(tf.keras.Sequential):
  """Two convolutions with batch norm, dropout, pooling and a classifier:
  the kind of Keras model a user has. Its layers are named: the names are
  the checkpoint's variable paths."""

  def __init__(self):
    layers = [keras.Input((IMAGE_SIZE, IMAGE_SIZE, 3))]
    for i, filters in enumerate((16, 32)):
      layers += [keras.layers.Conv2D(filters, 3, padding='same', name=f'conv{i}'),
                 keras.layers.BatchNormalization(name=f'bn{i}'),
                 keras.layers.ReLU(name=f'relu{i}'),
                 keras.layers.MaxPooling2D(name=f'pool{i}')]
    layers += [keras.layers.Dropout(0.2, name='drop'),
               keras.layers.GlobalAveragePooling2D(name='global_pool'),
               keras.layers.Dense(NUM_CLASSES, name='logits')]
    super().__init__(layers, name='keras_convnet')


@model_registry.RegisterExperiment
class KerasConvNetCifar(base_experiment.BaseExperiment):
  """KerasConvNet on 2 cells with 4 micro-batches, 1F1B, on generated
  16x16 images of CifarInput (CIFAR-10's own files, train/dev.file_pattern,
  hold 32x32 images: a model for them starts with keras.Input((32, 32, 3)))."""

  BATCH_SIZE = 32

  def Task(self) -> hyperparams.Params:
    p = image_model.ImageClassificationTask.Params().Set(name='image')
    p.classifier.Set(
        layers=keras_models.KerasLayers(KerasConvNet, [None, IMAGE_SIZE, IMAGE_SIZE, 3]),
        num_classes=NUM_CLASSES, input_shape=[self.BATCH_SIZE, IMAGE_SIZE, IMAGE_SIZE, 3])
    p.classifier.pipeline.Set(num_partitions=2, num_micro_batches=4,
                              schedule=schedule.ScheduleKind.ONE_F_ONE_B)
    return p

  def Train(self) -> hyperparams.Params:
    return image_input.CifarInput.Params().Set(batch_size=self.BATCH_SIZE,
                                               image_size=IMAGE_SIZE)

  def Dev(self) -> hyperparams.Params:
    return self.Train().Set(split='eval')

  def Trainer(self) -> hyperparams.Params:
    return base_experiment.TrainerParams().Set(
        max_steps=300, steps_per_loop=50, learning_rate=3e-3, eval_steps=8)
