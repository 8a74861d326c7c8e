"""--mode=decode and --mode=export, on the newest checkpoint in the logdir."""

from trainer import checkpoints
from trainer import decoder
from trainer import export
from trainer import run_context
from trainer.run_context import UserError


def Run(ctx: run_context.RunContext) -> None:
  """Decodes (--decode_prompt's text or the dev split) or exports."""
  mode = ctx.options.mode
  try:
    decoder.CheckCanDecode(ctx.params, ctx.options.model)
  except decoder.NoDecoderError as e:
    raise UserError(str(e)) from None
  if not export.LatestCheckpoint(ctx.logdir):
    raise UserError(f'No checkpoint in {ctx.logdir!r} to {mode}; train first '
                    '(--mode=train) or point --logdir at a trained run.')
  trainer_obj = ctx.NewTrainer()
  try:
    trainer_obj.Restore()
    if mode == 'decode':
      decoder.Decoder(trainer_obj).Run(ctx.options.decode_prompt)
    else:
      print(f'Exported {export.Export(trainer_obj, ctx.options.export_keep_devices)}')
  except (FileNotFoundError, ValueError, checkpoints.CheckpointError) as e:
    raise UserError(str(e)) from None
