"""Greedy and beam search against exhaustive search on hand-built models."""

import itertools
import math

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.tasks.mt import beam_search

PAD, BOS, EOS, A, B = 0, 1, 2, 3, 4


def _BigramFn(probs):
  """A scorer whose next token depends on the previous one (BOS first):
  probs[prev] is the distribution of the next token."""
  table = tf.math.log(tf.constant(probs, tf.float32))

  def LogProbs(ids, t):
    prev = tf.where(t > 0, tf.gather(ids, tf.maximum(t - 1, 0), axis=1), BOS)
    return tf.gather(table, prev)
  return LogProbs


def _Rows(*rows):
  """Rows of probabilities over (PAD, BOS, EOS, A, B); PAD and BOS are
  never emitted."""
  tiny = 1e-9
  return [[tiny, tiny] + list(r) for r in rows]


# From BOS: A 0.5, B 0.4, EOS 0.1. After A everything is vague; after B the
# sentence ends at once. Greedy takes A and wanders; the best is B EOS.
_TRAP = _Rows([0.3, 0.35, 0.35],   # PAD (unused)
              [0.1, 0.5, 0.4],     # BOS
              [0.3, 0.35, 0.35],   # EOS (unused)
              [0.3, 0.35, 0.35],   # A
              [0.9, 0.05, 0.05])   # B


def _Exhaustive(probs, max_len):
  """The best (score, tokens) over every sequence of A/B/EOS: one ending
  at EOS, or max_len tokens long."""
  best = (-math.inf, None)
  logp = np.log(np.array(probs))
  for n in range(1, max_len + 1):
    for seq in itertools.product([EOS, A, B], repeat=n):
      if EOS in seq[:-1] or (n < max_len and seq[-1] != EOS):
        continue
      prev, score = BOS, 0.0
      for tok in seq:
        score += logp[prev, tok]
        prev = tok
      best = max(best, (score, seq))
  return best


def test_greedy_falls_in_the_trap_and_beam_search_escapes():
  fn = _BigramFn(_TRAP)
  greedy = beam_search.GreedySearch(fn, batch_size=1, max_len=4, eos_id=EOS)
  # After A, A and B tie at 0.35 and the lower id wins; no EOS in 4 steps.
  assert greedy.ids.numpy().tolist() == [[A, A, A, A]]
  assert greedy.lengths.numpy().tolist() == [4]
  assert greedy.scores.numpy()[0] == pytest.approx(math.log(0.5) + 3 * math.log(0.35), rel=1e-5)
  beam = beam_search.BeamSearch(fn, batch_size=1, max_len=4, beam_size=2, eos_id=EOS)
  assert beam.ids.numpy().tolist() == [[B, EOS, PAD, PAD]]
  assert beam.scores.numpy()[0] == pytest.approx(math.log(0.4) + math.log(0.9), rel=1e-5)
  assert beam.lengths.numpy().tolist() == [2]
  assert beam.scores.numpy()[0] >= greedy.scores.numpy()[0]


def test_a_beam_covering_every_sequence_finds_the_exhaustive_best():
  rng = np.random.RandomState(0)
  probs = rng.dirichlet(np.ones(3), size=5)
  probs = _Rows(*probs)
  max_len = 3
  score, seq = _Exhaustive(probs, max_len)
  # 3 + 9 + 27 sequences: a beam of 27 keeps all of them.
  beam = beam_search.BeamSearch(_BigramFn(probs), batch_size=1, max_len=max_len,
                                beam_size=27, eos_id=EOS)
  got = [t for t in beam.ids.numpy()[0] if t != PAD]
  assert tuple(got) == seq
  assert beam.scores.numpy()[0] == pytest.approx(score, rel=1e-5)


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_beam_1_equals_greedy(seed):
  rng = np.random.RandomState(seed)
  vocab, max_len, batch = 7, 6, 5
  # A scorer that depends on the position and on the whole prefix.
  w = tf.constant(rng.randn(vocab, vocab).astype(np.float32))
  pos = tf.constant(rng.randn(max_len, vocab).astype(np.float32))
  rows = tf.constant(rng.randn(batch, vocab).astype(np.float32))

  def Fn(ids, t):
    hist = tf.reduce_sum(tf.one_hot(ids, vocab), axis=1)
    return tf.nn.log_softmax(hist @ w + pos[t] + rows)

  greedy = beam_search.GreedySearch(Fn, batch, max_len, eos_id=2)
  beam = beam_search.BeamSearch(Fn, batch, max_len, beam_size=1, eos_id=2)
  np.testing.assert_array_equal(beam.ids.numpy(), greedy.ids.numpy())
  np.testing.assert_allclose(beam.scores.numpy(), greedy.scores.numpy(), rtol=1e-6)
  np.testing.assert_array_equal(beam.lengths.numpy(), greedy.lengths.numpy())


def test_the_result_is_the_best_normalized_hypothesis_of_the_beam():
  # The beam's hypotheses and raw scores do not depend on alpha; the result
  # is the one with the best score / ((5 + length) / 6) ** alpha.
  fn = _BigramFn(_TRAP)
  raw = beam_search.BeamSearch(fn, 1, 4, beam_size=4, eos_id=EOS, length_alpha=0.0)
  scores = raw.beam_scores.numpy()[0]
  lengths = tf.reduce_sum(tf.cast(raw.beam_ids[0] != PAD, tf.int32), axis=1).numpy()
  assert len(set(lengths)) > 1
  for alpha in (0.0, 0.6, 5.0):
    out = beam_search.BeamSearch(fn, 1, 4, beam_size=4, eos_id=EOS, length_alpha=alpha)
    divisor = ((5.0 + lengths) / 6.0) ** alpha
    assert out.normalized_scores.numpy()[0] == pytest.approx(np.max(scores / divisor), rel=1e-5)


def test_bad_beam_size():
  with pytest.raises(ValueError, match='beam_size must be >= 1, got 0'):
    beam_search.BeamSearch(_BigramFn(_TRAP), 1, 3, beam_size=0, eos_id=EOS)
