"""Corpus BLEU (Papineni et al., 2002) over whitespace-separated tokens.

BLEU = BP * exp(sum_n log(p_n) / N) for n-gram orders 1..N (N = 4): p_n is
the corpus's modified n-gram precision, each hypothesis n-gram counted at
most as often as it occurs in its reference, summed over all sentences
before dividing; BP = exp(1 - r / c) when the hypotheses' total length c is
shorter than the references' r, else 1.

Smoothing policy (a Smoothing): NONE, the default, is the paper's corpus
BLEU: an order with no matching n-gram in the whole corpus makes BLEU 0.
ADD_ONE adds 1 to the numerator and the denominator of every order above 1
(Lin and Och, 2004), so short or poor corpora get a graded, non-zero score.
One reference per hypothesis; scores are in [0, 100].
"""

import collections
import dataclasses
import enum
import math
from typing import Counter, List, Sequence, Tuple

MAX_ORDER = 4


class Smoothing(enum.Enum):
  """How an n-gram order with no match counts (see the module docstring)."""
  NONE = 'none'
  ADD_ONE = 'add_one'


@dataclasses.dataclass
class BleuStats:
  """The sufficient statistics of corpus BLEU; add them over sentences."""
  matches: List[int] = dataclasses.field(default_factory=lambda: [0] * MAX_ORDER)
  totals: List[int] = dataclasses.field(default_factory=lambda: [0] * MAX_ORDER)
  hyp_len: int = 0
  ref_len: int = 0

  def Add(self, hypothesis: str, reference: str) -> None:
    """Counts one hypothesis against its reference."""
    hyp, ref = hypothesis.split(), reference.split()
    self.hyp_len += len(hyp)
    self.ref_len += len(ref)
    for n in range(1, MAX_ORDER + 1):
      hyp_grams, ref_grams = _NGrams(hyp, n), _NGrams(ref, n)
      self.matches[n - 1] += sum(min(count, ref_grams[g]) for g, count in hyp_grams.items())
      self.totals[n - 1] += max(len(hyp) - n + 1, 0)

  def Precisions(self, smoothing: Smoothing = Smoothing.NONE) -> List[float]:
    """The modified n-gram precision of each order, smoothed as asked."""
    out = []
    for n, (m, t) in enumerate(zip(self.matches, self.totals), start=1):
      if smoothing == Smoothing.ADD_ONE and n > 1:
        m, t = m + 1, t + 1
      out.append(m / t if t else 0.0)
    return out

  def BrevityPenalty(self) -> float:
    """exp(1 - r / c) if the hypotheses are shorter than the references."""
    if self.hyp_len == 0:
      return 0.0
    if self.hyp_len >= self.ref_len:
      return 1.0
    return math.exp(1.0 - self.ref_len / self.hyp_len)

  def Bleu(self, smoothing: Smoothing = Smoothing.NONE) -> float:
    """Corpus BLEU in [0, 100]."""
    precisions = self.Precisions(smoothing)
    if min(precisions) <= 0.0:
      return 0.0
    log_mean = sum(math.log(p) for p in precisions) / MAX_ORDER
    return 100.0 * self.BrevityPenalty() * math.exp(log_mean)


def _NGrams(tokens: Sequence[str], n: int) -> Counter[Tuple[str, ...]]:
  return collections.Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def CorpusBleu(hypotheses: Sequence[str], references: Sequence[str],
               smoothing: Smoothing = Smoothing.NONE) -> float:
  """Corpus BLEU in [0, 100] of hypotheses against one reference each.

  Raises:
    ValueError: if the two lists differ in length.
  """
  if len(hypotheses) != len(references):
    raise ValueError(f'{len(hypotheses)} hypotheses but {len(references)} '
                     'references; give one reference per hypothesis.')
  stats = BleuStats()
  for hyp, ref in zip(hypotheses, references):
    stats.Add(hyp, ref)
  return stats.Bleu(smoothing)
