"""The tables a loop step follows: per device its actions as branch indices, and the depth of each ring.

A loop step (loop_executor) runs one tf.while_loop per device (of each
replica), one iteration per action of the device, in the schedule's
order. An action is a branch index: 1 + KINDS * (the cell's place on its
device) + its kind: F, X (the input backward, B or I), W, or KEPT: the
last cell's forward, loss and backward in one branch, for the
micro-batches that the program keeps (program.Lower: its forward
recorded, its backward next on its device).

Between cells, tensors travel through FIFO queues (cell j's outputs to
cell j+1, cell j+1's input gradients to cell j), so each boundary's
consumer must take its micro-batches in the order its producer makes
them: cell j's and cell j+1's forwards in the same micro-batch order,
and their backwards too (Build checks). What a device keeps for later
lives in its loop's own arrays, written at every iteration (to a spare
slot when nothing is due): a cell's inputs from its forward to its
backward (its recomputation), the last cell's loss gradients from its
forward to its backward, a split cell's factors from its I to its W,
each in a ring of slots m mod S, S the smallest depth at which no
micro-batch's write comes before the last read of the micro-batch it
overwrites (positions in the device's actions).
"""

import dataclasses
from typing import Dict, FrozenSet, List, Sequence, Set, Tuple

import numpy as np

from lingvo_pipe.pipeline.lowering import program
from lingvo_pipe.pipeline.schedules import actions
from lingvo_pipe.pipeline.schedules.actions import ActionKind

F, X, W, KEPT = 0, 1, 2, 3  # a branch's kind
KINDS = 4
_KINDS = {ActionKind.F: F, ActionKind.B: X, ActionKind.I: X, ActionKind.W: W}


def RingDepth(writes: Sequence[int], last_reads: Sequence[int]) -> int:
  """The smallest S such that micro-batch m + S is written (at position
  writes[m + S]) after micro-batch m's last read (last_reads[m]), for
  every m: the slots m mod S are then never overwritten while still to be
  read."""
  num = len(writes)
  # Equal: a micro-batch that its writer's own branch reads (a kept last cell).
  early = [m for m, (w, r) in enumerate(zip(writes, last_reads)) if r < w]
  if early:
    raise RuntimeError(f'Loop tables: micro-batch {early[0]} is read (position '
                       f'{last_reads[early[0]]}) before it is written ({writes[early[0]]}); '
                       'the schedule passed validation, so this is a bug in the lowering.')
  for depth in range(1, num):
    if all(writes[m + depth] > last_reads[m] for m in range(num - depth)):
      return depth
  return max(num, 1)


@dataclasses.dataclass(frozen=True)
class DeviceTable:
  """What one device's loop runs.

  Attributes:
    cells: its cells in order (a cell's place is its index here).
    branches: [actions] the branch index of each.
    micro: [actions] its micro-batch.
    positions: (kind F, X or W, cell, micro-batch) -> its action's index;
      a KEPT micro-batch's X at its F's.
    num_forwards: how many of its first actions are F's.
  """
  cells: List[int]
  branches: np.ndarray
  micro: np.ndarray
  positions: Dict[Tuple[int, int, int], int]
  num_forwards: int

  def Slots(self, kind: int, cell: int, depth: int, num_micro: int) -> np.ndarray:
    """Per action, the slot of an array of `cell` written by its `kind`
    actions: micro-batch m's m mod depth there, else the spare slot depth
    (everywhere if the device runs no such action: an evaluation's
    backward)."""
    slots = np.full([len(self.branches)], depth, np.int32)
    for m in range(num_micro):
      if (kind, cell, m) in self.positions:
        slots[self.positions[(kind, cell, m)]] = m % depth
    return slots


@dataclasses.dataclass(frozen=True)
class LoopTables:
  """What a loop step runs (module docstring).

  Attributes:
    num_micro: M.
    devices: per device its DeviceTable.
    kept: the last cell's micro-batches run as KEPT.
    split: per cell, whether its backward is I and W (else B).
    input_rings: per cell the depth of the ring of its inputs (cell 0's
      come from the step's inputs: 0).
    loss_gradients: the depth of the ring of the last cell's loss
      gradients (from its forward to its backward).
    factor_rings: per cell the depth of the ring of its backwards'
      factors: a split cell's from its I to its W, else M (all wait for
      the products after the loop).
    forwards_first: whether every device runs all its F's first (a step
      with the loss outside needs it).
  """
  num_micro: int
  devices: List[DeviceTable]
  kept: FrozenSet[int]
  split: Tuple[bool, ...]
  input_rings: List[int]
  loss_gradients: int
  factor_rings: List[int]
  forwards_first: bool

  def DeviceOf(self, cell: int) -> int:
    return next(d for d, table in enumerate(self.devices) if cell in table.cells)


