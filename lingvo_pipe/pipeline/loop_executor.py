"""The executor as one tf.while_loop over clocks: any schedule, every replica, a graph that does not grow with M.

Per clock of loop_tables each device of each replica runs a tf.switch_case
over its cells' F, X (B or I), W and KEPT branches, and beside it one over
its cells' W's for a W the tables put in the same clock: a few calls per
cell whatever M is. A lane is one cell of one replica (lane r*C + c); replica r
reads its own copy of the variables on its own devices.

Arrays per lane carry what crosses between clocks (loop_tables' rings):
activations, gradients, the last cell's outputs and loss gradients, the
input gradients, and each micro-batch's deferred factor pairs, packed in
a vector per dtype (every loop variable costs ops in every clock). Every
array is written every clock (an unset tensor at a spare slot if nothing
is due): no write needs a condition; reads see the arrays as at the
clock's start. Weight gradients add into the cells' accumulators
(CellGradients.StartLoopStep, then ZeroAccumulators once a probe says
which weights defer wholly). A B's factor pairs leave the loop for one
product per weight after it; an I's wait in their array for its W.

With replicas the clocks after the forwards run as one loop per span
between REDUCE clocks (loop_tables.ReduceClocks): after each span its
finished cells are all-reduced while the next span's loop runs the cells
still working, as the unrolled REDUCE does. A span's loop leaves out the
devices and branches it never runs.

Every micro-batch but the last cell's KEPT ones is recomputed in its
backward (PER_LAYER per layer, other policies the cell whole). With the
loss inside (Run) the last cell's F also computes its micro-batch's loss
and output gradients, the loss function traced once; with the loss
outside (Forwards, then Backwards) the step is two loops, the forwards'
clocks and then the rest.
"""

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline import cell_runner
from lingvo_pipe.pipeline import executor
from lingvo_pipe.pipeline import loop_arrays
from lingvo_pipe.pipeline import loop_probes
from lingvo_pipe.pipeline import loop_tables
from lingvo_pipe.pipeline import plan as plan_lib
from lingvo_pipe.pipeline import remat
from lingvo_pipe.pipeline.cell_gradients import IsDifferentiable
from lingvo_pipe.pipeline.loop_tables import F, KINDS, W, X


