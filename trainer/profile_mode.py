"""--mode=profile: a pipeline timeline of one training step, on a copy of
the state.

The steps it runs are thrown away: the global step, the checkpoints and the
training curves in the logdir stay as they were. It writes only
logdir/timeline.json, logdir/timeline.png, the raw profile under
logdir/plugins/profile and the bubble summaries under logdir/profile.
"""

import os

from trainer import profiling
from trainer import run_context
from trainer.run_context import UserError


def Run(ctx: run_context.RunContext) -> None:
  """Restores the newest checkpoint (if any), profiles one step, prints the
  bubble line and where the timeline went."""
  logdir = ctx.PrepareLogdir()
  trainer_obj = ctx.NewTrainer()
  restored = ctx.Restore(trainer_obj)
  timeline = os.path.join(logdir, 'timeline.json')
  replaced = ' (replacing the previous ones)' if os.path.exists(timeline) else ''
  try:
    with ctx.Supervised(trainer_obj):
      print(profiling.ProfileOneStep(trainer_obj))
  except ValueError as e:
    raise UserError(str(e)) from None
  state = ('the checkpoints and the step in the logdir are as they were' if restored else
           'with no checkpoint in the logdir it profiled the initial weights (a '
           "step's timeline depends on the shapes, not the values)")
  print(f'Timeline: {timeline} (Perfetto, chrome://tracing) and '
        f'{os.path.join(logdir, "timeline.png")}{replaced}. The profiled steps were '
        f'not saved; {state}.')
