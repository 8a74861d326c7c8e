"""Any schedule's loss-inside training step as one tf.while_loop over its clocks.

executor emits every task of schedule.Tasks: 2*C*M cell calls for C
cells, and the time to the first step grows with them. Here one loop runs
the schedule's clocks; per clock, each device runs a tf.switch_case whose
index comes from a constant [clocks, devices] table built from the tasks:
idle, or the forward or backward of one of the device's cells (or both,
below). The step holds at most 2*C cell calls whatever M is.

The last cell's forward also computes its micro-batch's loss and the
gradients of its outputs (executor.LossAndOutputGrads), the loss
added into a loop variable. Data between cells lives in TensorArrays per
cell boundary, indexed by a ring slot m mod S: activations (cell j's
forward writes them, cell j+1's forward and backward read them) and output
gradients (cell j+1's backward writes them, cell j's reads them). S is the
smallest depth at which no micro-batch's write comes before the last read
of the micro-batch it overwrites (RingDepths), so 1F1B keeps its bound of
micro-batches in flight, not M. Every array is written every clock, at
index S (a spare slot) when nothing is written there, so no write needs a
condition; reads read the arrays as they were at the start of the clock.
The last cell's outputs and the input gradients are M-sized arrays (with
a spare slot too), gathered out once.

The last cell's micro-batches that remat.Decide keeps (its backward next
on its device, KeptLastMicroBatches: all of them under 1F1B and the
interleaved schedule with per-cell remat) run forward, loss and backward in
one branch, the backward from the forward's tape, at the forward's clock.
Every other micro-batch is recomputed in its backward (RematPolicy.PER_LAYER
per layer, every other policy the cell whole); a kept micro-batch of
another cell is recomputed too, since a tape cannot outlive its clock.
Weight gradients are added into the cells' accumulators
(CellGradients.StartLoopStep, then ZeroAccumulators once a probe trace
says which weights defer wholly); under PER_CELL the projections' deferred
factor pairs (deferred_grads) leave the loop in M-sized TensorArrays per
cell, as in tick_loop, and each weight takes one product after it.
Batch-norm statistics are summed in loop variables. Dropout masks take the
step seed [s0, m * micro-batch size] of micro-batch m, as in the unrolled
step. The loss
function is traced once: it must be a function of its micro-batch's
outputs (and of tensors computed before the pipeline).
"""

import dataclasses
from typing import Any, Dict, FrozenSet, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline import cell_runner
from lingvo_pipe.pipeline import loop_arrays
from lingvo_pipe.pipeline import remat
from lingvo_pipe.pipeline import schedule
from lingvo_pipe.pipeline import executor
from lingvo_pipe.pipeline.cell_gradients import IsDifferentiable
from lingvo_pipe.pipeline.tick_loop import MicroTheta

_Key = Tuple[schedule.Phase, int, int]  # (phase, cell, micro-batch)
# What a branch runs of one of its device's cells.
_FORWARD, _BACKWARD, _KEPT = 0, 1, 2  # _KEPT: both, from the forward's tape


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
  """Ring depths of a schedule's arrays.

  Attributes:
    activations: per boundary j (cell j -> cell j+1), for cell j's outputs.
    gradients: per boundary j, for the gradients of cell j's outputs.
    loss_gradients: for the gradients of the last cell's outputs.
  """
  activations: List[int]
  gradients: List[int]
  loss_gradients: int


def KeptLastMicroBatches(tasks: Sequence[schedule.Task], policy: remat.RematPolicy,
                         remat_last_micro_batch: bool) -> FrozenSet[int]:
  """The micro-batches whose last-cell backward runs in the branch of its
  forward, from the forward's tape (no recomputation): those whose backward
  the last cell runs next, when remat.Decide keeps them (1F1B: all)."""
  last = max(t.cell for t in tasks)
  num_micro = max(t.micro_batch for t in tasks) + 1
  if not remat.Decide(policy, remat_last_micro_batch, 0, num_micro,
                      backward_follows=True).record:
    return frozenset()
  return frozenset(m for k, m in schedule.KeptForwards(tasks) if k == last)


def _Clocks(tasks: Sequence[schedule.Task], kept: FrozenSet[int]) -> Dict[_Key, int]:
  """The clock of each task; a kept last-cell backward's is its forward's."""
  last = max(t.cell for t in tasks)
  clock = {(t.phase, t.cell, t.micro_batch): t.clock for t in tasks}
  for m in kept:
    clock[(schedule.Phase.BACKWARD, last, m)] = clock[(schedule.Phase.FORWARD, last, m)]
  return clock


