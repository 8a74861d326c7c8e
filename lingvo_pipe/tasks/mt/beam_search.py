"""Greedy and beam search over any next-token scorer, as TensorFlow graphs.

The scorer is `log_probs_fn(ids, t)`: given the output ids so far [N, L]
(positions >= t hold PAD) it returns the log-probabilities [N, V] of the
token at position t. Both searches run in one tf.while_loop with fixed
shapes, so they trace once and can be exported in a SavedModel.

Beam search keeps `beam_size` hypotheses per example, ranked by their summed
log-probability. A hypothesis that emitted EOS is finished: it stays in the
beam, extended by PAD at no cost, so its score no longer changes. The
result is the beam's best hypothesis by length-normalized score
score / ((5 + length) / 6) ** alpha (Wu et al., 2016; alpha 0: the raw
score), with length counting the tokens up to and including EOS. With beam
size 1 it picks the same tokens as greedy search.
"""

from typing import Callable

import tensorflow as tf

from lingvo_pipe.core.nested_map import NestedMap

LogProbsFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]
# A score no real hypothesis reaches: unused beams and forbidden tokens.
_DEAD = -1e9


def LengthPenalty(lengths: tf.Tensor, alpha: float) -> tf.Tensor:
  """((5 + length) / 6) ** alpha, the divisor of a hypothesis's score."""
  return tf.pow((5.0 + tf.cast(lengths, tf.float32)) / 6.0, alpha)


def _SetColumn(ids: tf.Tensor, t: tf.Tensor, column: tf.Tensor) -> tf.Tensor:
  """ids [..., L] with position t replaced by column [...]."""
  at_t = tf.equal(tf.range(tf.shape(ids)[-1]), t)
  return tf.where(at_t, column[..., tf.newaxis], ids)


def GreedySearch(log_probs_fn: LogProbsFn, batch_size: int, max_len: int,
                 eos_id: int, pad_id: int = 0) -> NestedMap:
  """Picks the most likely token at each step until EOS or max_len.

  Returns:
    NestedMap(ids [B, max_len] int32, PAD after EOS; scores [B], the summed
    log-probabilities of the emitted tokens; lengths [B], tokens up to and
    including EOS).
  """

  def Body(t, ids, scores, lengths, finished):
    logp = log_probs_fn(ids, t)
    token = tf.argmax(logp, axis=-1, output_type=tf.int32)
    token = tf.where(finished, pad_id, token)
    picked = tf.gather(logp, token, batch_dims=1)
    scores += tf.where(finished, 0.0, picked)
    lengths += tf.cast(tf.logical_not(finished), tf.int32)
    finished = tf.logical_or(finished, tf.equal(token, eos_id))
    return t + 1, _SetColumn(ids, t, token), scores, lengths, finished

  def Cond(t, ids, scores, lengths, finished):
    del ids, scores, lengths
    return tf.logical_and(t < max_len, tf.logical_not(tf.reduce_all(finished)))

  init = (tf.constant(0), tf.fill([batch_size, max_len], pad_id),
          tf.zeros([batch_size]), tf.zeros([batch_size], tf.int32),
          tf.zeros([batch_size], tf.bool))
  _, ids, scores, lengths, _ = tf.while_loop(Cond, Body, init)
  return NestedMap(ids=ids, scores=scores, lengths=lengths)


def BeamSearch(log_probs_fn: LogProbsFn, batch_size: int, max_len: int,
               beam_size: int, eos_id: int, pad_id: int = 0,
               length_alpha: float = 0.0) -> NestedMap:
  """Beam search (see the module docstring).

  `log_probs_fn` sees batch_size * beam_size rows, example-major (the
  beams of example b are rows b * beam_size ... (b + 1) * beam_size - 1).

  Returns:
    NestedMap(ids [B, max_len], scores [B] (summed log-probabilities),
    normalized_scores [B], lengths [B] of the best hypothesis, and
    beam_ids [B, beam_size, max_len], beam_scores [B, beam_size] of all).

  Raises:
    ValueError: for beam_size < 1.
  """
  if beam_size < 1:
    raise ValueError(f'beam_size must be >= 1, got {beam_size}.')
  b, k = batch_size, beam_size

  def Body(t, ids, scores, lengths, finished):
    logp = tf.reshape(log_probs_fn(tf.reshape(ids, [b * k, max_len]), t), [b, k, -1])
    vocab = tf.shape(logp)[-1]
    pad_only = tf.where(tf.equal(tf.range(vocab), pad_id), 0.0, _DEAD)
    logp = tf.where(finished[..., tf.newaxis], pad_only, logp)
    candidates = tf.reshape(scores[..., tf.newaxis] + logp, [b, -1])
    scores, flat = tf.math.top_k(candidates, k)
    beam, token = flat // vocab, flat % vocab
    ids = tf.gather(ids, beam, batch_dims=1)
    was_finished = tf.gather(finished, beam, batch_dims=1)
    lengths = tf.gather(lengths, beam, batch_dims=1) + tf.cast(
        tf.logical_not(was_finished), tf.int32)
    finished = tf.logical_or(was_finished, tf.equal(token, eos_id))
    return t + 1, _SetColumn(ids, t, token), scores, lengths, finished

  def Cond(t, ids, scores, lengths, finished):
    del ids, scores, lengths
    return tf.logical_and(t < max_len, tf.logical_not(tf.reduce_all(finished)))

  # Only beam 0 is alive at first, so the first step fills the beam with
  # distinct tokens rather than k copies of one.
  first = tf.concat([tf.zeros([b, 1]), tf.fill([b, k - 1], _DEAD)], axis=1)
  init = (tf.constant(0), tf.fill([b, k, max_len], pad_id), first,
          tf.zeros([b, k], tf.int32), tf.zeros([b, k], tf.bool))
  _, ids, scores, lengths, _ = tf.while_loop(Cond, Body, init)
  normalized = scores / LengthPenalty(lengths, length_alpha)
  best = tf.argmax(normalized, axis=1, output_type=tf.int32)
  return NestedMap(
      ids=tf.gather(ids, best, batch_dims=1),
      scores=tf.gather(scores, best, batch_dims=1),
      normalized_scores=tf.gather(normalized, best, batch_dims=1),
      lengths=tf.gather(lengths, best, batch_dims=1),
      beam_ids=ids, beam_scores=scores)
