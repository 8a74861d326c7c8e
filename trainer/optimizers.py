"""Optimizers and learning-rate schedules from the trainer params.

The optimizers are TensorFlow's tf.compat.v1.train ones: they create each
slot variable next to its variable, so a pipeline cell's optimizer state
lives on the cell's device (Keras 3's put every slot on device 0; see
docs/design.md).
"""

from typing import Callable, List, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe import base_experiment
from lingvo_pipe.base_experiment import LrSchedule, OptimizerKind
from lingvo_pipe.core import hyperparams


def LearningRate(tp: hyperparams.Params,
                 global_step: tf.Variable) -> Callable[[], tf.Tensor]:
  """A callable giving the learning rate at the current global step."""
  lr, warmup = tp.learning_rate, max(tp.warmup_steps, 0)

  def Value() -> tf.Tensor:
    step = tf.cast(global_step, tf.float32)
    if tp.lr_schedule == LrSchedule.CONSTANT:
      return tf.constant(lr, tf.float32)
    if tp.lr_schedule == LrSchedule.WARMUP_RSQRT:
      w = float(max(warmup, 1))
      return lr * tf.minimum((step + 1.0) / w, tf.math.rsqrt((step + 1.0) / w))
    if tp.lr_schedule == LrSchedule.COSINE:
      decayed = tf.compat.v1.train.cosine_decay(
          lr, tf.maximum(step - warmup, 0.0), max(tp.max_steps - warmup, 1))
      if callable(decayed):  # eagerly, the v1 schedule returns a function
        decayed = decayed()
      return tf.where(step < warmup, lr * (step + 1.0) / max(warmup, 1), decayed)
    raise ValueError(f'Unknown lr_schedule {tp.lr_schedule!r}; use a '
                     f'{base_experiment.LrSchedule.__name__}.')

  return Value


def StepsPastScheduleWarning(tp: hyperparams.Params, max_steps: int) -> str:
  """A warning if a run to `max_steps` trains past the end of a learning
  rate schedule that decays to 0 (COSINE over trainer.max_steps), where its
  steps change nothing; '' otherwise."""
  if tp.lr_schedule != LrSchedule.COSINE or max_steps <= tp.max_steps:
    return ''
  return (f'warning: --max_steps={max_steps} is past trainer.max_steps={tp.max_steps}, '
          f'where the COSINE learning rate reaches 0: the steps after {tp.max_steps} '
          'leave the weights as they are. To train longer, raise trainer.max_steps '
          f'(--model_params_override=trainer.max_steps={max_steps}).')


def Optimizer(tp: hyperparams.Params,
              learning_rate: Callable[[], tf.Tensor]) -> tf.compat.v1.train.Optimizer:
  """The optimizer named by tp.optimizer."""
  kind = tp.optimizer
  if kind == OptimizerKind.SGD:
    return tf.compat.v1.train.GradientDescentOptimizer(learning_rate)
  if kind == OptimizerKind.MOMENTUM:
    return tf.compat.v1.train.MomentumOptimizer(learning_rate, tp.momentum)
  if kind == OptimizerKind.ADAM:
    return tf.compat.v1.train.AdamOptimizer(learning_rate)
  if kind == OptimizerKind.RMSPROP:
    return tf.compat.v1.train.RMSPropOptimizer(learning_rate, momentum=tp.momentum)
  raise ValueError(f'Unknown optimizer {kind!r}; use an OptimizerKind.')


def ClipByGlobalNorm(grads, clip_norm: float, counted: int = -1):
  """(clipped grads, global norm before clipping); clip_norm 0: no clip.
  The norm is of the first `counted` grads (all if -1): the model's, when
  the rest are its replica copies' gradients again. Each gradient's square
  sum and its scaling run next to the gradient (a cell's device, a
  replica's), so no gradient leaves its device for the norm."""
  # The arithmetic of tf.linalg.global_norm and tf.clip_by_global_norm.
  halves = []
  for g in grads if counted < 0 else grads[:counted]:
    with tf.device(g.device or None):
      halves.append(tf.nn.l2_loss(g))
  norm = tf.sqrt(tf.reduce_sum(tf.stack(halves)) * 2.0)
  if clip_norm <= 0:
    return list(grads), norm
  scale = clip_norm * tf.minimum(1.0 / norm, 1.0 / clip_norm)
  clipped = []
  for g in grads:
    with tf.device(g.device or None):
      clipped.append(g * tf.cast(scale, g.dtype))
  return clipped, norm


def IsFinite(*values: tf.Tensor) -> tf.Tensor:
  return tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in values])


def CreateSlots(optimizer: tf.compat.v1.train.Optimizer,
                variables: Sequence[tf.Variable]) -> None:
  """Creates the optimizer's slots for `variables` (and its own variables,
  e.g. Adam's beta powers) as its first apply_gradients would, each next to
  its variable, by tracing an apply of zero gradients that never runs.
  tf.function traces a function twice when its first trace creates
  variables: created first, the training loop is traced once. The apply is
  traced by wrap_function, once (tf.function would trace it twice too)."""
  def Apply() -> None:
    optimizer.apply_gradients([(tf.zeros(v.shape, v.dtype.base_dtype), v)
                               for v in variables])
  tf.compat.v1.wrap_function(Apply, [])


def SynchronizeCopies(optimizer: tf.compat.v1.train.Optimizer,
                      pairs: Sequence[Tuple[tf.Variable, List[tf.Variable]]]) -> None:
  """Sets each replica copy (pipeline/replicas/replica_variables.py) and its
  optimizer slots to its original's. Slots that do not exist yet are left:
  they are created alike (zeros) at the first step."""
  names = optimizer.get_slot_names()
  for original, copies in pairs:
    for copy in copies:
      copy.assign(original)
      for name in names:
        slot, copy_slot = optimizer.get_slot(original, name), optimizer.get_slot(copy, name)
        if slot is not None and copy_slot is not None:
          copy_slot.assign(slot)
