"""One executor: runs a plan's actions (F, B, I, W) over every replica, unrolled.

The executor runs a Program (program.Lower) in its order, as a
step_runner.StepRunner: every action of every replica, each device's in
its schedule's order (each waits for its device's previous action through
control dependencies on the cell's call; a backward is done once all its
gradients are, the weights' too), so a cell keeps only the
micro-batches its schedule has in flight. Replicas are an axis: replica r
runs the same actions on its own devices (plan.replica_devices)
on its slice of the batch; micro-batch m of replica r is micro-batch
r*M + m of the whole batch (its dropout masks too).

- F runs a cell's forward as its remat.Decision says (the program's); on
  the last cell, with a loss function, also the micro-batch's loss and the
  gradients of the cell's outputs.
- B runs the cell's backward, recomputing or from the forward's tape;
  weight gradients go to the cell's CellGradients.
- I runs the same backward split (remat.Decision.split): the projections'
  weight gradients are left as factor pairs for the micro-batch's W, which
  adds their products into the step's sums; W's of one cell next to each
  other on a device are one product (the program's weight_runs). Where the
  decision cannot defer (remat PER_LAYER, one micro-batch, compiled
  cells), I is a B and its W does nothing.
- REDUCE (replicas only: the program puts it after the cell's last B or
  W on its device) reads the cell's step gradients in every replica and
  sums them over the replicas with a collective all-reduce
  (all_reduce.py), each replica receiving the sum on its own device.

Training with the loss outside the pipeline (FProp) runs the forwards
(Forwards) and, from the outer tape's gradients, the rest (Backwards);
with the loss inside (FPropWithLoss) every action in one go (Run).
Evaluation runs the forwards alone. Each replica trains its own copy of
its cells' variables (replica_variables.py), so the cells' gradients are
all-reduced at their REDUCE; the statistics are added on replica 0's
devices, where the model's variables live (Result).
"""

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline.cell import cell_gradients
from lingvo_pipe.pipeline.cell import cell_runner
from lingvo_pipe.pipeline.layout import plan as plan_lib
from lingvo_pipe.pipeline.lowering import program
from lingvo_pipe.pipeline.lowering import remat
from lingvo_pipe.pipeline.replicas import all_reduce
from lingvo_pipe.pipeline.schedules.actions import Action, ActionKind
from lingvo_pipe.pipeline.step import step_runner

@dataclasses.dataclass
class _Forward:
  """What one (replica, cell, micro-batch) forward saw and produced."""
  inputs: tuple
  theta: NestedMap
  outputs: tuple
  decision: Optional[remat.Decision]
  recording: Optional[cell_runner.Recording]


