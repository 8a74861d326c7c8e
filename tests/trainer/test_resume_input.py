"""A resume reads on from the input position only with the train input
params it was saved with: any other is refused in one line before anything
is written (tf.data would rebuild the saved pipeline: the old input, or a
failure at the first batch); every other param a user may change between
runs trains on or is refused in one line; and params.txt is written once a
step has run with its params, before that step's checkpoint."""

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


def _Resume(trained, tmp_path, override):
  """A copy of the trained logdir resumed one step with `override`: the
  result, and whether the copy is byte for byte as it was."""
  logdir = tmp_path / 'run'
  shutil.copytree(trained, logdir)
  before = _Snapshot(logdir)
  result = in_process.Run(f'--model={TINY}', f'--logdir={logdir}', '--mode=train',
                          f'--max_steps={STEPS + 1}', f'--model_params_override={override}',
                          check=False)
  return result, _Snapshot(logdir) == before


def _OneErrorLine(result):
  assert result.returncode == 2, result.stdout + result.stderr
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1 and 'Traceback' not in result.stderr, result.stderr
  return errors[0]


@pytest.mark.parametrize('override,change', [
    ('train.batch_size=8', 'train.batch_size: 4 -> 8'),
    ('train.seq_len=32', 'train.seq_len: 16 -> 32'),
    ('train.seed=7', 'train.seed: 1234 -> 7'),
    ('train.max_bytes=1000', 'train.max_bytes: 200000 -> 1000'),
    ("train.file_pattern='README.md'", "train.file_pattern: '' -> 'README.md'"),
])
def test_other_train_input_params_are_refused_and_change_nothing(trained, tmp_path, override,
                                                                 change):
  result, unchanged = _Resume(trained, tmp_path, override)
  error = _OneErrorLine(result)
  assert (f'Checkpoint ckpt-{STEPS} in {tmp_path}/run/checkpoints was saved with other train '
          f'input params ({change})') in error, error
  assert 'trainer.init_from_checkpoint_rules' in error
  assert unchanged


_OPTIMIZER = "enum('lingvo_pipe.base_experiment.OptimizerKind', 'SGD')"
_SCHEDULE = "enum('lingvo_pipe.base_experiment.LrSchedule', 'COSINE')"
_DYNAMIC = "enum('lingvo_pipe.base_experiment.LossScaling', 'DYNAMIC')"


# Every other param a user may change between runs of one logdir: each
# trains on from the checkpoint, or is refused in one line, changing
# nothing. The params that only steer training share one
# resume; bfloat16 compute resumes in tests/trainer/test_layout_change.py.
@pytest.mark.parametrize('override,refusal', [
    (f'trainer.steps_per_loop=2; trainer.learning_rate=0.01; trainer.lr_schedule={_SCHEDULE}; '
     'trainer.warmup_steps=1; trainer.clip_gradient_norm_to_value=0.5; '
     'trainer.max_checkpoints_to_keep=1', None),
    (f'trainer.optimizer={_OPTIMIZER}', 'does not match the model (optimizer slots:'),
    (f'trainer.loss_scaling={_DYNAMIC}',
     'lacks part of the training state (no value for good_steps:0, scale:0)'),
    ('task.stack.model_dim=32', 'does not match the model (variables:'),
    ('task.stack.seq_len=32; train.seq_len=32', 'train.seq_len: 16 -> 32'),
])
def test_every_other_param_trains_on_or_is_refused(trained, tmp_path, override, refusal):
  result, unchanged = _Resume(trained, tmp_path, override)
  if refusal is None:
    assert result.returncode == 0, result.stdout + result.stderr
    assert f'ckpt-{STEPS} at step {STEPS}' in result.stdout, result.stdout
    assert f'step {STEPS + 1:>6}/{STEPS + 1}' in result.stdout, result.stdout
  else:
    assert refusal in _OneErrorLine(result)
    assert unchanged


def test_evaluation_reads_no_input_position_and_takes_other_train_params(trained, tmp_path):
  logdir = tmp_path / 'run'
  shutil.copytree(trained, logdir)
  result = _Run(logdir, '--mode=eval', '--model_params_override=train.batch_size=8')
  assert f'ckpt-{STEPS}' in result.stdout


def _Trainer(logdir, policy=base_experiment.NonFinitePolicy.STOP):
  params = experiment_params.ExperimentParams(model_registry.GetExperiment(TINY))
  params.trainer.Set(on_nonfinite=policy, steps_per_loop=1)
  return loop.Trainer(params, str(logdir), log=lambda _: None)


def test_params_are_recorded_once_a_step_ran_and_before_its_checkpoint(tmp_path):
  """Train's before_first_save, which writes params.txt: once, after the
  first loop and before the first save; never when the first loop applies
  nothing (a NaN loss under on_nonfinite=STOP)."""
  trainer = _Trainer(tmp_path)
  checkpoints_then = []
  trainer.Train(3, before_first_save=lambda: checkpoints_then.append(
      trainer.manager.latest_checkpoint))
  assert checkpoints_then == [None]
  assert trainer.manager.latest_checkpoint.endswith('ckpt-3')
  softmax = [w for w in trainer.task.trainable_variables if 'softmax' in w.name][0]
  softmax.assign(softmax * float('nan'))  # every loss is NaN: STOP applies nothing
  with pytest.raises(loop.NonFiniteLossError):
    trainer.Train(5, before_first_save=lambda: checkpoints_then.append('called'))
  assert checkpoints_then == [None]
