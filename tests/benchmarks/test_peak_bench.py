"""peak_bench: the ranks it compares, and one small run of it end to end."""

import json

import pytest

from benchmarks import peak_bench
from tests import fresh_process


def test_ranks_average_ties_and_spearman_compares_orders():
  assert peak_bench.Ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]
  assert peak_bench.Spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
  assert peak_bench.Spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
  assert peak_bench.Spearman([1, 1, 1], [1, 2, 3]) is None  # nothing to order


def test_rankings_order_the_schedules_of_each_group():
  def Row(schedule, low, high, measured, emission='loop'):
    return dict(workload='ffn', schedule=schedule, emission=emission, remat='none',
                predicted_low_mb=low, predicted_high_mb=high, measured_mb=measured)

  rows = [Row('gpipe', 10, 30, 25), Row('zb_h1', 5, 15, 12), Row('zb_v', 8, 10, 13),
          Row('gpipe', 1, 1, None, emission='unrolled')]  # a failed run: left out
  (ranking,) = peak_bench.Rankings(rows)
  assert ranking['by_predicted'] == ['zb_v', 'zb_h1', 'gpipe']
  assert ranking['by_measured'] == ['zb_h1', 'zb_v', 'gpipe']
  assert ranking['spearman'] == 0.5


def test_a_small_run_prints_measured_beside_predicted():
  """Two layers of the ffn workload, ZB-H1 per cell at K=2 M=2 as loops: a
  measured peak within a few times the predicted range, and its ranking."""
  out = fresh_process.RunPython(
      '-m', 'benchmarks.peak_bench', '--workloads=ffn', '--num_layers=2', '--batch=8',
      '--k=2', '--m=2', '--schedules=zb_h1', '--remats=per_cell', '--emissions=loop').stdout
  result = json.loads(out.strip().splitlines()[-1])
  (row,) = result['rows']
  assert (row['schedule'], row['emission'], row['error']) == ('zb_h1', 'loop', None)
  assert 0 < row['predicted_low_mb'] <= row['predicted_high_mb']
  assert 0.2 < row['measured_over_high'] and row['measured_over_low'] < 5, row
  (ranking,) = result['rankings']
  assert ranking['by_predicted'] == ranking['by_measured'] == ['zb_h1']
