"""What both emissions of a step share: the interface they offer, their result, and the steps' common parts.

A step's emission (executor.Executor, unrolled; loop_executor.LoopExecutor,
one loop per device) runs a program.Program and offers one interface,
StepRunner, to the training step's custom gradients (train_step): the
forwards then the backwards from the outer tape's gradients (the loss
outside), or every action at once (the loss inside), and the statistics
and loss. Both take the same per-micro-batch loss (MicroLossFn), give the
same StepResult, and build a micro-batch's seed, its loss and output
gradients, and the sums over replicas with the functions below.
"""

import dataclasses
from typing import Any, Callable, List, Optional, Protocol, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.core import precision
from lingvo_pipe.core import step_seeds
from lingvo_pipe.pipeline.cell.cell_gradients import IsDifferentiable
from lingvo_pipe.pipeline.replicas import all_reduce

# The per-micro-batch loss: (the last cell's outputs of micro-batch m of
# replica r (a tensor, or a tuple for several), r, m) -> a scalar; m is a
# Python int or, in a loop, a scalar tensor. The step's loss is the sum.
MicroLossFn = Callable[[Any, int, Any], tf.Tensor]


@dataclasses.dataclass
class StepResult:
  """What a step produced, its replicas added.

  Attributes:
    loss: the sum of the micro-batch losses (None without a loss function).
    last_outputs: per replica, per micro-batch the last cell's outputs.
    input_grads: per replica, per micro-batch the gradients of the flat
      pipeline inputs (None where not floating point).
    theta_grads: [replica][cell] the gradients of the cell's flat theta
      summed over micro-batches and replicas, on the replica's device.
    updates: per cell, its additive statistics summed likewise.
  """
  loss: Optional[tf.Tensor]
  last_outputs: List[List[tuple]]
  input_grads: List[List[List[Any]]]
  theta_grads: List[List[List[Any]]]
  updates: List[NestedMap]


class StepRunner(Protocol):
  """A step's emission, built for one program (module docstring)."""

  def Forwards(self) -> List[List[tuple]]:
    """Every forward: [replica][micro-batch] the last cell's outputs."""

  def Backwards(self, output_grads: Sequence[Sequence[List[Any]]]) -> StepResult:
    """The rest, from [replica][micro-batch] the gradients of the last
    cell's flat outputs (after Forwards)."""

  def Run(self) -> StepResult:
    """Every action, the loss inside."""

  def Loss(self) -> Optional[tf.Tensor]:
    """The sum of the micro-batch losses (None without a loss function)."""

  def Updates(self) -> List[NestedMap]:
    """Per cell its statistics summed over micro-batches and replicas."""


def MicroTheta(theta: NestedMap, first_example: Any) -> NestedMap:
  """Cell theta for the micro-batch whose first example has index
  `first_example` in the global batch: step seeds [s0, first_example]
  (step_seeds.WithStepSeed).

  The seed passes through PlaceholderWithDefault, which Grappler never
  folds: from a constant step seed (none set, or Python numbers) each
  call of a cell would get a constant of its own, and Grappler
  specializes a called function for each distinct constant input, K*M
  copies of the cells' functions, which doubles the first step
  (docs/benchmarks/profiles.md, 'Figures behind the code').
  """
  seed = MicroSeed(theta, first_example)
  if seed is None:
    return theta
  return step_seeds.WithStepSeed(
      theta, tf.raw_ops.PlaceholderWithDefault(input=seed, shape=[2]))


def MicroSeed(theta: NestedMap, first_example: Any) -> Optional[tf.Tensor]:
  """The step seed [s0, first_example] of a micro-batch whose first example
  has index `first_example` in the global batch (step_seeds.WithStepSeed);
  None if no layer of theta uses a step seed."""
  seeds = step_seeds.Seeds(theta)
  if not seeds:
    return None
  return tf.stack([seeds[0][0], tf.cast(first_example, tf.int64)])


def LossAndOutputGrads(loss_fn: MicroLossFn, outputs: tuple, r: int, m: Any
                       ) -> Tuple[tf.Tensor, List[Any]]:
  """Micro-batch m of replica r's loss and its gradient of each flat output (zeros for
  outputs it does not use or that are not floating point), the gradient
  of the loss times precision.LossScale() under loss scaling (so the
  backwards that start from it are scaled: train_step.LossInside
  divides it out again)."""
  flat = tf.nest.flatten(outputs)
  diff = [x for x in flat if IsDifferentiable(x)]
  scale = precision.LossScale()
  with tf.GradientTape(watch_accessed_variables=False) as tape:
    tape.watch(diff)
    loss = loss_fn(containers.UnwrapSingle(outputs), r, m)
    if not (isinstance(loss, tf.Tensor) and loss.shape.rank == 0):
      raise ValueError(f'The per-micro-batch loss function must return a '
                       f'scalar tensor; it returned {loss!r}.')
    objective = loss if scale is None else loss * tf.cast(scale, loss.dtype)
  grads = iter(tape.gradient(objective, diff,
                             unconnected_gradients=tf.UnconnectedGradients.ZERO))
  return loss, [next(grads) if IsDifferentiable(x) else tf.zeros_like(x)
                for x in flat]



def AddN(nests: Sequence[Any]) -> Any:
  """The sum of nests of one structure, entry by entry."""
  return tf.nest.map_structure(lambda *xs: tf.add_n(list(xs)), *nests)


def SumUpdatesOverReplicas(per_replica: Sequence[Sequence[NestedMap]],
                           devices: Sequence[Any]) -> List[NestedMap]:
  """Per cell its statistics ([replica][cell]) added over replicas on its
  variable device (replica 0's)."""
  summed = []
  for c, device in enumerate(devices):
    with tf.device(device.name):
      summed.append(AddN([cells[c] for cells in per_replica]))
  return summed


def SumCellOverReplicas(per_replica: Sequence[List[Any]],
                        replica_devices: Sequence[Sequence[Any]], c: int,
                        keys: all_reduce.Collectives) -> List[List[Any]]:
  """Cell c's flat theta gradients ([replica]) summed over replicas
  (all_reduce.Sum with the pipeline's keys), each replica's on its device
  of the cell."""
  return all_reduce.Sum(per_replica, [row[c].name for row in replica_devices[:len(per_replica)]],
                        keys)
