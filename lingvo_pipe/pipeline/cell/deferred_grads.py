"""Weight gradients of projections, deferred to once per step.

In a GPipe backward, each micro-batch's gradient of a projection weight,
x_m^T dy_m, is a weight-sized product that is written and then added into
an accumulator, M times per step. When the micro-batch rows are few, that
traffic dominates (ffn, K=4, M=16: 4-row products by 512x2048 weights).
Inside `Deferring`, a projection by one of the given weights whose factors
over the whole step are no bigger than the weight records its factors
(x_m, dy_m) instead, and the pipeline multiplies them once per step:
concat_m(x_m)^T concat_m(dy_m). The rows stashed until then are what the
accumulator traffic is traded for, hence the size rule.
"""

import contextlib
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import weight_grad_deferral


class Collector(weight_grad_deferral.WeightGradCollector):
  """The deferred factors of one cell's backward for one micro-batch.

  Weights are named by their index in `weights`; `factors[i]` lists the
  pairs (a, b) whose products a^T b sum to the deferred part of weight i's
  gradient.
  """

  def __init__(self, weights: Sequence[tf.Tensor], num_micro: int,
               always: bool = False) -> None:
    self._index = {w.ref(): i for i, w in enumerate(weights)}
    self._num_micro = num_micro
    self._always = always
    self.factors: Dict[int, List[Tuple[tf.Tensor, tf.Tensor]]] = {}

  def Claim(self, w: tf.Tensor, rows: Optional[int]) -> Optional[int]:
    """The index of 2-D `w` if a projection of `rows` rows by it is
    deferred: `w` is one of the weights, and the step's factors (M * rows
    rows of w's two dims) are no bigger than `w`, or `always` (a split
    backward, whose W multiplies one micro-batch's factors)."""
    index = self._index.get(w.ref())
    if index is None or self._always:
      return index
    if rows is None or not w.shape.is_fully_defined():
      return None
    return index if StepDefers(self._num_micro, rows, *w.shape) else None

  def Record(self, index: int, a: tf.Tensor, b: tf.Tensor) -> None:
    self.factors.setdefault(index, []).append((a, b))


def StepDefers(num_micro: int, rows: int, in_dim: int, out_dim: int) -> bool:
  """The size rule: whether the weight gradient of a product of `rows` rows
  per micro-batch by an [in_dim, out_dim] weight is deferred to one product
  per step of `num_micro` micro-batches (its factors are no bigger than the
  weight)."""
  return num_micro * rows * (in_dim + out_dim) <= in_dim * out_dim


@contextlib.contextmanager
def Deferring(weights: Sequence[tf.Tensor], num_micro: int,
              always: bool = False) -> Iterator[Collector]:
  """Projections by `weights` traced (and differentiated) inside may defer
  their weight gradients into the yielded collector (all of them if
  `always`)."""
  with weight_grad_deferral.Collecting(Collector(weights, num_micro, always)) as collector:
    yield collector


def Product(pairs: Sequence[Tuple[tf.Tensor, tf.Tensor]]) -> tf.Tensor:
  """sum over pairs of a^T b, as one product of the row-concatenated
  factors."""
  a = tf.concat([a for a, _ in pairs], axis=0)
  b = tf.concat([b for _, b in pairs], axis=0)
  return tf.matmul(a, b, transpose_a=True)
