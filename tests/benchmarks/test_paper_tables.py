"""paper_tables' Table 2 shape and batch-256 speedup sections: their
configurations, and the tables, targets and pictures docs/benchmarks.md
renders from canned JSON (no TensorFlow, no processes)."""

import json
import shutil

import pytest

from benchmarks import analysis
from benchmarks import bench_doc
from benchmarks import paper_tables
from benchmarks import runner

ONE = analysis.ONE_PER_DEVICE
SUMMARY = 'K=2 M=16 bubble: measured {:.3f}, theoretical (K-1)/(M+K-1) = 0.059'


def _Entry(config, *runs):
  return dict(config=config, command='cmd', runs=list(runs))


def _Table2():
  steps = {2: 4.0, 4: 4.4, 8: 5.0}
  return {f'transformer_K{k}_M32_{ONE}': _Entry(
      dict(workload='transformer', num_layers=16, batch=32, threads=ONE,
           baseline=False, k=k, m=32, remat='per_cell'),
      dict(step_s_median=steps[k], first_step_s=10.0 * k),
      dict(step_s_median=steps[k] + 1.0, first_step_s=10.0 * k + 2.0),
      {'error': 'timeout after 900 s'}) for k in steps}


def _B256(k2_bubbles=(0.06, 0.065, 0.2), k2_step=0.55):
  config = dict(workload='ffn', batch=256, threads=ONE, baseline=False, m=16,
                remat='per_cell')
  return {
      f'ffn_B256_K1_M16_{ONE}': _Entry(dict(config, k=1),
                                       dict(step_s_median=1.0, batch=256)),
      f'ffn_B256_K2_M16_{ONE}': _Entry(
          dict(config, k=2),
          *[dict(step_s_median=k2_step, batch=256, timeline=SUMMARY.format(b))
            for b in k2_bubbles],
          dict(step_s_median=k2_step, batch=256)),  # a run without a profile
  }


def test_table2_configs_are_the_issue_shape():
  entries = paper_tables.Table2Configs()
  assert sorted(c['k'] for c, _ in entries.values()) == [2, 4, 8]
  for config, args in entries.values():
    k = config['k']
    assert config['m'] == 32 and config['threads'] == ONE
    assert args == ['--workload=transformer', '--num_layers=16', '--batch=32',
                    f'--k={k}', '--m=32', '--remat=per_cell', '--intra_op_threads=1',
                    f'--inter_op_threads={k}']


def test_b256_configs_profile_only_the_pipelined_run():
  entries = paper_tables.SpeedupB256Configs('ROOT')
  (k1_config, k1_args), (k2_config, k2_args) = (entries[f'ffn_B256_K{k}_M16_{ONE}']
                                                for k in (1, 2))
  assert (k1_config['k'], k2_config['k'], k2_config['batch'], k2_config['m']) == (1, 2, 256, 16)
  assert k1_args == ['--workload=ffn', '--batch=256', '--k=1', '--m=16', '--remat=per_cell',
                     '--intra_op_threads=1', '--inter_op_threads=1']
  assert k2_args[-3:] == ['--intra_op_threads=1', '--inter_op_threads=2',
                          f'--timeline_dir=ROOT/ffn_B256_K2_M16_{ONE}']


def test_commands_name_the_timeline_directory_dir():
  text = 'python -m benchmarks.pipeline_bench --k=2 --timeline_dir=/tmp/tmpab12/ffn_K2 --steps=5'
  assert paper_tables.PortableCommand(text) == (
      'python -m benchmarks.pipeline_bench --k=2 --timeline_dir=DIR/ffn_K2 --steps=5')


def test_core_bound_speedup():
  assert analysis.CoreBoundSpeedup(2, 32, cores=2) == pytest.approx(64 / 33)
  assert analysis.CoreBoundSpeedup(8, 32, cores=2) == 2.0
  assert analysis.CoreBoundSpeedup(4, 32, cores=8) == analysis.IdealSpeedup(4, 32)


def test_table2_rows_relative_to_k2():
  rows = {r['k']: r for r in analysis.Table2Rows(_Table2(), cores=2)}
  assert [r['k'] for r in analysis.Table2Rows(_Table2(), cores=2)] == [2, 4, 8]
  assert rows[8]['step'] == pytest.approx(5.5)     # median of the runs without error
  assert rows[8]['first'] == pytest.approx(81.0)
  assert rows[2]['throughput_vs_k2'] == pytest.approx(1.0)
  assert rows[8]['throughput_vs_k2'] == pytest.approx(4.5 / 5.5)
  assert rows[8]['ideal_vs_k2'] == pytest.approx((8 * 32 / 39) / (2 * 32 / 33))
  assert rows[4]['bound_vs_k2'] == rows[8]['bound_vs_k2'] == pytest.approx(33 / 32)
  assert analysis.Table2Rows(_Table2(), cores=None)[0]['bound_vs_k2'] is None
  lines = analysis.RenderTable2(list(rows.values()), 2).splitlines()
  assert lines[0] == ('| K | M | build + first step s | step s | throughput vs K=2 | '
                      'ideal vs K=2 (K devices) | bound vs K=2 (2 cores) |')
  assert '| 8 | 32 | 81.0 | 5.500 | 0.82x | 3.38x | 1.03x |' in lines


