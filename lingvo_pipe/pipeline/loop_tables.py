"""The tables a loop step follows: each action's clock, ring depths, and what each device runs at each clock.

A loop step (loop_executor) runs a schedule's actions as one
tf.while_loop over clocks. The clocks come from the simulator with every
action one clock long (simulate.Simulate): an action starts when its
device is free and its inputs have ended, so at clock t an action reads
only what ended by t-1. Per clock and device a branch index says what
runs: 0 idle, else 1 + KINDS * (the cell's place on its device) + its
kind: F, X (the input backward, B or I), W, or KEPT: the last cell's
forward, loss and backward in one branch, for the micro-batches that remat
keeps (its forward recorded, its backward next on its device), the
backward at the forward's clock. A W that its device's next action (not a
W) follows takes no clock of its own: it runs at the clock its device is
free, beside what runs there, from a second table (w_branches: 0 none,
else 1 + the cell's place); ZB-V at K=2 M=16 takes 68 clocks, not 97.

Data between cells lives in arrays indexed by a ring slot m mod S
(activations per cell boundary, written by F and read by the next cell's
F and X; gradients per boundary, written by X and read by the previous
cell's X; the loss's gradients of the last cell's outputs). S is the
smallest depth at which no micro-batch's write comes before the last read
of the micro-batch it overwrites, so a schedule keeps its bound of
micro-batches in flight.
"""

import dataclasses
from typing import Any, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

import numpy as np

from lingvo_pipe.pipeline import simulate
from lingvo_pipe.pipeline.schedules import actions
from lingvo_pipe.pipeline.schedules.actions import ActionKind

F, X, W, KEPT = 0, 1, 2, 3  # a branch's kind
KINDS = 4
_Key = Tuple[int, int, int]  # (kind F, X or W, cell, micro-batch)


def RingDepth(writes: Sequence[int], last_reads: Sequence[int]) -> int:
  """The smallest S such that micro-batch m + S is written (at clock
  writes[m + S]) after micro-batch m's last read (last_reads[m]), for every
  m: the slots m mod S are then never overwritten while still to be read."""
  num = len(writes)
  # Equal: a micro-batch that its writer's own branch reads (a kept last cell).
  assert all(r >= w for w, r in zip(writes, last_reads)), (writes, last_reads)
  for depth in range(1, num):
    if all(writes[m + depth] > last_reads[m] for m in range(num - depth)):
      return depth
  return max(num, 1)


@dataclasses.dataclass(frozen=True)
class Rings:
  """Ring depths: per boundary j (cell j -> cell j+1) of cell j's outputs
  and of their gradients, and of the loss's gradients."""
  activations: List[int]
  gradients: List[int]
  loss_gradients: int


@dataclasses.dataclass(frozen=True)
class LoopTables:
  """What a loop step runs (module docstring).

  Attributes:
    num_micro: M.
    num_clocks: clocks of the whole step.
    forward_clocks: clocks [0, forward_clocks) hold every F and nothing
      else (the forward phase of a step with the loss outside), or None.
    clocks: (kind, cell, micro-batch) -> clock, kind F, X or W.
    kept: the last cell's micro-batches run as KEPT.
    split: per cell, whether its backward is I and W (else B).
    cells_on: per device, its cells in order.
    branches: [clocks, devices] the branch index.
    micro: [clocks, devices] the micro-batch of that branch.
    rings: the ring depths.
    w_branches: [clocks, devices] the W run beside the branch (0: none).
    w_micro: [clocks, devices] its micro-batch.
  """
  num_micro: int
  num_clocks: int
  forward_clocks: Optional[int]
  clocks: Dict[_Key, int]
  kept: FrozenSet[int]
  split: Tuple[bool, ...]
  cells_on: List[List[int]]
  branches: np.ndarray
  micro: np.ndarray
  rings: Rings
  w_branches: np.ndarray
  w_micro: np.ndarray

  def Writes(self, kind: int, cell: int) -> List[int]:
    """The clock of `kind` of `cell` for each micro-batch."""
    return [self.clocks[(kind, cell, m)] for m in range(self.num_micro)]

  def ReduceClocks(self) -> Dict[int, int]:
    """Per cell the clock after its last X or W: from there its step
    gradients are final (its REDUCE can start)."""
    ends: Dict[int, int] = {}
    for (kind, cell, _), clock in self.clocks.items():
      if kind != F:
        ends[cell] = max(ends.get(cell, 0), clock + 1)
    return ends

  def Picks(self, table: np.ndarray, start: int, end: int) -> Set[Tuple[int, int]]:
    """The (device, branch) pairs other than idle that `table` (branches or
    w_branches) holds in clocks [start, end)."""
    return {(d, int(b)) for d in range(table.shape[1]) for b in table[start:end, d] if b}

  def WriteSlots(self) -> Dict[str, Any]:
    """Per clock the slot each array is written at (Slots), by the
    loop's names: per boundary 'acts' and 'grads', per cell 'factors'."""
    num_cells, rings, num_micro = len(self.split), self.rings, self.num_micro
    last = num_cells - 1
    return dict(
        acts=[self.Slots(self.Writes(F, c), rings.activations[c]) for c in range(last)],
        grads=[self.Slots(self.Writes(X, c + 1), rings.gradients[c]) for c in range(last)],
        dys=self.Slots(self.Writes(F, last), rings.loss_gradients),
        outs=self.Slots(self.Writes(F, last), num_micro),
        d_inputs=self.Slots(self.Writes(X, 0), num_micro),
        factors=[self.Slots(self.Writes(X, c), num_micro) for c in range(num_cells)])

  def Slots(self, writes: Sequence[int], depth: int) -> np.ndarray:
    """Per clock, the slot written then: micro-batch m's m mod depth at
    clock writes[m], else the spare slot `depth`."""
    slots = np.full([self.num_clocks], depth, np.int32)
    for m, c in enumerate(writes):
      slots[c] = m % depth
    return slots


