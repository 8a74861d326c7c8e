"""The executor as one tf.while_loop per device: any schedule, every replica, a graph that does not grow with M.

Each device of each replica runs its own loop over its actions
(loop_tables), on its own device: per iteration a tf.switch_case over its
cells' F, X (B or I), W and KEPT branches (their bodies: loop_actions). Devices meet only where data
passes: a forward puts its outputs in a FIFO queue on the next cell's
device, whose forward takes them from it; a backward puts its input
gradients in one on the previous cell's device. So no device waits for
another's iteration (as one loop over clocks for all devices would: each
clock then as long as its longest action, and every tensor a device reads
crossing devices through the loop's frame every clock). The queues are
the pipeline's, named per loop step of a graph (loop_queues.QueueNames:
a retrace reuses them) and drained at the step's start, so a step that
failed halfway leaves nothing behind.

What a device keeps between its iterations are its loop's arrays (each
written every iteration, to a spare slot when nothing is due: no write
needs a condition): its cells' inputs for their backwards' recomputation
and the last cell's loss gradients in rings (loop_tables), the last
cell's outputs, the input gradients, deferred factors (loop_probes: a
B's an array each, an I's packed) and statistics and loss sums. Weight
gradients add into the cells' accumulators (CellGradients.StartLoopStep,
then ZeroAccumulators once a probe says which weights defer wholly). A
B's factors leave the loop, each gathered into its weight's one product
after it; an I's wait in a ring for its W, whose products add into sums
the loop carries (not into the accumulators: the next iteration would
wait for the update).

Every micro-batch but the last cell's KEPT ones is recomputed in its
backward (PER_LAYER per layer, other policies the cell whole). With the
loss inside (Run) the last cell's F also computes its micro-batch's loss
and output gradients; with the loss outside (Forwards, then Backwards)
each device runs two loops, its forwards and then the rest; in
evaluation its forwards alone (the loss, if any, after them). With
replicas a cell's gradients are all-reduced once its devices' loops end,
while other devices' loops still run. What the step hands back is read
from the loops' final states (loop_results).
"""

from typing import Any, Dict, List, Optional, Sequence

import tensorflow as tf

from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.core import step_seeds
from lingvo_pipe.pipeline.cell import cell_runner
from lingvo_pipe.pipeline.layout import plan as plan_lib
from lingvo_pipe.pipeline.lowering import loop_tables
from lingvo_pipe.pipeline.lowering import program
from lingvo_pipe.pipeline.lowering.loop_tables import F, KINDS, W, X
from lingvo_pipe.pipeline.replicas import all_reduce
from lingvo_pipe.pipeline.step import step_runner
from lingvo_pipe.pipeline.step.loop import loop_actions
from lingvo_pipe.pipeline.step.loop import loop_arrays
from lingvo_pipe.pipeline.step.loop import loop_probes
from lingvo_pipe.pipeline.step.loop import loop_queues
from lingvo_pipe.pipeline.step.loop import loop_results
from lingvo_pipe.pipeline.step.loop import loop_state