@pytest.mark.parametrize('k2_step, bubbles, passed', [
    (0.55, (0.06, 0.064, 0.2), (True, True)),      # 1.82x; median 0.064: 1.09x
    (0.60, (0.07, 0.07, 0.07), (False, False)),    # 1.67x; 1.19x
])
def test_b256_targets(k2_step, bubbles, passed):
  rows = analysis.BubbleSpeedupRows(_B256(bubbles, k2_step))
  k2 = [r for r in rows if r['k'] == 2][0]
  assert k2['micro_rows'] == 16 and k2['bubble_schedule'] == pytest.approx(1 / 17)
  assert k2['bubble'] == pytest.approx(sorted(bubbles)[1])
  assert [r for r in rows if r['k'] == 1][0]['bubble'] is None
  speedup, bubble = analysis.BubbleSpeedupTargets(rows)
  assert speedup.name == 'ffn B=256 K=2 M=16, one thread per device: speedup vs K=1'
  assert speedup.value == pytest.approx(1.0 / k2_step)
  assert bubble.value == pytest.approx(sorted(bubbles)[1] * 17)
  assert (speedup.passed, bubble.passed) == passed


def test_b256_targets_without_data():
  assert [t.passed for t in analysis.BubbleSpeedupTargets([])] == [None, None]


def test_measured_bubbles_read_the_timeline_summary():
  runs = [dict(timeline=SUMMARY.format(0.074)),
          dict(timeline='K=4 M=8 (8 cells) bubble: measured 0.150, schedule table 0.158'),
          dict(step_s_median=1.0), {'error': 'boom', 'timeline': SUMMARY.format(0.9)}]
  assert analysis.MeasuredBubbles(runs) == [0.074, 0.150]


def _Write(out, name, data, repeats=3):
  (out / f'{name}.json').write_text(json.dumps(dict(repeats=repeats, steps=5, warmup=1,
                                                    data=data)))


def test_doc_renders_the_new_sections(tmp_path):
  out = tmp_path / 'benchmarks'
  out.mkdir()
  _Write(out, 'table2', _Table2())
  _Write(out, 'speedup_b256', _B256())
  lines = bench_doc.RenderDoc(out, dict(cpu='X', nproc='2'), predicted=None).splitlines()
  assert "## The paper's Table 2 shape: transformer, K in {2, 4, 8} at M=32" in lines
  assert '| 4 | 32 | 41.0 | 4.900 | 0.92x | 1.89x | 1.03x |' in lines
  assert any('at most that bubble, (M+1)/M = 1.03x at M=32' in line for line in lines)
  # Summaries from before the cell-calls-alone figure leave its columns empty.
  assert ('| ffn | 256 | 16 | 2 | 16 | 0.550 | 1.82x | 1.88x | 0.065 | 0.059 | 1.10x | – | – |'
          in lines)
  assert '| ffn B=256 K=2 M=16: measured bubble / (K-1)/(M+K-1) | 1.105 | <= 1.1 | FAIL |' in lines
  assert '- transformer_K2_M32_one_per_device: timeout after 900 s' in lines


def test_doc_shows_a_picture_per_schedule_and_links_the_schedule_page(tmp_path):
  out = tmp_path / 'benchmarks'
  out.mkdir()
  pictures = runner.REPO_ROOT / 'docs' / 'benchmarks'
  for name in ('timeline_gpipe.png', 'timeline_one_f_one_b.png'):
    shutil.copy(pictures / name, out / name)
  text = bench_doc.RenderDoc(out, dict(cpu='X', nproc='2'), predicted=None)
  timeline = text.split('## Timeline')[1].split('## Profiles')[0]
  assert '![Fill-drain (GPipe) timeline](benchmarks/timeline_gpipe.png)' in timeline
  assert '![1F1B (PipeDream-flush) timeline](benchmarks/timeline_one_f_one_b.png)' in timeline
  assert '**Interleaved, v=2**: _not drawn yet: docs/benchmarks/timeline_interleaved.png._' in (
      timeline)
  assert '[docs/benchmarks/schedules.md](benchmarks/schedules.md)' in timeline
  for _, schedule, _ in bench_doc.SCHEDULE_PICTURES:
    assert f'**{schedule}**' in timeline


def test_the_schedule_pictures_exist_in_the_repository():
  docs = runner.REPO_ROOT / 'docs' / 'benchmarks'
  for name, _, _ in bench_doc.SCHEDULE_PICTURES:
    assert (docs / name).is_file(), name


def test_measured_bubbles_of_the_step_and_of_the_cell_calls_alone():
  runs = [dict(timeline='K=2 M=16 bubble: measured 0.095 (cell calls alone 0.062), '
                        'theoretical (K-1)/(M+K-1) = 0.059'),
          dict(timeline='K=2 M=16 bubble: measured 0.070, theoretical'), dict(error='x')]
  assert analysis.MeasuredBubbles(runs) == [0.095, 0.070]
  assert analysis.MeasuredBubbles(runs, cell_calls_alone=True) == [0.062]
