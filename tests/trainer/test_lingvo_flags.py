"""A Lingvo trainer command line (--mode=sync, --run_locally, --job, ...)
ends with one line naming each Lingvo flag and what to pass instead,
before anything starts."""

import pytest

from trainer import lingvo_flags
from tests.trainer import your_experiment


@pytest.mark.parametrize('argv,expected', [
    (['--mode=sync'], ['--mode=sync: pass --mode=train']),
    (['--mode', 'async'], ['--mode=async: pass --mode=train']),
    (['--mode=shell'], ['--mode=shell: pass --mode=inspect_params']),
    (['--mode=write_inference_graph'], ['pass --mode=export']),
    (['-run_locally=cpu'], ['--run_locally: a run is local unless --cluster_spec']),
    (['--job=evaler_dev,evaler_test'], ['--job: one process', 'evaler for an evaler beside it']),
    (['--worker_gpus', '1', '--tpu=grpc://host:8470'],
     ['--worker_gpus: cells are placed', '--tpu: TPUs are not supported']),
    (['--worker_replicas=2'], ["the pipeline's num_replicas"]),
    (['--saver_max_to_keep=3'], ['trainer.max_checkpoints_to_keep=N']),
])
def test_each_lingvo_flag_is_named_with_what_to_pass_instead(argv, expected):
  line = lingvo_flags.Refusal(['--model=lm.StdlibBytesTiny', *argv])
  assert line.startswith("Lingvo's trainer flags, which this trainer does not take: ")
  for text in expected:
    assert text in line, line


@pytest.mark.parametrize('argv', [
    ['--mode=train', '--logdir=/tmp/run'], ['--mode', 'worker', '--task', '0'],
    ['--model_params_override=task.stack.pipeline.num_replicas=2'], [],
])
def test_this_trainers_flags_pass(argv):
  assert lingvo_flags.Refusal(argv) is None


def test_the_binary_refuses_a_lingvo_command_line_before_it_starts(tmp_path):
  logdir = tmp_path / 'logdir'
  result = your_experiment.RunTrainer(
      tmp_path, '--model=lm.StdlibBytesTiny', f'--logdir={logdir}', '--mode=sync',
      '--run_locally=cpu', '--logtostderr', check=False)
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines() == [
      "error: Lingvo's trainer flags, which this trainer does not take: --mode=sync: pass "
      '--mode=train (or train_and_eval, which also evaluates); --run_locally: a run is '
      'local unless --cluster_spec names worker tasks: drop it.']
  assert not logdir.exists()
