"""Sampling from a GPipe Transformer language model, with or without a
key/value cache.

The cached sampler runs one position per step through every layer, cell by
cell on each cell's device (eval mode: no dropout, no gradient): each causal
self-attention appends the new position's key and value to its cache and
attends over the cache, so generating T bytes costs O(T) layer steps. The
prompt (and a refill) goes through in one forward that fills the cache. The
full-window sampler runs the whole pipeline's eval forward on the context
at every step, O(T) layer steps per byte; it is the reference the cached one
must equal.

Both keep the same context window of at most `window` positions (the
model's trained seq_len): when it is full, the oldest half is dropped and
the cached sampler refills its cache from the newest half, so positions
stay within those the model was trained on. Sampling divides the logits by
the temperature (0: argmax), keeps the top_k (0: all) and draws with a
stateless seed per step, so both samplers draw the same bytes from the same
logits.
"""

from typing import Any, Callable, List, Optional, Tuple

import numpy as np
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import eval_mode
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline import pipelined_model
from lingvo_pipe.pipeline.layout import micro_batch_count
from lingvo_pipe.core.layers import transformer
from lingvo_pipe.tasks.lm import layers as lm_layers

def NextToken(logits: tf.Tensor, temperature: float, top_k: int,
              seed: Tuple[int, int]) -> tf.Tensor:
  """Draws ids [B] from logits [B, V]: argmax if temperature is 0, else
  from softmax(logits / temperature) restricted to the top_k (0: all)."""
  if temperature <= 0.0:
    return tf.argmax(logits, axis=-1, output_type=tf.int32)
  logits = logits / temperature
  if 0 < top_k < logits.shape[-1]:
    kth = tf.math.top_k(logits, top_k).values[:, -1:]
    logits = tf.where(logits < kth, logits.dtype.min, logits)
  return tf.random.stateless_categorical(logits, 1, seed, dtype=tf.int32)[:, 0]