def RingDepths(tasks: Sequence[schedule.Task], kept: FrozenSet[int] = frozenset()) -> Rings:
  """The ring depths of the step that runs `tasks` (schedule.Tasks), with
  the last cell's micro-batches `kept` (KeptLastMicroBatches)."""
  clock = _Clocks(tasks, kept)
  num_cells = max(t.cell for t in tasks) + 1
  micro = range(max(t.micro_batch for t in tasks) + 1)
  fwd, bwd = schedule.Phase.FORWARD, schedule.Phase.BACKWARD
  last = num_cells - 1
  activations = [RingDepth([clock[(fwd, j, m)] for m in micro],
                           [max(clock[(fwd, j + 1, m)], clock[(bwd, j + 1, m)])
                            for m in micro]) for j in range(last)]
  gradients = [RingDepth([clock[(bwd, j + 1, m)] for m in micro],
                         [clock[(bwd, j, m)] for m in micro]) for j in range(last)]
  loss_gradients = RingDepth([clock[(fwd, last, m)] for m in micro],
                             [clock[(bwd, last, m)] for m in micro])
  return Rings(activations, gradients, loss_gradients)


def _WriteSlots(num_clocks: int, writes: Sequence[int], depth: int) -> tf.Tensor:
  """Per clock, the slot written then: micro-batch m's m mod depth at clock
  writes[m], else the spare slot `depth`."""
  slots = np.full([num_clocks], depth, np.int32)
  for m, c in enumerate(writes):
    slots[c] = m % depth
  return tf.constant(slots)


