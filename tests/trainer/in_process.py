"""Runs the trainer binary in the test process, as its console script would
run with the same flags, without a new process and TensorFlow import.

For tests of what the trainer does (modes, checkpoints, errors, output);
tests of the process itself (the console script, its C++ log filter,
signals, kills, remote workers) start one (tests/fresh_process.py). The
test process's TensorFlow already has conftest's logical devices, which the
trainer uses when they are enough for the model.
"""

import contextlib
import io
import subprocess
import sys
from typing import Callable, Sequence

from absl import flags

from tests import fresh_process
from trainer import lingvo_flags
from trainer import trainer

PROGRAM = 'lingvo_pipe_trainer'


def Run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
  """Runs the trainer with command-line `args`; returns its exit status and
  what it printed.

  Lingvo's flags are refused as Run() refuses them; flags absl cannot parse
  raise its error. With check, a non-zero status fails an AssertionError
  with the output.
  """
  command = [PROGRAM, *args]
  refusal = lingvo_flags.Refusal(list(args))

  def Execute() -> int:
    if refusal:
      print(f'error: {refusal}', file=sys.stderr)
      return 2
    with _Flags(command):
      try:
        return trainer.Execute()
      except SystemExit as e:  # a mode's exit after a stop signal
        return e.code if isinstance(e.code, int) else 1
  return Captured(command, Execute, check)


def Captured(command: Sequence[str], run: Callable[[], int],
             check: bool = True) -> subprocess.CompletedProcess:
  """Runs `run` (a program's entry point, returning its exit status) with
  stdout and stderr captured, as the finished process `command` would be
  reported; with check, a non-zero status fails an AssertionError with the
  output."""
  stdout, stderr = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
    status = run()
  result = subprocess.CompletedProcess(list(command), status, stdout.getvalue(),
                                       stderr.getvalue())
  if check and status:
    raise AssertionError(fresh_process._Report(  # pylint: disable=protected-access
        command, f'exited with status {status}', result.stderr, result.stdout))
  return result


@contextlib.contextmanager
def _Flags(argv):
  """absl's FLAGS parsed from argv, back at their defaults afterwards."""
  flags.FLAGS.unparse_flags()
  flags.FLAGS(argv)
  try:
    yield
  finally:
    flags.FLAGS.unparse_flags()

