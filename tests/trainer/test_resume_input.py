"""A resume reads on from the input position only with the train input
params it was saved with: any other is refused in one line before anything
is written (tf.data would rebuild the saved pipeline: the old input, or a
failure at the first batch), and params.txt is written once a step has run
with its params, before that step's checkpoint."""

import hashlib
import os
import shutil

import pytest

from lingvo_pipe import base_experiment
from lingvo_pipe import model_registry
from tests.trainer import in_process
from trainer import experiment_params
from trainer import loop

TINY = 'lm.StdlibBytesTiny'
STEPS = 2


def _Snapshot(directory):
  out = {}
  for root, _, files in os.walk(directory):
    for name in files:
      with open(os.path.join(root, name), 'rb') as f:
        out[os.path.relpath(os.path.join(root, name), directory)] = (
            hashlib.sha256(f.read()).hexdigest())
  return out


def _Run(logdir, *flags, check=True):
  return in_process.Run(f'--model={TINY}', f'--logdir={logdir}', '--sample_bytes=0',
                        '--model_params_override=trainer.steps_per_loop=1', *flags,
                        check=check)


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  logdir = tmp_path_factory.mktemp('trained') / 'run'
  _Run(logdir, '--mode=train', f'--max_steps={STEPS}')
  return logdir


@pytest.mark.parametrize('override,change', [
    ('train.batch_size=8', 'train.batch_size: 4 -> 8'),
    ('train.seq_len=32', 'train.seq_len: 16 -> 32'),
    ('train.seed=7', 'train.seed: 1234 -> 7'),
    ('train.max_bytes=1000', 'train.max_bytes: 200000 -> 1000'),
    ("train.file_pattern='README.md'", "train.file_pattern: '' -> 'README.md'"),
])
def test_other_train_input_params_are_refused_and_change_nothing(trained, tmp_path, override,
                                                                 change):
  logdir = tmp_path / 'run'
  shutil.copytree(trained, logdir)
  before = _Snapshot(logdir)
  result = in_process.Run(f'--model={TINY}', f'--logdir={logdir}', '--mode=train',
                          f'--max_steps={STEPS + 2}', f'--model_params_override={override}',
                          check=False)
  assert result.returncode == 2, result.stdout + result.stderr
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1 and 'Traceback' not in result.stderr, result.stderr
  assert (f'Checkpoint ckpt-{STEPS} in {logdir}/checkpoints was saved with other train '
          f'input params ({change})') in errors[0], errors[0]
  assert 'trainer.init_from_checkpoint_rules' in errors[0]
  assert _Snapshot(logdir) == before


def test_evaluation_reads_no_input_position_and_takes_other_train_params(trained, tmp_path):
  logdir = tmp_path / 'run'
  shutil.copytree(trained, logdir)
  result = _Run(logdir, '--mode=eval', '--model_params_override=train.batch_size=8')
  assert f'ckpt-{STEPS}' in result.stdout


def _Trainer(logdir, policy=base_experiment.NonFinitePolicy.STOP):
  params = experiment_params.ExperimentParams(model_registry.GetExperiment(TINY))
  params.trainer.Set(on_nonfinite=policy, steps_per_loop=1)
  return loop.Trainer(params, str(logdir), log=lambda _: None)


def test_params_are_recorded_once_a_step_ran_before_its_checkpoint(tmp_path):
  trainer = _Trainer(tmp_path)
  checkpoints_then = []
  trainer.Train(3, before_first_save=lambda: checkpoints_then.append(
      trainer.manager.latest_checkpoint))
  assert checkpoints_then == [None]  # once, before the first save
  assert trainer.manager.latest_checkpoint.endswith('ckpt-3')


def test_params_are_not_recorded_when_the_first_step_fails(tmp_path):
  trainer = _Trainer(tmp_path)
  softmax = [w for w in trainer.task.trainable_variables if 'softmax' in w.name][0]
  softmax.assign(softmax * float('nan'))  # every loss is NaN: STOP applies nothing
  called = []
  with pytest.raises(loop.NonFiniteLossError):
    trainer.Train(3, before_first_save=lambda: called.append(True))
  assert not called