class ScheduledLoop:
  """The training step of schedule.Tasks as one while loop (module
  docstring).

  Args:
    runners: the cells' CellRunners, by cell.
    devices: the device name of each device index of the tasks.
    tasks: schedule.Tasks of the schedule.
    thetas: each cell's theta (read on its device).
    micro_inputs: the pipeline's inputs of each micro-batch.
    micro_size: examples per micro-batch (dropout masks index examples).
    policy: the pipeline's RematPolicy (PER_LAYER recomputes per layer).
    remat_last_micro_batch: the pipeline's: recompute the last cell's
      micro-batches that KeptLastMicroBatches would keep.
    loss_fn: the per-micro-batch loss (executor.MicroLossFn).
  """

  def __init__(self, runners: Sequence[cell_runner.CellRunner],
               devices: Sequence[str], tasks: Sequence[schedule.Task],
               thetas: Sequence[NestedMap], micro_inputs: Sequence[tuple],
               micro_size: int,
               policy: remat.RematPolicy, remat_last_micro_batch: bool,
               loss_fn: executor.MicroLossFn) -> None:
    self._runners = list(runners)
    self._devices = list(devices)
    self._thetas = list(thetas)
    self._loss_fn = loss_fn
    self._num_micro = len(micro_inputs)
    self._micro_size = micro_size
    self._num_cells = len(runners)
    self._input_struct = micro_inputs[0]
    self._decision = remat.Decision(
        record=False, inline=False, per_layer=policy == remat.RematPolicy.PER_LAYER,
        defer=policy == remat.RematPolicy.PER_CELL)
    self._kept_decision = remat.Decide(policy, remat_last_micro_batch, 0,
                                       self._num_micro, backward_follows=True)
    kept = self._kept = KeptLastMicroBatches(tasks, policy, remat_last_micro_batch)
    self._clock = _Clocks(tasks, kept)
    self._num_clocks = max(t.clock for t in tasks) + 1
    self._rings = RingDepths(tasks, kept)
    # Per device its cells, in order; a task's branch is 1 + 3 * (the
    # cell's place on its device) + _Kind, 0 is idle.
    device_of = {t.cell: t.device for t in tasks}
    self._cells_on = [[j for j in range(self._num_cells) if device_of[j] == d]
                      for d in range(len(devices))]
    branches = np.zeros([self._num_clocks, len(devices)], np.int32)
    micro = np.zeros([self._num_clocks, len(devices)], np.int32)
    last = self._num_cells - 1
    for t in tasks:
      place = self._cells_on[t.device].index(t.cell)
      kind = _FORWARD if t.phase == schedule.Phase.FORWARD else _BACKWARD
      if t.cell == last and t.micro_batch in kept:
        if kind == _BACKWARD:
          continue  # run by its forward's branch
        kind = _KEPT
      branches[t.clock, t.device] = 1 + 3 * place + kind
      micro[t.clock, t.device] = t.micro_batch
    self._used = {(d, int(b)) for d in range(len(devices)) for b in branches[:, d]}
    self._branches, self._micro = tf.constant(branches), tf.constant(micro)
    with tf.device(runners[0].device):
      flat = [tf.nest.flatten(x) for x in micro_inputs]
      self._stacked_inputs = [tf.stack(list(column)) for column in zip(*flat)]
    self._out_structs, self._update_structs, self._loss_spec = self._Structures()

  def _MicroTheta(self, k: int, m: tf.Tensor) -> NestedMap:
    """Cell k's theta for micro-batch m (tick_loop.MicroTheta)."""
    return MicroTheta(self._thetas[k], m * self._micro_size)

  def _Structures(self) -> Tuple[List[Any], List[Any], tf.TensorSpec]:
    """Each cell's output and statistics structures and the loss's spec,
    from a throwaway trace of the chain."""
    def Chain():
      x, outs, updates = self._input_struct, [], []
      for k, runner in enumerate(self._runners):
        x, upd, _ = runner.Forward(self._thetas[k], x)
        outs.append(x)
        updates.append(upd)
      loss, _ = executor.LossAndOutputGrads(self._loss_fn, x)
      return outs, updates, loss

    traced = tf.function(Chain, autograph=False).get_concrete_function()
    specs = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype),
                                  traced.structured_outputs)
    return specs[0], specs[1], specs[2]

  def _Writes(self, phase: schedule.Phase, cell: int) -> List[int]:
    return [self._clock[(phase, cell, m)] for m in range(self._num_micro)]

  def _Inputs(self, j: int, m: tf.Tensor, acts: List[List[tf.TensorArray]]) -> tuple:
    """Cell j's inputs of micro-batch m: the pipeline's for cell 0, else
    cell j-1's outputs from their ring."""
    if j == 0:
      flat = [tf.gather(x, m) for x in self._stacked_inputs]
      return tf.nest.pack_sequence_as(self._input_struct, flat)
    slot = m % self._rings.activations[j - 1]
    return tf.nest.pack_sequence_as(self._out_structs[j - 1],
                                    [a.read(slot) for a in acts[j - 1]])

  def _FactorLayouts(self, in_specs: List[List[tf.TensorSpec]],
                     out_specs: List[List[tf.TensorSpec]]
                     ) -> List[List[Tuple[int, List[tf.TensorSpec]]]]:
    """Per cell, the weight gradients its backward defers: (weight index,
    specs of its flat factor pairs), from a throwaway trace of one backward
    per cell (the functions the loop then calls, traced once)."""
    indices: List[List[int]] = []  # per cell, its deferring weights

    def Probe():
      layouts = []
      for j, runner in enumerate(self._runners):
        m = tf.constant(0)
        x = tf.nest.pack_sequence_as(self._input_struct if j == 0 else
                                     self._out_structs[j - 1], loop_arrays.Zeros(in_specs[j]))
        dy = tf.nest.pack_sequence_as(self._out_structs[j], loop_arrays.Zeros(out_specs[j]))
        runner.Backward(self._MicroTheta(j, m), x, dy, self._decision,
                        self._num_micro)
        factors = runner.gradients.TakeFactors()
        indices.append(sorted(factors))
        layouts.append([[f for pair in factors[i] for f in pair] for i in sorted(factors)])
      return layouts

    traced = tf.function(Probe, autograph=False).get_concrete_function()
    return [[(i, loop_arrays.Specs(flat)) for i, flat in zip(cell_indices, cell)]
            for cell_indices, cell in zip(indices, traced.structured_outputs)]

  def Run(self) -> executor.StepResult:
    """Runs the loop: the StepResult, theta gradients read from the cells'
    accumulators after it."""
    num_micro, last, rings = self._num_micro, self._num_cells - 1, self._rings
    fwd, bwd = schedule.Phase.FORWARD, schedule.Phase.BACKWARD
    for runner in self._runners:
      runner.gradients.StartLoopStep(num_micro)
    out_specs = [loop_arrays.Specs(s) for s in self._out_structs]
    upd_specs = [loop_arrays.Specs(s) for s in self._update_structs]
    in_specs = [loop_arrays.Specs(self._input_struct)] + out_specs[:-1]
    # The arrays written by each cell's forward and backward, and their
    # write slots per clock.
    acts = [loop_arrays.Arrays(out_specs[j], rings.activations[j] + 1) for j in range(last)]
    grads = [loop_arrays.Arrays(out_specs[j], rings.gradients[j] + 1) for j in range(last)]
    dys = loop_arrays.Arrays(out_specs[last], rings.loss_gradients + 1)
    outs = loop_arrays.Arrays(out_specs[last], num_micro + 1)
    d_inputs = loop_arrays.Arrays(in_specs[0], num_micro + 1)
    act_slots = [_WriteSlots(self._num_clocks, self._Writes(fwd, j), rings.activations[j])
                 for j in range(last)]
    grad_slots = [_WriteSlots(self._num_clocks, self._Writes(bwd, j + 1), rings.gradients[j])
                  for j in range(last)]
    dy_slots = _WriteSlots(self._num_clocks, self._Writes(fwd, last), rings.loss_gradients)
    out_slots = _WriteSlots(self._num_clocks, self._Writes(fwd, last), num_micro)
    in_slots = _WriteSlots(self._num_clocks, self._Writes(bwd, 0), num_micro)
    layouts = self._FactorLayouts(in_specs, out_specs)
    for j, runner in enumerate(self._runners):
      runner.gradients.ZeroAccumulators(self._thetas[j])
    factor_specs = [[s for _, specs in cell for s in specs] for cell in layouts]
    factors = [loop_arrays.Arrays(specs, num_micro + 1) for specs in factor_specs]
    factor_slots = [_WriteSlots(self._num_clocks, self._Writes(bwd, j), num_micro)
                    for j in range(self._num_cells)]
    sums = [loop_arrays.Zeros(s) for s in upd_specs]
    with tf.device(self._runners[last].device):
      loss = tf.zeros([], self._loss_spec.dtype)

    def Forward(j, m, acts):
      """Cell j's forward of micro-batch m: flat outputs, statistics and,
      for the last cell, the loss and output gradients."""
      with tf.device(self._runners[j].device):
        out, upd, _ = self._runners[j].Forward(
            self._MicroTheta(j, m), self._Inputs(j, m, acts))
        result = tf.nest.flatten(out) + tf.nest.flatten(upd)
        if j == last:
          micro_loss, dy = executor.LossAndOutputGrads(self._loss_fn, out)
          result += [micro_loss] + dy
        return result

    def Backward(j, m, acts, grads, dys):
      """Cell j's backward of micro-batch m: the flat input gradients, then
      its deferred factors, flat."""
      with tf.device(self._runners[j].device):
        x = self._Inputs(j, m, acts)
        ring, depth = (dys, rings.loss_gradients) if j == last else (
            grads[j], rings.gradients[j])
        dy = tf.nest.pack_sequence_as(self._out_structs[j],
                                      [a.read(m % depth) for a in ring])
        dx = self._runners[j].Backward(self._MicroTheta(j, m), x, dy,
                                       self._decision, num_micro)
        factors = self._runners[j].gradients.TakeFactors()
        return [tf.zeros_like(v) if g is None else g
                for v, g in zip(tf.nest.flatten(x), dx)] + [
                    f for i in sorted(factors) for pair in factors[i] for f in pair]

    def Kept(m, acts):
      """The last cell's forward of micro-batch m recorded, its loss, and its
      backward from the record: the pieces of Forward and Backward."""
      runner = self._runners[last]
      with tf.device(runner.device):
        x = self._Inputs(last, m, acts)
        out, upd, recording = runner.Forward(self._MicroTheta(last, m), x,
                                             self._kept_decision, num_micro)
        micro_loss, dy = executor.LossAndOutputGrads(self._loss_fn, out)
        dx = runner.BackwardFromTape(recording, x, out,
                                     tf.nest.pack_sequence_as(out, dy))
        factors = runner.gradients.TakeFactors()
        forward = tf.nest.flatten(out) + tf.nest.flatten(upd) + [micro_loss] + dy
        return forward, [tf.zeros_like(v) if g is None else g
                         for v, g in zip(tf.nest.flatten(x), dx)] + [
                             f for i in sorted(factors) for pair in factors[i] for f in pair]

    def Parts(j):
      """Specs of the pieces of cell j in its device's branch results."""
      forward = out_specs[j] + upd_specs[j] + (
          [self._loss_spec] + out_specs[j] if j == last else [])
      return forward, in_specs[j] + factor_specs[j]

    def Body(t, acts, grads, dys, outs, d_inputs, factors, sums, loss):
      # The branches read the arrays as they were at the start of the clock.
      new_acts, new_grads, new_sums = list(acts), list(grads), list(sums)
      new_factors = list(factors)
      new_dys, new_outs, new_d_inputs, new_loss = dys, outs, d_inputs, loss
      for d, cells in enumerate(self._cells_on):
        with tf.device(self._devices[d]):
          index = tf.gather(self._branches[t], d)
          m = tf.gather(self._micro[t], d)
          parts = [Parts(j) for j in cells]
          layout = [specs for pair in parts for specs in pair]

          def Branch(place, kind):
            """The branch running `kind` of the device's cell at `place` (or
            idle): its pieces computed, every other piece zeros."""
            def Fn():
              pieces = [loop_arrays.Zeros(s) for s in layout]
              if kind == _FORWARD:
                pieces[2 * place] = Forward(cells[place], m, acts)
              elif kind == _BACKWARD:
                pieces[2 * place + 1] = Backward(cells[place], m, acts, grads, dys)
              elif kind == _KEPT:
                pieces[2 * place], pieces[2 * place + 1] = Kept(m, acts)
              return [x for piece in pieces for x in piece]
            return Fn

          # Branches that the table never picks are idle ones (1F1B's last
          # cell runs no recomputing backward).
          fns = [Branch(i, kind) if (d, 1 + 3 * i + kind) in self._used else
                 Branch(None, None) for i in range(len(cells))
                 for kind in (_FORWARD, _BACKWARD, _KEPT)]
          fns.insert(0, Branch(None, None))
          flat = tf.switch_case(index, fns)
          pieces, start = [], 0
          for specs in layout:
            pieces.append(flat[start:start + len(specs)])
            start += len(specs)
        for place, j in enumerate(cells):
          with tf.device(self._runners[j].device):
            forward, backward = pieces[2 * place], pieces[2 * place + 1]
            dx, cell_factors = backward[:len(in_specs[j])], backward[len(in_specs[j]):]
            new_factors[j] = [a.write(factor_slots[j][t], f)
                              for a, f in zip(factors[j], cell_factors)]
            num_out, num_upd = len(out_specs[j]), len(upd_specs[j])
            y, upd = forward[:num_out], forward[num_out:num_out + num_upd]
            new_sums[j] = [s + u for s, u in zip(sums[j], upd)]
            if j < last:
              slot = act_slots[j][t]
              new_acts[j] = [a.write(slot, x) for a, x in zip(acts[j], y)]
            else:
              rest = forward[num_out + num_upd:]
              new_loss = loss + rest[0]
              new_outs = [a.write(out_slots[t], x) for a, x in zip(outs, y)]
              new_dys = [a.write(dy_slots[t], x) for a, x in zip(dys, rest[1:])]
            if j > 0:
              new_grads[j - 1] = [a.write(grad_slots[j - 1][t], g)
                                  for a, g in zip(grads[j - 1], dx)]
            else:
              new_d_inputs = [a.write(in_slots[t], g) for a, g in zip(d_inputs, dx)]
      return (t + 1, new_acts, new_grads, new_dys, new_outs, new_d_inputs,
              new_factors, new_sums, new_loss)

    _, _, _, _, outs, d_inputs, factors, sums, loss = tf.while_loop(
        lambda t, *_: t < self._num_clocks, Body,
        (tf.constant(0), acts, grads, dys, outs, d_inputs, factors, sums, loss))
    micro = list(range(num_micro))
    for j, runner in enumerate(self._runners):
      flat = iter(factors[j])
      pairs = {}
      with tf.device(runner.device):
        for i, specs in layouts[j]:
          rows = [loop_arrays.GatherRows(next(flat), micro) for _ in specs]
          pairs[i] = [(rows[n], rows[n + 1]) for n in range(0, len(rows), 2)]
      runner.gradients.PutFactors(pairs)
    with tf.device(self._runners[last].device):
      columns = [tf.unstack(a.gather(micro), num_micro) for a in outs]
      last_outputs = [tuple(tf.nest.pack_sequence_as(self._out_structs[last], list(f)))
                      for f in zip(*columns)]
    with tf.device(self._runners[0].device):
      columns = [tf.unstack(a.gather(micro), num_micro) if IsDifferentiable(x)
                 else [None] * num_micro
                 for a, x in zip(d_inputs, tf.nest.flatten(self._input_struct))]
    input_grads = [list(g) for g in zip(*columns)]
    theta_grads = [runner.gradients.StepGradients(self._thetas[j])
                   for j, runner in enumerate(self._runners)]
    updates = [tf.nest.pack_sequence_as(self._update_structs[j], sums[j])
               for j in range(self._num_cells)]
    return executor.StepResult(loss, [last_outputs], [input_grads], theta_grads, updates)
