"""Small models for pipeline tests, their inputs, loss and training step."""

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core.layers.activations import Activation
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.layers import conv
from lingvo_pipe.core.layers import dropout
from lingvo_pipe.core.layers import linear
from lingvo_pipe.core.layers import normalization
from lingvo_pipe.core.layers import pooling
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.core import step_seeds
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.tasks.lm import layers as lm_layers

BATCH = 16
BN_DECAY = 0.9
# The (K, M) grid of the transparency tests: every K from one cell to one
# layer per cell, every M from the whole batch to one example each.
KS, MS = (1, 2, 4, 8), (1, 2, 4, 8, 16)


def KMGrid(ks: Sequence[int] = KS, ms: Sequence[int] = MS,
           fast_ms: Sequence[int] = ()) -> List[Any]:
  """pytest params (k, m) of the grid ks x ms: a diagonal with every K and
  every M (of fast_ms, if given) runs in `make test`, the rest is marked
  slow (`make test-slow`)."""
  fast_ms = fast_ms or ms
  n = max(len(ks), len(fast_ms))
  diagonal = {(ks[i % len(ks)], fast_ms[i % len(fast_ms)]) for i in range(n)}
  return [pytest.param(k, m, id=f'{k}-{m}',
                       marks=() if (k, m) in diagonal else pytest.mark.slow)
          for k in ks for m in ms]


def ConvNetLayers(keep_prob: float = 0.8) -> Tuple[List[Any], List[int]]:
  """Eight layers: conv, batch norm, dropout (twice), pooling, projection."""
  layers = []
  for i, (cin, cout) in enumerate([(3, 4), (4, 4)]):
    layers += [
        conv.Conv2DLayer.Params().Set(name=f'conv{i}', filter_shape=(3, 3, cin, cout),
                                      activation=Activation.RELU),
        normalization.BatchNormLayer.Params().Set(name=f'bn{i}', dim=cout,
                                                  decay=BN_DECAY),
        dropout.DropoutLayer.Params().Set(name=f'drop{i}', keep_prob=keep_prob),
    ]
  layers += [pooling.GlobalPoolingLayer.Params().Set(name='pool'),
             linear.ProjectionLayer.Params().Set(name='proj', input_dim=4, output_dim=3)]
  return layers, [BATCH, 6, 6, 3]


def FfnLayers(keep_prob: float = 0.8, dim: int = 8,
              num_layers: int = 4) -> Tuple[List[Any], List[int]]:
  """num_layers residual feed-forward + dropout layers: by default four,
  one or two per cell up to K=4 (each layer is graph to trace; pass K for
  more cells)."""
  layers = []
  for i in range(num_layers):
    body = containers.SequentialLayer.Params().Set(sub=[
        linear.FeedForwardLayer.Params().Set(name='ffn', input_dim=dim, hidden_dim=2 * dim),
        dropout.DropoutLayer.Params().Set(name='drop', keep_prob=keep_prob)])
    layers.append(containers.ResidualLayer.Params().Set(name=f'res{i}', body=body))
  return layers, [BATCH, dim]


def Pipeline(layers, input_shape, k, m, **kwargs) -> gpipe.PipeliningLayer:
  return gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, num_partitions=k, num_micro_batches=m,
      input_shapes=[input_shape], **kwargs).Instantiate()


VOCAB, LABEL_SMOOTHING = 16, 0.1  # the Transformer stack's


def TransformerStackPipeline(k: int, m: int, **pipeline_kwargs) -> gpipe.PipeliningLayer:
  """The pipeline of a small GPipe Transformer LM with dropout: embedding,
  Transformer layers, softmax, max(k, 4) layers in all (two Transformer
  layers, six at K=8: one layer per cell at most; each layer is graph to
  trace); (ids, paddings) -> (logits, weights)."""
  p = lm_layers.GPipeTransformerStack.Params().Set(
      name='lm', vocab_size=VOCAB, model_dim=8, num_heads=2, hidden_dim=16,
      num_layers=max(k, 4) - 2, batch_size=BATCH, seq_len=4, residual_keep_prob=0.8,
      label_smoothing=LABEL_SMOOTHING)
  p.pipeline.Set(num_partitions=k, num_micro_batches=m, **pipeline_kwargs)
  return lm_layers.GPipeTransformerStack.PipelineParams(p).Instantiate()


def TransformerInputs(seed: int) -> Tuple[tf.Tensor, tf.Tensor]:
  """The stack pipeline's inputs (ids, paddings)."""
  ids = tf.random.stateless_uniform([BATCH, 4], [seed, 0], 0, VOCAB, tf.int32)
  paddings = tf.cast(tf.range(4)[None, :] >= tf.range(BATCH)[:, None] % 4 + 1,
                     tf.float32)
  return ids, paddings


def TransformerLabels(seed: int) -> tf.Tensor:
  return tf.random.stateless_uniform([BATCH, 4], [seed, 1], 0, VOCAB, tf.int32)


def TransformerBatch(seed: int) -> NestedMap:
  """A token task's batch NestedMap(ids, paddings, labels)."""
  ids, paddings = TransformerInputs(seed)
  return NestedMap(ids=ids, paddings=paddings, labels=TransformerLabels(seed))