def _Proj(x: tf.Tensor, w: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
  return tf.einsum('btd,dh->bth', x, tf.cast(w, x.dtype)) + tf.cast(b, x.dtype)


class _Layer:
  """One layer of the stack for one position at a time."""

  def __init__(self, layer: base_layer.BaseLayer, path: List[Any]) -> None:
    self.layer = layer
    self.path = path  # keys from the stack's theta to this layer's

  def Theta(self, stack_theta: NestedMap) -> NestedMap:
    theta = stack_theta
    for key in self.path:
      theta = theta[key]
    return theta


class CachedSampler:
  """Samples from a GPipeTransformerStack one position per step, keeping
  each self-attention's keys and values (see the module docstring)."""

  def __init__(self, stack: lm_layers.GPipeTransformerStack, batch_size: int,
               window: int = 0) -> None:
    """`window`: most positions of context (0: the stack's seq_len)."""
    self.stack = stack
    self.batch_size = batch_size
    self.window = window or stack.params.seq_len
    self.cells: List[Tuple[str, List[_Layer]]] = []
    pipeline = stack.pipeline
    for k, run in enumerate(pipeline.CellLayerIndices()):
      layers = []
      for i in run:
        layer = pipeline.layers[i]
        if not isinstance(layer, (lm_layers.TokenEmbeddingStage, lm_layers.SoftmaxStage,
                                  pipelined_model.CarryLayer)) or (
            isinstance(layer, pipelined_model.CarryLayer) and
            not isinstance(layer.body, transformer.TransformerEncoderLayer)):
          raise ValueError(f'CachedSampler cannot step layer {layer.params.name!r} '
                           f'({type(layer).__name__}); it steps embedding, '
                           'Transformer and softmax layers.')
        layers.append(_Layer(layer, ['pipeline', 'layers', i]))
      self.cells.append((pipeline.devices[k].name, layers))
    self._step = tf.function(self._Step, autograph=False)

  def NewCache(self) -> List[NestedMap]:
    """Empty keys and values [B, window, heads, head_dim] of every
    Transformer layer, each on its cell's device."""
    caches = []
    for device, layers in self.cells:
      for entry in layers:
        if isinstance(entry.layer, pipelined_model.CarryLayer):
          att = entry.layer.body.self_atten.params
          heads = att.num_heads
          shape = [self.batch_size, self.window, heads, (att.hidden_dim or att.input_dim) // heads]
          with tf.device(device):
            caches.append(NestedMap(key=tf.zeros(shape), value=tf.zeros(shape)))
    return caches

  def _Attend(self, body: transformer.TransformerEncoderLayer, theta: NestedMap,
              x: tf.Tensor, start: tf.Tensor, cache: NestedMap) -> Tuple[tf.Tensor, NestedMap]:
    """The Transformer layer on positions start .. start + n - 1 (x
    [B, n, D]): their keys and values go into the cache, and each attends
    over the cache up to itself."""
    p = body.self_atten.params
    at = theta.self_atten
    n = x.shape[1]
    normed = body.self_atten_ln.FProp(theta.self_atten_ln, x)
    head_dim = (p.hidden_dim or p.input_dim) // p.num_heads

    def Heads(t: tf.Tensor) -> tf.Tensor:
      return tf.reshape(t, [self.batch_size, n, p.num_heads, head_dim])

    def Place(t: tf.Tensor) -> tf.Tensor:
      """[B, n, N, H] -> [B, window, N, H], rows start .. start + n - 1."""
      return tf.roll(tf.pad(t, [[0, 0], [0, self.window - n], [0, 0], [0, 0]]), start, axis=1)

    slots = tf.range(self.window)
    new = tf.logical_and(slots >= start, slots < start + n)[None, :, None, None]
    keys = tf.where(new, Place(Heads(_Proj(normed, at.key_w, at.key_b))), cache.key)
    values = tf.where(new, Place(Heads(_Proj(normed, at.value_w, at.value_b))), cache.value)
    q = Heads(_Proj(normed, at.query_w, at.query_b)) * head_dim**-0.5
    logits = tf.einsum('btnh,bsnh->bnts', q, keys)
    seen = (slots[None, :] <= start + tf.range(n)[:, None])[None, None]
    logits = tf.where(seen, logits, -0.7 * logits.dtype.max)
    context = tf.einsum('bnts,bsnh->btnh', tf.nn.softmax(logits, axis=-1), values)
    out = _Proj(tf.reshape(context, [self.batch_size, n, -1]), at.post_w, at.post_b)
    x = x + body.self_atten_dropout.FProp(theta.self_atten_dropout, out)
    normed = body.ffn_ln.FProp(theta.ffn_ln, x)
    x = x + body.ffn_dropout.FProp(theta.ffn_dropout, body.ffn.FProp(theta.ffn, normed))
    return x, NestedMap(key=keys, value=values)

  def _Step(self, ids: tf.Tensor, start: tf.Tensor, caches: List[NestedMap]
            ) -> Tuple[tf.Tensor, List[NestedMap]]:
    """Logits [B, V] after ids [B, n] at positions start .. start + n - 1
    (n 1 when sampling, more when filling the cache); the updated caches."""
    theta = self.stack.theta
    n = ids.shape[1]
    new_caches: List[NestedMap] = []
    x: Any = None
    with eval_mode.EvalMode():
      for device, layers in self.cells:
        with tf.device(device):
          for entry in layers:
            layer, lt = entry.layer, entry.Theta(theta)
            if isinstance(layer, lm_layers.TokenEmbeddingStage):
              x = layer.emb.FProp(lt.emb, ids)
              table = lm_layers.Positions(self.window, layer.params.model_dim, x.dtype)
              x += tf.gather(table, start + tf.range(n))[None]
            elif isinstance(layer, pipelined_model.CarryLayer):
              x, cache = self._Attend(layer.body, lt.body, x, start, caches[len(new_caches)])
              new_caches.append(cache)
            else:
              x = x[:, -1:, :]  # only the newest position's logits
              x = layer.FProp(lt, x, tf.zeros([self.batch_size, 1]))[0]
    return x[:, 0, :], new_caches

  def _Fill(self, tokens: List[np.ndarray]) -> Tuple[tf.Tensor, List[NestedMap], int]:
    """A new cache holding `tokens` (one forward over all of them): the
    logits after the last, the caches and the next position."""
    logits, caches = self._step(tf.constant(np.stack(tokens, axis=1)), tf.constant(0),
                                self.NewCache())
    return logits, caches, len(tokens)

  def Sample(self, prompt: np.ndarray, num_steps: int, temperature: float = 0.8,
             top_k: int = 0, seed: int = 0,
             on_logits: Optional[Callable[[int, tf.Tensor], None]] = None) -> np.ndarray:
    """Continues prompt [B, P] (P >= 1) by num_steps ids; returns them
    [B, num_steps]. on_logits(step, logits) sees each step's logits."""
    tokens = [np.asarray(prompt, np.int32)[:, i] for i in range(prompt.shape[1])]
    logits, caches, pos = self._Fill(tokens[max(len(tokens) - self.window + 1, 0):])
    out = []
    for step in range(num_steps):
      if on_logits is not None:
        on_logits(step, logits)
      nxt = NextToken(logits, temperature, top_k, (seed, step)).numpy()
      out.append(nxt)
      tokens.append(nxt)
      if pos == self.window:  # full: refill from the newest half
        logits, caches, pos = self._Fill(tokens[-(self.window // 2):])
      else:
        logits, caches = self._step(tf.constant(nxt[:, None]), tf.constant(pos), caches)
        pos += 1
    return np.stack(out, axis=1) if out else np.zeros([prompt.shape[0], 0], np.int32)


class FullWindowSampler:
  """Samples by running the pipeline's eval forward on the whole context at
  every step: the reference of CachedSampler, same window policy."""

  def __init__(self, stack: lm_layers.GPipeTransformerStack, batch_size: int,
               window: int = 0) -> None:
    self.stack = stack
    self.batch_size = batch_size
    self.window = window or stack.params.seq_len
    # The pipeline takes batches of a multiple of its micro-batches (or of
    # their size): pad with rows.
    multiple = micro_batch_count.BatchMultiple(stack.params.pipeline)
    self.padded = -(-batch_size // multiple) * multiple

    def Logits(window_ids: tf.Tensor, last: tf.Tensor) -> tf.Tensor:
      ids = tf.pad(window_ids, [[0, self.padded - batch_size], [0, 0]])
      with eval_mode.EvalMode():
        out = stack.FProp(stack.theta, ids, tf.zeros(tf.shape(ids)), ids)
      return tf.gather(out.logits[:batch_size], last, axis=1)
    self._logits = tf.function(Logits, autograph=False)

  def _Next(self, context: List[np.ndarray]) -> tf.Tensor:
    ids = np.zeros([self.batch_size, self.window], np.int32)
    ids[:, :len(context)] = np.stack(context, axis=1)
    return self._logits(tf.constant(ids), tf.constant(len(context) - 1))

  def Sample(self, prompt: np.ndarray, num_steps: int, temperature: float = 0.8,
             top_k: int = 0, seed: int = 0,
             on_logits: Optional[Callable[[int, tf.Tensor], None]] = None) -> np.ndarray:
    """As CachedSampler.Sample."""
    tokens = [np.asarray(prompt, np.int32)[:, i] for i in range(prompt.shape[1])]
    context = tokens[max(len(tokens) - self.window + 1, 0):]
    out = []
    for step in range(num_steps):
      logits = self._Next(context)
      if on_logits is not None:
        on_logits(step, logits)
      nxt = NextToken(logits, temperature, top_k, (seed, step)).numpy()
      out.append(nxt)
      tokens.append(nxt)
      context = context + [nxt]
      if len(context) > self.window:
        context = tokens[-(self.window // 2):]
    return np.stack(out, axis=1) if out else np.zeros([prompt.shape[0], 0], np.int32)
