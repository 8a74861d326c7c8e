"""Runs Python in a fresh process: its own TensorFlow runtime and devices,
its own allocator peak, and the trainer binary as a user runs it."""

import os
import pathlib
import subprocess
import sys
from typing import Dict, Optional, Sequence, Tuple, Union

ROOT = pathlib.Path(__file__).resolve().parents[1]
# Lines of stderr and of stdout a failure shows, the last ones.
TAIL_LINES = 30


def RunPython(*args: str, env: Optional[Dict[str, str]] = None,
              timeout_s: float = 600, check: bool = True) -> subprocess.CompletedProcess:
  """Runs `python *args` (e.g. '-m', 'trainer.trainer', '--mode=train') in
  the repository root and returns the finished process (text output).

  The environment is this one with the repository on PYTHONPATH,
  TF_CPP_MIN_LOG_LEVEL=3 (TensorFlow's start-up lines would bury the
  program's own stderr), then `env`. With check, a non-zero exit status
  fails an AssertionError; so does a timeout, always. Its message holds
  the command, the status and the last lines of stderr and stdout.
  """
  command = [sys.executable, *args]
  full_env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL='3')
  full_env.update(env or {})
  try:
    result = subprocess.run(command, cwd=ROOT, env=full_env, capture_output=True,
                            text=True, timeout=timeout_s)
  except subprocess.TimeoutExpired as e:
    raise AssertionError(_Report(command, f'timed out after {timeout_s} s',
                                 _Text(e.stderr), _Text(e.stdout))) from None
  if check and result.returncode:
    raise AssertionError(_Report(command, f'exited with status {result.returncode}',
                                 result.stderr, result.stdout))
  return result


def Finish(process: subprocess.Popen, timeout_s: float) -> Tuple[int, str, str]:
  """(status, stdout, stderr) of a started text-mode process once it ends;
  killed, an AssertionError with the last lines of its output, if it is
  still running after timeout_s."""
  try:
    out, err = process.communicate(timeout=timeout_s)
  except subprocess.TimeoutExpired:
    process.kill()
    out, err = process.communicate()
    args = process.args if isinstance(process.args, (list, tuple)) else [process.args]
    raise AssertionError(_Report([str(a) for a in args], f'still running after {timeout_s} s',
                                 err, out)) from None
  return process.returncode, out, err


def _Report(command: Sequence[str], what: str, stderr: str, stdout: str) -> str:
  return (f'{" ".join(command)}\n{what}.\n'
          f'--- stderr (last {TAIL_LINES} lines) ---\n{_Tail(stderr)}\n'
          f'--- stdout (last {TAIL_LINES} lines) ---\n{_Tail(stdout)}')


def _Tail(text: str) -> str:
  return '\n'.join(text.splitlines()[-TAIL_LINES:])


def _Text(output: Union[bytes, str, None]) -> str:
  """TimeoutExpired holds the output read so far, as bytes even in text
  mode, or None."""
  if isinstance(output, bytes):
    return output.decode('utf-8', errors='replace')
  return output or ''
