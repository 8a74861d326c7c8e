"""--mode=evaler: evaluates each checkpoint of a training run as the
trainer writes it, beside the trainer, as Lingvo's evaler job does.

It reads the logdir's recorded checkpoints (oldest first), evaluates each
once on the dev split (a line, and summaries under logdir/eval at the
checkpoint's step; the best one copied to logdir/best with
trainer.best_checkpoint_metric), and ends by itself once it has evaluated
the one at --max_steps (or trainer.max_steps); Ctrl-C ends it at once. It
writes nothing into checkpoints/, and a checkpoint the trainer's retention
removed before it was read is skipped with one line. Checkpoints do not
depend on the layout, so it may run under other K, M or schedule.
"""

import os
import time
from typing import Dict, Optional

import tensorflow as tf

from lingvo_pipe.core import variable_paths
from trainer import best_checkpoint
from trainer import checkpoint_keys
from trainer import checkpoints
from trainer import loop
from trainer import run_context
from trainer import train_mode
from trainer.run_context import UserError

# How often the checkpoint directory is listed for new checkpoints.
POLL_S = 1.0


def _Evaluate(trainer_obj: loop.Trainer, model_state: tf.train.Checkpoint,
              path: str) -> Optional[Dict[str, float]]:
  """Restores the model and step of checkpoint `path` and evaluates them;
  returns the metrics, or None (and one line) if the trainer removed it
  first."""
  try:
    checkpoint_keys.CheckMatches(path, trainer_obj.model_variables, [], reset_slots=True)
    model_state.read(path).expect_partial()
  except (tf.errors.NotFoundError, tf.errors.DataLossError, ValueError):
    if os.path.exists(path + '.index'):
      raise
    trainer_obj.log(f'Skipped {os.path.basename(path)}: the trainer removed it '
                    '(trainer.max_checkpoints_to_keep) before it was read.')
    return None
  return trainer_obj.Eval('dev')


def Run(ctx: run_context.RunContext) -> None:
  """Evaluates the training run's checkpoints until the one at max_steps."""
  ctx.ConfigureDevices()
  train_mode.CheckEvalInput(ctx.params)
  trainer_obj = ctx.NewTrainer()
  model_state = tf.train.Checkpoint(model=variable_paths.Nested(trainer_obj.model_variables),
                                    global_step=trainer_obj.global_step)
  best = best_checkpoint.FromParams(ctx.logdir, ctx.params.trainer, trainer_obj.log)
  print(f'Following {trainer_obj.checkpoint_dir} until the checkpoint at step '
        f'{ctx.max_steps} (Ctrl-C stops).', flush=True)
  evaluated = set()
  while True:
    for path in checkpoints.Recorded(trainer_obj.checkpoint_dir):
      if path in evaluated:
        continue
      evaluated.add(path)
      try:
        with ctx.Supervised(trainer_obj):
          metrics = _Evaluate(trainer_obj, model_state, path)
        if best is not None and metrics is not None:
          best.Consider(path, int(trainer_obj.global_step.numpy()), metrics)
      except (checkpoint_keys.CheckpointError, best_checkpoint.UnknownMetricError) as e:
        raise UserError(str(e)) from None
      if int(path.rsplit('-', 1)[1]) >= ctx.max_steps:
        return
    time.sleep(POLL_S)
