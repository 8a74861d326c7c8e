"""--mode=tune: the table, the chart and one line that trains when pasted
back; its one-line refusals."""

import re

import pytest

from tests.trainer import in_process

# A batch of 2: micro-batch counts 1 and 2, so the tuning is short.
SMALL = 'task.stack.batch_size=2; train.batch_size=2'


@pytest.mark.parametrize('devices', [
    1,  # on one device: M and remat (and the zero-bubble split) only
    pytest.param(2, marks=pytest.mark.slow)])  # the pipelined layouts too
def test_tune_ends_with_an_override_that_trains_as_pasted(tmp_path, devices):
  tuned = in_process.Run('--model=lm.StdlibBytesTiny', '--mode=tune',
                         f'--logdir={tmp_path / "tune"}', f'--model_params_override={SMALL}',
                         '--memory_budget_mb=64', f'--num_logical_devices={devices}')
  lines = tuned.stdout.strip().splitlines()
  assert lines[0].startswith('Tuned task.stack.pipeline in '), tuned.stdout
  assert f' over {devices} device(s)' in lines[0]
  assert 'budget 64 MiB per device, 2 optimizer slot(s)' in lines[0]
  phases = re.search(r'\(layers timed alone \d+ s, (\d+) calibration trials \d+ s, (\d+) '
                     r'verification trials \d+ s\)', lines[0])
  assert phases and int(phases.group(1)) >= 1, lines[0]
  assert (tmp_path / 'tune' / 'tune.png').stat().st_size > 0
  picked = [l for l in lines if l.startswith('*')]
  assert len(picked) == 1 and re.search(r' \d+\.\d{4} +\d+\.\d +\d+\.\d{4} ', picked[0]), lines
  last = lines[-1]
  match = re.fullmatch(r"tuned: --model_params_override='(.*)'", last)
  assert match and 'task.stack.pipeline.num_partitions=' in match.group(1), last
  trained = in_process.Run('--model=lm.StdlibBytesTiny', '--mode=train', '--max_steps=2',
                           f'--logdir={tmp_path / "train"}',
                           f'--model_params_override={SMALL}; {match.group(1)}')
  assert (tmp_path / 'train' / 'checkpoints' / 'checkpoint').exists(), trained.stdout
  # Nothing but the chart is written in the tuning's logdir.
  assert sorted(p.name for p in (tmp_path / 'tune').iterdir()) == ['tune.png']


def test_a_negative_budget_is_one_line(tmp_path):
  result = in_process.Run('--model=lm.StdlibBytesTiny', '--mode=tune',
                          f'--logdir={tmp_path / "run"}', '--memory_budget_mb=-1', check=False)
  assert result.returncode == 2
  assert result.stderr.strip() == (
      'error: --memory_budget_mb=-1 must be >= 0: the memory of each device in MiB, '
      "e.g. 16384 (0: the host's memory)."), result.stderr
  assert not (tmp_path / 'run').exists()
