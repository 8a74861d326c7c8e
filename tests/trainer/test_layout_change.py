"""A checkpoint trained at one layout (K=2, M=2, dropout on) evaluates and
resumes under any other: K, M, R, the schedule, the loop emission and the
compute dtype change no variable, so the eval loss and the next steps'
losses are those of continuing at K=2."""

import shutil

import numpy as np
import pytest

from lingvo_pipe import model_registry
from trainer import experiment_params
from trainer import loop

from tests.trainer import summaries

FIRST, MORE = 8, 8
BASE = ('task.stack.num_layers=4; task.stack.residual_keep_prob=0.8; '
        'trainer.steps_per_loop=1; trainer.save_interval_steps=1000; '
        'trainer.eval_steps=2; ')
K2 = 'task.stack.pipeline.num_partitions=2; task.stack.pipeline.num_micro_batches=2'
_PIPE = 'task.stack.pipeline.'
_SCHEDULE = "enum('lingvo_pipe.pipeline.schedules.schedule.ScheduleKind', '{}')"
LAYOUTS = {
    'K1-M1': f'{_PIPE}num_partitions=1; {_PIPE}num_micro_batches=1',
    'K4-M2': f'{_PIPE}num_partitions=4; {_PIPE}num_micro_batches=2',
    'K2-M4': f'{_PIPE}num_partitions=2; {_PIPE}num_micro_batches=4',
    'K2-R2': f'{K2}; {_PIPE}num_replicas=2',
    '1F1B': f'{K2}; {_PIPE}schedule=' + _SCHEDULE.format('ONE_F_ONE_B'),
    'interleaved-v2': (f'{_PIPE}num_partitions=4; {_PIPE}num_micro_batches=2; '
                       f'{_PIPE}cells_per_device=2; {_PIPE}schedule=' +
                       _SCHEDULE.format('INTERLEAVED')),
    'tick-loop': f'{K2}; {_PIPE}loop_min_micro_batches=2',
}


def _Trainer(logdir, overrides):
  params = experiment_params.ExperimentParams(
      model_registry.GetExperiment('lm.StdlibBytesTiny'))
  experiment_params.ApplyOverrides(params, BASE + overrides)
  return loop.Trainer(params, str(logdir), log=lambda _: None)


def _Losses(logdir):
  losses = dict(summaries.Scalars(logdir, 'train')['loss'])
  return np.array([losses[s] for s in sorted(losses) if s > FIRST])


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """A logdir with the checkpoint of FIRST steps at K=2 M=2; the eval loss
  there, and the losses of MORE steps more at K=2: the same trainer going
  on, as a run never stopped would (one trainer: building and tracing one
  is most of a test's time)."""
  root = tmp_path_factory.mktemp('layouts')
  trainer = _Trainer(root / 'k2', K2)
  trainer.Train(FIRST)
  shutil.copytree(root / 'k2' / 'checkpoints', root / 'first' / 'checkpoints')
  eval_loss = trainer.Eval()['loss']
  trainer.Train(FIRST + MORE)
  return root / 'first', eval_loss, _Losses(root / 'k2')


def _Resume(trained, tmp_path, overrides):
  logdir, eval_loss, losses = trained
  shutil.copytree(logdir / 'checkpoints', tmp_path / 'checkpoints')
  trainer = _Trainer(tmp_path, overrides)
  assert trainer.Restore()
  assert int(trainer.global_step.numpy()) == FIRST
  got_eval = trainer.Eval()['loss']
  trainer.Train(FIRST + MORE)
  return got_eval, eval_loss, _Losses(tmp_path), losses


# M, replicas, 1F1B and the tick loop are checked against one cell step by
# step in tests/pipeline/test_layout_independence.py (and a resume under
# another R in tests/trainer/test_replica_training.py); here they run in
# make test-slow. make test resumes under another schedule with interleaved.
_SLOW_LAYOUTS = ('K2-M4', 'K2-R2', '1F1B', 'tick-loop')


@pytest.mark.parametrize('layout', [
    pytest.param(name, marks=pytest.mark.slow if name in _SLOW_LAYOUTS else ())
    for name in LAYOUTS])
def test_resumes_under_another_layout(layout, trained, tmp_path):
  got_eval, eval_loss, got, expected = _Resume(trained, tmp_path, LAYOUTS[layout])
  np.testing.assert_allclose(got_eval, eval_loss, rtol=1e-6)
  assert len(got) == MORE
  np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_resumes_with_bfloat16_compute(trained, tmp_path):
  """bfloat16 compute reads the same float32 weights: the eval loss and the
  next steps agree to bfloat16's precision, not bitwise."""
  got_eval, eval_loss, got, expected = _Resume(
      trained, tmp_path, f"{K2}; task.fprop_dtype=dtype('bfloat16')")
  np.testing.assert_allclose(got_eval, eval_loss, rtol=2e-2)
  np.testing.assert_allclose(got, expected, rtol=2e-2)


def test_a_different_layout_is_not_a_different_model(trained, tmp_path):
  """The check can fail: a checkpoint of another seed gives other losses."""
  logdir, eval_loss, _ = trained
  _Trainer(tmp_path, f'{K2}; task.random_seed=11').Train(FIRST)
  other = _Trainer(tmp_path, K2)
  assert other.Restore()
  assert abs(other.Eval()['loss'] - eval_loss) > 1e-4
