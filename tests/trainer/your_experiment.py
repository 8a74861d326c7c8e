"""The user's module of docs/your_experiment.md and the trainer run on it
as a user runs it: from the module's directory, through the console script
(RunTrainer) or, where the process is not what a test checks, in the test
process (RunTrainerInProcess: no TensorFlow import of its own)."""

import contextlib
import os
import pathlib
import subprocess
import sys
from typing import Dict, Iterator, List, Optional, Tuple

from lingvo_pipe import model_registry
from tests import doc_blocks
from tests import fresh_process
from tests.trainer import in_process

DOC = fresh_process.ROOT / 'docs' / 'your_experiment.md'
MODULE = 'my_exps'
KEY = 'my_exps.MlpGPipe'
# Code blocks before this heading make the module; those after it are run.
RUN_HEADING = '## 5. Run it'
TRAINER = pathlib.Path(sys.executable).parent / 'lingvo_pipe_trainer'


def Blocks() -> Tuple[str, List[Tuple[str, str]]]:
  """(the module's source, [(language, code)] of the blocks to run)."""
  text = DOC.read_text()
  cut = text.index(RUN_HEADING)
  module = [code for _, code in doc_blocks.Blocks(text[:cut])]
  return '\n\n'.join(module), doc_blocks.Blocks(text[cut:])


def WriteModule(directory: pathlib.Path) -> pathlib.Path:
  """Writes my_exps.py of the walk-through into directory; returns it."""
  path = directory / f'{MODULE}.py'
  path.write_text(Blocks()[0])
  return path


def Env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
  """The user's environment: no PYTHONPATH, no TF_CPP_MIN_LOG_LEVEL."""
  env = {k: v for k, v in os.environ.items()
         if k not in ('PYTHONPATH', 'TF_CPP_MIN_LOG_LEVEL')}
  env.update(extra or {})
  return env


def RunTrainer(cwd: pathlib.Path, *flags: str, check: bool = True,
               timeout_s: float = 600, env: Optional[Dict[str, str]] = None
               ) -> subprocess.CompletedProcess:
  """Runs the console script lingvo_pipe_trainer in cwd."""
  return RunCommand(cwd, [str(TRAINER), *flags], check=check, timeout_s=timeout_s,
                    env=env)


def RunCommand(cwd: pathlib.Path, command: List[str], check: bool = True,
               timeout_s: float = 600, env: Optional[Dict[str, str]] = None
               ) -> subprocess.CompletedProcess:
  """Runs command in cwd with the user's environment; with check, a
  non-zero status fails with the command's last lines of output."""
  try:
    result = subprocess.run(command, cwd=cwd, env=Env(env), capture_output=True,
                            text=True, timeout=timeout_s)
  except subprocess.TimeoutExpired as e:
    raise AssertionError(f'{command} timed out after {timeout_s} s:\n'
                         f'{fresh_process._Text(e.stderr)}') from None  # pylint: disable=protected-access
  if check and result.returncode:
    raise AssertionError(f'{" ".join(command)}\nexited {result.returncode}\n'
                         f'--- stderr ---\n{result.stderr[-3000:]}\n'
                         f'--- stdout ---\n{result.stdout[-3000:]}')
  return result


def RunTrainerInProcess(cwd: pathlib.Path, *flags: str,
                        check: bool = True) -> subprocess.CompletedProcess:
  """RunTrainer's flags, run by the trainer in this process from cwd."""
  with _InUserDirectory(cwd):
    return in_process.Run(*flags, check=check)


@contextlib.contextmanager
def _InUserDirectory(directory: pathlib.Path) -> Iterator[None]:
  """directory as the working directory and first on sys.path, and a
  registry of experiments of its own; after, all three as they were and
  the user's module forgotten, so that the next run imports its own."""
  # pylint: disable=protected-access
  cwd, path, registry = os.getcwd(), list(sys.path), model_registry._DEFAULT_REGISTRY
  os.chdir(directory)
  sys.path.insert(0, str(directory))
  model_registry._DEFAULT_REGISTRY = model_registry.Registry()
  try:
    yield
  finally:
    os.chdir(cwd)
    sys.path[:] = path
    model_registry._DEFAULT_REGISTRY = registry
    sys.modules.pop(MODULE, None)
