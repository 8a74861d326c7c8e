"""schedule_bench's configurations and its page, from made-up runs."""

import json
import sys

from benchmarks import runner
from benchmarks import schedule_bench
from benchmarks import workloads
from lingvo_pipe.planning import planner
from lingvo_pipe.pipeline.layout import plan as plan_lib
from lingvo_pipe.pipeline.lowering.remat import RematPolicy
from lingvo_pipe.pipeline.schedules.schedule import ScheduleKind


def _Runs(**values):
  return [dict(values), dict(values)]


def test_entries_compare_like_with_like():
  memory = schedule_bench.MemoryEntries()
  assert sorted(memory) == ['gpipe_none', 'gpipe_per_cell', 'one_f_one_b_none',
                            'one_f_one_b_per_cell']
  assert all('--k=4' in args and '--m=8' in args for args in memory.values())
  bubble = schedule_bench.BubbleEntries('ROOT')
  assert bubble['K4_interleaved_v2'][-1] == '--timeline_dir=ROOT/K4_interleaved_v2'
  assert '--inter_op_threads=2' in bubble['K2_gpipe']
  loop = schedule_bench.LoopEntries()
  assert '--loop_min_micro_batches=0' in loop['ffn_K4_M64_unrolled']
  assert '--loop_min_micro_batches=2' in loop['transformer_K8_M32_loop']
  one_f = schedule_bench.LoopEntries('loop_1f1b')
  assert {'--schedule=one_f_one_b', '--loop_min_micro_batches=2'} <= set(
      one_f['ffn_1f1b_K4_M64_loop'])


def test_loop_default_entries_keep_micro_batches_of_four_rows():
  entries = schedule_bench.LoopEntries('loop_default')
  assert '--batch=512' in entries['ffn_rows4_zb_h1_K2_M128_loop']
  assert '--batch=128' in entries['ffn_rows4_gpipe_K2_M32_unrolled']


def test_the_loop_starts_from_the_smallest_m_no_slower_at_every_larger_one():
  assert schedule_bench.ChooseLoopFromM({32: 1.0, 64: 1.01, 128: 1.02}) == 32
  assert schedule_bench.ChooseLoopFromM({32: 1.02, 64: 1.06, 128: 1.01}) == 128
  assert schedule_bench.ChooseLoopFromM({32: 1.01, 64: 1.02, 128: 1.06}) is None
  assert schedule_bench.ChooseLoopFromM({32: 1.01, 64: None, 128: 1.0}) == 128


def test_the_loop_default_is_what_the_committed_measurements_chose():
  """plan.LOOP_FROM_M holds, per built-in schedule, the M that the
  loop_default section of docs/benchmarks/schedules.json chose."""
  results = json.loads((runner.REPO_ROOT / 'docs' / 'benchmarks' /
                        'schedules.json').read_text())['loop_default']
  chosen = {}
  for prefix, k, ms, args, _ in schedule_bench.LOOP_GROUPS['loop_default']:
    ratios = schedule_bench.LoopStepRatios(results, prefix, k, ms)
    assert None not in ratios.values(), (prefix, ratios)
    m = schedule_bench.ChooseLoopFromM(ratios)
    if m:
      schedule = next(a for a in args if a.startswith('--schedule=')).split('=')[1]
      chosen[ScheduleKind[schedule.upper()]] = m
  assert chosen == plan_lib.LOOP_FROM_M


def test_portable_commands():
  command = f'{sys.executable} -m benchmarks.pipeline_bench --timeline_dir=/tmp/abc/gpipe'
  assert schedule_bench._Portable(command) == (  # pylint: disable=protected-access
      'python -m benchmarks.pipeline_bench --timeline_dir=DIR/gpipe')


def test_render_ratios():
  results = dict(
      repeats=2,
      memory={'gpipe_none': dict(command='a', runs=_Runs(bfc_peak_bytes=200 * 2**20,
                                                          step_s_median=2.0, first_step_s=4.0)),
              'one_f_one_b_none': dict(command='b', runs=_Runs(
                  bfc_peak_bytes=80 * 2**20, step_s_median=2.2, first_step_s=4.0))},
      bubble={'K4_gpipe': dict(command='c', runs=_Runs(
                  timeline='K=4 M=8 bubble: measured 0.300, theoretical', step_s_median=1.0)),
              'K4_interleaved_v2': dict(command='d', runs=_Runs(
                  timeline='K=4 M=8 (8 cells) bubble: measured 0.150, schedule', step_s_median=1.0))},
      loop={f'ffn_K4_M{m}_{e}': dict(command='e', runs=_Runs(
          first_step_s=float(m if e == 'unrolled' else 8) + m / 4, step_s_median=m / 4,
          graph_ops=10))
            for m in (4, 16, 64) for e in ('unrolled', 'loop')})
  page = schedule_bench.Render(results, {'cpu': 'x', 'nproc': '2'})
  assert '| none | 200 | 80 | 0.40x | 2.00 | 2.20 | 1.10x | 1.00x |' in page
  assert ('K=4: interleaved / fill-drain measured bubble 0.50x (unit-time model: '
          '(K-1)/(vM+K-1) = 0.158 against (K-1)/(M+K-1) = 0.273, 0.58x)') in page
  assert 'K=2: interleaved / fill-drain measured bubble –' in page
  assert 'ffn K=4 unrolled: first step at M=64 / M=4: 16.00x; less one step: 16.00x' in page
  assert 'ffn K=4 loop: first step at M=64 / M=4: 2.67x; less one step: 1.00x' in page


def test_planner_brackets_the_measured_schedule_peaks():
  """The planner's model of each schedule against the measured rows of
  docs/benchmarks/schedules.json: on CPU one allocator serves every device,
  so a measured peak lies between the planner's shared_peak_bytes (the
  cells' activation peaks never coincide) and total_peak_bytes (they all
  do)."""
  results = json.loads((runner.REPO_ROOT / 'docs' / 'benchmarks' / 'schedules.json').read_text())
  w = workloads.WORKLOADS['transformer-act']
  checked = 0
  for name, entry in results['memory'].items():
    kind, remat = name.rsplit('_', 1) if not name.endswith('per_cell') else (
        name[:-len('_per_cell')], 'per_cell')
    measured = runner.Median(entry['runs'], 'bfc_peak_bytes')
    row = planner.Estimate(workloads.Layers(w), [w.input_shape], 4, 8, RematPolicy(remat),
                           schedule_kind=ScheduleKind(kind))
    assert row.shared_peak_bytes <= measured <= row.total_peak_bytes, (name, row, measured)
    checked += 1
  assert checked == 4