class LoopExecutor:
  """A step of a plan's actions as one loop over clocks (module docstring).

  Args:
    plan: the pipeline's Plan.
    runners: [replica][cell] the CellRunners.
    thetas: [replica][cell] the cell's theta in the compute dtype, on the
      replica's device.
    micro_inputs: [replica][micro-batch] the pipeline's inputs.
    micro_size: examples per micro-batch (dropout masks index examples).
    loss_fn: the per-micro-batch loss (Run), or None (Forwards, Backwards).
  """

  def __init__(self, plan: plan_lib.Plan,
               runners: Sequence[Sequence[cell_runner.CellRunner]],
               thetas: Sequence[Sequence[NestedMap]],
               micro_inputs: Sequence[Sequence[tuple]],
               micro_size: int, loss_fn: Optional[executor.MicroLossFn] = None) -> None:
    self._plan = plan
    self._num_micro = num_micro = len(micro_inputs[0])
    self._num_cells = plan.num_cells
    self._num_replicas = len(micro_inputs)
    self._runners = [list(row) for row in runners[:self._num_replicas]]
    self._thetas = [list(row) for row in thetas[:self._num_replicas]]
    self._micro_size = micro_size
    self._loss_fn = loss_fn
    kept = remat.Decide(plan.policy, plan.remat_last_micro_batch, 0, num_micro,
                        backward_follows=True)
    self._tables = tables = loop_tables.Build(plan.Actions(num_micro),
                                              loss_fn is not None and kept.record)
    defer = plan.policy == remat.RematPolicy.PER_CELL
    self._decisions = [remat.Decision(
        record=False, inline=False, per_layer=plan.policy == remat.RematPolicy.PER_LAYER,
        defer=defer, split=defer and split) for split in tables.split]
    self._kept_decision = dataclasses.replace(kept, split=kept.defer and tables.split[-1])
    self._branches = tf.constant(tables.branches)
    self._micro = tf.constant(tables.micro)
    self._w_branches = tf.constant(tables.w_branches)
    self._w_micro = tf.constant(tables.w_micro)
    self._input_struct = micro_inputs[0][0]
    self._stacked_inputs = [loop_arrays.Stacked(micro_inputs[r], row[0].device)
                            for r, row in enumerate(self._runners)]
    self._out_structs, self._update_structs, self._loss_spec = loop_probes.Structures(
        self._runners[0], self._thetas[0], self._input_struct, loss_fn)
    self._out_specs = [loop_arrays.Specs(s) for s in self._out_structs]
    self._upd_specs = [loop_arrays.Specs(s) for s in self._update_structs]
    self._in_specs = [loop_arrays.Specs(self._input_struct)] + self._out_specs[:-1]
    for row in self._runners:
      for runner in row:
        runner.gradients.StartLoopStep(num_micro)
    self._layouts = loop_probes.FactorLayouts(
        self._runners, self._MicroTheta, [self._input_struct] + self._out_structs[:-1],
        self._out_structs, self._decisions, tables.split, num_micro)
    self._factor_specs = [loop_probes.PackedSpecs(cell) for cell in self._layouts]
    for r, row in enumerate(self._runners):
      for c, runner in enumerate(row):
        runner.gradients.ZeroAccumulators(self._thetas[r][c], every=tables.split[c])
    self._state = loop_arrays.InitialState(
        [[r.device for r in row] for row in self._runners], tables.rings, num_micro,
        self._out_specs, self._upd_specs, self._in_specs[0], self._factor_specs,
        self._loss_spec)
    self._updates: Optional[List[NestedMap]] = None
    self._reduced: Dict[int, List[List[Any]]] = {}  # cell -> [replica] its sums

  # --- phases ----------------------------------------------------------------

  def Updates(self) -> List[NestedMap]:
    """Per cell its statistics summed over micro-batches and replicas on
    its variable device (after Forwards or Run)."""
    if self._updates is None:
      per_replica = [[tf.nest.pack_sequence_as(self._update_structs[c],
                                               self._state['sums'][r * self._num_cells + c])
                      for c in range(self._num_cells)] for r in range(self._num_replicas)]
      self._updates = executor.SumUpdatesOverReplicas(per_replica, self._plan.devices)
    return self._updates

  def Run(self) -> executor.StepResult:
    """Every clock, the loss inside: the StepResult."""
    self._state = self._Spans(0, self._state)
    return self._Result()

  def Forwards(self) -> List[List[tuple]]:
    """The forwards' clocks (the loss outside): [replica][micro-batch] the
    last cell's outputs."""
    if self._tables.forward_clocks is None:  # FProp checked plan.ForwardsFirst
      raise ValueError('Forwards needs every forward before any backward.')
    self._state = self._Loop(0, self._tables.forward_clocks, self._state)
    return self._LastOutputs()

  def Backwards(self, output_grads: Sequence[Sequence[List[Any]]]) -> executor.StepResult:
    """The remaining clocks, from [replica][micro-batch] the gradients of the
    last cell's flat outputs."""
    state = dict(self._state)
    dys = []
    for r, per_micro in enumerate(output_grads):
      with tf.device(self._runners[r][-1].device):
        dys.append([a.scatter(list(range(self._num_micro)), tf.stack(list(column)))
                    for a, column in zip(state['dys'][r], zip(*per_micro))])
    state['dys'] = dys
    self._state = self._Spans(self._tables.forward_clocks or 0, state)
    return self._Result()

  # --- setup -----------------------------------------------------------------

  def _MicroTheta(self, r: int, c: int, m: tf.Tensor) -> NestedMap:
    theta = self._thetas[r][c]
    seed = executor.MicroSeed(theta, (r * self._num_micro + m) * self._micro_size)
    return theta if seed is None else base_layer.WithStepSeed(theta, seed)

  # --- the loop ----------------------------------------------------------------

  def _Spans(self, start: int, state: Dict[str, Any]) -> Dict[str, Any]:
    """The clocks from `start` on; with replicas one loop per span between
    REDUCE clocks, each finished cell all-reduced after its span."""
    end = self._tables.num_clocks
    ends = self._tables.ReduceClocks() if self._num_replicas > 1 else {}
    for stop in sorted({e for e in ends.values() if start < e < end} | {end}):
      state = self._Loop(start, stop, state)
      for c in sorted((c for c, e in ends.items() if start < e <= stop), reverse=True):
        self._reduced[c] = executor.SumCellOverReplicas(
            [self._CellGradients(state, r, c) for r in range(self._num_replicas)],
            self._plan.replica_devices, c)
      start = stop
    return state

  def _Loop(self, start: int, end: int, state: Dict[str, Any]) -> Dict[str, Any]:
    tables = self._tables
    slots = tf.nest.map_structure(tf.constant, tables.WriteSlots())
    # Branches that the span never picks are idle ones (a finished cell's
    # backward is not traced again), and so are devices it never uses.
    used = tables.Picks(tables.branches, start, end)
    w_used = tables.Picks(tables.w_branches, start, end)
    active, w_active = (sorted({d for d, _ in picks}) for picks in (used, w_used))

    def Body(t, state):
      new = {key: list(value) for key, value in state.items()}
      done = []
      for r in range(self._num_replicas):
        for d in active:
          cells = tables.cells_on[d]
          pieces = self._DeviceClock(r, d, cells, t, state, used)
          for place, c in enumerate(cells):
            self._Write(r, c, t, pieces[2 * place], pieces[2 * place + 1], state,
                        new, slots)
        for d in w_active:
          done.append(self._DeviceW(r, d, tables.cells_on[d], t, state, w_used))
      with tf.control_dependencies(done):
        return t + 1, new

    _, state = tf.while_loop(lambda t, _: t < end, Body, (tf.constant(start), state))
    return state

  def _Idle(self, c: int) -> List[List[tf.Tensor]]:
    """Cell c's forward and backward pieces when it runs nothing: zeros
    where summed (statistics, loss), else unset (loop_arrays.Unset)."""
    forward = loop_arrays.Unset(self._out_specs[c]) + loop_arrays.Zeros(self._upd_specs[c])
    if c == self._num_cells - 1 and self._loss_fn:
      forward += loop_arrays.Zeros([self._loss_spec]) + loop_arrays.Unset(self._out_specs[c])
    return [forward, loop_arrays.Unset(self._in_specs[c] + self._factor_specs[c])]

  def _DeviceClock(self, r: int, d: int, cells: List[int], t: tf.Tensor,
                   state: Dict[str, Any], used: Set[Tuple[int, int]]
                   ) -> List[List[tf.Tensor]]:
    """What device d of replica r runs at clock t: a switch_case over its
    cells' branches, those not in `used` (device, branch) idle. Returns its
    pieces, forward and backward per cell."""
    with tf.device(self._runners[r][cells[0]].device):
      index = tf.gather(self._branches[t], d)
      m = tf.gather(self._micro[t], d)
      idle = [piece for c in cells for piece in self._Idle(c)]

      def Branch(place, kind):
        def Fn():
          pieces = list(idle)
          if place is not None:
            c = cells[place]
            if kind == F:
              pieces[2 * place] = self._Forward(r, c, m, state)
            elif kind == X:
              pieces[2 * place + 1] = self._Backward(r, c, m, state)
            elif kind == W:
              self._WeightBackward(r, c, m, state)
            else:
              pieces[2 * place], pieces[2 * place + 1] = self._Kept(r, m, state)
          return [x for piece in pieces for x in piece]
        return Fn

      fns = [Branch(None, None)] + [
          Branch(i, kind) if (d, 1 + KINDS * i + kind) in used else Branch(None, None)
          for i in range(len(cells)) for kind in range(KINDS)]
      flat = tf.switch_case(index, fns)
    pieces, start = [], 0
    for piece in idle:
      pieces.append(flat[start:start + len(piece)])
      start += len(piece)
    return pieces

  def _DeviceW(self, r: int, d: int, cells: List[int], t: tf.Tensor,
               state: Dict[str, Any], w_used: Set[Tuple[int, int]]) -> tf.Tensor:
    """The W that device d of replica r runs beside its action at clock t
    (loop_tables' w_branches): a switch_case over its cells' W's."""
    with tf.device(self._runners[r][cells[0]].device):
      m = tf.gather(self._w_micro[t], d)

      def Branch(branch):
        def Fn():
          if (d, branch) in w_used:
            self._WeightBackward(r, cells[branch - 1], m, state)
          return tf.constant(0)
        return Fn

      return tf.switch_case(tf.gather(self._w_branches[t], d),
                            [Branch(b) for b in range(1 + len(cells))])

  def _Inputs(self, r: int, c: int, m: tf.Tensor, state: Dict[str, Any]) -> tuple:
    """Cell c's inputs of micro-batch m: the pipeline's for cell 0, else
    cell c-1's outputs from their ring."""
    if c == 0:
      flat = [tf.gather(x, m) for x in self._stacked_inputs[r]]
      return tf.nest.pack_sequence_as(self._input_struct, flat)
    slot = m % self._tables.rings.activations[c - 1]
    lane = r * self._num_cells + c - 1
    return tf.nest.pack_sequence_as(self._out_structs[c - 1],
                                    [a.read(slot) for a in state['acts'][lane]])

  def _Forward(self, r: int, c: int, m: tf.Tensor, state: Dict[str, Any]) -> List[tf.Tensor]:
    runner = self._runners[r][c]
    with tf.device(runner.device):
      out, upd, _ = runner.Forward(self._MicroTheta(r, c, m), self._Inputs(r, c, m, state))
      result = tf.nest.flatten(out) + tf.nest.flatten(upd)
      if c == self._num_cells - 1 and self._loss_fn:
        micro_loss, dy = executor.LossAndOutputGrads(self._loss_fn, out)
        result += [micro_loss] + dy
      return result

  def _Backward(self, r: int, c: int, m: tf.Tensor, state: Dict[str, Any]) -> List[tf.Tensor]:
    """X: the flat input gradients, then the deferred factors, flat."""
    runner = self._runners[r][c]
    with tf.device(runner.device):
      x = self._Inputs(r, c, m, state)
      if c == self._num_cells - 1:
        depth = self._tables.rings.loss_gradients if self._loss_fn else self._num_micro
        ring = state['dys'][r]
      else:
        depth, ring = self._tables.rings.gradients[c], state['grads'][r * self._num_cells + c]
      dy = tf.nest.pack_sequence_as(self._out_structs[c], [a.read(m % depth) for a in ring])
      dx = runner.Backward(self._MicroTheta(r, c, m), x, dy, self._decisions[c],
                           self._num_micro)
      return loop_probes.FlatBackward(
          x, dx, runner.gradients, self._tables.split[c], self._layouts[c])

  def _Kept(self, r: int, m: tf.Tensor, state: Dict[str, Any]
            ) -> Tuple[List[tf.Tensor], List[tf.Tensor]]:
    """The last cell's forward of micro-batch m recorded, its loss, and its
    backward from the record."""
    c = self._num_cells - 1
    runner = self._runners[r][c]
    with tf.device(runner.device):
      x = self._Inputs(r, c, m, state)
      out, upd, recording = runner.Forward(self._MicroTheta(r, c, m), x,
                                           self._kept_decision, self._num_micro)
      assert self._loss_fn is not None and recording is not None  # KEPT's premises
      micro_loss, dy = executor.LossAndOutputGrads(self._loss_fn, out)
      dx = runner.BackwardFromTape(recording, x, out, tf.nest.pack_sequence_as(out, dy))
      forward = tf.nest.flatten(out) + tf.nest.flatten(upd) + [micro_loss] + dy
      return forward, loop_probes.FlatBackward(
          x, dx, runner.gradients, self._tables.split[c], self._layouts[c])

  def _WeightBackward(self, r: int, c: int, m: tf.Tensor, state: Dict[str, Any]) -> None:
    """W: the product of micro-batch m's factor pairs, from its I's array."""
    runner = self._runners[r][c]
    with tf.device(runner.device):
      runner.WeightBackward(loop_probes.Pairs(
          [a.read(m) for a in state['factors'][r * self._num_cells + c]], self._layouts[c]))

  def _Write(self, r: int, c: int, t: tf.Tensor, forward: List[tf.Tensor],
             backward: List[tf.Tensor], state: Dict[str, Any], new: Dict[str, Any],
             slots: Dict[str, Any]) -> None:
    """Writes lane (r, c)'s pieces of clock t into the new state."""
    lane, last = r * self._num_cells + c, self._num_cells - 1
    with tf.device(self._runners[r][c].device):
      num_in = len(self._in_specs[c])
      dx, factors = backward[:num_in], backward[num_in:]
      new['factors'][lane] = [a.write(slots['factors'][c][t], f)
                              for a, f in zip(state['factors'][lane], factors)]
      num_out, num_upd = len(self._out_specs[c]), len(self._upd_specs[c])
      y, upd = forward[:num_out], forward[num_out:num_out + num_upd]
      new['sums'][lane] = [s + u for s, u in zip(state['sums'][lane], upd)]
      if c < last:
        new['acts'][lane] = [a.write(slots['acts'][c][t], x)
                             for a, x in zip(state['acts'][lane], y)]
      else:
        new['outs'][r] = [a.write(slots['outs'][t], x) for a, x in zip(state['outs'][r], y)]
        if self._loss_fn:
          rest = forward[num_out + num_upd:]
          new['losses'][r] = state['losses'][r] + rest[0]
          new['dys'][r] = [a.write(slots['dys'][t], x)
                           for a, x in zip(state['dys'][r], rest[1:])]
      if c > 0:
        new['grads'][lane - 1] = [a.write(slots['grads'][c - 1][t], g)
                                  for a, g in zip(state['grads'][lane - 1], dx)]
      else:
        new['d_inputs'][r] = [a.write(slots['d_inputs'][t], g)
                              for a, g in zip(state['d_inputs'][r], dx)]

  # --- results -------------------------------------------------------------

  def _LastOutputs(self) -> List[List[tuple]]:
    per_replica = []
    for r, row in enumerate(self._runners):
      with tf.device(row[-1].device):
        columns = [loop_arrays.Unstacked(a, self._num_micro) for a in self._state['outs'][r]]
        per_replica.append([tuple(tf.nest.pack_sequence_as(self._out_structs[-1], list(f)))
                            for f in zip(*columns)])
    return per_replica

  def _Result(self) -> executor.StepResult:
    state = self._state
    cells = range(self._num_cells)
    grads = ([[self._reduced[c][r] for c in cells] for r in range(self._num_replicas)]
             if self._num_replicas > 1 else [[self._CellGradients(state, 0, c) for c in cells]])
    input_grads = []
    for r, row in enumerate(self._runners):
      with tf.device(row[0].device):
        columns = [loop_arrays.Unstacked(a, self._num_micro) if IsDifferentiable(x)
                   else [None] * self._num_micro
                   for a, x in zip(state['d_inputs'][r], tf.nest.flatten(self._input_struct))]
      input_grads.append([list(g) for g in zip(*columns)])
    with tf.device(self._plan.devices[-1].name):
      loss = tf.add_n(state['losses']) if state['losses'] else None
    return executor.StepResult(loss, self._LastOutputs(), input_grads, grads, self.Updates())

  def _CellGradients(self, state: Dict[str, Any], r: int, c: int) -> List[Any]:
    """Cell c's step gradients in replica r, from the state after its
    last X or W (a B's factor pairs gathered from their array)."""
    runner = self._runners[r][c]
    if not self._tables.split[c]:
      micro = list(range(self._num_micro))
      with tf.device(runner.device):
        runner.gradients.PutFactors(loop_probes.Pairs(
            [a.gather(micro) for a in state['factors'][r * self._num_cells + c]],
            self._layouts[c]))
    return runner.gradients.StepGradients(self._thetas[r][c])

