"""lingvo_pipe_checkpoint: `list` prints a checkpoint's variables, slots and
step quietly; a checkpoint of an earlier version (the task module itself
checkpointed, cell-indexed names) stops the trainer with one line naming
`convert`, which writes it in today's format into a new logdir: variables,
slots, optimizer state, step and input position carry over, so training on
from it equals training on from the same state saved today."""

import hashlib
import os

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe import model_registry
from tests import fresh_process
from tests.trainer import in_process
from tests.trainer import summaries
from trainer.checkpointing import checkpoint_keys
from trainer.checkpointing import checkpoint_tool
from trainer import experiment_params
from trainer import loop

TINY = 'lm.StdlibBytesTiny'
OVERRIDES = 'trainer.steps_per_loop=2'


def _Tool(*args, check=True):
  """The tool run in the test process (its own process only where its
  quiet start is what is tested: _FreshTool)."""
  return in_process.Captured(
      ['lingvo_pipe_checkpoint', *args],
      lambda: checkpoint_tool.Execute(checkpoint_tool.Parser().parse_args(args)), check)


def _FreshTool(*args, check=True):
  return fresh_process.RunPython('-m', 'trainer.checkpointing.checkpoint_tool', *args, check=check)


def _Trainer(*args, check=True):
  return in_process.Run(f'--model={TINY}', '--mode=train',
                        f'--model_params_override={OVERRIDES}', *args, check=check)


def _Snapshot(directory):
  out = {}
  for root, _, files in os.walk(directory):
    for name in files:
      data = open(os.path.join(root, name), 'rb').read()
      out[os.path.relpath(os.path.join(root, name), directory)] = hashlib.sha256(data).hexdigest()
  return out


def _OldGraph(layer):
  """What earlier versions checkpointed of `layer` (tf.train.Checkpoint of
  the task module): its variables and children by attribute name, lists by
  index, a pipeline's layers as its cells' lists `cell_<k>/sub/<j>` (today
  cells are views of the pipeline's `layers`; before, they were children)."""
  node = {name: v for name, v in layer.vars.items() if isinstance(v, tf.Variable)}
  runs = layer.CellLayerIndices() if hasattr(layer, 'CellLayerIndices') else None
  for name, child in layer.Children():
    attr, _, index = name.partition('.')
    if runs is not None and attr == 'layers':
      continue
    if index:
      node.setdefault(attr, {})[index] = _OldGraph(child)
    else:
      node[attr] = _OldGraph(child)
  for k, run in enumerate(runs or []):
    node[f'cell_{k}'] = {'sub': {str(j): _OldGraph(layer.layers[i])
                                 for j, i in enumerate(run)}}
  return node


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
  """Two logdirs holding the same training state at step 2: `today` as the
  trainer writes it, `old` as earlier versions did (cell-indexed names),
  with the run's params.txt; and that state's trainer."""
  today, old = tmp_path_factory.mktemp('today'), tmp_path_factory.mktemp('old')
  params = experiment_params.ExperimentParams(model_registry.GetExperiment(TINY))
  experiment_params.ApplyOverrides(params, OVERRIDES)
  trainer = loop.Trainer(params, str(today), log=lambda _: None)
  trainer.Train(2)
  checkpoint = tf.train.Checkpoint(model=_OldGraph(trainer.task), optimizer=trainer.optimizer,
                                   global_step=trainer.global_step,
                                   train_iterator=trainer.train_iterator)
  tf.train.CheckpointManager(checkpoint, str(old / 'checkpoints'), 5).save(2)
  (old / 'params.txt').write_text(params.ToText())
  (today / 'params.txt').write_text(params.ToText())
  return today, old, trainer


def test_list_prints_variables_slots_and_step_quietly(runs):
  today = runs[0]
  result = _FreshTool('list', str(today))
  lines = result.stdout.splitlines()
  assert lines[0] == f'{today}/checkpoints/ckpt-2  global step 2'
  assert lines[1].split() == ['variable', 'shape', 'dtype', 'slots']
  emb = [l for l in lines if l.split()[0] == 'stack/pipeline/embedding/emb/emb']
  assert len(emb) == 1 and emb[0].split()[-4:] == ['[256,', '16]', 'float32', 'm,v'], emb
  assert '35 variables, 12,896 values; optimizer slots: m, v' in lines
  assert lines[-1].startswith('other: global_step int64[], optimizer/beta1_power')
  assert result.stderr == ''  # no TensorFlow start-up lines
  missing = _Tool('list', str(today / 'nothing'), check=False)
  assert missing.returncode == 2 and missing.stderr.startswith('error: No checkpoint at ')


