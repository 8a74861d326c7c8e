"""Small models for pipeline tests and a sequential reference without the
pipeline machinery."""

from typing import Any, Dict, List, Tuple

import numpy as np
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core.layers.activations import Activation
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.layers import conv
from lingvo_pipe.core.layers import dropout
from lingvo_pipe.core.layers import linear
from lingvo_pipe.core.layers import normalization
from lingvo_pipe.core.layers import pooling
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline import pipelined_model
from lingvo_pipe.tasks.lm import layers as lm_layers

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


def TransformerStackPipeline(k: int, m: int, **pipeline_kwargs) -> gpipe.PipeliningLayer:
  """The pipeline of a small GPipe Transformer LM with dropout: embedding,
  six layers, softmax (8 layers)."""
  p = lm_layers.GPipeTransformerStack.Params().Set(
      name='lm', vocab_size=16, model_dim=8, num_heads=2, hidden_dim=16,
      num_layers=6, batch_size=BATCH, seq_len=4, residual_keep_prob=0.8,
      label_smoothing=0.1)
  p.pipeline.Set(num_partitions=k, num_micro_batches=m, **pipeline_kwargs)
  return lm_layers.GPipeTransformerStack.PipelineParams(p).Instantiate()


def TransformerInputs(seed: int) -> Tuple[tf.Tensor, ...]:
  ids = tf.random.stateless_uniform([BATCH, 4], [seed, 0], 0, 16, tf.int32)
  paddings = tf.cast(tf.range(4)[None, :] >= tf.range(BATCH)[:, None] % 4 + 1,
                     tf.float32)
  labels = tf.random.stateless_uniform([BATCH, 4], [seed, 1], 0, 16, tf.int32)
  return ids, paddings, labels


def Loss(outputs: Any) -> tf.Tensor:
  """Mean of squared outputs; the stack's weighted cross entropy."""
  if isinstance(outputs, tuple):
    _, per_token, weights = outputs
    return lm_layers.WeightedLoss(per_token, weights)
  return tf.reduce_mean(tf.square(outputs))


def _FloatInputs(inputs: tuple) -> List[tf.Tensor]:
  return [x for x in inputs if x.dtype.is_floating]


def TrainStep(pipe: gpipe.PipeliningLayer, step: int):
  """A tf.function of the inputs: (outputs, loss, grads of the trainable
  variables and the float inputs)."""
  variables = list(pipe.trainable_variables)

  @tf.function(autograph=False)
  def Step(*inputs):
    with tf.GradientTape() as tape:
      tape.watch(_FloatInputs(inputs))
      theta = base_layer.WithStepSeed(pipe.theta, [step, 0])
      outputs = pipe.FProp(theta, *inputs)
      loss = Loss(outputs)
    return outputs, loss, tape.gradient(loss, variables + _FloatInputs(inputs))

  return Step


def SequentialReference(pipe: gpipe.PipeliningLayer, inputs: tuple, num_micro: int,
                        step: int) -> Dict[str, Any]:
  """The network without the pipeline: every layer of every cell applied in
  order to each micro-batch (step seed [step, m], batch norm on the
  micro-batch), plain autodiff. Records each batch-norm layer's inputs."""
  variables = list(pipe.trainable_variables)
  bn_inputs: Dict[str, List[np.ndarray]] = {}
  with tf.GradientTape() as tape:
    tape.watch(_FloatInputs(inputs))
    outs = []
    for m, micro in enumerate(zip(*[tf.split(x, num_micro) for x in inputs])):
      h = tuple(micro)
      for cell in pipe.cells:
        for layer in cell.sub:
          inner = layer.body if isinstance(layer, pipelined_model.CarryLayer) else layer
          if isinstance(inner, normalization.BatchNormLayer):
            bn_inputs.setdefault(inner.path, []).append(h[0].numpy())
          theta = base_layer.WithStepSeed(layer.theta, [step, m])
          h = containers.AsTuple(layer.FProp(theta, *h))
      outs.append(h)
    y = tuple(tf.concat(column, 0) for column in zip(*outs))
    y = y[0] if len(y) == 1 else y
    loss = Loss(y)
  grads = tape.gradient(loss, variables + _FloatInputs(inputs))
  return dict(y=y, loss=loss, grads=grads, bn_inputs=bn_inputs)


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
