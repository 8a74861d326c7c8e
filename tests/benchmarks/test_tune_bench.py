"""tune_bench: one small run end to end (the tuner against its grid), and
its replay from the JSON it wrote."""

import json

from tests import fresh_process

_FLAGS = ('--workloads=uneven', '--uneven_layers=2', '--dim=16', '--uneven_batch=8',
          '--micro_batches=1', '--remats=NONE', '--devices=2', '--verify=1')


def _Json(*args: str):
  out = fresh_process.RunPython('-m', 'benchmarks.tune_bench', *_FLAGS, *args).stdout
  return json.loads(out.strip().splitlines()[-1])


def test_a_small_run_compares_the_pick_with_the_grid_and_replays_as_it_ran(tmp_path):
  ran = _Json('--repeats=1')
  (row,) = ran['rows']
  assert row['workload'] == 'uneven' and row['candidates'] == len(row['grid']) > 1
  assert {g['candidate'].split()[0] for g in row['grid']} == {'K=1', 'K=2'}
  assert all(g['measured_s'] > 0 and g['measured_peak_mb'] > 0 for g in row['grid'])
  assert any(g['calibration'] for g in row['grid'])
  assert len(row['layer_costs']['1']) == 2 and row['layer_costs']['1'][0]['forward_s'] > 0
  assert 0 <= row['step_error']['median'] <= row['step_error']['worst']
  assert [b['share'] for b in row['budgets']] == [1.0, 0.5, 0.25]
  for budget in row['budgets']:
    if budget['fits']:
      assert budget['pick_over_best'] >= 1.0
      assert budget['pick_predicted_peak_mb'] <= budget['budget_mb']

  # The replay takes the recorded costs and trials: the tuner's every step
  # after Measure gives what the run gave.
  path = tmp_path / 'tune.json'
  path.write_text(json.dumps(ran))
  replayed = _Json(f'--replay={path}')
  assert replayed['replayed_from'] == str(path)
  assert replayed['rows'] == ran['rows']
