"""partition_bench: its uneven stack, and one small run of it end to end."""

import json

from benchmarks import partition_bench
from tests import fresh_process


def test_the_uneven_stack_is_elementwise_then_projections():
  layers = partition_bench.UnevenLayers(4, 16)
  assert [p.name for p in layers] == ['elementwise_0', 'elementwise_1', 'projection_0',
                                      'projection_1']
  assert len(layers[0].sub) == 10


def test_a_small_run_times_both_partitions():
  out = fresh_process.RunPython(
      '-m', 'benchmarks.partition_bench', '--workloads=uneven', '--uneven_layers=4',
      '--dim=32', '--uneven_batch=8', '--k=2', '--m=2', '--steps=1', '--rounds=1',
      '--repeats=1').stdout
  (row,) = json.loads(out.strip().splitlines()[-1])['rows']
  assert row['workload'] == 'uneven' and len(row['layer_ms']) == 4
  for key in ('flops_cells', 'measured_cells'):
    assert sum(row[key], []) == [0, 1, 2, 3] and len(row[key]) == 2
  assert row['flops_step_s'] > 0 and row['measured_step_s'] > 0