class LoopExecutor:
  """A step of a plan's actions as one loop per device (module docstring).

  Args:
    plan: the pipeline's Plan (where each cell runs).
    step: the step's Program, lowered for the loop emission.
    runners: [replica][cell] the CellRunners.
    thetas: [replica][cell] the cell's theta in the compute dtype, on the
      replica's device.
    micro_inputs: [replica][micro-batch] the pipeline's inputs.
    micro_size: examples per micro-batch (dropout masks index examples).
    loss_fn: the per-micro-batch loss (Run, or evaluation's Loss), or None
      (Forwards, Backwards).
    queue_names: the pipeline's names of its queues (loop_queues).
  """

  def __init__(self, plan: plan_lib.Plan, step: program.Program,
               runners: Sequence[Sequence[cell_runner.CellRunner]],
               thetas: Sequence[Sequence[NestedMap]],
               micro_inputs: Sequence[Sequence[tuple]],
               micro_size: int, loss_fn: Optional[step_runner.MicroLossFn],
               collectives: all_reduce.Collectives,
               queue_names: loop_queues.QueueNames) -> None:
    if step.emission != program.Emission.LOOP:
      raise RuntimeError(f'A loop step got a program lowered for {step.emission}: a bug.')
    self._plan, self._program = plan, step
    self._collectives = collectives
    self._num_micro = num_micro = len(micro_inputs[0])
    self._num_cells = plan.num_cells
    self._num_replicas = len(micro_inputs)
    self._runners = [list(row) for row in runners[:self._num_replicas]]
    self._thetas = [list(row) for row in thetas[:self._num_replicas]]
    self._micro_size = micro_size
    self._training, self._loss_fn = step.step.training, loss_fn
    self._tables = tables = loop_tables.Build(step)
    self._decisions = step.loop_backwards
    self._input_struct = micro_inputs[0][0]
    self._out_structs, self._update_structs, loss_spec = loop_probes.Structures(
        self._runners[0], self._thetas[0], self._input_struct, loss_fn if self._training else None)
    out_specs = [loop_arrays.Specs(s) for s in self._out_structs]
    self._layouts = (self._StartGradients() if self._training
                     else [[] for _ in range(self._num_cells)])
    self._specs = loop_state.Specs(
        [loop_arrays.Specs(self._input_struct)] + out_specs[:-1], out_specs,
        [loop_arrays.Specs(s) for s in self._update_structs],
        [loop_probes.FactorSpecs(layout, split)
         for layout, split in zip(self._layouts, tables.split)],
        [runner.gradients.SumSpecs([i for i, _ in layout]) if split else []
         for runner, layout, split in zip(self._runners[0], self._layouts, tables.split)],
        loss_spec)
    prefix = queue_names.Step()
    last = self._num_cells - 1
    self._actions = loop_actions.LoopActions(
        self._runners,
        [loop_queues.Build(out_specs, [runner.device for runner in row], num_micro,
                           f'{prefix}_r{r}') for r, row in enumerate(self._runners)],
        [loop_arrays.Stacked(micro_inputs[r], row[0].device)
         for r, row in enumerate(self._runners)],
        self._input_struct, self._out_structs, tables, self._specs, self._layouts,
        self._decisions, step.decisions[(last, min(tables.kept))] if tables.kept else None,
        loss_fn, self._training, num_micro, self._num_cells)
    self._state: List[List[Dict[str, Any]]] = []  # [replica][device] its loop's state
    for row in self._runners:
      self._state.append([])
      for table in tables.devices:
        with tf.device(row[table.cells[0]].device):
          self._state[-1].append(loop_state.Initial(self._specs, tables, table.cells))
    self._updates: Optional[List[NestedMap]] = None
    self._last_outputs: List[List[tuple]] = []

  # --- phases ----------------------------------------------------------------

  def Updates(self) -> List[NestedMap]:
    """Per cell its statistics summed over micro-batches and replicas on
    its variable device (after Forwards or Run)."""
    if self._updates is None:
      per_replica = [[tf.nest.pack_sequence_as(self._update_structs[c], self._Lane(r, c, 'sums'))
                      for c in range(self._num_cells)] for r in range(self._num_replicas)]
      self._updates = step_runner.SumUpdatesOverReplicas(per_replica, self._plan.devices)
    return self._updates

  def Run(self) -> step_runner.StepResult:
    """Every action, the loss inside: the StepResult."""
    self._Loops('all')
    return self._Result()

  def Forwards(self) -> List[List[tuple]]:
    """Each device's forwards (the loss outside, or evaluation):
    [replica][micro-batch] the last cell's outputs."""
    if not self._tables.forwards_first:  # FProp checked plan.ForwardsFirst
      raise ValueError('Forwards needs every forward before any backward.')
    self._Loops('forwards')
    self._last_outputs = self._LastOutputs()
    return self._last_outputs

  def Loss(self) -> Optional[tf.Tensor]:
    """An evaluation's loss (after Forwards): the sum of its micro-batch
    losses on the last cell's device; None without a loss function."""
    if self._loss_fn is None:
      return None
    with tf.device(self._runners[0][-1].device):
      return tf.add_n([self._loss_fn(containers.UnwrapSingle(out), 0, m)
                       for m, out in enumerate(self._last_outputs[0])])

  def Backwards(self, output_grads: Sequence[Sequence[List[Any]]]) -> step_runner.StepResult:
    """The remaining actions, from [replica][micro-batch] the gradients of
    the last cell's flat outputs."""
    d = self._tables.DeviceOf(self._num_cells - 1)
    for r, per_micro in enumerate(output_grads):
      state = self._state[r][d]
      with tf.device(self._runners[r][-1].device):
        state['dys'] = [a.scatter(list(range(self._num_micro)), tf.stack(list(column)))
                        for a, column in zip(state['dys'], zip(*per_micro))]
    self._Loops('rest')
    return self._Result()

  # --- setup -----------------------------------------------------------------

  def _StartGradients(self) -> List[loop_probes.FactorLayout]:
    """Starts a training step's gradients: per cell the layout of its
    backwards' deferred factors (a probe's trace), the accumulators of the
    rest zeroed."""
    for row in self._runners:
      for runner in row:
        runner.gradients.StartLoopStep(self._num_micro)
    layouts = loop_probes.FactorLayouts(
        self._runners, lambda r, c, m: self._MicroTheta(self._thetas[r][c], r, m),
        [self._input_struct] + self._out_structs[:-1], self._out_structs,
        self._decisions, self._tables.split, self._num_micro)
    for row in self._runners:
      for runner in row:
        runner.gradients.ZeroAccumulators()
    return layouts

  def _MicroTheta(self, theta: NestedMap, r: int, m: tf.Tensor) -> NestedMap:
    seed = step_runner.MicroSeed(theta, (r * self._num_micro + m) * self._micro_size)
    return theta if seed is None else step_seeds.WithStepSeed(theta, seed)

  # --- the loops ---------------------------------------------------------------

  def _Loops(self, part: str) -> None:
    """Each device's loop, every replica, over its actions: 'all', its
    'forwards' (its first num_forwards) or the 'rest'."""
    for r in range(self._num_replicas):
      for d, table in enumerate(self._tables.devices):
        num, forwards = len(table.branches), table.num_forwards
        start, end = dict(all=(0, num), forwards=(0, forwards), rest=(forwards, num))[part]
        if start < end:
          self._state[r][d] = self._Loop(r, d, start, end)

  def _Loop(self, r: int, d: int, start: int, end: int) -> Dict[str, Any]:
    table = self._tables.devices[d]
    used = sorted(set(table.branches[start:end].tolist()))
    with tf.device(self._runners[r][table.cells[0]].device):
      # The loop's own handles of its cells' thetas: a loop variable
      # enters the loop on its source's device, and a theta can come
      # from elsewhere (an identity without a device), then crossing
      # devices every iteration.
      thetas = {c: tf.nest.map_structure(tf.identity, self._thetas[r][c])
                for c in table.cells}
      branches = tf.constant([used.index(b) for b in table.branches[start:end]])
      micro = tf.constant(table.micro[start:end])
      slots = {key: [tf.constant(s[start:end]) for s in per_cell]
               for key, per_cell in loop_state.WriteSlots(self._specs, self._tables,
                                                          table).items()}

      def Body(i, token, state):
        with tf.control_dependencies([token]):
          index, m = tf.gather(branches, i), tf.gather(micro, i)
        idle = loop_state.Idle(self._specs, table.cells, state)
        fns = [self._Branch(r, d, b, m, thetas, state, idle) for b in used]
        flat = tf.switch_case(index, fns)
        with tf.control_dependencies(flat):
          token = tf.identity(i)
        return i + 1, token, loop_state.Written(i, loop_state.Unflatten(flat, idle), state,
                                                slots)

      _, _, state = tf.while_loop(lambda i, *_: i < end - start, Body,
                                  (tf.constant(0), tf.constant(0), self._state[r][d]))
    return state

  def _Branch(self, r: int, d: int, branch: int, m: tf.Tensor, thetas: Dict[int, NestedMap],
              state: Dict[str, Any], idle: loop_state.Pieces):
    """The function of `branch` (loop_tables' index) on device d of
    replica r: its cell's action on micro-batch m; flat pieces as idle's,
    after its queue writes and weight updates."""
    place, kind = divmod(branch - 1, KINDS)
    c = self._tables.devices[d].cells[place]

    def Fn():
      pieces = [dict(p) for p in idle]
      runner = self._runners[r][c]
      with tf.device(runner.device):
        theta = self._MicroTheta(thetas[c], r, m)
        if kind == F:
          done = self._actions.Forward(r, c, m, theta, pieces[place])
        elif kind == X:
          done = self._actions.Backward(r, c, m, theta, place, state, pieces[place])
        elif kind == W:
          done = self._actions.Weights(c, m, runner, state['factors'][place], pieces[place])
        else:
          done = self._actions.Kept(r, m, theta, pieces[place])
        flat = loop_state.Flatten(pieces)
        if done:  # the next iteration waits for it (Body's token)
          with tf.control_dependencies(done):
            flat[0] = tf.identity(flat[0])
        return flat
    return Fn

  # --- results -------------------------------------------------------------

  def _Lane(self, r: int, c: int, key: str) -> Any:
    """Cell c's entry `key` of replica r's state."""
    d = self._tables.DeviceOf(c)
    return self._state[r][d][key][self._tables.devices[d].cells.index(c)]

  def _LastState(self, r: int) -> Dict[str, Any]:
    return self._state[r][self._tables.DeviceOf(self._num_cells - 1)]

  def _LastOutputs(self) -> List[List[tuple]]:
    return [loop_results.LastOutputs(self._LastState(r)['outs'], self._specs.outs[-1],
                                     self._out_structs[-1], self._num_micro, row[-1].device)
            for r, row in enumerate(self._runners)]

  def _Result(self) -> step_runner.StepResult:
    cells, replicas = range(self._num_cells), range(self._num_replicas)
    grads = [[loop_results.CellGradients(
        self._runners[r][c], self._thetas[r][c], self._layouts[c], self._tables.split[c],
        self._Lane(r, c, 'weight_sums' if self._tables.split[c] else 'factors'),
        self._specs.factors[c], self._num_micro) for c in cells] for r in replicas]
    if self._num_replicas > 1:
      reduced = {c: step_runner.SumCellOverReplicas([grads[r][c] for r in replicas],
                                                 self._plan.replica_devices, c,
                                                 self._collectives)
                 for c in self._program.reduces}
      grads = [[reduced[c][r] for c in cells] for r in replicas]
    first = self._tables.DeviceOf(0)
    input_grads = [loop_results.InputGradients(
        self._state[r][first]['d_inputs'], self._specs.ins[0], self._input_struct,
        self._num_micro, row[0].device) for r, row in enumerate(self._runners)]
    losses = [self._LastState(r)['loss'][0] for r in replicas if self._LastState(r)['loss']]
    with tf.device(self._plan.devices[-1].name):
      loss = tf.add_n(losses) if losses else None
    return step_runner.StepResult(loss, self._LastOutputs(), input_grads, grads, self.Updates())
