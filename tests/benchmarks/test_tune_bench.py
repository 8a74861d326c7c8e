"""tune_bench: one small run end to end (the tuner against its grid, each
candidate run twice), and its replay from the JSON it wrote."""

import json

import tensorflow as tf

from benchmarks import tune_bench
from lingvo_pipe.core.layers import linear
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.lowering.remat import RematPolicy
from lingvo_pipe.pipeline.schedules.schedule import ScheduleKind
from lingvo_pipe.planning import candidates
from lingvo_pipe.planning import trial
from tests import fresh_process

_FLAGS = ('--workloads=uneven', '--uneven_layers=2', '--dim=16', '--uneven_batch=8',
          '--micro_batches=1', '--remats=NONE', '--devices=2', '--verify=1')


def _Json(*args: str):
  out = fresh_process.RunPython('-m', 'benchmarks.tune_bench', *_FLAGS, *args).stdout
  return json.loads(out.strip().splitlines()[-1])


def test_a_small_run_compares_the_pick_with_the_grid_and_replays_as_it_ran(tmp_path):
  ran = _Json('--repeats=1', '--side_by_side_rounds=1')
  (row,) = ran['rows']
  assert row['workload'] == 'uneven' and row['candidates'] == len(row['grid']) > 1
  assert {g['candidate'].split()[0] for g in row['grid']} == {'K=1', 'K=2'}
  assert all(g['measured_s'] > 0 and g['measured_peak_mb'] > 0 for g in row['grid'])
  assert all(len(g['passes_s']) == 2 and g['measured_s'] == min(g['passes_s'])
             for g in row['grid'])
  assert 0 <= row['pass_spread']['median'] <= row['pass_spread']['worst']
  assert any(g['calibration'] for g in row['grid'])
  assert len(row['layer_costs']['1']) == 2 and row['layer_costs']['1'][0]['forward_s'] > 0
  assert 0 <= row['step_error']['median'] <= row['step_error']['worst']
  assert [b['share'] for b in row['budgets']] == [1.0, 0.5, 0.25]
  for budget in row['budgets']:
    if budget['fits']:
      assert budget['pick_over_best'] >= 1.0
      assert budget['pick_over_best_side_by_side'] > 0
      assert budget['pick_predicted_peak_mb'] <= budget['budget_mb']

  # The replay takes the recorded costs and trials: the tuner's every step
  # after Measure gives what the run gave.
  path = tmp_path / 'tune.json'
  path.write_text(json.dumps(ran))
  replayed = _Json(f'--replay={path}')
  assert replayed['replayed_from'] == str(path)
  assert replayed['rows'] == ran['rows']


def test_side_by_side_times_the_two_alternately_and_gives_the_median_ratio(monkeypatch):
  """Both layouts are built and traced, then timed pick, best, pick,
  best...: the rounds' ratios 2, 3 and 1 give 2."""
  layers = [linear.ProjectionLayer.Params().Set(name=f'p{i}', input_dim=8, output_dim=8)
            for i in range(2)]
  pipeline = gpipe.PipeliningLayer.Params().Set(name='pipe', layers=layers,
                                                input_shapes=[[4, 8]])
  x = [tf.random.stateless_normal([4, 8], [1, 2])]
  pick = candidates.Candidate(ScheduleKind.GPIPE, 1, 1, 2, RematPolicy.NONE, ())
  best = candidates.Candidate(ScheduleKind.GPIPE, 1, 1, 1, RematPolicy.NONE, ())
  timed, seconds = [], iter([2.0, 1.0, 6.0, 2.0, 1.0, 1.0])

  def StepSeconds(run, rounds):
    timed.append(run)
    return next(seconds)

  monkeypatch.setattr(trial, 'StepSeconds', StepSeconds)
  assert tune_bench.SideBySide(pipeline, x, pick, best, rounds=3) == 2.0
  assert len(set(timed)) == 2 and timed[0::2] == [timed[0]] * 3 and timed[1::2] == [timed[1]] * 3
