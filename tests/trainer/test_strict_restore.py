"""Strict restore: a checkpoint that does not match the model stops the
trainer binary before any step with one line, and nothing in the checkpoint
directory changes (file names, sizes, sha256); eval changes nothing either,
even past a damaged checkpoint. reset_optimizer_state restores the model
and starts the slots afresh, once."""

import hashlib
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe import model_registry
from tests.trainer import in_process
from trainer.checkpointing import checkpoint_keys
from trainer import experiment_params
from trainer import loop

TINY = 'lm.StdlibBytesTiny'
FOUR_LAYERS = 'task.stack.num_layers=4'
# Checkpoints hold the logical model whatever the layout: one cell and one
# micro-batch trace the 4-layer step in less time than Tiny's 2 and 2.
ONE_CELL = 'task.stack.pipeline.num_partitions=1; task.stack.pipeline.num_micro_batches=1'
MOMENTUM = "trainer.optimizer=enum('lingvo_pipe.base_experiment.OptimizerKind', 'MOMENTUM')"
SGD = "trainer.optimizer=enum('lingvo_pipe.base_experiment.OptimizerKind', 'SGD')"
# A user's own experiment module, imported before the binary runs.
WITH_RENAMED = '--import=tests.trainer.renamed_layer_experiment'


def _Params(overrides=''):
  params = experiment_params.ExperimentParams(model_registry.GetExperiment(TINY))
  experiment_params.ApplyOverrides(
      params, f'trainer.steps_per_loop=2; {ONE_CELL}; {FOUR_LAYERS}; ' + overrides)
  return params


def _Train(logdir, steps, overrides=''):
  trainer = loop.Trainer(_Params(overrides), str(logdir), log=lambda _: None)
  trainer.Train(steps)
  return trainer


@pytest.fixture(scope='module')
def adam_logdir(tmp_path_factory):
  """4 layers, Adam, ckpt-2 and ckpt-4."""
  logdir = tmp_path_factory.mktemp('adam')
  _Train(logdir, 4)
  return logdir


@pytest.fixture(scope='module')
def sgd_logdir(tmp_path_factory):
  """4 layers, SGD (no slots), ckpt-2."""
  logdir = tmp_path_factory.mktemp('sgd')
  _Train(logdir, 2, SGD)
  return logdir


def _Snapshot(directory):
  """{relative path: (size, sha256)} of every file under `directory`."""
  out = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      data = open(path, 'rb').read()
      out[os.path.relpath(path, directory)] = (len(data), hashlib.sha256(data).hexdigest())
  return out


def _Copy(logdir, tmp_path):
  copy = tmp_path / 'logdir'
  shutil.copytree(logdir, copy)
  return copy


def _Run(logdir, mode, overrides, program=(), model=TINY, check=False, layout=ONE_CELL):
  return in_process.Run(
      *program, f'--model={model}', f'--mode={mode}', f'--logdir={logdir}',
      f'--model_params_override=trainer.steps_per_loop=2; {layout}; {overrides}',
      '--max_steps=6', check=check)


def _OneErrorLine(result):
  assert result.returncode != 0 and 'Traceback' not in result.stderr, result.stderr
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1, result.stderr
  assert 'step ' not in result.stdout and 'eval at step' not in result.stdout
  return errors[0]


@pytest.mark.parametrize('case', ['three_layers', 'renamed_layer', 'hidden_dim',
                                  'missing_slots'])
def test_mismatch_stops_before_any_step_and_changes_nothing(
    case, adam_logdir, sgd_logdir, tmp_path):
  source, overrides, program, model = adam_logdir, FOUR_LAYERS, (), TINY
  if case == 'three_layers':
    overrides, expected = 'task.stack.num_layers=3', ['variables:', 'unexpected, not in the model']
  elif case == 'renamed_layer':
    program, model = (WITH_RENAMED,), 'TinyRenamedLayer'
    expected = ['variables:', 'missing from it (stack/pipeline/', 'block_3/',
                'unexpected, not in the model (stack/pipeline/', 'layer_3/']
  elif case == 'hidden_dim':
    overrides += '; task.stack.hidden_dim=64'
    expected = ['variables:', 'with another shape or dtype', 'fc0/w: checkpoint '
                'float32[16, 32], model float32[16, 64]']
  else:  # an SGD checkpoint (no slots) resumed with Adam (slots m and v)
    source = sgd_logdir
    expected = ['optimizer slots: 134 of 134 missing from it', '(slot m)',
                'trainer.reset_optimizer_state=True']
  logdir = _Copy(source, tmp_path)
  before = _Snapshot(logdir / 'checkpoints')
  # Both modes restore through one check; eval runs it for one case.
  for mode in ('train', 'eval') if case == 'three_layers' else ('train',):
    line = _OneErrorLine(_Run(logdir, mode, overrides, program, model))
    assert line.startswith('error: Checkpoint ckpt-') and 'does not match the model' in line
    for text in expected:
      assert text in line, line
    assert 'The checkpoint is intact and was not changed.' in line
    assert 'damaged' not in line and 'Move the directory away' not in line
    assert _Snapshot(logdir / 'checkpoints') == before, mode
  assert not (logdir / 'params.txt').exists()  # a refused run writes nothing


