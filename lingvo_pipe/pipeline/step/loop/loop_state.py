"""What one device's loop of a loop step carries (loop_executor), and how an iteration writes it.

Per cell on the device: 'ins' (its inputs, from its forward to its
backward's recomputation, in a ring; none for cell 0, whose come from
the step's inputs, nor in evaluation), 'factors' (its backwards'
deferred factors as loop_probes.FactorSpecs says: all M of a B's, an
I's in a ring until its W), 'sums' (statistics) and a split cell's
'weight_sums' (its W's products, which every other action passes on);
the last cell's 'outs', 'dys' (its loss gradients: a ring with the loss
inside, else all M, from outside) and 'loss'; cell 0's 'd_inputs'. An
iteration's branch yields pieces for all of them; every array is
written every iteration, a piece the branch does not produce unset
(loop_arrays.Unset) to the array's spare slot, so no write needs a
condition.
"""

import dataclasses
from typing import Any, Dict, List, Optional

import numpy as np
import tensorflow as tf

from lingvo_pipe.pipeline.cell import cell_gradients
from lingvo_pipe.pipeline.lowering import loop_tables
from lingvo_pipe.pipeline.lowering.loop_tables import F, X
from lingvo_pipe.pipeline.step.loop import loop_arrays

Pieces = List[Dict[str, List[tf.Tensor]]]  # per cell on the device, per key


@dataclasses.dataclass(frozen=True)
class Specs:
  """Per cell the TensorSpecs of its inputs, outputs, statistics,
  deferred factors and weight sums (none unless split); the loss's, None
  without the loss inside."""
  ins: List[List[tf.TensorSpec]]
  outs: List[List[tf.TensorSpec]]
  updates: List[List[tf.TensorSpec]]
  factors: List[List[tf.TensorSpec]]
  weight_sums: List[List[tf.TensorSpec]]
  loss: Optional[tf.TensorSpec]


def InputDepth(tables: loop_tables.LoopTables, c: int) -> int:
  """The depth of the ring of cell c's inputs (cell 0's, never read, 1)."""
  return max(tables.input_rings[c], 1)


def LossGradientDepth(specs: Specs, tables: loop_tables.LoopTables) -> int:
  """Slots of the last cell's loss gradients: a ring with the loss
  inside, else one per micro-batch."""
  return tables.loss_gradients if specs.loss is not None else tables.num_micro


def Initial(specs: Specs, tables: loop_tables.LoopTables, cells: List[int]) -> Dict[str, Any]:
  """The state of a device holding `cells`, before its first iteration
  (on the caller's device)."""
  num_micro, last = tables.num_micro, len(specs.outs) - 1
  state: Dict[str, Any] = dict(
      ins=[loop_arrays.Arrays(specs.ins[c], InputDepth(tables, c) + 1)
           if tables.input_rings[c] else [] for c in cells],
      factors=[loop_arrays.Arrays(specs.factors[c], tables.factor_rings[c] + 1)
               for c in cells],
      sums=[loop_arrays.Zeros(specs.updates[c]) for c in cells],
      weight_sums=[cell_gradients.FreshZeros(specs.weight_sums[c]) for c in cells])
  if last in cells:
    state.update(outs=loop_arrays.Arrays(specs.outs[last], num_micro + 1),
                 dys=loop_arrays.Arrays(specs.outs[last], LossGradientDepth(specs, tables) + 1),
                 loss=[tf.zeros([], specs.loss.dtype)] if specs.loss is not None else [])
  if 0 in cells:
    state['d_inputs'] = loop_arrays.Arrays(specs.ins[0], num_micro + 1)
  return state


def WriteSlots(specs: Specs, tables: loop_tables.LoopTables,
               table: loop_tables.DeviceTable) -> Dict[str, List[np.ndarray]]:
  """Per array of the device of `table` the slot each of its actions
  writes (DeviceTable.Slots)."""
  num_micro, last = tables.num_micro, len(specs.outs) - 1
  slots = dict(ins=[table.Slots(F, c, InputDepth(tables, c), num_micro) for c in table.cells],
               factors=[table.Slots(X, c, tables.factor_rings[c], num_micro)
                        for c in table.cells])
  if last in table.cells:
    slots.update(outs=[table.Slots(F, last, num_micro, num_micro)],
                 dys=[table.Slots(F, last, LossGradientDepth(specs, tables), num_micro)])
  if 0 in table.cells:
    slots['d_inputs'] = [table.Slots(X, 0, num_micro, num_micro)]
  return slots


def Idle(specs: Specs, cells: List[int], state: Dict[str, Any]) -> Pieces:
  """The pieces of `cells` when they run nothing: zeros where summed
  (statistics, loss), the weight sums of `state` as they are, else
  unset."""
  last = len(specs.outs) - 1
  idle = []
  for place, c in enumerate(cells):
    pieces = dict(ins=loop_arrays.Unset(specs.ins[c]) if c else [],
                  factors=loop_arrays.Unset(specs.factors[c]),
                  sums=loop_arrays.Zeros(specs.updates[c]),
                  weight_sums=list(state['weight_sums'][place]))
    if c == last:
      inside = specs.loss is not None
      pieces.update(outs=loop_arrays.Unset(specs.outs[c]),
                    dys=loop_arrays.Unset(specs.outs[c]) if inside else [],
                    loss=loop_arrays.Zeros([specs.loss]) if inside else [])
    if c == 0:
      pieces['d_inputs'] = loop_arrays.Unset(specs.ins[0])
    idle.append(pieces)
  return idle


def Flatten(pieces: Pieces) -> List[tf.Tensor]:
  return [x for cell in pieces for key in sorted(cell) for x in cell[key]]


def Unflatten(flat: List[tf.Tensor], like: Pieces) -> Pieces:
  """`flat` (Flatten's) in the structure of `like`."""
  out, start = [], 0
  for cell in like:
    pieces = {}
    for key in sorted(cell):
      pieces[key] = list(flat[start:start + len(cell[key])])
      start += len(cell[key])
    out.append(pieces)
  return out


def Written(i: tf.Tensor, pieces: Pieces, state: Dict[str, Any],
            slots: Dict[str, List[tf.Tensor]]) -> Dict[str, Any]:
  """A device's state after writing iteration i's pieces at their slots
  (WriteSlots, as tensors) and adding its sums."""
  new = dict(state)
  for key in ('ins', 'factors'):
    new[key] = [_Write(state[key][place], i, slots[key][place], cell[key])
                for place, cell in enumerate(pieces)]
  new['sums'] = [[s + u for s, u in zip(state['sums'][place], cell['sums'])]
                 for place, cell in enumerate(pieces)]
  new['weight_sums'] = [cell['weight_sums'] for cell in pieces]
  for cell in pieces:
    for key in ('outs', 'dys', 'd_inputs'):
      if cell.get(key):
        new[key] = _Write(state[key], i, slots[key][0], cell[key])
    if cell.get('loss'):
      new['loss'] = [state['loss'][0] + cell['loss'][0]]
  return new


def _Write(arrays: List[tf.TensorArray], i: tf.Tensor, slots: tf.Tensor,
           values: List[tf.Tensor]) -> List[tf.TensorArray]:
  """`arrays` with `values` written at iteration i's slot (one lookup for all)."""
  if not arrays:
    return []
  slot = tf.gather(slots, i)
  return [a.write(slot, x) for a, x in zip(arrays, values)]
