"""End-to-end tests of the trainer binary, run in the test process (the
console script itself: test_your_experiment.py, test_lingvo_flags.py)."""

import glob
import os

import pytest

from tests import fresh_process
from tests.trainer import in_process
from tests.trainer import summaries

TINY = 'lm.StdlibBytesTiny'


def _Run(*flags, check=True):
  return in_process.Run(*flags, check=check)


def test_resume_continues_exactly(tmp_path):
  straight, resumed = str(tmp_path / 'straight'), str(tmp_path / 'resumed')
  common = ['--model=' + TINY, '--mode=train', '--model_params_override=trainer.steps_per_loop=2']
  _Run(*common, '--logdir=' + straight, '--max_steps=8')
  first = _Run(*common, '--logdir=' + resumed, '--max_steps=4')
  assert 'step      4/4' in first.stdout
  assert glob.glob(os.path.join(resumed, 'checkpoints', 'ckpt-4*'))
  second = _Run(*common, '--logdir=' + resumed, '--max_steps=8')
  assert 'Restored' in second.stdout and 'at step 4' in second.stdout
  a, b = summaries.Scalars(straight, 'train'), summaries.Scalars(resumed, 'train')
  assert [s for s, _ in a['loss']] == [2, 4, 6, 8]
  assert a['loss'] == b['loss']  # exactly: weights, slots, data position, seeds
  for tag in ('learning_rate', 'grad_norm', 'examples_per_sec', 'step_time_s'):
    assert len(a[tag]) == 4
  assert (tmp_path / 'straight' / 'params.txt').read_text().startswith('task.')

  evaluated = _Run('--model=' + TINY, '--mode=eval', '--logdir=' + straight)
  assert 'eval at step 8' in evaluated.stdout
  metrics = summaries.Scalars(straight, 'eval')
  assert metrics['bits_per_byte'][0][0] == 8
  assert 0 < metrics['bits_per_byte'][0][1] < 9


def test_train_and_eval_prints_metrics_and_a_sample(tmp_path):
  result = _Run('--model=' + TINY, '--logdir=' + str(tmp_path), '--sample_bytes=20')
  assert 'eval at step 8: accuracy' in result.stdout
  assert '--- sample ---' in result.stdout


def test_inspect_params_and_model():
  params = _Run('--model=lm.StdlibBytesGPipe', '--mode=inspect_params').stdout
  assert 'task.stack.pipeline.num_micro_batches : 8' in params
  assert 'trainer.optimizer : enum(' in params
  plan = _Run('--model=lm.StdlibBytesGPipe', '--mode=inspect_model').stdout
  assert 'K=4 cells, M=8 micro-batches' in plan
  assert plan.count('device:CPU:') == 4 and 'embedding' in plan and 'softmax' in plan


@pytest.mark.parametrize('flags,message', [
    (['--model=lm.StdlibBytesTyny'], "Unknown experiment 'lm.StdlibBytesTyny'. Did you mean"),
    (['--model_params_override=trainer.max_stepz=3'],
     "Unknown param 'trainer.max_stepz'. Did you mean 'max_steps'"),
    (['--model_params_override=trainer.max_steps=0.5'],
     "trainer.max_steps takes an int (the experiment's value: 8), not 0.5"),
    (['--logdir=/proc/no_such_dir'], 'Cannot write to --logdir'),
    (['--model_params_override=train.file_pattern="/nonexistent/*.txt"'], 'No file matches'),
    (["--model_params_override=task.stack.pipeline.schedule_text='0F0,0X1'"],
     "'0X1' is not an action"),
])
def test_user_errors_are_one_line_without_traceback(flags, message, tmp_path):
  args = ['--model=' + TINY, '--mode=train', f'--logdir={tmp_path / "new" / "run"}'] + flags
  result = _Run(*args, check=False)
  assert result.returncode == 2
  assert 'Traceback' not in result.stderr
  lines = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(lines) == 1 and message in lines[0], result.stderr
  assert not list(tmp_path.iterdir())  # nothing written, not even the new directories


def test_params_file_override_then_flag_override(tmp_path):
  overrides = tmp_path / 'overrides.txt'
  overrides.write_text('# a comment\ntrainer.max_steps : 7\ntrainer.seed : 5\n')
  text = _Run('--model=' + TINY, '--mode=inspect_params',
              f'--model_params_file_override={overrides}',
              '--model_params_override=trainer.seed=9').stdout
  assert 'trainer.max_steps : 7\n' in text and 'trainer.seed : 9\n' in text


@pytest.mark.slow  # the inspect modes: test_inspect_params_and_model; every
# experiment's params and plan: test_experiment_conformance.py, in process.
def test_every_experiment_prints_params_and_plan():
  for model in ('lm.StdlibBytesGPipe', 'mt.ReverseBytesGPipe', 'image.AmoebaNetDCifarGPipe'):
    assert 'task.' in _Run(f'--model={model}', '--mode=inspect_params').stdout
    assert 'K=4 cells' in _Run(f'--model={model}', '--mode=inspect_model').stdout


def test_devices_made_before_the_run_are_used_or_refused_in_one_line(tmp_path):
  """The trainer called from Python after TensorFlow made its devices: the
  tests' own runs use conftest's 8; 2 are too few for 4 cells."""
  code = ('import tensorflow as tf; tf.config.set_logical_device_configuration('
          'tf.config.list_physical_devices("CPU")[0], '
          '[tf.config.LogicalDeviceConfiguration()] * 2); tf.config.list_logical_devices(); '
          'from trainer import trainer; trainer.Run()')
  result = fresh_process.RunPython(
      '-c', code, '--model=lm.StdlibBytesGPipe', '--mode=train', '--max_steps=1',
      f'--logdir={tmp_path / "run"}', check=False)
  assert result.returncode == 2 and 'Traceback' not in result.stderr, result.stderr
  # TensorFlow's start-up lines come before the trainer's log filter here.
  assert [l for l in result.stderr.splitlines() if l.startswith('error:')] == [
      'error: TensorFlow in this process already made 2 logical CPU device(s) and the '
      'model needs 4; make 4 with tf.config.set_logical_device_configuration before '
      'anything uses TensorFlow, or run the trainer in a process of its own.']
  assert not (tmp_path / 'run').exists()
