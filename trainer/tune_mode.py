"""--mode=tune: the fastest layout of the model's pipeline that fits
--memory_budget_mb per device, measured on this machine (planning/tuner).

The task is built once to read what its pipeline receives (one batch of
the training data, run eagerly up to the pipeline); the layers are timed
alone at every candidate micro-batch size; every candidate is predicted;
the calibration steps and the fastest predicted candidates train a few
steps each in a trainer of their own, with the experiment's optimizer and
the override the last line prints, so what is measured is what that line
runs. Nothing is written
but logdir/tune.png; checkpoints are neither read nor saved.
"""

import functools
import gc
import os
import tempfile
import time
from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import hyperparams
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.planning import trial
from lingvo_pipe.planning import tune_chart
from lingvo_pipe.planning import tuner
from trainer import experiment_params
from trainer import inspection
from trainer import loop
from trainer import run_context
from trainer.run_context import UserError


class _Captured(Exception):
  """Stops the task's forward at its pipeline, holding the pipeline's inputs."""

  def __init__(self, inputs: Tuple[Any, ...]) -> None:
    super().__init__('captured')
    self.inputs = inputs


def Run(ctx: run_context.RunContext) -> None:
  """Tunes the model's one pipeline; prints the table and the override."""
  if ctx.cluster is not None:
    raise UserError('--mode=tune measures on this machine\'s devices; drop --cluster_spec '
                    '(and TF_CONFIG) and set the devices with --num_logical_devices.')
  budget = _BudgetBytes(ctx.options.memory_budget_mb)
  pipelines = list(inspection.PipelinesInParams(ctx.params.task))
  if len(pipelines) != 1:
    raise UserError(f'--mode=tune tunes one PipeliningLayer whose layers are in the '
                    f'params; this model has {len(pipelines)} such.')
  path, pipeline, owner = pipelines[0]
  prefix = f'task.{path}'
  ctx.ConfigureLocalDevices()
  devices = [d.name for d in tf.config.list_logical_devices('CPU')]
  devices = devices[:ctx.options.num_logical_devices or len(devices)]
  start = time.perf_counter()
  inputs = _PipelineInputs(ctx.params, prefix)
  space = tuner.Space(schedules=[s for s in tuner.ALL_SCHEDULES
                                 if s[0] in inspection.RunnableSchedules(owner)],
                      devices=[d for d in (1, 2, 4, 8) if d <= len(devices)])
  slots = inspection.OptimizerSlots(ctx.params.trainer.optimizer)
  try:
    tuned = tuner.Tune(
        pipeline, inputs, budget, devices,
        lambda chosen: _Trials(ctx.params, [c.Override(prefix) for c in chosen]), space, slots)
  except ValueError as e:
    raise UserError(str(e)) from None
  logdir = ctx.PrepareLogdir()
  chart = os.path.join(logdir, 'tune.png')
  rows, pick = tuned.rows, tuned.pick
  tune_chart.Draw(rows, budget, chart, f'{ctx.options.model}: {prefix}', pick)
  print(f'Tuned {prefix} in {time.perf_counter() - start:.0f} s ({tuned.phases}) over '
        f'{len(devices)} device(s), budget {budget / 2**20:.0f} MiB per device, {slots} '
        'optimizer slot(s) '
        'per weight. Predicted from each layer timed alone, calibrated by whole steps; '
        'the measured rows trained in a trainer of their own (seconds per step: the '
        'fastest of 5 rounds; peak: the allocator\'s, over every device). Chart: ' + chart)
  print(tuner.FormatTable(rows, pick))
  print(f"tuned: --model_params_override='{pick.candidate.Override(prefix)}'")


def _BudgetBytes(budget_mb: int) -> int:
  """--memory_budget_mb in bytes; 0: this host's memory (logical CPU
  devices share it)."""
  if budget_mb < 0:
    raise UserError(f'--memory_budget_mb={budget_mb} must be >= 0: the memory of each '
                    "device in MiB, e.g. 16384 (0: the host's memory).")
  if budget_mb:
    return budget_mb << 20
  return os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')


def _PipelineInputs(params: hyperparams.Params, prefix: str) -> Tuple[Any, ...]:
  """What the task's pipeline (at `prefix`) receives for one training
  batch: the task, its pipeline in one cell (on any number of devices),
  runs eagerly until its pipeline is called."""
  params = params.Copy()
  experiment_params.ApplyOverrides(params, f'{prefix}.num_partitions=1; {prefix}.splits=[]; '
                                   f'{prefix}.cells_per_device=1; {prefix}.num_replicas=1')
  task = params.task.Instantiate()
  pipe = next(m for m in task.submodules if isinstance(m, gpipe.PipeliningLayer))

  def Capture(theta: Any, *inputs: Any) -> Any:
    del theta
    raise _Captured(inputs)

  # The instance's own attributes shadow the class's methods (one task, thrown away).
  pipe.FProp = Capture  # type: ignore[method-assign]
  pipe.FPropWithLoss = (  # type: ignore[method-assign]
      lambda theta, loss_fn, *inputs, **_: Capture(theta, *inputs))
  batch = next(iter(params.train.Instantiate().Dataset()))
  try:
    task.FProp(task.theta, batch)
  except _Captured as captured:
    return captured.inputs
  raise UserError('The task did not call its PipeliningLayer in training; nothing to tune.')


def _Trials(params: hyperparams.Params, overrides: Sequence[str]
            ) -> List[Tuple[float, Optional[int]]]:
  """(seconds per step, allocator peak bytes or None) of the experiment
  trained with each of `overrides` (trial.Timed), each in a trainer of its
  own and a logdir thrown away."""
  with tempfile.TemporaryDirectory() as logdir:

    def Start(override: str) -> trial.Steps:
      trial_params = params.Copy()
      experiment_params.ApplyOverrides(trial_params, override)
      trainer = loop.Trainer(trial_params, tempfile.mkdtemp(dir=logdir), log=lambda _: None)
      trainer.SynchronizeCopies()
      return trial.Steps(trainer.TraceTraining, trainer.RunStepsUnsaved)

    results = trial.Timed([functools.partial(Start, o) for o in overrides])
  gc.collect()
  return results
