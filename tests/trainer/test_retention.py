"""Retention under repeated restarts: exactly the max_to_keep newest
checkpoints plus one per keep_checkpoint_every_n_hours survive, as an
independent model of the rule predicts (a fake clock stands in for hours).
Retention does not depend on the model: the tiny LM is cut to one layer on
one cell, which each restart traces in a fraction of the time."""

import glob
import os
import types

from tensorflow.python.checkpoint import checkpoint_management

from lingvo_pipe import model_registry
from trainer import experiment_params
from trainer import loop

MAX_TO_KEEP = 2
EVERY_N_HOURS = 1.0
MINUTES_PER_LOOP = 20
SPL = 2
# One Transformer layer on one cell: the cheapest training step to trace.
ONE_CELL = ('task.stack.num_layers=1; task.stack.pipeline.num_partitions=1; '
            'task.stack.pipeline.num_micro_batches=1')


def _Survivors(save_steps_and_times, start_time):
  """The rule, modelled independently: the newest MAX_TO_KEEP stay; one
  pushed out is kept for good if EVERY_N_HOURS have passed since the last
  one kept for good (at first: since the first manager was made)."""
  recent, kept, last_kept = [], [], start_time
  for step, when in save_steps_and_times:
    recent.append((step, when))
    while len(recent) > MAX_TO_KEEP:
      old_step, old_time = recent.pop(0)
      if old_time - EVERY_N_HOURS * 3600 >= last_kept:
        kept.append(old_step)
        last_kept = old_time
  return sorted(kept + [s for s, _ in recent])


def test_retention_over_restarts(tmp_path, monkeypatch):
  clock = {'now': 1_000_000_000.0}
  monkeypatch.setattr(checkpoint_management, 'time',
                      types.SimpleNamespace(time=lambda: clock['now']))
  saves = []
  start_time = clock['now']
  for max_steps in (6, 10, 16, 18):  # a restart before each
    params = experiment_params.ExperimentParams(
        model_registry.GetExperiment('lm.StdlibBytesTiny'))
    experiment_params.ApplyOverrides(params, ONE_CELL)
    params.trainer.Set(steps_per_loop=SPL, max_checkpoints_to_keep=MAX_TO_KEEP,
                       keep_checkpoint_every_n_hours=EVERY_N_HOURS)
    trainer = loop.Trainer(params, str(tmp_path), log=lambda _: None)
    trainer.Restore()

    def AfterLoop(trainer=trainer):
      saves.append((int(trainer.global_step.numpy()), clock['now']))
      clock['now'] += MINUTES_PER_LOOP * 60

    trainer.Train(max_steps, after_loop=AfterLoop)
  expected = _Survivors(saves, start_time)
  on_disk = sorted(int(os.path.basename(p)[len('ckpt-'):-len('.index')])
                   for p in glob.glob(os.path.join(str(tmp_path), 'checkpoints', '*.index')))
  print(f'saved steps {[s for s, _ in saves]}; survivors {on_disk}')
  assert on_disk == expected
  assert len(expected) > MAX_TO_KEEP  # some kept by the hours rule: the test can fail
  assert [os.path.basename(p) for p in trainer.manager.checkpoints] == [
      f'ckpt-{s}' for s in expected[-MAX_TO_KEEP:]]