def test_a_logdir_of_another_task_names_the_task_it_was_trained_as(adam_logdir, tmp_path):
  logdir = _Copy(adam_logdir, tmp_path)
  (logdir / 'params.txt').write_text(_Params().ToText())
  # No ONE_CELL: the mt task has no task.stack.
  line = _OneErrorLine(_Run(logdir, 'eval', '', model='mt.ReverseBytesGPipe', layout=''))
  assert 'does not match the model' in line
  assert (f'--model_params_file_override={logdir}/params.txt, with a --model whose task '
          'is lingvo_pipe.tasks.lm.model.LanguageModelTask)') in line, line


def test_eval_past_a_damaged_checkpoint_changes_nothing(adam_logdir, tmp_path):
  logdir = _Copy(adam_logdir, tmp_path)
  data = logdir / 'checkpoints' / 'ckpt-4.data-00000-of-00001'
  data.write_bytes(data.read_bytes()[:100])
  before = _Snapshot(logdir / 'checkpoints')
  result = _Run(logdir, 'eval', FOUR_LAYERS, check=True)
  assert 'Checkpoint ckpt-4 is damaged (' in result.stdout
  assert 'left ckpt-4 untouched (this mode changes no checkpoint' in result.stdout
  assert 'eval at step 2' in result.stdout
  assert _Snapshot(logdir / 'checkpoints') == before


def test_reset_optimizer_state_restores_the_model_with_fresh_slots(adam_logdir, tmp_path):
  logdir = _Copy(adam_logdir, tmp_path)
  prefix = str(logdir / 'checkpoints' / 'ckpt-4')
  reader = tf.train.load_checkpoint(prefix)
  lines = []
  trainer = loop.Trainer(_Params(f'{MOMENTUM}; trainer.reset_optimizer_state=True'),
                         str(logdir), log=lines.append)
  assert trainer.Restore() == prefix and int(trainer.global_step.numpy()) == 4
  for path, var in trainer.model_variables.items():
    np.testing.assert_array_equal(
        var.numpy(), reader.get_tensor(checkpoint_keys.VariableKey(path)), err_msg=path)
  assert any('Optimizer state reset' in l and '(momentum)' in l for l in lines), lines
  trainer.Train(6)
  saved = tf.train.load_checkpoint(str(logdir / 'checkpoints' / 'ckpt-6'))
  path = next(iter(trainer.model_variables))
  assert saved.has_tensor(checkpoint_keys.SlotKey(path, 'momentum'))
  assert not saved.has_tensor(checkpoint_keys.SlotKey(path, 'm'))

  # The same command again resumes ckpt-6 with its slots: the reset was once.
  again = _Run(logdir, 'train', f'{FOUR_LAYERS}; {MOMENTUM}; '
               'trainer.reset_optimizer_state=True', check=True)
  assert 'ckpt-6 at step 6' in again.stdout
  assert 'Optimizer state reset' not in again.stdout


@pytest.mark.parametrize('mode', ['profile', 'export'])
def test_profile_and_export_change_no_checkpoint(adam_logdir, tmp_path, mode):
  # decode takes the same read-only restore (trainer.py's _DecodeOrExport).
  logdir = _Copy(adam_logdir, tmp_path)
  before = _Snapshot(logdir / 'checkpoints')
  result = _Run(logdir, mode, FOUR_LAYERS, check=True)
  assert 'ckpt-4 at step 4' in result.stdout
  assert _Snapshot(logdir / 'checkpoints') == before  # profile's steps not saved
