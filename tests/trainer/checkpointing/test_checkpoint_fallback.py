"""Damaged checkpoints: reported, set aside, and the previous readable one
restored; no readable one is one clear error; a damaged or missing state
file is rebuilt from the files, never a silent start from scratch."""

import glob
import os
import shutil

import numpy as np
import pytest

from lingvo_pipe import model_registry
from tests.trainer import in_process
from trainer.checkpointing import checkpoints
from trainer import experiment_params
from trainer import loop

TINY = 'lm.StdlibBytesTiny'


def _Trainer(logdir, lines=None):
  params = experiment_params.ExperimentParams(model_registry.GetExperiment(TINY))
  params.trainer.Set(steps_per_loop=2, max_steps=4)
  return loop.Trainer(params, str(logdir), log=(lines.append if lines is not None
                                                else lambda _: None))


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """A logdir with ckpt-2 and ckpt-4, and the weights at step 2."""
  logdir = tmp_path_factory.mktemp('trained')
  trainer = _Trainer(logdir)
  trainer.Train(2)
  at_2 = [v.numpy() for v in trainer.task.trainable_variables]
  trainer.Train(4)
  return logdir, at_2


def _Copy(trained, tmp_path):
  logdir = tmp_path / 'logdir'
  shutil.copytree(trained[0], logdir)
  return logdir, logdir / 'checkpoints'


def _Truncate(path):
  data = open(path, 'rb').read()
  open(path, 'wb').write(data[:len(data) // 2])


def _Garble(path):
  data = bytearray(open(path, 'rb').read())
  middle = len(data) // 2
  data[middle:middle + 64] = bytes(b ^ 0x5A for b in data[middle:middle + 64])
  open(path, 'wb').write(bytes(data))


@pytest.mark.parametrize('damage,file', [
    (_Truncate, 'ckpt-4.data-00000-of-00001'), (_Garble, 'ckpt-4.data-00000-of-00001'),
    # make test runs the truncated and garbled data file; these take the same path.
    pytest.param(_Garble, 'ckpt-4.index', marks=pytest.mark.slow),
    pytest.param(os.remove, 'ckpt-4.data-00000-of-00001', marks=pytest.mark.slow)])
def test_damaged_newest_falls_back_to_the_previous(trained, tmp_path, damage, file):
  logdir, ckpt = _Copy(trained, tmp_path)
  damage(str(ckpt / file))
  lines = []
  trainer = _Trainer(logdir, lines)
  assert trainer.Restore() == str(ckpt / 'ckpt-2')
  assert int(trainer.global_step.numpy()) == 2
  for want, v in zip(trained[1], trainer.task.trainable_variables):
    np.testing.assert_array_equal(want, v.numpy())
  assert lines[0].startswith('Checkpoint ckpt-4 is damaged (') and len(lines) == 3, lines
  assert 'Fell back to ckpt-2; set aside ckpt-4 as *.damaged.' in lines[1]
  assert not glob.glob(str(ckpt / 'ckpt-4.*[!d]'))  # all renamed *.damaged
  assert trainer.manager.checkpoints == [str(ckpt / 'ckpt-2')]
  trainer.Train(4)  # saves a new ckpt-4; a restart restores it
  again = _Trainer(logdir)
  assert again.Restore() == str(ckpt / 'ckpt-4')


def test_no_readable_checkpoint_is_one_clear_error(trained, tmp_path):
  logdir, ckpt = _Copy(trained, tmp_path)
  _Truncate(str(ckpt / 'ckpt-4.data-00000-of-00001'))
  _Garble(str(ckpt / 'ckpt-2.data-00000-of-00001'))
  before = sorted(os.listdir(ckpt))
  with pytest.raises(checkpoints.CheckpointError,
                     match=r'No readable checkpoint in .*: ckpt-4 \(.*\); ckpt-2 \(.*\)\. '
                     'Move the directory away'):
    _Trainer(logdir).Restore()
  assert sorted(os.listdir(ckpt)) == before  # nothing renamed or removed


@pytest.mark.parametrize('state', ['garbage {{{', None])
def test_damaged_or_missing_state_file_is_rebuilt(trained, tmp_path, state):
  logdir, ckpt = _Copy(trained, tmp_path)
  if state is None:
    os.remove(ckpt / 'checkpoint')
  else:
    (ckpt / 'checkpoint').write_text(state)
  lines = []
  trainer = _Trainer(logdir, lines)
  assert trainer.Restore() == str(ckpt / 'ckpt-4')
  assert int(trainer.global_step.numpy()) == 4
  assert 'rebuilt it from the 2 checkpoint(s) on disk, newest ckpt-4' in lines[0]
  assert (ckpt / 'checkpoint.damaged').exists() == (state is not None)


def test_leftovers_of_an_interrupted_save_are_removed(trained, tmp_path):
  logdir, ckpt = _Copy(trained, tmp_path)
  (ckpt / 'ckpt-6_temp').mkdir()  # a save of ckpt-6 cut short while merging
  (ckpt / 'ckpt-6_temp' / 'part-00000-of-00001.index').write_bytes(b'partial')
  (ckpt / 'ckpt-6.index').write_bytes(b'partial')
  (ckpt / 'checkpoint.tmp0123abcd').write_text('partial')
  for name in ('ckpt-4.index', 'ckpt-4.data-00000-of-00001'):  # whole, never recorded
    shutil.copy(ckpt / name, ckpt / name.replace('4', '8'))
  lines = []
  trainer = _Trainer(logdir, lines)
  assert trainer.Restore() == str(ckpt / 'ckpt-4')
  assert lines[0] == ('Removed leftovers of an interrupted save: checkpoint.tmp0123abcd, '
                      'ckpt-6.index, ckpt-6_temp, ckpt-8.data-00000-of-00001, ckpt-8.index.')
  assert sorted(os.listdir(ckpt)) == ['checkpoint', 'ckpt-2.data-00000-of-00001',
                                      'ckpt-2.index', 'ckpt-4.data-00000-of-00001',
                                      'ckpt-4.index']


def test_trainer_binary_reports_fallback_and_no_readable_checkpoint(trained, tmp_path):
  logdir, ckpt = _Copy(trained, tmp_path)
  _Truncate(str(ckpt / 'ckpt-4.data-00000-of-00001'))
  args = ['--model=' + TINY, '--mode=train', f'--logdir={logdir}',
          '--model_params_override=trainer.steps_per_loop=2', '--max_steps=4']
  result = in_process.Run(*args)
  assert 'Checkpoint ckpt-4 is damaged (' in result.stdout
  assert 'Restored' in result.stdout and 'ckpt-2 at step 2' in result.stdout
  assert 'step      4/4' in result.stdout
  for path in glob.glob(str(ckpt / 'ckpt-*.data*[!d]')):
    _Garble(path)
  failed = in_process.Run(*args, check=False)
  assert failed.returncode == 2 and 'Traceback' not in failed.stderr
  errors = [l for l in failed.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1 and 'No readable checkpoint in' in errors[0], failed.stderr
