"""What rematerialization means: one table of per-micro-batch decisions.

`Decide` states what a policy keeps, recomputes, inlines and defers for one
micro-batch; program.Lower, the one lowering, applies it to a schedule for
each emission (a loop step recomputes more: see program.py):

  policy     micro-batch m of M           record inline per_layer defer
  NONE       every m                      yes    yes    no        M > 1, split
  PER_CELL   m not kept, or remat_last    no     no     no        M > 1
  PER_CELL   m kept, not remat_last       yes    yes    no        M > 1
  PER_LAYER  every m                      no     no     yes       no

A backward that the schedule splits into I and W (`split`) is split
where the decision defers: with M > 1 under PER_CELL and NONE.

Under PER_CELL the kept micro-batch is the one whose backward the cell
runs right after its forward: m == M - 1 in fill-drain; in 1F1B every
micro-batch of the last cell (program.Lower).

A recorded forward keeps its activations on a tape for its backward;
the others keep only the cell's inputs and their backward recomputes the
cell. Under PER_CELL the last micro-batch's backward is the cell's first,
so keeping it costs no device's peak (torchgpipe's except_last). Recorded
forwards are inlined into the step's graph, optimized with the rest of the
step as in the unpipelined network (the executor's control dependencies
keep them in their device's order), and a deferred factor must be a
tensor of the step's graph. Under NONE that makes the step graph grow
with M (each micro-batch's ops, not a call): measured against calls of
the traced forward with TensorFlow's derived backward (ffn B256 K=2,
1F1B), at M=16 the step 0.28 against 0.38 s and the peak 290 against
584 MB, the first step 13.6 against 4.4 s (the loop executor's graph
does not grow with M).
"""

import dataclasses
import enum
from typing import Optional


class RematPolicy(enum.Enum):
  """What the backward pass recomputes instead of keeping."""
  NONE = 'none'            # keep every activation of every micro-batch
  PER_CELL = 'per_cell'    # keep cell inputs; recompute the cell in backward
  PER_LAYER = 'per_layer'  # as PER_CELL, and inside it keep only layer inputs


@dataclasses.dataclass(frozen=True)
class Decision:
  """How the training step runs one cell's forward and backward of one
  micro-batch.

  Attributes:
    record: keep the forward's activations on a tape for the backward
      (else the backward recomputes the forward from the cell's inputs).
    inline: build the forward's ops in the step's graph (else call the
      cell's traced forward function).
    per_layer: the recomputation keeps only each sublayer's inputs
      (tf.recompute_grad per sublayer).
    defer: projections may defer their weight gradients to one product
      per step (deferred_grads).
    split: the backward is split into I and W (schedules/actions): every
      projection defers its weight gradient to the micro-batch's W, which
      multiplies its factors (needs defer).
  """
  record: bool
  inline: bool
  per_layer: bool
  defer: bool
  split: bool = False

  def __post_init__(self) -> None:
    if self.defer and self.record and not self.inline:
      raise ValueError(f'{self}: a recorded forward defers weight gradients '
                       'only if inlined (the factors must be tensors of the '
                       "step's graph, not of a traced function's).")
    if self.split and not self.defer:
      raise ValueError(f'{self}: a split backward defers its projections\' '
                       'weight gradients to its W; set defer too.')


def Decide(policy: RematPolicy, remat_last_micro_batch: bool,
           micro_batch: int, num_micro_batches: int,
           backward_follows: Optional[bool] = None, split: bool = False) -> Decision:
  """The Decision for micro-batch `micro_batch` of `num_micro_batches`
  under `policy` (PipeliningLayer's p.remat, p.remat_last_micro_batch).

  `backward_follows`: whether the cell's next task is this micro-batch's
  backward, the micro-batch that PER_CELL keeps unless
  remat_last_micro_batch (the table's 'm == M - 1'). None: fill-drain's
  answer, micro_batch == num_micro_batches - 1; other schedules
  (program.Lower) say which. `split`: whether the schedule splits this
  micro-batch's backward into I and W (the Decision's split where it
  defers).

  Raises:
    TypeError: if policy is not a RematPolicy.
    ValueError: unless 0 <= micro_batch < num_micro_batches.
  """
  if not isinstance(policy, RematPolicy):
    raise TypeError(f'policy must be a RematPolicy, got {policy!r}.')
  if not 0 <= micro_batch < num_micro_batches:
    raise ValueError(f'micro_batch ({micro_batch}) must be in [0, '
                     f'num_micro_batches) = [0, {num_micro_batches}).')
  if backward_follows is None:
    backward_follows = micro_batch == num_micro_batches - 1
  if policy == RematPolicy.PER_CELL:
    record = backward_follows and not remat_last_micro_batch
  else:
    record = policy == RematPolicy.NONE
  several = num_micro_batches > 1
  defer = several and (policy == RematPolicy.PER_CELL or
                       (policy == RematPolicy.NONE and split))
  return Decision(
      record=record,
      inline=record,
      per_layer=policy == RematPolicy.PER_LAYER,
      defer=defer, split=split and defer)
