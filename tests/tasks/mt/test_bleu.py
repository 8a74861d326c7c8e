"""Corpus BLEU against values computed by hand."""

import math

import pytest

from lingvo_pipe.tasks.mt import bleu


def test_perfect_match_is_100():
  assert bleu.CorpusBleu(['a b c d e', 'x y z w'], ['a b c d e', 'x y z w']) == pytest.approx(100.0)


def test_no_overlap_is_0_with_either_smoothing():
  for smoothing in bleu.Smoothing:
    assert bleu.CorpusBleu(['a b c d e'], ['v w x y z'], smoothing) == 0.0


def test_partial_match_by_hand():
  # hyp a b c d e f, ref a b c d e g: matched / total n-grams are
  # 1-grams 5/6, 2-grams 4/5, 3-grams 3/4, 4-grams 2/3; equal lengths, BP 1.
  # BLEU = (5/6 * 4/5 * 3/4 * 2/3) ** (1/4) = (1/3) ** 0.25 = 0.7598...
  stats = bleu.BleuStats()
  stats.Add('a b c d e f', 'a b c d e g')
  assert stats.matches == [5, 4, 3, 2] and stats.totals == [6, 5, 4, 3]
  assert stats.Bleu() == pytest.approx(100 * (1 / 3) ** 0.25)
  assert stats.Bleu() == pytest.approx(75.9836, abs=1e-4)


def test_brevity_penalty_by_hand():
  # Every n-gram of the 4-word hypothesis matches; c = 4 < r = 6, so
  # BP = exp(1 - 6/4) = exp(-0.5) = 0.6065.
  assert bleu.CorpusBleu(['a b c d'], ['a b c d e f']) == pytest.approx(100 * math.exp(-0.5))
  # A longer hypothesis gets no penalty (only its precision drops).
  stats = bleu.BleuStats()
  stats.Add('a b c d e f', 'a b c d')
  assert stats.BrevityPenalty() == 1.0


def test_counts_are_summed_over_the_corpus_before_dividing():
  # Sentence 1 matches fully (1-4 grams: 4, 3, 2, 1); sentence 2 'x y' vs
  # 'x z' adds 1/2 unigrams and 0/1 bigrams. Corpus precisions 5/6, 3/4,
  # 2/2, 1/1; lengths 6 = 6. BLEU = (5/6 * 3/4) ** (1/4) = 0.8891.
  score = bleu.CorpusBleu(['a b c d', 'x y'], ['a b c d', 'x z'])
  assert score == pytest.approx(100 * (5 / 6 * 3 / 4) ** 0.25)
  # Averaging sentence BLEUs instead would give (100 + 0) / 2.
  assert score != pytest.approx(50.0)


def test_clipped_counts():
  # 'the' four times against a reference with one 'the': 1/4 unigrams.
  stats = bleu.BleuStats()
  stats.Add('the the the the', 'the cat')
  assert stats.Precisions()[0] == pytest.approx(0.25)


def test_smoothing_policy_add_one_above_unigrams():
  # hyp 'the cat sat on the mat', ref 'the cat is on the mat': matches
  # 5/6, 3/5, 1/4, 0/3; without smoothing the empty 4-gram order gives 0.
  hyp, ref = ['the cat sat on the mat'], ['the cat is on the mat']
  assert bleu.CorpusBleu(hyp, ref) == 0.0
  # ADD_ONE: 5/6, 4/6, 2/5, 1/4 -> (1/18) ** (1/4) = 0.4855.
  assert bleu.CorpusBleu(hyp, ref, bleu.Smoothing.ADD_ONE) == pytest.approx(
      100 * (1 / 18) ** 0.25)


def test_empty_hypotheses_score_0_and_mismatched_lists_are_an_error():
  assert bleu.CorpusBleu([''], ['a b']) == 0.0
  with pytest.raises(ValueError, match='2 hypotheses but 1 references'):
    bleu.CorpusBleu(['a', 'b'], ['a'])
