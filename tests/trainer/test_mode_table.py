"""The trainer as a table of modes over one run context (issue 28, point
11): every mode of --mode has a module with Run(ctx), trainer.py keeps only
flags and the table, and every mode reads the same context, so the same bad
flag is refused alike, before any work, whatever the mode."""

import ast
import importlib
import inspect

import pytest

from tests import fresh_process
from tests.trainer import in_process

TRAINER_PY = fresh_process.ROOT / 'trainer' / 'trainer.py'


def _Modes():
  """MODES of trainer.py, read from its source (importing it defines flags)."""
  tree = ast.parse(TRAINER_PY.read_text())
  for node in tree.body:
    if isinstance(node, ast.AnnAssign) and getattr(node.target, 'id', '') == 'MODES':
      return ast.literal_eval(node.value)
  raise AssertionError('trainer.py defines no MODES table')


def test_every_mode_has_a_module_with_run():
  modes = _Modes()
  assert set(modes) == {'train', 'eval', 'train_and_eval', 'evaler', 'decoder', 'inspect_params',
                        'inspect_model', 'profile', 'decode', 'export', 'worker', 'tune'}
  for module_name in set(modes.values()):
    run = importlib.import_module(module_name).Run
    assert list(inspect.signature(run).parameters) == ['ctx'], module_name


def test_trainer_py_holds_flags_and_the_table_only():
  tree = ast.parse(TRAINER_PY.read_text())
  functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
  local_imports = [n for f in functions for n in ast.walk(f)
                   if isinstance(n, (ast.Import, ast.ImportFrom))]
  assert len(local_imports) == 1  # run_context, after the C++ log filter
  assert len(TRAINER_PY.read_text().splitlines()) < 200


@pytest.mark.parametrize('mode', ['inspect_params', 'inspect_model', 'train', 'eval',
                                  'evaler', 'decoder', 'profile', 'decode', 'export',
                                  'worker', 'tune'])
def test_every_mode_refuses_a_bad_cluster_spec_alike(mode, tmp_path):
  result = in_process.Run('--model=lm.StdlibBytesTiny', f'--mode={mode}',
                          f'--logdir={tmp_path / "run"}', '--cluster_spec=garbage',
                          check=False)
  assert result.returncode == 2, result.stdout
  assert result.stderr.strip() == (
      "error: Cluster spec part 'garbage' is not job=host:port,...; e.g. "
      '--cluster_spec=worker=localhost:2222,localhost:2223.'), result.stderr
  assert not (tmp_path / 'run').exists()
