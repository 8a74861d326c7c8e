"""Small models for pipeline tests and an independent sequential reference."""

from typing import Any, Dict, List, Tuple

import numpy as np
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import gpipe
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.layers import conv
from lingvo_pipe.core.layers import dropout
from lingvo_pipe.core.layers import linear
from lingvo_pipe.core.layers import normalization
from lingvo_pipe.core.layers import pooling
from lingvo_pipe.core.layers.activations import Activation

BATCH = 16


def ConvNetLayers(keep_prob: float = 0.8) -> Tuple[List[Any], List[int]]:
  """Eight layers: conv, batch norm, dropout (twice), pooling, projection."""
  layers = []
  for i, (cin, cout) in enumerate([(3, 4), (4, 4)]):
    layers += [
        conv.Conv2DLayer.Params().Set(name=f'conv{i}', filter_shape=(3, 3, cin, cout),
                                      activation=Activation.RELU),
        normalization.BatchNormLayer.Params().Set(name=f'bn{i}', dim=cout, decay=0.9),
        dropout.DropoutLayer.Params().Set(name=f'drop{i}', keep_prob=keep_prob),
    ]
  layers += [pooling.GlobalPoolingLayer.Params().Set(name='pool'),
             linear.ProjectionLayer.Params().Set(name='proj', input_dim=4, output_dim=3)]
  return layers, [BATCH, 6, 6, 3]


def FfnLayers(keep_prob: float = 0.8, dim: int = 8) -> Tuple[List[Any], List[int]]:
  """Eight residual feed-forward + dropout layers."""
  layers = []
  for i in range(8):
    body = containers.SequentialLayer.Params().Set(sub=[
        linear.FeedForwardLayer.Params().Set(name='ffn', input_dim=dim, hidden_dim=2 * dim),
        dropout.DropoutLayer.Params().Set(name='drop', keep_prob=keep_prob)])
    layers.append(containers.ResidualLayer.Params().Set(name=f'res{i}', body=body))
  return layers, [BATCH, dim]


def Pipeline(layers, input_shape, k, m, **kwargs) -> gpipe.PipeliningLayer:
  return gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, num_partitions=k, num_micro_batches=m,
      input_shapes=[input_shape], **kwargs).Instantiate()


def Loss(y: tf.Tensor) -> tf.Tensor:
  return tf.reduce_mean(tf.square(y))


def TrainStep(pipe: gpipe.PipeliningLayer, step: int):
  """A tf.function: (outputs, loss, grads of trainable vars and inputs)."""
  variables = list(pipe.trainable_variables)

  @tf.function(autograph=False)
  def Step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      theta = base_layer.WithStepSeed(pipe.theta, [step, 0])
      y = pipe.FProp(theta, x)
      loss = Loss(y)
    return y, loss, tape.gradient(loss, variables + [x])

  return Step


def SequentialReference(pipe: gpipe.PipeliningLayer, x: tf.Tensor, num_micro: int,
                        step: int) -> Dict[str, Any]:
  """The network without the pipeline: every layer of every cell applied in
  order to each micro-batch (step seed [step, m], batch norm on the
  micro-batch), plain autodiff. Records each batch-norm layer's inputs."""
  variables = list(pipe.trainable_variables)
  bn_inputs: Dict[str, List[np.ndarray]] = {}
  with tf.GradientTape() as tape:
    tape.watch(x)
    outs = []
    for m, xm in enumerate(tf.split(x, num_micro)):
      h = xm
      for cell in pipe.cells:
        for layer in cell.sub:
          if isinstance(layer, normalization.BatchNormLayer):
            bn_inputs.setdefault(layer.path, []).append(h.numpy())
          theta = base_layer.WithStepSeed(layer.theta, [step, m])
          h = layer.FProp(theta, h)
      outs.append(h)
    y = tf.concat(outs, 0)
    loss = Loss(y)
  return dict(y=y, loss=loss, grads=tape.gradient(loss, variables + [x]),
              bn_inputs=bn_inputs)


def ExpectedMovingAverages(pipe, bn_inputs) -> Dict[str, Tuple[np.ndarray, np.ndarray]]:
  """NumPy: moving averages after one update from the whole mini-batch."""
  expected = {}
  for cell in pipe.cells:
    for layer in cell.sub:
      if isinstance(layer, normalization.BatchNormLayer):
        h = np.concatenate(bn_inputs[layer.path]).astype(np.float64)
        axes = tuple(range(h.ndim - 1))
        d = layer.params.decay
        mean0, var0 = np.zeros(h.shape[-1]), np.ones(h.shape[-1])
        expected[layer.path] = (d * mean0 + (1 - d) * h.mean(axes),
                                d * var0 + (1 - d) * h.var(axes))
  return expected