def Build(step: program.Program) -> LoopTables:
  """The tables of a program lowered for the loop: the last cell's
  micro-batches it keeps (forward recorded, backward next) run as KEPT.
  An evaluation's runs only its forwards, which keep nothing for later:
  every ring is 0 deep.

  Raises:
    ValueError: where CheckLoops does.
  """
  schedule, training = step.schedule, step.step.training
  CheckLoops(schedule)
  split = schedule.split_cells
  num_cells, num_micro = schedule.num_cells, schedule.num_micro_batches
  last = num_cells - 1
  kept = {m for c, m in step.kept if c == last}
  if len(kept) != len(step.kept):
    raise RuntimeError(f'A loop keeps only the last cell\'s forwards for their backward; the '
                       f'program keeps {sorted(step.kept)}: a bug in the lowering.')
  devices = [_DeviceTable(schedule, d, frozenset(kept)) for d in range(schedule.num_devices)]
  positions = {key: p for table in devices for key, p in table.positions.items()}
  micro = range(num_micro)
  input_rings, loss_gradients, factor_rings = [0] * num_cells, 0, [0] * num_cells
  if training:
    input_rings = [0] + [RingDepth([positions[(F, c, m)] for m in micro],
                                   [positions[(X, c, m)] for m in micro])
                         for c in range(1, num_cells)]
    loss_gradients = RingDepth([positions[(F, last, m)] for m in micro],
                               [positions[(X, last, m)] for m in micro])
    factor_rings = [RingDepth([positions[(X, c, m)] for m in micro],
                              [positions[(W, c, m)] for m in micro]) if split[c] else num_micro
                    for c in range(num_cells)]
  forwards_first = not kept and all(
      t.num_forwards == sum((b - 1) % KINDS == F for b in t.branches) for t in devices)
  return LoopTables(num_micro, devices, frozenset(kept), split, input_rings,
                    loss_gradients, factor_rings, forwards_first)


def CheckLoops(schedule: actions.Schedule) -> None:
  """Whether `schedule` can run as loops.

  Raises:
    ValueError: if a cell mixes B with I and W (a loop traces one backward
      per cell), or a boundary's two cells run their forwards or their
      backwards in different micro-batch orders (a queue between them).
  """
  num_cells = schedule.num_cells
  backward_kinds: Dict[int, Set[ActionKind]] = {c: set() for c in range(num_cells)}
  orders: Dict[Tuple[int, int], List[int]] = {}  # (kind F or X, cell) -> micro-batches
  for row in schedule.devices:
    for a in row:
      if a.kind in _KINDS:
        orders.setdefault((_KINDS[a.kind], a.cell), []).append(a.micro)
      if a.kind in actions.INPUT_BACKWARDS:
        backward_kinds[a.cell].add(a.kind)
  mixed = [c for c, k in backward_kinds.items() if len(k) > 1]
  if mixed:
    raise ValueError(f'Cell {mixed[0]} runs both B and I backwards; a loop step '
                     'traces one backward per cell: use one kind per cell.')
  for j in range(num_cells - 1):
    for kind, name in ((F, 'forwards'), (X, 'backwards')):
      ours, theirs = orders.get((kind, j), []), orders.get((kind, j + 1), [])
      if ours != theirs:
        raise ValueError(
            f'Cells {j} and {j + 1} run their {name} in different micro-batch orders '
            f'({ours} and {theirs}); a loop step passes '
            'tensors between them in a queue: order them alike, or run the step '
            'unrolled (loop_min_micro_batches=0).')


def _DeviceTable(schedule: actions.Schedule, d: int, kept: FrozenSet[int]) -> DeviceTable:
  last = schedule.num_cells - 1
  cells = [c for c in range(schedule.num_cells) if schedule.cell_devices[c] == d]
  branches: List[int] = []
  micro: List[int] = []
  positions: Dict[Tuple[int, int, int], int] = {}
  for a in schedule.devices[d]:
    if a.kind not in _KINDS:
      continue
    kind = _KINDS[a.kind]
    if a.cell == last and a.micro in kept and kind != W:
      if kind == X:
        positions[(X, last, a.micro)] = positions[(F, last, a.micro)]
        continue  # run by its forward's branch
      kind = KEPT
    positions[(F if kind == KEPT else kind, a.cell, a.micro)] = len(branches)
    branches.append(1 + KINDS * cells.index(a.cell) + kind)
    micro.append(a.micro)
  num_forwards = next((i for i, b in enumerate(branches) if (b - 1) % KINDS != F),
                      len(branches))
  return DeviceTable(cells, np.array(branches, np.int32), np.array(micro, np.int32),
                     positions, num_forwards)
