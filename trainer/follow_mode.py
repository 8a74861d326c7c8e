"""--mode=evaler and --mode=decoder: beside a training run, each checkpoint
as the trainer writes it, as Lingvo's evaler and decoder jobs do.

It reads the logdir's recorded checkpoints (oldest first) and takes each
once: the evaler evaluates it on the dev split (a line, and summaries
under logdir/eval at the checkpoint's step; the best one copied to
logdir/best with trainer.best_checkpoint_metric), the decoder decodes
trainer.decode_steps dev batches as --mode=decode does (logdir/decode_<step>.txt,
summaries under logdir/decode). It ends by itself once it has taken the one
at --max_steps (or trainer.max_steps); Ctrl-C ends it (a decode under way
first writes what it decoded). It writes nothing into checkpoints/, and a
checkpoint the trainer's retention removed before it was read is skipped
with one line. Checkpoints do not depend on the layout, so it may run
under other K, M or schedule.
"""

import os
import time
from typing import Callable

import tensorflow as tf

from lingvo_pipe.core import variable_paths
from trainer.checkpointing import best_checkpoint
from trainer.checkpointing import checkpoint_keys
from trainer.checkpointing import checkpoints
from trainer import decode_mode
from trainer import decoder
from trainer import loop
from trainer import run_context
from trainer import train_mode
from trainer.run_context import UserError

# How often the checkpoint directory is listed for new checkpoints.
POLL_S = 1.0


def _Restore(trainer_obj: loop.Trainer, model_state: tf.train.Checkpoint, path: str) -> bool:
  """Restores the model and step of checkpoint `path`; False (and one line)
  if the trainer removed it first."""
  try:
    checkpoint_keys.CheckMatches(path, trainer_obj.model_variables, [], reset_slots=True)
    model_state.read(path).expect_partial()
  except (tf.errors.NotFoundError, tf.errors.DataLossError, ValueError):
    if os.path.exists(path + '.index'):
      raise
    trainer_obj.log(f'Skipped {os.path.basename(path)}: the trainer removed it '
                    '(trainer.max_checkpoints_to_keep) before it was read.')
    return False
  return True


def _Job(ctx: run_context.RunContext, trainer_obj: loop.Trainer) -> Callable[[str], None]:
  """What the mode does with a restored checkpoint (its path)."""
  if ctx.options.mode == 'decoder':
    dec = decoder.Decoder(trainer_obj)  # traced once, for every checkpoint
    return lambda path: decode_mode.DecodeGracefully(dec, '')
  best = best_checkpoint.FromParams(ctx.logdir, ctx.params.trainer, trainer_obj.log)

  def Evaluate(path: str) -> None:
    metrics = trainer_obj.Eval('dev')
    if best is not None:
      best.Consider(path, int(trainer_obj.global_step.numpy()), metrics)
  return Evaluate


def Run(ctx: run_context.RunContext) -> None:
  """Takes the training run's checkpoints until the one at max_steps."""
  if ctx.options.mode == 'decoder':
    decode_mode.CheckCanDecode(ctx)
  else:
    train_mode.CheckEvalInput(ctx.params)
  ctx.ConfigureDevices()
  trainer_obj = ctx.NewTrainer()
  model_state = tf.train.Checkpoint(model=variable_paths.Nested(trainer_obj.model_variables),
                                    global_step=trainer_obj.global_step)
  job = _Job(ctx, trainer_obj)
  print(f'Following {trainer_obj.checkpoint_dir} until the checkpoint at step '
        f'{ctx.max_steps} (Ctrl-C stops).', flush=True)
  taken = set()
  while True:
    for path in checkpoints.Recorded(trainer_obj.checkpoint_dir):
      if path in taken:
        continue
      taken.add(path)
      try:
        with ctx.Supervised(trainer_obj):
          if _Restore(trainer_obj, model_state, path):
            job(path)
      except (checkpoint_keys.CheckpointError, best_checkpoint.UnknownMetricError) as e:
        raise UserError(str(e)) from None
      if int(path.rsplit('-', 1)[1]) >= ctx.max_steps:
        return
    time.sleep(POLL_S)
