"""precision_bench's summary: medians per variant and ratios to float32."""

import pytest

from benchmarks import precision_bench


def _Run(step, peak, first):
  return dict(step_s_median=step, bfc_peak_bytes=peak, first_step_s=first)


def test_summary_medians_and_ratios_to_f32():
  runs = {
      'ffn-k4m4/f32': [_Run(1.0, 100, 10.0), _Run(3.0, 100, 30.0)],
      'ffn-k4m4/bf16': [_Run(1.0, 50, 10.0), _Run(1.0, 70, 10.0),
                        {'error': 'timeout after 5 s'}],
  }
  summary = precision_bench.Summary(runs, ['ffn-k4m4'], ['f32', 'bf16'])
  f32, bf16 = summary['ffn-k4m4']['f32'], summary['ffn-k4m4']['bf16']
  assert f32['step_s_median'] == 2.0 and 'ratio_to_f32' not in f32
  assert bf16['runs'] == 2 and bf16['errors'] == ['timeout after 5 s']
  assert bf16['ratio_to_f32'] == pytest.approx(
      dict(step_s_median=0.5, bfc_peak_bytes=0.6, first_step_s=0.5))
  # Round by round: bf16's first run against f32's first, and so on.
  assert bf16['pair_ratios_to_f32'] == dict(
      step_s_median=[1.0, 1 / 3], bfc_peak_bytes=[0.5, 0.7],
      first_step_s=[1.0, 1 / 3])


def test_every_variant_and_workload_is_a_pipeline_bench_flag_set():
  assert set(precision_bench.VARIANTS) >= {'f32', 'bf16', 'f32-xla', 'bf16-xla'}
  for flags in list(precision_bench.WORKLOADS.values()) + list(
      precision_bench.VARIANTS.values()):
    assert all(f.startswith('--') and '=' in f for f in flags)
