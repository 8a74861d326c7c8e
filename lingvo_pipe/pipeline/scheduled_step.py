"""A training step with the loss inside the pipeline, in any schedule's order.

GPipe's fill-drain can run the loss after the pipeline, because every
backward waits for every forward. 1F1B and the interleaved schedule start
micro-batch m's backward before the forward of m+K: the last cell computes
micro-batch m's loss and its gradient as soon as its forward ends. So this
step takes a per-micro-batch loss function, and runs every forward, loss
and backward of schedule.Tasks in their order: each device's tasks wait for
its previous task (control dependencies on the cell calls, as the
fill-drain emission does), so a cell keeps only the micro-batches the
schedule has in flight.

What each (cell, micro-batch) keeps or recomputes is remat.Decide's; a
forward that its own backward follows next on its device keeps its
activations under per-cell remat (fill-drain's except_last, and under 1F1B
every micro-batch of the last cell), since recomputing them would restore
them at once. Weight gradients are summed by the cells' CellGradients.
"""

import dataclasses
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline import cell_runner
from lingvo_pipe.pipeline import remat
from lingvo_pipe.pipeline import schedule
from lingvo_pipe.pipeline.cell_gradients import IsDifferentiable

# The per-micro-batch loss: the last cell's outputs of one micro-batch (a
# tensor, or a tuple for several) -> a scalar. The step's loss is the sum.
MicroLossFn = Callable[[Any], tf.Tensor]


@dataclasses.dataclass
class StepResult:
  """What one scheduled training step produced.

  Attributes:
    loss: the sum of the micro-batch losses, on the last cell's device.
    last_outputs: per micro-batch, the last cell's outputs (a tuple).
    input_grads: per micro-batch, the gradients of the flat pipeline inputs
      of that micro-batch (None for inputs that are not floating point).
    theta_grads: per cell, the gradients of its flat theta summed over the
      micro-batches (None where theta is not floating point).
    updates: per cell, its additive statistics summed over micro-batches.
  """
  loss: tf.Tensor
  last_outputs: List[tuple]
  input_grads: List[List[Any]]
  theta_grads: List[List[Any]]
  updates: List[NestedMap]


@dataclasses.dataclass
class _Forward:
  """What one (cell, micro-batch) forward saw and produced."""
  inputs: tuple
  theta: NestedMap
  outputs: tuple
  decision: remat.Decision
  recording: Optional[cell_runner.Recording]


def Decisions(tasks: Sequence[schedule.Task], policy: remat.RematPolicy,
              remat_last_micro_batch: bool, num_micro: int
              ) -> Dict[Tuple[int, int], remat.Decision]:
  """remat.Decide for every (cell, micro-batch) of `tasks`."""
  kept = schedule.KeptForwards(tasks)
  return {(t.cell, t.micro_batch): remat.Decide(
      policy, remat_last_micro_batch, t.micro_batch, num_micro,
      backward_follows=(t.cell, t.micro_batch) in kept)
          for t in tasks if t.phase == schedule.Phase.FORWARD}


def _LossAndOutputGrads(loss_fn: MicroLossFn, outputs: tuple
                        ) -> Tuple[tf.Tensor, List[Any]]:
  """The micro-batch loss and its gradient of each flat output (zeros for
  outputs it does not use or that are not floating point)."""
  flat = tf.nest.flatten(outputs)
  diff = [x for x in flat if IsDifferentiable(x)]
  with tf.GradientTape(watch_accessed_variables=False) as tape:
    tape.watch(diff)
    loss = loss_fn(containers.UnwrapSingle(outputs))
  if not (isinstance(loss, tf.Tensor) and loss.shape.rank == 0):
    raise ValueError(f'The per-micro-batch loss function must return a '
                     f'scalar tensor; it returned {loss!r}.')
  grads = iter(tape.gradient(loss, diff,
                             unconnected_gradients=tf.UnconnectedGradients.ZERO))
  return loss, [next(grads) if IsDifferentiable(x) else tf.zeros_like(x)
                for x in flat]


