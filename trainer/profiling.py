"""The trainer's profile mode: a pipeline timeline of one training step."""

import os

from lingvo_pipe.profiling import timeline
from trainer import loop


def ProfileOneStep(trainer_obj: loop.Trainer, warmup_steps: int = 2) -> str:
  """Warms up, then profiles one training step and writes its timeline.

  Each profiled or warm-up call is one loop of one step (steps_per_loop is
  capped by Train's target step), so the trace holds exactly one step.

  Args:
    trainer_obj: a restored loop.Trainer; its global step advances by
      warmup_steps + 1 (checkpoints are saved as in training).
    warmup_steps: unprofiled steps first; the first one traces the step.

  Returns:
    The bubble Summary line; logdir/timeline.json and logdir/timeline.png
    are written, the raw profile under logdir/plugins/profile.

  Raises:
    ValueError: warmup_steps < 1, or the step has no pipeline cell calls.
  """
  if warmup_steps < 1:
    raise ValueError(f'warmup_steps ({warmup_steps}) must be >= 1: the first '
                     'step traces the function and must not be profiled.')

  def OneStep() -> None:
    trainer_obj.Train(int(trainer_obj.global_step.numpy()) + 1)

  return timeline.Record(OneStep, os.path.abspath(trainer_obj.logdir),
                         warmup=warmup_steps)
