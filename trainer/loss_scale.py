"""Dynamic loss scaling for float16 compute, checkpointed with the trainer.

float16 keeps 5 exponent bits: gradients below 6e-8 flush to zero and above
65504 become inf. The loss is multiplied by a scale S before the backward
pass, so small gradients stay representable, and the float32 gradients are
divided by S before clipping and the update. When a step's gradients are
not finite while its loss is (an overflow), the step is skipped (nothing is
applied) and S is divided by `factor`; after `growth_interval` steps in a
row without one, S is multiplied by `factor`. S and the count of good steps
are variables, so a checkpoint keeps them and a resumed run goes on with
the scale it had. bfloat16 has float32's exponent range and needs none.
"""

from typing import List, Optional

import tensorflow as tf

from lingvo_pipe import base_experiment
from lingvo_pipe.core import hyperparams


class DynamicLossScale(tf.Module):
  """The loss scale S and its count of overflow-free steps."""

  def __init__(self, initial_scale: float = 2.0**15, factor: float = 2.0,
               growth_interval: int = 2000, min_scale: float = 1.0) -> None:
    """Raises ValueError unless initial_scale >= min_scale > 0, factor > 1
    and growth_interval >= 1."""
    super().__init__(name='loss_scale')
    if not (initial_scale >= min_scale > 0 and factor > 1 and growth_interval >= 1):
      raise ValueError(
          f'Dynamic loss scaling needs loss_scale_initial >= {min_scale} '
          f'(got {initial_scale}), loss_scale_factor > 1 (got {factor}) and '
          f'loss_scale_growth_interval >= 1 (got {growth_interval}); e.g. '
          '2**15, 2.0 and 2000.')
    self.factor = float(factor)
    self.growth_interval = int(growth_interval)
    self.min_scale = float(min_scale)
    self.scale = tf.Variable(float(initial_scale), dtype=tf.float32,
                             trainable=False, name='scale')
    self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False,
                                  name='good_steps')

  def ScaleLoss(self, loss: tf.Tensor) -> tf.Tensor:
    """loss * S, in float32."""
    return tf.cast(loss, tf.float32) * self.scale

  def Unscale(self, grads: List[Optional[tf.Tensor]]) -> List[Optional[tf.Tensor]]:
    """Each gradient divided by S, next to the gradient."""
    inverse = 1.0 / self.scale
    out: List[Optional[tf.Tensor]] = []
    for g in grads:
      if g is None:
        out.append(None)
        continue
      with tf.device(g.device or None):
        out.append(g * tf.cast(inverse, g.dtype))
    return out

  def Update(self, grads_finite: tf.Tensor) -> tf.Operation:
    """After a step: lowers S if the gradients were not finite, else counts
    the step and raises S after growth_interval good steps in a row."""
    grown = self.good_steps + 1 >= self.growth_interval
    new_scale = tf.where(
        grads_finite,
        tf.where(grown, self.scale * self.factor, self.scale),
        tf.maximum(self.scale / self.factor, self.min_scale))
    new_good = tf.where(tf.logical_and(grads_finite, tf.logical_not(grown)),
                        self.good_steps + 1, tf.constant(0, tf.int64))
    return tf.group(self.scale.assign(new_scale), self.good_steps.assign(new_good))


def FromParams(tp: hyperparams.Params) -> Optional[DynamicLossScale]:
  """The trainer's loss scale for tp.loss_scaling; None for NONE."""
  kind = tp.loss_scaling
  if kind == base_experiment.LossScaling.NONE:
    return None
  if kind == base_experiment.LossScaling.DYNAMIC:
    return DynamicLossScale(tp.loss_scale_initial, tp.loss_scale_factor,
                            tp.loss_scale_growth_interval)
  raise ValueError(f'Unknown loss_scaling {kind!r}; use a '
                   f'{base_experiment.LossScaling.__name__}.')
