"""--mode=evaler: evaluates each checkpoint of a training run as the
trainer writes it, beside the trainer, as Lingvo's evaler job does.

It reads the logdir's recorded checkpoints (oldest first), evaluates each
once on the dev split (a line, and summaries under logdir/eval at the
checkpoint's step), and ends by itself once it has evaluated the one at
--max_steps (or trainer.max_steps); Ctrl-C ends it at once. It writes
nothing into checkpoints/, and a checkpoint the trainer's retention
removed before it was read is skipped with one line. Checkpoints do not
depend on the layout, so it may run under other K, M or schedule.
"""

import os
import time
from typing import List

import tensorflow as tf

from lingvo_pipe.core import variable_paths
from trainer import checkpoint_keys
from trainer import loop
from trainer import run_context
from trainer import train_mode
from trainer.run_context import UserError

# How often the checkpoint directory is listed for new checkpoints.
POLL_S = 1.0


def Recorded(checkpoint_dir: str) -> List[str]:
  """The checkpoints the trainer has recorded as saved, oldest first."""
  state = tf.train.get_checkpoint_state(checkpoint_dir)
  return list(state.all_model_checkpoint_paths) if state else []


def _Evaluate(trainer_obj: loop.Trainer, model_state: tf.train.Checkpoint,
              path: str) -> bool:
  """Restores the model and step of checkpoint `path` and evaluates them;
  False (and one line) if the trainer removed it first."""
  try:
    checkpoint_keys.CheckMatches(path, trainer_obj.model_variables, [], reset_slots=True)
    model_state.read(path).expect_partial()
  except (tf.errors.NotFoundError, tf.errors.DataLossError, ValueError):
    if os.path.exists(path + '.index'):
      raise
    trainer_obj.log(f'Skipped {os.path.basename(path)}: the trainer removed it '
                    '(trainer.max_checkpoints_to_keep) before it was read.')
    return False
  trainer_obj.Eval('dev')
  return True


def Run(ctx: run_context.RunContext) -> None:
  """Evaluates the training run's checkpoints until the one at max_steps."""
  ctx.ConfigureDevices()
  train_mode.CheckEvalInput(ctx.params)
  trainer_obj = ctx.NewTrainer()
  model_state = tf.train.Checkpoint(model=variable_paths.Nested(trainer_obj.model_variables),
                                    global_step=trainer_obj.global_step)
  print(f'Following {trainer_obj.checkpoint_dir} until the checkpoint at step '
        f'{ctx.max_steps} (Ctrl-C stops).', flush=True)
  evaluated = set()
  while True:
    for path in Recorded(trainer_obj.checkpoint_dir):
      if path in evaluated:
        continue
      evaluated.add(path)
      try:
        with ctx.Supervised(trainer_obj):
          _Evaluate(trainer_obj, model_state, path)
      except checkpoint_keys.CheckpointError as e:
        raise UserError(str(e)) from None
      if int(path.rsplit('-', 1)[1]) >= ctx.max_steps:
        return
    time.sleep(POLL_S)