def Build(schedule: actions.Schedule, keep_last: bool) -> LoopTables:
  """The tables of `schedule`; with `keep_last` the last cell's
  micro-batches whose backward follows their forward on its device run as
  KEPT.

  Raises:
    ValueError: if a cell mixes B with I and W (a loop traces one backward
      per cell).
  """
  num_cells, num_micro = schedule.num_cells, schedule.num_micro_batches
  last = num_cells - 1
  fused = {a for row in schedule.devices for a, b in zip(row, row[1:])
           if a.kind == ActionKind.W and b.kind != ActionKind.W}  # beside b
  timeline = simulate.Simulate(schedule, dataclasses.replace(
      simulate.UNIT_COSTS, per_action={a: 0.0 for a in fused})).timeline
  clocks: Dict[_Key, int] = {}
  kinds = {ActionKind.F: F, ActionKind.B: X, ActionKind.I: X, ActionKind.W: W}
  backward_kinds: Dict[int, set] = {c: set() for c in range(num_cells)}
  for timed_row in timeline:
    for t in timed_row:
      if t.action.kind in kinds:
        clocks[(kinds[t.action.kind], t.action.cell, t.action.micro)] = int(t.start)
      if t.action.kind in actions.INPUT_BACKWARDS:
        backward_kinds[t.action.cell].add(t.action.kind)
  mixed = [c for c, k in backward_kinds.items() if len(k) > 1]
  if mixed:
    raise ValueError(f'Cell {mixed[0]} runs both B and I backwards; a loop step '
                     'traces one backward per cell: use one kind per cell.')
  split = tuple(ActionKind.I in backward_kinds[c] for c in range(num_cells))
  kept: Set[int] = set()
  if keep_last:
    for row in schedule.devices:
      for a, b in zip(row, row[1:]):
        if (a.kind == ActionKind.F and a.cell == last and
            b.kind in actions.INPUT_BACKWARDS and (b.cell, b.micro) == (last, a.micro)):
          kept.add(a.micro)
  for m in kept:
    clocks[(X, last, m)] = clocks[(F, last, m)]
  num_clocks = 1 + max(int(t.start) for row in timeline for t in row)
  cells_on = [[c for c in range(num_cells) if schedule.cell_devices[c] == d]
              for d in range(schedule.num_devices)]
  branches, micro, w_branches, w_micro = (
      np.zeros([num_clocks, schedule.num_devices], np.int32) for _ in range(4))
  fused_keys = {(W, a.cell, a.micro) for a in fused}
  for (kind, cell, m), clock in clocks.items():
    d = schedule.cell_devices[cell]
    if (kind, cell, m) in fused_keys:
      w_branches[clock, d] = 1 + cells_on[d].index(cell)
      w_micro[clock, d] = m
      continue
    if cell == last and m in kept:
      if kind == X:
        continue  # run by its forward's branch
      if kind == F:
        kind = KEPT
    branches[clock, d] = 1 + KINDS * cells_on[d].index(cell) + kind
    micro[clock, d] = m
  forward = [c for (k, _, _), c in clocks.items() if k == F]
  others = [c for (k, _, _), c in clocks.items() if k != F]
  forward_clocks = max(forward) + 1 if not kept and min(others) > max(forward) else None
  return LoopTables(num_micro, num_clocks, forward_clocks, clocks, frozenset(kept), split,
                    cells_on, branches, micro,
                    _Rings(clocks, num_cells, num_micro), w_branches, w_micro)


def _Rings(clocks: Dict[_Key, int], num_cells: int, num_micro: int) -> Rings:
  micro = range(num_micro)
  last = num_cells - 1
  activations = [RingDepth([clocks[(F, j, m)] for m in micro],
                           [max(clocks[(F, j + 1, m)], clocks[(X, j + 1, m)])
                            for m in micro]) for j in range(last)]
  gradients = [RingDepth([clocks[(X, j + 1, m)] for m in micro],
                         [clocks[(X, j, m)] for m in micro]) for j in range(last)]
  loss_gradients = RingDepth([clocks[(F, last, m)] for m in micro],
                             [clocks[(X, last, m)] for m in micro])
  return Rings(activations, gradients, loss_gradients)
