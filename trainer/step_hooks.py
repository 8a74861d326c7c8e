"""Work done between loops of training steps, at an interval of steps:
evaluation (trainer.eval_interval_steps) and decoding
(trainer.decode_interval_steps), as loop.Trainer.Train's after_loop."""

from typing import Callable, Optional, Sequence

import tensorflow as tf


class EveryNSteps:
  """Runs `action` after a loop when the global step has passed a multiple
  of `interval` since the last run (or since the hook was made).

  Attributes:
    last_step: the global step of the last run, or None.
  """

  def __init__(self, global_step: tf.Variable, interval: int,
               action: Callable[[], object]) -> None:
    self._global_step = global_step
    self._interval = interval
    self._action = action
    self._mark = int(global_step.numpy()) // interval
    self.last_step: Optional[int] = None

  def __call__(self) -> None:
    step = int(self._global_step.numpy())
    if step // self._interval > self._mark:
      self._mark = step // self._interval
      self._action()
      self.last_step = step


def Chain(hooks: Sequence[Callable[[], None]]) -> Optional[Callable[[], None]]:
  """One after_loop calling `hooks` in order; None for none."""
  if not hooks:
    return None

  def AfterLoop() -> None:
    for hook in hooks:
      hook()
  return AfterLoop
