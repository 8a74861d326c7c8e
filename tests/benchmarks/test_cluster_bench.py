"""cluster_bench runs a schedule other than fill-drain, as a loop, on real
loopback worker processes that it starts and stops itself."""

import json

from tests import fresh_process


def test_a_zero_bubble_loop_step_on_workers():
  out = fresh_process.RunPython(
      '-m', 'benchmarks.cluster_bench', '--run=workers', '--replicas=1', '--k=2',
      '--m=4', '--num_layers=2', '--batch=16', '--steps=2', '--warmup=0',
      '--schedule=zb_h1', '--loop_min_micro_batches=2').stdout
  result = json.loads(out.strip().splitlines()[-1])
  assert (result['schedule'], result['loop_min_micro_batches'], result['K']) == ('zb_h1', 2, 2)
  assert result['step_s_median'] > 0
  # The boundary's activations and gradients cross between the two workers.
  assert result['worker_to_worker_bytes_per_step'] >= result['boundary_bytes_per_step']