def _PerToken(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
  """The cross entropy of each token with its label-smoothed target."""
  targets = ((1.0 - LABEL_SMOOTHING) * tf.one_hot(labels, VOCAB) + LABEL_SMOOTHING / VOCAB)
  return -tf.reduce_sum(targets * tf.nn.log_softmax(logits), axis=-1)


def TokenLoss(labels: tf.Tensor) -> Callable[[Any], tf.Tensor]:
  """The stack's loss of its pipeline's outputs (logits, weights) with
  `labels`: the mean cross entropy over the weighted tokens, its divisor a
  constant of the batch (no gradient through the count), as
  TokenMicroLoss's."""
  def Loss(outputs: tuple) -> tf.Tensor:
    logits, weights = outputs
    norm = tf.stop_gradient(tf.maximum(tf.reduce_sum(weights), 1.0))
    return tf.reduce_sum(_PerToken(logits, labels) * weights) / norm
  return Loss


def TokenMicroLoss(paddings: tf.Tensor) -> Callable[[tuple, tf.Tensor], tf.Tensor]:
  """TokenLoss's term of one micro-batch, for FPropWithLoss with the
  labels as loss_inputs: the whole batch's token count from `paddings`."""
  norm = tf.maximum(tf.reduce_sum(1.0 - paddings), 1.0)
  return lambda out, labels: tf.reduce_sum(_PerToken(out[0], labels) * out[1]) / norm


def Loss(outputs: Any) -> tf.Tensor:
  """Mean of squared outputs."""
  return tf.reduce_mean(tf.square(outputs))


def ClassifierLoss(labels: tf.Tensor, num_classes: int, label_smoothing: float
                   ) -> Callable[[Any], tf.Tensor]:
  """GPipeConvNetClassifier's loss of its pipeline's logits with `labels`:
  the mean cross entropy with the label-smoothed targets."""
  targets = (1.0 - label_smoothing) * tf.one_hot(labels, num_classes) + (
      label_smoothing / num_classes)
  return lambda logits: tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(targets, logits))


def FloatInputs(inputs: tuple) -> List[tf.Tensor]:
  """The inputs that gradients are taken of."""
  return [x for x in inputs if x.dtype.is_floating]


def TrainStep(pipe: gpipe.PipeliningLayer, step: int,
              loss_fn: Callable[[Any], tf.Tensor] = Loss, eager: bool = False):
  """A function of the inputs (a tf.function unless eager): (outputs, loss,
  grads of the trainable variables and the float inputs), step seed
  [step, 0]."""
  variables = list(pipe.trainable_variables)

  def Step(*inputs):
    with tf.GradientTape() as tape:
      tape.watch(FloatInputs(inputs))
      theta = step_seeds.WithStepSeed(pipe.theta, [step, 0])
      outputs = pipe.FProp(theta, *inputs)
      loss = loss_fn(outputs)
    return outputs, loss, tape.gradient(loss, variables + FloatInputs(inputs))

  return Step if eager else tf.function(Step, autograph=False)


def ExpectedMovingAverages(bn_inputs: Dict[str, List[np.ndarray]], decay: float
                           ) -> Dict[str, Tuple[np.ndarray, np.ndarray]]:
  """NumPy: per batch-norm layer path, its moving mean and variance after
  one update from its inputs of all micro-batches (the whole mini-batch)."""
  expected = {}
  for path, inputs in bn_inputs.items():
    h = np.concatenate(inputs).astype(np.float64)
    axes = tuple(range(h.ndim - 1))
    mean0, var0 = np.zeros(h.shape[-1]), np.ones(h.shape[-1])
    expected[path] = (decay * mean0 + (1 - decay) * h.mean(axes),
                      decay * var0 + (1 - decay) * h.var(axes))
  return expected


def MicroLoss(num_micro: int) -> Callable[[Any], tf.Tensor]:
  """The per-micro-batch terms of Loss, for PipeliningLayer.FPropWithLoss:
  they sum to Loss of the merged outputs."""
  return lambda out: (tf.reduce_sum(tf.square(out)) /
                      tf.cast(tf.size(out) * num_micro, out.dtype))


def TrainStepWithLoss(pipe: gpipe.PipeliningLayer, step: int, num_micro: int,
                      eager: bool = False, labels: Optional[tf.Tensor] = None):
  """As TrainStep, through FPropWithLoss with MicroLoss (with `labels`, the
  Transformer stack's TokenMicroLoss, the labels its loss_inputs): the loss
  inside the pipeline, in the order of the pipeline's schedule."""
  variables = list(pipe.trainable_variables)

  def Step(*inputs):
    with tf.GradientTape() as tape:
      tape.watch(FloatInputs(inputs))
      theta = step_seeds.WithStepSeed(pipe.theta, [step, 0])
      if labels is None:
        loss, outputs = pipe.FPropWithLoss(theta, MicroLoss(num_micro), *inputs)
      else:
        loss, outputs = pipe.FPropWithLoss(theta, TokenMicroLoss(inputs[1]), *inputs,
                                           loss_inputs=labels)
    return outputs, loss, tape.gradient(loss, variables + FloatInputs(inputs))

  return Step if eager else tf.function(Step, autograph=False)
