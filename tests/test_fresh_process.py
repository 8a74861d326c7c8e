"""RunPython: output on success, and failures that say what ran and why."""

import pytest

from tests import fresh_process


def test_output_environment_and_working_directory():
  result = fresh_process.RunPython(
      '-c', 'import os; print(os.getcwd(), os.environ["TF_CPP_MIN_LOG_LEVEL"], '
      'os.environ["EXTRA"])', env={'EXTRA': 'x'})
  assert result.stdout.split() == [str(fresh_process.ROOT), '3', 'x']


def test_a_failure_shows_the_command_status_and_output_tails():
  script = ('import sys\nfor i in range(50): print("out", i)\n'
            'sys.stderr.write("first\\nlast error line\\n"); sys.exit(3)')
  with pytest.raises(AssertionError) as failure:
    fresh_process.RunPython('-c', script)
  message = str(failure.value)
  assert script in message and 'exited with status 3' in message
  assert 'last error line' in message and 'out 49' in message
  assert 'out 19\n' not in message  # only the last 30 lines of stdout
  assert fresh_process.RunPython('-c', script, check=False).returncode == 3


def test_a_timeout_fails_with_the_output_so_far():
  script = 'import time\nprint("started", flush=True)\ntime.sleep(30)'
  with pytest.raises(AssertionError, match=r'timed out after 1 s(.|\n)*started'):
    fresh_process.RunPython('-u', '-c', script, timeout_s=1)
