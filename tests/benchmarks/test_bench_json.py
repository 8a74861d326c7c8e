"""pipeline_bench prints the JSON object that docs/workloads.md describes;
contention_bench prints its own.

Each case runs the program in a fresh process on a tiny ffn; no timing is
asserted.
"""

import sys

import pytest

from benchmarks import runner

TINY = ['--workload=ffn', '--num_layers=2', '--batch=8']

SCHEMA = {
    'step_s_median': float, 'step_s_min': float, 'first_step_s': float,
    'bfc_peak_bytes': int, 'bfc_process_peak_bytes': int, 'graph_ops': int, 'K': int, 'M': int, 'remat': str,
    'remat_last_micro_batch': bool,
    'baseline': bool, 'intra_op_threads': int, 'inter_op_threads': int,
    'steps': int, 'tf_version': str, 'workload': str, 'num_layers': int,
    'batch': int,
}


def _Run(*args: str) -> dict:
  result = runner.Execute(runner.OursCommand([*TINY, *args], steps=1, warmup=0),
                          timeout_s=300)
  assert 'error' not in result, result['error']
  return result


@pytest.mark.parametrize('args, expected', [
    (('--k=2', '--m=2', '--remat=per_cell'),
     dict(K=2, M=2, remat='per_cell', remat_last_micro_batch=False, baseline=False)),
    (('--k=2', '--m=2', '--remat=per_cell', '--remat_last_micro_batch'),
     dict(K=2, M=2, remat='per_cell', remat_last_micro_batch=True, baseline=False)),
    (('--baseline', '--intra_op_threads=1', '--inter_op_threads=1'),
     dict(K=1, M=1, remat='none', baseline=True, intra_op_threads=1,
          inter_op_threads=1)),
])
def test_json_has_the_documented_keys_and_types(args, expected):
  result = _Run(*args)
  for key, kind in SCHEMA.items():
    assert key in result, f'missing {key!r} in {sorted(result)}'
    assert isinstance(result[key], kind), (key, result[key])
  assert {k: result[k] for k in expected} == expected
  assert result['num_layers'] == 2 and result['batch'] == 8 and result['steps'] == 1
  assert result['step_s_min'] == result['step_s_median'] > 0  # of the one timed step
  assert 0 < result['bfc_peak_bytes'] <= result['bfc_process_peak_bytes']
  assert result['graph_ops'] > 0


def test_zb_v_runs_its_two_cells_a_device_on_k_devices():
  """--schedule=zb_v needs no --cells_per_device=2: K=2 devices hold its
  four cells (before, the layers went into K*1 cells, ZB-V's V on one
  device, and nothing said so)."""
  result = _Run('--num_layers=4', '--k=2', '--m=2', '--schedule=zb_v')
  assert (result['K'], result['cells_per_device']) == (2, 2), result


def test_contention_bench_json():
  cmd = runner.Command(argv=(sys.executable, '-m', 'benchmarks.contention_bench',
                             '--weights=2', '--passes=2', '--repeats=2'),
                       cwd=str(runner.REPO_ROOT))
  result = runner.Execute(cmd, timeout_s=300)
  assert 'error' not in result, result['error']
  assert (result['rows'], result['weights_per_device']) == (4, 2)
  alone, both = result['us_per_product_alone'], result['us_per_product_side_by_side']
  assert alone > 0 and both > 0
  assert result['slowdown'] == pytest.approx(both / alone)
