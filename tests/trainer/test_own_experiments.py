"""An experiment in the user's own module runs through the console script
(issue 28, point 1): --model=pkg.module.ClassName imports the module from
the working directory, --import imports any, and the start stays quiet."""

from tests.trainer import your_experiment

# What TensorFlow's C++ runtime prints at start-up when nothing hides it.
CPP_LOG_MARKERS = ('I0000', 'E0000', 'W0000', 'cuInit', 'oneDNN', 'absl::InitializeLog')


def _AssertQuiet(stderr: str) -> None:
  found = [line for line in stderr.splitlines()
           if any(marker in line for marker in CPP_LOG_MARKERS)]
  assert not found, stderr


def test_model_key_imports_the_module_from_the_working_directory(tmp_path):
  your_experiment.WriteModule(tmp_path)
  result = your_experiment.RunTrainer(tmp_path, f'--model={your_experiment.KEY}',
                                      '--mode=inspect_params')
  assert 'task.pipeline.num_micro_batches : 4\n' in result.stdout
  assert "task.cls : cls('my_exps.MlpClassifierTask')" in result.stdout
  _AssertQuiet(result.stderr)


def test_import_flag_registers_the_modules_experiments(tmp_path):
  your_experiment.WriteModule(tmp_path)
  result = your_experiment.RunTrainer(tmp_path, '--import=my_exps', '--model=MlpGPipe',
                                      '--mode=inspect_params')
  assert 'trainer.max_steps : 200\n' in result.stdout
  _AssertQuiet(result.stderr)


def test_a_users_trainer_py_does_not_shadow_the_trainer(tmp_path):
  your_experiment.WriteModule(tmp_path)
  (tmp_path / 'trainer.py').write_text('raise SystemExit("the user\'s trainer.py ran")\n')
  result = your_experiment.RunTrainer(tmp_path, f'--model={your_experiment.KEY}',
                                      '--mode=inspect_params')
  assert 'trainer.max_steps : 200\n' in result.stdout


def test_a_missing_module_is_one_line_naming_it(tmp_path):
  for flags in (['--model=not_there.Mlp'], ['--import=not_there', '--model=Mlp']):
    result = your_experiment.RunTrainer(tmp_path, *flags, '--mode=inspect_params',
                                        check=False)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith('error: '), result.stderr
    assert "'not_there'" in lines[0]