class Executor:
  """One step of a plan's actions over its replicas (module docstring).

  Args:
    plan: the pipeline's Plan (where each cell runs).
    step: the step's Program (what runs, in which order).
    runners: [replica][cell] the CellRunners.
    thetas: [replica][cell] the cell's theta in the compute dtype, on the
      replica's device (replica_variables: each replica's own copy).
    micro_inputs: [replica][micro-batch] the pipeline's inputs.
    micro_size: examples per micro-batch (dropout masks index examples).
    loss_fn: the per-micro-batch loss, or None (loss outside, or eval).
  """

  def __init__(self, plan: plan_lib.Plan, step: program.Program,
               runners: Sequence[Sequence[cell_runner.CellRunner]],
               thetas: Sequence[Sequence[NestedMap]],
               micro_inputs: Sequence[Sequence[tuple]],
               micro_size: int, loss_fn: Optional[step_runner.MicroLossFn],
               collectives: all_reduce.Collectives) -> None:
    self._plan = plan
    self._collectives = collectives
    self._runners = runners
    self._num_micro = len(micro_inputs[0])
    self._micro_inputs = micro_inputs
    self._micro_size = micro_size
    self._loss_fn = loss_fn
    self._training = step.step.training
    self._decisions = step.decisions
    self._thetas = [list(row) for row in thetas]
    self._order = step.order
    self._weight_runs = step.weight_runs
    self._forwards: Dict[Tuple[int, int, int], _Forward] = {}
    self._output_grads: Dict[Tuple[int, int, int], List[Any]] = {}
    self._factors: Dict[Tuple[int, int, int], Any] = {}
    self._previous: Dict[Tuple[int, int], List[Any]] = {}  # (r, device) -> last
    self._reduced: Dict[int, List[List[Any]]] = {}  # cell -> [replica] its sums
    num_r, num_m = plan.num_replicas, self._num_micro
    self._updates: List[List[List[NestedMap]]] = [
        [[] for _ in range(plan.num_cells)] for _ in range(num_r)]
    self.last_outputs: List[List[Any]] = [[None] * num_m for _ in range(num_r)]
    self.input_grads: List[List[Any]] = [[None] * num_m for _ in range(num_r)]
    self._losses: List[tf.Tensor] = []
    self._summed_updates: Optional[List[NestedMap]] = None

  # --- phases ----------------------------------------------------------------

  def Forwards(self) -> List[List[tuple]]:
    """Runs every F, in order: [replica][micro-batch] the last cell's
    outputs."""
    self._Emit([a for a in self._order if a.kind == ActionKind.F])
    return self.last_outputs

  def Backwards(self, output_grads: Sequence[Sequence[List[Any]]]) -> step_runner.StepResult:
    """Runs every action but the F's, in order, from [replica][micro-batch]
    the gradients of the last cell's flat outputs: the StepResult."""
    last = self._plan.num_cells - 1
    for r, per_micro in enumerate(output_grads):
      for m, dys in enumerate(per_micro):
        self._output_grads[(r, last, m)] = list(dys)
    self._StartBackwards()
    self._Emit([a for a in self._order if a.kind != ActionKind.F])
    return self._Result()

  def Run(self) -> step_runner.StepResult:
    """Runs every action, in order (the loss inside the pipeline): the
    StepResult."""
    self._StartBackwards()
    self._Emit(self._order)
    return self._Result()

  def _Result(self) -> step_runner.StepResult:
    """The step's results, replicas added (at their REDUCE)."""
    plan = self._plan
    if plan.num_replicas > 1:
      grads = [[self._reduced[c][r] for c in range(plan.num_cells)]
               for r in range(plan.num_replicas)]
    else:
      # After the device's last action: a device whose cells end at
      # different times runs its remaining backwards first.
      grads = [[self._StepGradients(0, c) for c in range(plan.num_cells)]]
    return step_runner.StepResult(self.Loss(), self.last_outputs, self.input_grads, grads,
                      self.Updates())

  def _StepGradients(self, r: int, c: int) -> List[Any]:
    """Cell c's step gradients in replica r, after its device's last
    action so far."""
    with self._After(r, c):
      return self._runners[r][c].gradients.StepGradients(self._thetas[r][c])

  def Loss(self) -> Optional[tf.Tensor]:
    """The sum of the micro-batch losses on the last cell's device (None
    without a loss function)."""
    if not self._losses:
      return None
    with tf.device(self._plan.devices[-1].name):
      return tf.add_n(self._losses)

  def Updates(self) -> List[NestedMap]:
    """Per cell, its statistics summed over micro-batches and replicas on
    its variable device (after Forwards; built once)."""
    if self._summed_updates is None:
      per_replica = []
      for r, row in enumerate(self._plan.replica_devices):
        summed = []
        for c, device in enumerate(row):
          with tf.device(device.name):
            summed.append(step_runner.AddN(self._updates[r][c]))
        per_replica.append(summed)
      self._summed_updates = step_runner.SumUpdatesOverReplicas(per_replica, self._plan.devices)
    return self._summed_updates

  # --- actions ---------------------------------------------------------------

  def _StartBackwards(self) -> None:
    for row in self._runners:
      for runner in row:
        runner.gradients.StartStep(self._num_micro)

  def _Emit(self, order: Sequence[Action]) -> None:
    for action in order:
      if action.kind == ActionKind.REDUCE:
        c = action.cell
        self._reduced[c] = step_runner.SumCellOverReplicas(
            [self._StepGradients(r, c) for r in range(self._plan.num_replicas)],
            self._plan.replica_devices, c, self._collectives)
        continue
      for r in range(self._plan.num_replicas):
        if action.kind == ActionKind.F:
          self._Forward(r, action.cell, action.micro)
        elif action.kind in (ActionKind.B, ActionKind.I):
          self._Backward(r, action.cell, action.micro)
        elif action.kind == ActionKind.W:
          self._WeightBackward(r, action.cell, action.micro)

  def _After(self, r: int, c: int):
    """A context whose ops wait for the device's previous action. Control
    edges on the cell's call op itself: identities of its inputs would cost
    M*K*(inputs + theta) graph nodes and their tracing time
    (docs/benchmarks/profiles.md)."""
    return tf.control_dependencies(
        self._previous.get((r, self._plan.cell_devices[c]), []))

  def _SetPrevious(self, r: int, c: int, done: List[Any]) -> None:
    """Marks `done` as the device's last action."""
    self._previous[(r, self._plan.cell_devices[c])] = done

  def _Forward(self, r: int, c: int, m: int) -> None:
    runner = self._runners[r][c]
    x = self._micro_inputs[r][m] if c == 0 else self._forwards[(r, c - 1, m)].outputs
    with tf.device(runner.device):
      theta = step_runner.MicroTheta(self._thetas[r][c],
                         (r * self._num_micro + m) * self._micro_size)
    decision = self._decisions.get((c, m))
    with self._After(r, c):
      out, upd, recording = runner.Forward(theta, x, decision, self._num_micro)
    self._forwards[(r, c, m)] = _Forward(x, theta, out, decision, recording)
    self._updates[r][c].append(upd)
    self._SetPrevious(r, c, tf.nest.flatten(out))
    if c < self._plan.num_cells - 1:
      return
    self.last_outputs[r][m] = out
    if self._loss_fn is None:
      return
    with tf.device(runner.device):
      if not self._training:
        self._losses.append(self._loss_fn(containers.UnwrapSingle(out), r, m))
        return
      loss, dys = step_runner.LossAndOutputGrads(self._loss_fn, out, r, m)
    self._losses.append(loss)
    self._output_grads[(r, c, m)] = dys

  def _Backward(self, r: int, c: int, m: int) -> None:
    """B, or I: the input gradient goes to the previous cell (or out)."""
    runner = self._runners[r][c]
    done = self._forwards.pop((r, c, m))
    if done.decision is None:
      raise RuntimeError(f'Backward of cell {c}, micro-batch {m} (replica {r}) after a '
                         'forward run for evaluation: a bug in the executor.')
    dy = tf.nest.pack_sequence_as(done.outputs, self._output_grads.pop((r, c, m)))
    with self._After(r, c):
      if done.recording is not None:
        backward = runner.BackwardFromTape(done.recording, done.inputs, done.outputs, dy)
      else:
        backward = runner.Backward(done.theta, done.inputs, dy, done.decision,
                                   self._num_micro)
    if done.decision.split:
      self._factors[(r, c, m)] = runner.gradients.TakeSplitFactors()
    # Not its input gradients alone: a weight's gradient still to run holds
    # what it reads (docs/schedules.md).
    self._SetPrevious(r, c, [backward.done])
    dx = backward.input_grads
    if c > 0:
      self._output_grads[(r, c - 1, m)] = [
          tf.zeros_like(x) if g is None else g
          for x, g in zip(tf.nest.flatten(done.inputs), dx)]
    else:
      self.input_grads[r][m] = dx

  def _WeightBackward(self, r: int, c: int, m: int) -> None:
    """W: the product of its run's factor pairs (nothing if its I's were
    B's, or for a W after its run's first)."""
    factors: cell_gradients.FactorPairs = {}
    for micro in self._weight_runs[(c, m)]:
      for i, pairs in self._factors.pop((r, c, micro), {}).items():
        factors.setdefault(i, []).extend(pairs)
    if factors:
      with self._After(r, c):
        self._SetPrevious(r, c, self._runners[r][c].WeightBackward(factors))


