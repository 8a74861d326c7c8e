"""The two custom gradients a training step is: the loss outside the pipeline, or inside.

Both wrap one step's emission (`Start`: its step_runner.StepRunner and its
batch cut into replicas x micro-batches, made inside the custom gradient) and
take and return nests, as tf.custom_gradient does. The forward applies the
cells' statistics (`apply_updates`).

- LossOutside (FProp): the forward runs every F and returns the outputs;
  the gradient function runs the rest of the schedule from the outer
  tape's gradients of the outputs (fill-drain).
- LossInside (FPropWithLoss): the forward runs every action, the losses
  included, and keeps the gradients; the gradient function scales them by
  the loss's upstream gradient (over the loss scale, under
  precision.LossScaling, whose scaled gradients the backwards ran with). The outputs are returned for metrics and
  are not differentiable.
"""

from typing import Any, Callable, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import custom_gradients
from lingvo_pipe.core import precision
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline.replicas import replica_batches
from lingvo_pipe.pipeline.step import step_runner

# ([replica][cell] thetas, inputs) -> the step's emission and its batch.
Start = Callable[[List[List[NestedMap]], tuple],
                 Tuple[step_runner.StepRunner, replica_batches.ReplicaBatches]]
ApplyUpdates = Callable[[List[NestedMap]], None]


def LossOutside(start: Start, apply_updates: ApplyUpdates, inputs: tuple,
                thetas: List[List[NestedMap]]) -> tuple:
  """The outputs of the whole batch, differentiable by the outer tape;
  `thetas` [replica][cell], each replica's gradient the sum over
  replicas."""

  @custom_gradients.CustomGradient
  def Pipeline(step_inputs, cell_thetas):
    run, batches = start(cell_thetas, step_inputs)
    last_outputs = run.Forwards()
    outputs = batches.Outputs(last_outputs)
    apply_updates(run.Updates())
    flat_out = tf.nest.flatten(outputs)

    def Grad(*dys, variables=None):
      dys = [tf.zeros_like(y) if dy is None else dy for y, dy in zip(flat_out, dys)]
      result = run.Backwards(batches.OutputGrads(last_outputs, dys))
      return _WithVariableGrads(
          batches.InputGrads(result.input_grads) +
          [g for row in result.theta_grads for cell in row for g in cell], variables)

    return outputs, Grad

  return Pipeline(inputs, thetas)


def LossInside(start: Start, apply_updates: ApplyUpdates, inputs: tuple,
               thetas: List[List[NestedMap]], devices: Sequence[Sequence[str]]
               ) -> Tuple[tf.Tensor, tuple]:
  """(loss, outputs); `thetas` and `devices` are [replica][cell] (where
  each cell's gradients are scaled)."""

  loss_scale = precision.LossScale()

  @custom_gradients.CustomGradient
  def Pipeline(step_inputs, cell_thetas):
    run, batches = start(cell_thetas, step_inputs)
    result = run.Run()
    outputs = batches.Outputs(result.last_outputs)
    d_inputs = batches.InputGrads(result.input_grads)
    apply_updates(result.updates)

    def Grad(d_loss, *unused_d_outputs, variables=None):
      if loss_scale is not None:  # the stored gradients are of the scaled loss
        d_loss = d_loss / tf.cast(loss_scale, d_loss.dtype)
      grads = _Scale(d_inputs, d_loss, devices[0][0])
      for r, row in enumerate(result.theta_grads):
        for k, cell_grads in enumerate(row):
          grads += _Scale(cell_grads, d_loss, devices[r][k])
      return _WithVariableGrads(grads, variables)

    return (result.loss, outputs), Grad

  loss, outputs = Pipeline(inputs, thetas)
  return loss, tf.nest.map_structure(tf.stop_gradient, outputs)


def _WithVariableGrads(grads: List[Any], variables: Optional[Sequence[tf.Variable]]) -> Any:
  """What a custom gradient returns: `grads` of its inputs, and None for
  each of `variables`, those read inside the step rather than passed in as
  theta (statistics, the loss scale).

  Raises:
    ValueError: naming the trainable ones: a layer read them directly
      (self.w, not theta.w), so the pipeline has no gradient for them.
  """
  if not variables:
    return grads
  trainable = [v.name for v in variables if v.trainable]
  if trainable:
    raise ValueError(
        f'The pipeline\'s layers read trainable variables directly, not from theta: '
        f'{trainable}. The pipeline differentiates theta only, so these would get no '
        'gradient; read them from the theta FProp receives (theta.w, not self.w).')
  return grads, [None] * len(variables)


def _Scale(grads: Sequence[Any], scale: tf.Tensor, device: str) -> List[Any]:
  """`grads` times the scalar `scale` on `device` (None stays None): the
  stored gradients of a loss, for an upstream gradient `scale` of it."""
  with tf.device(device):
    return [None if g is None else g * tf.cast(scale, g.dtype) for g in grads]
