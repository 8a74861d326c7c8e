"""--mode=decode and --mode=export, on the newest checkpoint in the logdir.

Decode is bounded like eval (trainer.decode_steps batches), shows its
progress, and ends on SIGINT or SIGTERM after the batch under way with what
it decoded written out (exit status 128 + the signal), as training does.
"""

import sys

from trainer.checkpointing import checkpoints
from trainer import decoder
from trainer import export
from trainer import run_context
from trainer import signals
from trainer.run_context import UserError


def CheckCanDecode(ctx: run_context.RunContext) -> None:
  """Refuses (UserError) an experiment whose task does not decode, before any work."""
  try:
    decoder.CheckCanDecode(ctx.params, ctx.options.model)
  except decoder.NoDecoderError as e:
    raise UserError(str(e)) from None


def DecodeGracefully(dec: decoder.Decoder, prompt: str) -> None:
  """Decodes under GracefulStop: a stop signal ends the decode cleanly,
  with what it decoded written out (exit status 128 + the signal)."""
  trainer_obj = dec.trainer
  with signals.GracefulStop(trainer_obj.stop_requested) as stop:
    try:
      dec.Run(
          prompt, should_stop=lambda: bool(trainer_obj.stop_requested.numpy()),
          progress=True)
    except decoder.DecodeStopped as e:
      signum = stop.signum or signals.signal.SIGTERM
      print(f'Stopped by {signals.signal.Signals(signum).name}; wrote the '
            f'{e.num_examples} examples decoded so far to {e.path}.', flush=True)
      sys.exit(128 + signum)


def Run(ctx: run_context.RunContext) -> None:
  """Decodes (--decode_prompt's text or the dev split) or exports."""
  mode = ctx.options.mode
  CheckCanDecode(ctx)
  if not export.LatestCheckpoint(ctx.logdir):
    raise UserError(f'No checkpoint in {ctx.logdir!r} to {mode}; train first '
                    '(--mode=train) or point --logdir at a trained run.')
  trainer_obj = ctx.NewTrainer()
  try:
    trainer_obj.Restore(read_only=True)  # changes nothing in the checkpoints
    if mode == 'decode':
      DecodeGracefully(decoder.Decoder(trainer_obj), ctx.options.decode_prompt)
    else:
      path = export.Export(trainer_obj, ctx.options.export_keep_devices)
      max_batch = export.MaxBatch(trainer_obj.task.ServingSignature()[0])
      rows = f' (serving_default takes 1 to {max_batch} rows a call)' if max_batch else ''
      print(f'Exported {path}{rows}')
  except (FileNotFoundError, ValueError, checkpoints.CheckpointError) as e:
    raise UserError(str(e)) from None
