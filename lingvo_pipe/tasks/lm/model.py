"""A language-model task: a GPipe Transformer stack, its metrics, and its
decoder (sampling continuations with a key/value cache)."""

import math
from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import eval_mode
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.tasks import decoding
from lingvo_pipe.tasks.lm import layers as lm_layers
from lingvo_pipe.tasks.lm import sampler


class LanguageModelTask(base_layer.BaseLayer, decoding.DecodingTask):
  """FProp(theta, batch) -> metrics: loss (nats per token), bits_per_byte,
  accuracy and num_tokens (the weight of the means).

  Its decoder continues prompts (batch.ids [B, P]) by sample_bytes sampled
  bytes (lm/sampler.py), with a key/value cache unless use_kv_cache is off.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('stack', lm_layers.GPipeTransformerStack.Params(),
             'The pipelined Transformer stack.')
    p.Define('num_samples', 4, 'Continuations sampled per --decode_prompt.')
    p.Define('sample_bytes', 256, 'Bytes sampled per continuation.')
    p.Define('prompt_bytes', 64, 'Prompts from the dev split: the last this '
             'many bytes of each window.')
    p.Define('temperature', 0.8, 'Sampling temperature (0: argmax).')
    p.Define('top_k', 0, 'Sample among the top_k bytes (0: all).')
    p.Define('use_kv_cache', True, 'Sample with a key/value cache, O(T) layer '
             'steps for T bytes; False: rerun the window per byte.')
    p.Define('sample_seed', 0, 'Seed of the sampling.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    if p.num_samples < 1 or p.sample_bytes < 0 or p.prompt_bytes < 1 or p.top_k < 0:
      raise ValueError(f'LanguageModelTask {p.name!r}: num_samples '
                       f'({p.num_samples}) and prompt_bytes ({p.prompt_bytes}) '
                       f'must be >= 1, sample_bytes ({p.sample_bytes}) and top_k '
                       f'({p.top_k}) >= 0.')
    self.CreateChild('stack', p.stack)

  def FProp(self, theta: NestedMap, batch: NestedMap) -> NestedMap:
    out = self.stack.FProp(theta.stack, batch.ids, batch.paddings, batch.labels)
    return TokenMetrics(out, batch.labels)

  # --- decoding ---------------------------------------------------------------

  def Sampler(self, batch_size: int) -> 'sampler.CachedSampler | sampler.FullWindowSampler':
    """The sampler of this task's params for batches of batch_size."""
    cls = sampler.CachedSampler if self.params.use_kv_cache else sampler.FullWindowSampler
    return cls(self.stack, batch_size)

  def Sample(self, prompt: np.ndarray, num_steps: int, seed: int = 0) -> np.ndarray:
    """Continues prompt [B, P] by num_steps bytes [B, num_steps] in eval
    mode, with the task's temperature, top_k and cache setting."""
    p = self.params
    return self.Sampler(prompt.shape[0]).Sample(prompt, num_steps, p.temperature,
                                                p.top_k, seed)

  def Decoder(self) -> Callable[[NestedMap], NestedMap]:
    """Samples sample_bytes after each prompt; one sampler per batch size,
    so its step function traces once."""
    samplers: Dict[int, sampler.CachedSampler | sampler.FullWindowSampler] = {}
    p = self.params

    def Run(batch: NestedMap) -> NestedMap:
      prompt = np.asarray(batch.ids)[:, -p.prompt_bytes:]
      size = prompt.shape[0]
      if size not in samplers:
        samplers[size] = self.Sampler(size)
      out = samplers[size].Sample(prompt, p.sample_bytes, p.temperature, p.top_k,
                                  p.sample_seed)
      return NestedMap(prompt=tf.constant(prompt), ids=tf.constant(out))
    return Run

  def Decode(self, theta: NestedMap, batch: NestedMap) -> NestedMap:
    """Samples continuations of batch.ids (the task's own variables are
    read: the cached sampler steps the stack's layers itself)."""
    del theta
    return self.Decoder()(batch)

  def PromptBatch(self, text: str) -> NestedMap:
    """num_samples copies of the prompt `text` (UTF-8 bytes)."""
    data = text.encode('utf-8')
    if not data:
      raise ValueError('--decode_prompt is empty; give some text to continue.')
    ids = np.tile(np.frombuffer(data, np.uint8).astype(np.int32), [self.params.num_samples, 1])
    return NestedMap(ids=tf.constant(ids))

  def PostProcessDecode(self, batch: NestedMap,
                        decoded: NestedMap) -> List[decoding.DecodedExample]:
    return [decoding.DecodedExample(source=decoding.Text(prompt), output=decoding.Text(ids))
            for prompt, ids in zip(decoded.prompt, decoded.ids)]

  def FormatDecoded(self, examples: Sequence[decoding.DecodedExample]) -> str:
    return ''.join(f'--- prompt ---\n{e.source}\n--- sample ---\n{e.output}\n'
                   for e in examples)

  def ServingSignature(self) -> Tuple[Dict[str, tf.TensorSpec], str]:
    p = self.params.stack
    return ({'ids': tf.TensorSpec([None, p.seq_len], tf.int32, name='ids')},
            'log_probs [batch, seq_len, vocab] of the byte after each position, '
            'next_ids [batch] (the most likely byte after the last)')

  def ServingFunction(self, theta: NestedMap, **inputs: tf.Tensor) -> Dict[str, tf.Tensor]:
    """Scores ids [batch, seq_len] (up to stack.batch_size rows: the batch
    is padded to it for the micro-batches, and cut back)."""
    ids = inputs['ids']
    p = self.params.stack
    n = tf.shape(ids)[0]
    check = tf.debugging.assert_less_equal(
        n, p.batch_size, message=f'The exported model takes at most '
        f'{p.batch_size} rows per call (stack.batch_size); split the batch.')
    with tf.control_dependencies([check]):
      padded = tf.ensure_shape(tf.pad(ids, [[0, p.batch_size - n], [0, 0]]),
                               [p.batch_size, p.seq_len])
    with eval_mode.EvalMode():
      out = self.stack.FProp(theta.stack, padded, tf.zeros(tf.shape(padded)), padded)
    log_probs = tf.nn.log_softmax(out.logits[:n])
    return {'log_probs': log_probs,
            'next_ids': tf.argmax(log_probs[:, -1], axis=-1, output_type=tf.int32)}


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
