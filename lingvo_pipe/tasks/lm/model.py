"""A language-model task: a GPipe Transformer stack, its metrics, sampling."""

import math
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.tasks.lm import layers as lm_layers


class LanguageModelTask(base_layer.BaseLayer):
  """FProp(theta, batch) -> metrics: loss (nats per token), bits_per_byte,
  accuracy and num_tokens (the weight of the means)."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('stack', lm_layers.GPipeTransformerStack.Params(),
             'The pipelined Transformer stack.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    self.CreateChild('stack', self.params.stack)

  def FProp(self, theta: NestedMap, batch: NestedMap) -> NestedMap:
    out = self.stack.FProp(theta.stack, batch.ids, batch.paddings, batch.labels)
    return TokenMetrics(out, batch.labels)

  def Sample(self, theta: NestedMap, prompt: tf.Tensor, num_steps: int,
             temperature: float = 0.8, seed: int = 0) -> tf.Tensor:
    """Extends `prompt` [batch, seq_len] (the context window, newest byte
    last) by num_steps sampled bytes; returns them [batch, num_steps]. Run in
    eval mode; each step runs the pipeline on the last seq_len bytes."""
    zeros = tf.zeros_like(prompt, tf.float32)

    @tf.function(autograph=False)
    def NextLogits(window):
      return self.stack.FProp(theta.stack, window, zeros, window).logits[:, -1, :]

    window = prompt
    samples = []
    for step in range(num_steps):
      logits = NextLogits(window) / temperature
      nxt = tf.random.stateless_categorical(logits, 1, [seed, step], dtype=tf.int32)
      samples.append(nxt)
      window = tf.concat([window[:, 1:], nxt], axis=1)
    return tf.concat(samples, axis=1)


def TokenMetrics(out: NestedMap, labels: tf.Tensor) -> NestedMap:
  """Metrics of a stack's NestedMap(logits, per_token_loss, weights, loss):
  loss, bits per token (byte), next-token accuracy and num_tokens, the
  weight of the means."""
  weights = out.weights
  num_tokens = tf.reduce_sum(weights)
  correct = tf.cast(tf.equal(tf.argmax(out.logits, -1, output_type=tf.int32), labels),
                    weights.dtype)
  xent = tf.reduce_sum(out.per_token_loss * weights) / tf.maximum(num_tokens, 1.0)
  return NestedMap(loss=out.loss, bits_per_byte=xent / math.log(2.0),
                   accuracy=tf.reduce_sum(correct * weights) / tf.maximum(num_tokens, 1.0),
                   num_tokens=num_tokens)