def RunStep(runners: Sequence[cell_runner.CellRunner], devices: Sequence[str],
            tasks: Sequence[schedule.Task], micro_inputs: Sequence[tuple],
            micro_theta: Callable[[int, int], NestedMap],
            decisions: Dict[Tuple[int, int], remat.Decision],
            loss_fn: MicroLossFn) -> StepResult:
  """Emits every task of a training step in the order of `tasks`.

  Args:
    runners: the cells' CellRunners, by cell.
    devices: device name of each device index of the tasks (task.device).
    tasks: schedule.Tasks of the schedule: forwards and backwards of every
      (cell, micro-batch), in an order that respects their dependencies.
    micro_inputs: the pipeline's inputs of each micro-batch.
    micro_theta: (cell, micro-batch) -> the cell's theta for it.
    decisions: (cell, micro-batch) -> its remat.Decision (Decisions()).
    loss_fn: the per-micro-batch loss, run on the last cell's device right
      after the last cell's forward.

  Returns:
    The StepResult.
  """
  num_micro = len(micro_inputs)
  last = len(runners) - 1
  forwards: Dict[Tuple[int, int], _Forward] = {}
  output_grads: Dict[Tuple[int, int], List[Any]] = {}
  updates: List[List[NestedMap]] = [[] for _ in runners]
  last_outputs: List[Any] = [None] * num_micro
  input_grads: List[Any] = [None] * num_micro
  losses: List[tf.Tensor] = []
  previous: Dict[int, List[Any]] = {}  # device -> its last task's outputs
  for runner in runners:
    runner.gradients.StartStep(num_micro)
  for task in tasks:
    k, m, d = task.cell, task.micro_batch, task.device
    runner = runners[k]
    if task.phase == schedule.Phase.FORWARD:
      x = micro_inputs[m] if k == 0 else forwards[(k - 1, m)].outputs
      theta = micro_theta(k, m)
      with tf.control_dependencies(previous.get(d, [])):
        out, upd, recording = runner.Forward(theta, x, decisions[(k, m)], num_micro)
      forwards[(k, m)] = _Forward(x, theta, out, decisions[(k, m)], recording)
      updates[k].append(upd)
      previous[d] = tf.nest.flatten(out)
      if k == last:
        with tf.device(devices[d]):
          loss, dys = _LossAndOutputGrads(loss_fn, out)
        losses.append(loss)
        output_grads[(k, m)] = dys
        last_outputs[m] = out
      continue
    done = forwards[(k, m)]
    dy = tf.nest.pack_sequence_as(done.outputs, output_grads.pop((k, m)))
    with tf.control_dependencies(previous.get(d, [])):
      if done.recording is not None:
        dx = runner.BackwardFromTape(done.recording, done.inputs, done.outputs, dy)
      else:
        dx = runner.Backward(done.theta, done.inputs, dy, done.decision, num_micro)
    # A backward with no input gradient to wait on leaves the order as it was.
    previous[d] = [g for g in dx if g is not None] or previous.get(d, [])
    if k > 0:
      output_grads[(k - 1, m)] = [tf.zeros_like(x) if g is None else g
                                  for x, g in zip(tf.nest.flatten(done.inputs), dx)]
    else:
      input_grads[m] = dx
  # A cell's step gradients (its deferred weight-gradient products) wait
  # for its device's last task: a device whose cells end at different
  # times (interleaved) runs its remaining backwards first, as the next
  # device waits on them, and the products after.
  device_of = {t.cell: t.device for t in tasks}
  theta_grads = []
  for k, runner in enumerate(runners):
    with tf.control_dependencies(previous.get(device_of[k], [])):
      theta_grads.append(runner.gradients.StepGradients(forwards[(k, 0)].theta))
  with tf.device(runners[last].device):
    total = tf.add_n(losses)
  summed = []
  for k, runner in enumerate(runners):
    with tf.device(runner.device):
      summed.append(tf.nest.map_structure(lambda *xs: tf.add_n(list(xs)),
                                          *updates[k]))
  return StepResult(total, last_outputs, input_grads, theta_grads, summed)


def ScaleGradients(grads: Sequence[Any], scale: tf.Tensor, device: str) -> List[Any]:
  """`grads` times the scalar `scale` on `device` (None stays None): the
  stored gradients of a loss, for an upstream gradient `scale` of it."""
  with tf.device(device):
    return [None if g is None else g * tf.cast(scale, g.dtype) for g in grads]
