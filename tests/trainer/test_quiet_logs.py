"""TensorFlow's C++ log lines stay off the trainer's stderr unless asked for."""

from tests import fresh_process
from trainer import quiet_logs

_ARGS = ['-m', 'trainer.trainer', '--model=lm.StdlibBytesTiny', '--mode=train',
         '--max_steps=-1']


def test_line_levels():
  assert quiet_logs.LineLevel(
      b'E0000 00:00:1795505344.657140   14034 cuda_platform.cc:52] failed call to cuInit') == 2
  assert quiet_logs.LineLevel(b'I1124 07:41:37.123 7 port.cc:153] oneDNN') == 0
  assert quiet_logs.LineLevel(b'WARNING: All log messages before absl::InitializeLog() '
                              b'is called are written to STDERR') == 1
  assert quiet_logs.LineLevel(b'error: --max_steps=-1 must be 0') is None
  assert quiet_logs.LineLevel(b'I0000 is not a log line') is None


def test_trainer_stderr_holds_only_its_own_line_by_default(tmp_path):
  # An empty TF_CPP_MIN_LOG_LEVEL counts as unset (fresh_process sets it).
  quiet = fresh_process.RunPython(*_ARGS, f'--logdir={tmp_path}',
                                  env={'TF_CPP_MIN_LOG_LEVEL': ''}, check=False)
  assert quiet.returncode == 2
  assert quiet.stderr.splitlines() == [
      "error: --max_steps=-1 must be 0 (the experiment's trainer.max_steps) or a "
      'positive step.'], quiet.stderr


def test_flag_and_environment_bring_the_lines_back(tmp_path):
  loud = fresh_process.RunPython(*_ARGS, f'--logdir={tmp_path}', '--tf_cpp_logs',
                                 env={'TF_CPP_MIN_LOG_LEVEL': ''}, check=False)
  assert loud.returncode == 2
  assert any(quiet_logs.LineLevel(l.encode()) == 0 for l in loud.stderr.splitlines()), loud.stderr
  assert loud.stderr.splitlines()[-1].startswith('error: --max_steps=-1')
  env = fresh_process.RunPython(*_ARGS, f'--logdir={tmp_path}',
                                env={'TF_CPP_MIN_LOG_LEVEL': '0'}, check=False)
  assert any(quiet_logs.LineLevel(l.encode()) == 0 for l in env.stderr.splitlines()), env.stderr


def test_filter_hides_log_messages_only_and_keeps_other_writes():
  script = (
      'import os, sys, time\n'
      'from absl import logging\n'
      'from trainer import quiet_logs\n'
      'quiet_logs.FilterCppLogs(3)\n'
      "os.write(2, b'I0000 00:00:1.2 5 x.cc:1] hidden\\nits second line\\n')\n"
      'time.sleep(0.2)\n'
      "os.write(2, b'a later C-level write\\n')\n"
      "print('python stderr', file=sys.stderr)\n"
      "logging.warning('absl warning')\n"
      "os.write(2, b'E0000 00:00:1.2 5 x.cc:1] hidden error\\nF0000 00:00:1.2 5 x.cc:1] fatal\\n')\n")
  result = fresh_process.RunPython('-c', script, timeout_s=60)
  assert sorted(result.stderr.splitlines()) == sorted([
      'a later C-level write', 'python stderr', 'WARNING:absl:absl warning',
      'F0000 00:00:1.2 5 x.cc:1] fatal']), result.stderr