def test_old_checkpoint_stops_the_trainer_with_the_convert_command(runs):
  old = runs[1]
  before = _Snapshot(old)
  for mode in ('train', 'eval'):
    result = _Trainer(f'--logdir={old}', '--max_steps=4', f'--mode={mode}', check=False)
    assert result.returncode == 2 and 'Traceback' not in result.stderr
    errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
    assert len(errors) == 1, result.stderr
    assert 'written by an earlier version' in errors[0]
    assert f'lingvo_pipe_checkpoint convert --model=MODEL {old} NEW_LOGDIR' in errors[0]
    assert 'step ' not in result.stdout
  assert _Snapshot(old) == before
  listed = _Tool('list', str(old)).stdout
  assert 'Written by an earlier version' in listed
  assert 'stack/pipeline/cell_1/sub/0/softmax/w ' in listed  # the last cell's softmax


def test_convert_round_trip(runs, tmp_path):
  today, old, trainer = runs
  new = tmp_path / 'converted'
  before = _Snapshot(old)
  result = _Tool('convert', f'--model={TINY}', str(old), str(new))
  assert f'with {old}/params.txt' in result.stdout
  assert f'Converted ckpt-2 (35 variables, 70 optimizer slots, step 2) to {new}' in result.stdout
  assert _Snapshot(old) == before
  reader = tf.train.load_checkpoint(str(new / 'checkpoints' / 'ckpt-2'))
  for path, var in trainer.model_variables.items():
    np.testing.assert_array_equal(reader.get_tensor(checkpoint_keys.VariableKey(path)),
                                  var.numpy(), err_msg=path)
    for slot in ('m', 'v'):
      np.testing.assert_array_equal(reader.get_tensor(checkpoint_keys.SlotKey(path, slot)),
                                    trainer.optimizer.get_slot(var, slot).numpy())
  assert int(reader.get_tensor(checkpoint_keys.GLOBAL_STEP_KEY)) == 2
  old_reader = tf.train.load_checkpoint(str(old / 'checkpoints'))
  # Adam's own state; the zero update that creates the slots would leave
  # one more power (0.9**4) if it were not restored.
  for power in ('beta1_power', 'beta2_power'):
    key = f'optimizer/{power}/.ATTRIBUTES/VARIABLE_VALUE'
    assert reader.get_tensor(key) == old_reader.get_tensor(key)
  assert old_reader.get_tensor('optimizer/beta1_power/.ATTRIBUTES/VARIABLE_VALUE') != np.float32(0.9**4)
  # Training on from the converted checkpoint equals training on from today's.
  for logdir in (new, today):
    resumed = _Trainer(f'--logdir={logdir}', '--max_steps=4')
    assert 'ckpt-2 at step 2' in resumed.stdout and 'step      4/4' in resumed.stdout
  assert summaries.Scalars(str(new), 'train')['loss'] == [
      s for s in summaries.Scalars(str(today), 'train')['loss'] if s[0] == 4]
  again = _Tool('convert', f'--model={TINY}', str(old), str(new), check=False)
  assert again.returncode == 2 and 'is not empty' in again.stderr


def test_convert_with_other_params_is_one_line_and_writes_nothing(runs, tmp_path):
  old, new = runs[1], tmp_path / 'converted'
  result = _Tool('convert', f'--model={TINY}', '--model_params_override=task.stack.num_layers=3',
                 str(old), str(new), check=False)
  assert result.returncode == 2 and 'Traceback' not in result.stderr
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1 and 'The model of these params does not fit ckpt-2:' in errors[0]
  assert 'not in the model (stack/pipeline/cell_' in errors[0], errors[0]
  assert not new.exists() or not os.listdir(new)


def test_convert_of_a_current_checkpoint_says_there_is_nothing_to_convert(runs, tmp_path):
  today, new = runs[0], tmp_path / 'converted'
  result = _Tool('convert', f'--model={TINY}', str(today), str(new), check=False)
  assert result.returncode == 2 and 'Traceback' not in result.stderr
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1 and 'is already in the current format' in errors[0], errors
  assert 'nothing to convert' in errors[0]
  assert not new.exists() or not os.listdir(new)
