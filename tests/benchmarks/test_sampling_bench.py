"""sampling_bench prints its JSON object; both samplers draw the same bytes.
Runs the tiny LM for a few bytes in a fresh process; no timing is asserted."""

import json

from tests import fresh_process


def test_sampling_bench_prints_json_and_the_samplers_agree():
  result = fresh_process.RunPython('-m', 'benchmarks.sampling_bench', '--model=lm.StdlibBytesTiny',
                                   '--batch=2', '--prompt=5', '--steps=20', '--repeats=1',
                                   timeout_s=300)
  out = json.loads(result.stdout)
  assert out['same_bytes'] is True
  assert out['generated_bytes'] == 20 and out['window'] == 16 and out['num_cells'] == 2
  assert set(out['bytes_per_s_median']) == {'cached', 'full_window'}
  assert out['cached_over_full_window'] > 0
