"""--mode=train, eval and train_and_eval.

Only a mode that trains writes logdir/params.txt, and only once a step has
run with its params, before that step's checkpoint: the file then
describes what trained the newest checkpoint beside it.
SIGTERM and SIGINT end training after the step under way with a checkpoint
at that step (exit status 128 + the signal); see docs/reliability.md.
"""

import os
import sys
import tempfile
from typing import Callable, Optional

from lingvo_pipe.core import hyperparams
from trainer.checkpointing import best_checkpoint
from trainer import decoder
from trainer import loop
from trainer import optimizers
from trainer import run_context
from trainer import signals
from trainer import step_hooks
from trainer.run_context import UserError

PARAMS_FILE = 'params.txt'


def WriteParamsText(params: hyperparams.Params, logdir: str) -> None:
  """Writes logdir/params.txt whole or not at all (a temporary file renamed)."""
  path = os.path.join(logdir, PARAMS_FILE)
  try:
    with tempfile.NamedTemporaryFile('w', dir=logdir, prefix='.params.txt.',
                                     delete=False) as f:
      f.write(params.ToText())
    os.replace(f.name, path)
  except OSError as e:
    raise UserError(f'Cannot write {path!r}: {e.strerror}; choose a writable '
                    '--logdir.') from None


def CheckEvalInput(params: hyperparams.Params) -> None:
  """Reads the dev input now, so a bad eval file fails before training."""
  try:
    params.dev.Instantiate()
  except (OSError, ValueError) as e:
    raise UserError(f'dev input: {run_context.Reason(e)}') from None


def _TrainUntilDoneOrStopped(ctx: run_context.RunContext, trainer_obj: loop.Trainer,
                             after_loop: Optional[Callable[[], None]]) -> None:
  """Trains to ctx.max_steps (under the cluster watchdog, if any); SIGTERM
  or SIGINT end the run after the step under way with a checkpoint at that
  step, exit status 128 + the signal number."""
  step = int(trainer_obj.global_step.numpy())
  if step >= ctx.max_steps:
    print(f'Nothing to train: the checkpoint is at step {step} and the run '
          f'stops at step {ctx.max_steps}; raise --max_steps (or '
          'trainer.max_steps) to train further.', flush=True)
    return
  warning = optimizers.StepsPastScheduleWarning(ctx.params.trainer, ctx.max_steps)
  if warning:
    print(warning, file=sys.stderr, flush=True)
  print('Building the training step (tracing the pipeline, optimizing its graph); then '
        f'a progress line every trainer.steps_per_loop={ctx.params.trainer.steps_per_loop} '
        'steps.', flush=True)
  try:
    with ctx.Supervised(trainer_obj):  # the trace makes the slots on the workers
      trainer_obj.TraceTraining()
  except ValueError as e:
    raise UserError(str(e)) from None
  with signals.GracefulStop(trainer_obj.stop_requested) as stop:
    try:
      with ctx.Supervised(trainer_obj):
        # params.txt names what trained the checkpoints beside it: written
        # once a step ran with these params, before that step's checkpoint.
        done = trainer_obj.Train(ctx.max_steps, after_loop,
                                 lambda: WriteParamsText(ctx.params, ctx.logdir))
    except loop.NonFiniteLossError as e:
      raise UserError(str(e)) from None
  if not done:
    signum = stop.signum or signals.signal.SIGTERM
    step = int(trainer_obj.global_step.numpy())
    print(f'Stopped by {signals.signal.Signals(signum).name} at step {step}; saved '
          f'{trainer_obj.manager.latest_checkpoint}. Run the same command to resume.',
          flush=True)
    sys.exit(128 + signum)


def _EvalKeepingBest(trainer_obj: loop.Trainer,
                     best: Optional[best_checkpoint.BestCheckpoint]) -> None:
  """Evaluates on the dev split; with `best`, the newest checkpoint becomes
  the best if it is at this step and its metric beats the kept one."""
  metrics = trainer_obj.Eval('dev')
  newest = trainer_obj.manager.latest_checkpoint
  step = int(trainer_obj.global_step.numpy())
  if best is not None and newest and newest.endswith(f'ckpt-{step}'):
    try:
      best.Consider(newest, step, metrics)
    except best_checkpoint.UnknownMetricError as e:
      raise UserError(str(e)) from None


def Run(ctx: run_context.RunContext) -> None:
  """Trains and/or evaluates, as ctx.options.mode says."""
  mode, params = ctx.options.mode, ctx.params
  decode_every = params.trainer.decode_interval_steps
  eval_every = params.trainer.eval_interval_steps if mode != 'eval' else 0
  if mode == 'train_and_eval' and decode_every > 0:
    try:
      decoder.CheckCanDecode(params, ctx.options.model)
    except decoder.NoDecoderError as e:
      raise UserError(f'trainer.decode_interval_steps is set but {e}') from None
  ctx.PrepareLogdir()
  ctx.ConfigureDevices()
  if mode in ('eval', 'train_and_eval') or eval_every > 0:
    CheckEvalInput(params)
  trainer_obj = ctx.NewTrainer()
  ctx.Restore(trainer_obj)
  evaluate = None
  best = best_checkpoint.FromParams(ctx.logdir, params.trainer, trainer_obj.log)
  if mode in ('train', 'train_and_eval'):
    hooks = []
    if eval_every > 0:
      evaluate = step_hooks.EveryNSteps(trainer_obj.global_step, eval_every,
                                        lambda: _EvalKeepingBest(trainer_obj, best))
      hooks.append(evaluate)
    if mode == 'train_and_eval' and decode_every > 0:
      hooks.append(decoder.EveryNSteps(trainer_obj, decode_every))
    _TrainUntilDoneOrStopped(ctx, trainer_obj, step_hooks.Chain(hooks))
  if mode in ('eval', 'train_and_eval'):
    if mode == 'eval' and not trainer_obj.manager.latest_checkpoint:
      raise UserError(f'No checkpoint in {ctx.logdir!r} to evaluate; train first.')
    evaluated = evaluate is not None and evaluate.last_step == int(
        trainer_obj.global_step.numpy())
    if not evaluated:  # the interval's evaluation may have just run at this step
      with ctx.Supervised(trainer_obj):
        _EvalKeepingBest(trainer_obj, best if mode == 'train_and_eval' else None)
  if mode == 'train_and_eval' and ctx.options.sample_bytes > 0:
    decoder.PrintSample(trainer_obj, ctx.options.sample_bytes)
  if mode in ('train', 'train_and_eval'):
    print(_ClosingLine(ctx, trainer_obj), flush=True)


def _ClosingLine(ctx: run_context.RunContext, trainer_obj: loop.Trainer) -> str:
  """Where the run's results are and what to run next."""
  line = (f'Done at step {int(trainer_obj.global_step.numpy())}: checkpoints in '
          f'{trainer_obj.checkpoint_dir}; curves: tensorboard --logdir={ctx.logdir}')
  try:
    decoder.CheckCanDecode(ctx.params, ctx.options.model)
  except decoder.NoDecoderError:
    return line + '.'
  return line + (f'; decode: lingvo_pipe_trainer --model={ctx.options.model} '
                 f'--logdir={ctx.logdir} --mode=decode.')
