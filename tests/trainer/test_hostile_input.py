"""Hostile input at the trainer binary: one line `error: ...`, exit 2, no
traceback, and nothing already in the logdir changed."""

import os

import pytest

from lingvo_pipe import model_registry
from tests.trainer import in_process
from trainer import experiment_params
from trainer import param_checks

TINY = 'lm.StdlibBytesTiny'
_OLD_PARAMS = 'an earlier run wrote this\n'


def _Case(tmp_path, flags):
  """Runs the trainer on a logdir holding an earlier run's params.txt."""
  logdir = tmp_path / 'logdir'
  logdir.mkdir()
  (logdir / 'params.txt').write_text(_OLD_PARAMS)
  args = ['--model=' + TINY, '--mode=train_and_eval',
          f'--logdir={logdir}'] + [f.replace('TMP', str(tmp_path)) for f in flags]
  return in_process.Run(*args, check=False), logdir


def _AssertOneErrorLine(result, message):
  assert result.returncode == 2, result.stderr
  assert 'Traceback' not in result.stderr, result.stderr
  lines = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(lines) == 1 and message in lines[0], result.stderr


# Each case: flags ('TMP' is a temporary directory; data files are made by
# _MakeData) and the text its one error line holds.
CASES = {
    'negative_max_steps': (['--max_steps=-5'], '--max_steps=-5 must be 0'),
    'zero_max_steps_param': (['--model_params_override=trainer.max_steps=0'],
                             'trainer.max_steps=0 must be at least 1'),
    'negative_batch': (['--model_params_override=train.batch_size=-2'],
                       'train.batch_size=-2 must be at least 1'),
    'zero_dim': (['--model_params_override=task.stack.model_dim=0'],
                 'task.stack.model_dim=0 must be at least 1'),
    'nan_learning_rate': (["--model_params_override=trainer.learning_rate=float('nan')"],
                          'trainer.learning_rate=nan is not finite'),
    'zero_steps_per_loop': (['--model_params_override=trainer.steps_per_loop=0'],
                            'trainer.steps_per_loop=0 must be at least 1'),
    'malformed_override': (['--model_params_override=trainer.max_steps=(3'],
                           "Override 'trainer.max_steps=(3'"),
    'not_key_value': (['--model_params_override=trainer.max_steps'], 'is not "key=value"'),
    'wrong_type': (["--model_params_override=trainer.learning_rate='fast'"],
                   "trainer.learning_rate takes a number (the experiment's value: 0.003)"),
    'malformed_params_file': (['--model_params_file_override=TMP/bad_params.txt'],
                              "bad_params.txt: Override 'trainer.seed 4' is not"),
    'unknown_experiment': (['--model=lm.NoSuchExperiment'], "Unknown experiment"),
    # Params text names classes and enums, never a function or a module's
    # variable (docs/security.md).
    'function_as_class': (["--model_params_override=task.cls=cls('os.system')"],
                          'os.system is a builtin_function_or_method, not a class'),
    'module_variable_as_enum': (['--model_params_file_override=TMP/environ_params.txt'],
                                'os.environ is a _Environ, not a class'),
    # Checked before the client connects; the worker's refusal is in
    # test_network_exposure.
    'cluster_beyond_loopback': (
        ['--cluster_spec=worker=192.0.2.1:2222,192.0.2.1:2223'],
        'This client would open a TensorFlow port that other machines reach (192.0.2.1:2222, '
        '192.0.2.1:2223 are not loopback addresses)'),
    'empty_data_file': (["--model_params_override=train.file_pattern=TMP/data/empty.txt"],
                        'Input has 0 bytes'),
    'data_is_a_directory': (["--model_params_override=train.file_pattern=TMP/data/dir.txt"],
                            'Is a directory'),
    'empty_dev_file': (["--model_params_override=dev.file_pattern=TMP/data/empty.txt"],
                       'dev input: Input has 0 bytes'),
    'read_only_logdir': (['--logdir=/sys'], "Cannot write to --logdir '/sys'"),
    'micro_batches_do_not_divide': (
        ['--model_params_override=task.stack.pipeline.num_micro_batches=3'],
        'num_micro_batches (3) must divide the batch size (4)'),
}
# make test runs these; the slow variant runs all CASES.
SHORT = ['negative_max_steps', 'nan_learning_rate', 'malformed_params_file',
         'data_is_a_directory', 'micro_batches_do_not_divide', 'function_as_class',
         'module_variable_as_enum', 'cluster_beyond_loopback']


def _MakeData(tmp_path):
  data = tmp_path / 'data'
  data.mkdir()
  (data / 'empty.txt').write_bytes(b'')
  (data / 'dir.txt').mkdir()
  (tmp_path / 'bad_params.txt').write_text('trainer.max_steps : 3\ntrainer.seed 4\n')
  (tmp_path / 'environ_params.txt').write_text(
      "task.stack.pipeline.remat : enum('os.environ', 'HOME')\n")


def _Check(name, tmp_path):
  _MakeData(tmp_path)
  flags, message = CASES[name]
  result, logdir = _Case(tmp_path, flags)
  _AssertOneErrorLine(result, message)
  if '--logdir=/sys' not in flags:
    assert (logdir / 'params.txt').read_text() == _OLD_PARAMS
    assert sorted(os.listdir(logdir)) == ['params.txt']


@pytest.mark.parametrize('name', SHORT)
def test_hostile_input_short(name, tmp_path):
  _Check(name, tmp_path)


@pytest.mark.slow  # make test runs test_hostile_input_short (SHORT).
@pytest.mark.parametrize('name', sorted(set(CASES) - set(SHORT)))
def test_hostile_input_rest(name, tmp_path):
  _Check(name, tmp_path)


def test_every_experiment_passes_the_range_checks():
  model_registry.ImportAllExperiments()
  for key in model_registry.Keys():
    params = experiment_params.ExperimentParams(model_registry.GetExperiment(key))
    assert param_checks.RangeProblems(params) == [], key


def test_range_checks_name_key_value_and_fix():
  params = experiment_params.ExperimentParams(model_registry.GetExperiment(TINY))
  experiment_params.ApplyOverrides(params, "trainer.learning_rate=float('inf'); "
                                   'train.seq_len=0; task.stack.pipeline.micro_batch_size=0; '
                                   'trainer.momentum=1.0; task.stack.residual_keep_prob=0.0')
  assert param_checks.RangeProblems(params) == [
      'task.stack.residual_keep_prob=0.0 must be in (0, 1]',
      'train.seq_len=0 must be at least 1',
      'trainer.learning_rate=inf is not finite; give a finite number',
      'trainer.momentum=1.0 must be in [0, 1)']
  with pytest.raises(param_checks.ParamRangeError, match=r'\(and 3 more\); fix it with'):
    param_checks.CheckRunParams(params, 0)
