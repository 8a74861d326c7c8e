"""device_peaks_bench: a layout run on a worker process per device, each
reporting its own allocator's peak."""

import json

from tests import fresh_process


def test_each_device_reports_its_own_peak(tmp_path):
  """The uneven stack of two layers at width 1024 and 8 rows, split in
  two: device 0 holds the elementwise layer (layer norms: 16 KiB of
  weights, about 1 MiB of activations), device 1 the 1024 x 1024
  projection (4 MiB of weights, and as much again of its gradient). One
  allocator for both would report one figure for both."""
  layout = dict(schedule='GPIPE', devices=2, v=1, micro_batches=1, remat='NONE', splits=[1])
  tune = dict(command='test', rows=[dict(workload='uneven', budgets=[
      dict(share=1.0, budget_mb=64.0, fits=3, pick='K=2 M=1 NONE GPIPE', pick_layout=layout,
           pick_predicted_peak_mb=9.0),
      dict(share=0.5, budget_mb=6.0, fits=1, pick='K=2 M=1 NONE GPIPE', pick_layout=layout,
           pick_predicted_peak_mb=9.0),
      dict(share=0.25, budget_mb=2.0, fits=0)])])
  path = tmp_path / 'tune.json'
  path.write_text(json.dumps(tune))
  out = fresh_process.RunPython(
      '-m', 'benchmarks.device_peaks_bench', f'--tune_json={path}', '--uneven_layers=2',
      '--dim=1024', '--uneven_batch=8').stdout
  result = json.loads(out.strip().splitlines()[-1])
  first, second = result['picks']  # the budget nothing fits is not run
  elementwise, projection = first['device_peaks_mb']
  assert elementwise < 2.0 and projection >= 8.0, first
  assert first['device_peaks_mb'] == second['device_peaks_mb']  # one run per layout
  assert first['within_budget'] and not second['within_budget']
  assert not result['all_within_budget'] and first['step_s'] > 0
