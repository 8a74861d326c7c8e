"""The key/value-cached sampler equals full-window sampling: same logits
(rtol 1e-5) at every step and the same bytes, across a window refill."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.tasks.lm import layers as lm_layers
from lingvo_pipe.tasks.lm import sampler

BATCH, WINDOW = 4, 12


def _Stack(k=2, m=2, micro_batch_size=0):
  p = lm_layers.GPipeTransformerStack.Params().Set(
      name='stack', vocab_size=32, model_dim=16, num_heads=2, hidden_dim=32,
      num_layers=3, batch_size=BATCH, seq_len=WINDOW, residual_keep_prob=0.8,
      random_seed=3)
  p.pipeline.Set(num_partitions=k, num_micro_batches=m, micro_batch_size=micro_batch_size)
  return p.Instantiate()


def _Prompt(length):
  return np.random.RandomState(0).randint(0, 32, [BATCH, length]).astype(np.int32)


def _Run(cls, stack, prompt, steps, **kwargs):
  seen = []
  out = cls(stack, prompt.shape[0]).Sample(prompt, steps, on_logits=lambda s, l: seen.append(l.numpy()),
                                 **kwargs)
  return out, np.stack(seen)


@pytest.mark.parametrize('prompt_len,temperature,top_k', [(5, 0.8, 0), (20, 1.0, 5), (3, 0.0, 0)])
def test_cached_equals_full_window(prompt_len, temperature, top_k):
  # 20 steps from a 5-byte prompt cross the 12-position window twice; a
  # 20-byte prompt starts from its last 11 bytes.
  stack = _Stack()
  kwargs = dict(temperature=temperature, top_k=top_k, seed=7)
  full, full_logits = _Run(sampler.FullWindowSampler, stack, _Prompt(prompt_len), 20, **kwargs)
  cached, cached_logits = _Run(sampler.CachedSampler, stack, _Prompt(prompt_len), 20, **kwargs)
  # rtol 1e-5, and for logits near 0 an atol of 1e-5 of the largest logit
  # (float32 sums in another order differ by ~4e-7 there).
  np.testing.assert_allclose(cached_logits, full_logits, rtol=1e-5,
                             atol=1e-5 * np.abs(full_logits).max())
  np.testing.assert_array_equal(cached, full)
  assert cached.shape == (BATCH, 20)


def test_full_window_pads_to_a_batch_of_micro_batch_size_rows():
  """Three rows, micro-batches of two: the full window runs four."""
  stack = _Stack(m=1, micro_batch_size=2)
  prompt = _Prompt(5)[:3]
  full, full_logits = _Run(sampler.FullWindowSampler, stack, prompt, 4, seed=7)
  cached, cached_logits = _Run(sampler.CachedSampler, stack, prompt, 4, seed=7)
  np.testing.assert_allclose(cached_logits, full_logits, rtol=1e-5,
                             atol=1e-5 * np.abs(full_logits).max())
  np.testing.assert_array_equal(cached, full)


def test_top_k_draws_only_the_k_best():
  logits = tf.constant([[0.0, 3.0, 1.0, 2.0]] * 64)
  drawn = set(sampler.NextToken(logits, 5.0, 2, (1, 2)).numpy().tolist())
  assert drawn == {1, 3}
  assert sampler.NextToken(logits, 0.0, 0, (1, 2)).numpy().tolist() == [1] * 64
