"""Which weight gradients a deferring backward multiplies once per step.

cell/deferred_grads defers the gradient of a projection (LayerMeta's
projections) whose factors over the step, M micro-batches of rows x
(in + out), are no bigger than its weight; every other weight's gradient
is made per micro-batch and added into an accumulator. The planner holds
the deferred ones' factors instead of accumulators; the step prediction
charges their product once per step.
"""

from typing import List, Sequence

from lingvo_pipe.core import layer_meta
from lingvo_pipe.pipeline.cell import deferred_grads


def Deferred(meta: layer_meta.LayerMeta, num_micro: int) -> List[layer_meta.Projection]:
  """The projections of a layer (`meta` at the micro-batch) whose weight
  gradients a deferring backward at M=`num_micro` multiplies once per step."""
  return [p for p in meta.projections
          if deferred_grads.StepDefers(num_micro, p.rows, p.in_dim, p.out_dim)]


def WeightBytes(p: layer_meta.Projection) -> int:
  """The bytes of projection `p`'s weight (and of its gradient)."""
  return p.in_dim * p.out_dim * p.bytes_per_element


def Shares(metas: Sequence[layer_meta.LayerMeta], num_micro: int) -> List[float]:
  """Per layer (its `metas` at the micro-batch), the share of its weight
  bytes whose gradients are Deferred (0 without weights)."""
  shares = []
  for meta in metas:
    deferred = sum(WeightBytes(q) for q in Deferred(meta, num_micro))
    shares.append(min(deferred / meta.param_bytes, 1.0) if meta.param_bytes else 0.0)
  return shares
