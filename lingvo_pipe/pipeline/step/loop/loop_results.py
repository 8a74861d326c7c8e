"""What a loop step hands back once its devices' loops end (loop_executor).

Read from the loops' final states: per micro-batch the last cell's
outputs and the pipeline's input gradients, and each cell's step
gradients from what its backwards left (a B's deferred factors, or a
split cell's weight sums).
"""

from typing import Any, List, Sequence

import tensorflow as tf

from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline.cell import cell_runner
from lingvo_pipe.pipeline.cell.cell_gradients import IsDifferentiable
from lingvo_pipe.pipeline.step.loop import loop_arrays
from lingvo_pipe.pipeline.step.loop import loop_probes


def LastOutputs(outs: Sequence[tf.TensorArray], specs: Sequence[tf.TensorSpec],
                struct: Any, num_micro: int, device: str) -> List[tuple]:
  """Per micro-batch the last cell's outputs (of struct), from its loop's
  'outs' arrays, on `device`."""
  with tf.device(device):
    columns = loop_arrays.Unstacked(outs, num_micro, specs)
  return [tuple(tf.nest.pack_sequence_as(struct, list(f))) for f in zip(*columns)]


def InputGradients(d_inputs: Sequence[tf.TensorArray], specs: Sequence[tf.TensorSpec],
                   struct: Any, num_micro: int, device: str) -> List[List[Any]]:
  """Per micro-batch the gradients of the flat pipeline inputs (of
  struct; None where not floating point), from the first cell's loop's
  'd_inputs' arrays, on `device`."""
  flat = tf.nest.flatten(struct)
  diff = [i for i, x in enumerate(flat) if IsDifferentiable(x)]
  with tf.device(device):
    columns = loop_arrays.Unstacked([d_inputs[i] for i in diff], num_micro,
                                    [specs[i] for i in diff])
  grads: List[List[Any]] = [[None] * len(flat) for _ in range(num_micro)]
  for i, column in zip(diff, columns):
    for m, g in enumerate(column):
      grads[m][i] = g
  return grads


def CellGradients(runner: cell_runner.CellRunner, theta: NestedMap,
                  layout: loop_probes.FactorLayout, split: bool, lane: List[Any],
                  factor_specs: Sequence[tf.TensorSpec], num_micro: int) -> List[Any]:
  """A cell's step gradients (CellGradients.StepGradients) from `lane`, its
  loop's final 'weight_sums' if `split`, else its 'factors' arrays (of
  factor_specs), whose pairs are gathered into one product per weight."""
  if split:
    runner.gradients.PutSums({i: s for s, (i, _) in zip(lane, layout)})
  else:
    with tf.device(runner.device):
      runner.gradients.PutFactors(loop_probes.Pairs(
          loop_arrays.Gathered(lane, num_micro, factor_specs), layout, packed=False))
  return runner.gradients.StepGradients(theta)
