"""Ratios, targets, searches and markdown of the benchmark reports, on canned
JSON objects (no TensorFlow, no processes, no peer venv)."""

import json

import pytest

from benchmarks import analysis
from benchmarks import bench_doc
from benchmarks import runner

MB = analysis.MB


def _Entry(config, *runs):
  return dict(config=config, command='cmd', runs=list(runs))


def _Pipe(workload, k, m, **extra):
  return dict(workload=workload, k=k, m=m, baseline=False, remat='per_cell', **extra)


def _Cmp():
  ours = {
      'ffn_K4_M4': _Entry(_Pipe('ffn', 4, 4),
                          dict(step_s_median=0.10, first_step_s=4.0, bfc_peak_bytes=300 * MB),
                          dict(step_s_median=0.30, first_step_s=6.0, bfc_peak_bytes=300 * MB),
                          {'error': 'timeout'}),
      'ffn_K4_M16': _Entry(_Pipe('ffn', 4, 16),
                           dict(step_s_median=0.5, first_step_s=8.0, bfc_peak_bytes=200 * MB,
                                bfc_process_peak_bytes=250 * MB)),
      'ffn_baseline': _Entry(dict(workload='ffn', k=1, m=1, baseline=True, remat='none'),
                             dict(step_s_median=0.1, first_step_s=2.0, bfc_peak_bytes=100 * MB)),
  }
  peer = {
      'ffn_K4_M4': _Entry({}, dict(step_s_median=0.5, graph_build_s=7.0, first_step_s=3.0,
                                   bfc_peak_mb=546.0)),
      'ffn_K4_M16': _Entry({}, dict(step_s_median=1.0, graph_build_s=5.0, first_step_s=1.0,
                                    bfc_peak_mb=546.0)),
      'ffn_baseline': _Entry({}, dict(step_s_median=0.2, graph_build_s=2.0, first_step_s=1.0,
                                      bfc_peak_mb=156.0)),
  }
  return ours, peer


def test_median_skips_failed_runs_and_ratio_handles_missing():
  runs = [dict(x=1.0), dict(x=3.0), {'error': 'boom', 'x': 100.0}, dict(y=1)]
  assert runner.Median(runs, 'x') == 2.0
  assert runner.Median(runs, 'z') is None
  assert runner.Ratio(1.0, 4.0) == 0.25
  assert runner.Ratio(None, 4.0) is None and runner.Ratio(1.0, 0.0) is None


@pytest.mark.parametrize('value, at_least, passed', [
    (0.3, False, True), (0.5, False, False), (0.5, True, True), (0.3, True, False),
    (None, False, None)])
def test_target_pass_fail(value, at_least, passed):
  target = analysis.Target('t', value, 0.4, at_least=at_least)
  assert target.passed is passed
  assert target.Row()[-1] == {True: 'PASS', False: 'FAIL', None: 'no data'}[passed]


def test_compare_rows_medians_and_ratios():
  rows = {r['name']: r for r in analysis.CompareRows(*_Cmp())}
  m4 = rows['ffn_K4_M4']
  assert m4['ours_step'] == pytest.approx(0.2)
  assert m4['step_ratio'] == pytest.approx(0.4)
  assert m4['peer_first'] == pytest.approx(10.0)  # graph build + first step
  assert m4['first_ratio'] == pytest.approx(0.5)
  assert m4['ours_peak_mb'] == pytest.approx(300.0)  # no process peak: the step's
  assert m4['peak_mb_ratio'] == pytest.approx(300 / 546)
  m16 = rows['ffn_K4_M16']
  assert (m16['ours_step_peak_mb'], m16['ours_peak_mb']) == (200, 250)
  assert m16['peak_mb_ratio'] == pytest.approx(250 / 546)


def test_compare_targets():
  targets = {t.name: t for t in analysis.CompareTargets(analysis.CompareRows(*_Cmp()))}
  assert not any(name.startswith('ffn_baseline') for name in targets)
  assert targets['ffn_K4_M4: step time ours/peer'].passed is False      # 0.4
  assert targets['ffn_K4_M16: step time ours/peer'].passed is False     # 0.5
  assert targets['ffn_K4_M4: first step ours/peer'].passed is True      # 0.4
  assert targets['ffn_K4_M16: first step ours/peer'].passed is False    # 8 / 6
  assert targets['ours: first step ffn K=4 M=16 / M=4'].value == pytest.approx(8 / 5)
  assert targets['ours: first step ffn K=4 M=16 / M=4'].passed is False
  assert targets['ffn K=4 M=16: allocator peak ours/peer'].passed is True


def test_comparison_markdown():
  text = analysis.RenderComparisonSection(dict(repeats=3, steps=10, warmup=3,
                                               ours=_Cmp()[0], peer=_Cmp()[1]))
  lines = text.splitlines()
  assert ('| ffn_K4_M4 | 0.200 | 0.500 | 0.40x | 5.0 | 10.0 | 0.50x | 300 | 300 | 546 | 0.55x |'
          in lines)
  assert '| ffn K=4 M=16: allocator peak ours/peer | 0.458 | <= 0.5 | PASS |' in lines


def test_markdown_table_rejects_ragged_rows():
  assert runner.MarkdownTable(['a', 'b'], [[1, 2]]) == '| a | b |\n|---|---|\n| 1 | 2 |'
  with pytest.raises(ValueError, match='3 cells'):
    runner.MarkdownTable(['a', 'b'], [[1, 2, 3]])


def test_parse_last_json_and_alternation_order():
  assert runner.ParseLastJson('log\n{"a": 1}\nmore log\n') == {'a': 1}
  with pytest.raises(ValueError, match='no JSON'):
    runner.ParseLastJson('nothing here')
  order = []

  def FakeExecute(cmd, timeout_s):
    order.append(cmd.argv[0])
    return dict(step_s_median=1.0)

  commands = {n: runner.Command(argv=(n,), cwd='.') for n in ('ours', 'peer')}
  runs = runner.Alternate(commands, 2, 1.0, log=lambda s: None, execute=FakeExecute)
  assert order == ['ours', 'peer', 'ours', 'peer']
  assert len(runs['ours']) == len(runs['peer']) == 2


def test_largest_fitting_bisects():
  probed_limit = []
  best, probed = analysis.LargestFitting(1, 48, lambda n: probed_limit.append(n) or n <= 13)
  assert best == 13 and probed == probed_limit and len(probed) <= 7
  assert analysis.LargestFitting(4, 8, lambda n: False) == (None, [4])
  assert analysis.LargestFitting(1, 8, lambda n: True)[0] == 8
  with pytest.raises(ValueError, match='lo'):
    analysis.LargestFitting(5, 2, lambda n: True)


def _Speedup():
  data = {}
  for threads, base_step in (('default', 1.0), (analysis.ONE_PER_DEVICE, 2.0)):
    data[f'b_{threads}'] = _Entry(dict(workload='ffn', threads=threads, baseline=True,
                                       k=1, m=1), dict(step_s_median=base_step))
    for k in (1, 2):
      data[f'K{k}_{threads}'] = _Entry(_Pipe('ffn', k, 16, threads=threads),
                                       dict(step_s_median=base_step * 2 / k))
  return data


def test_speedup_normalizes_to_k1_and_baseline_of_the_same_threads():
  rows = {(r['threads'], r['k']): r for r in analysis.SpeedupRows(_Speedup())}
  row = rows[(analysis.ONE_PER_DEVICE, 2)]
  assert row['speedup_vs_k1'] == pytest.approx(2.0)
  assert row['speedup_vs_baseline'] == pytest.approx(1.0)
  assert row['ideal'] == pytest.approx(32 / 17)
  [target] = analysis.SpeedupTargets(list(rows.values()))
  assert target.passed is True
  assert '| ffn | one_per_device | 2 | 16 | 2.000 | 2.00x | 1.00x | 1.88x |' in (
      analysis.RenderSpeedup(list(rows.values())).splitlines())


def test_memory_rows_and_targets():
  data = {
      'ref': _Entry(dict(k=1, m=1, remat='none'),
                    dict(bfc_peak_bytes=1000 * MB, step_s_median=1.0)),
      'cell': _Entry(dict(k=1, m=8, remat='per_cell'),
                     dict(bfc_peak_bytes=300 * MB, step_s_median=1.4)),
  }
  rows = analysis.MemoryRows(data, predicted={'cell': (250 * MB, 320 * MB)})
  cell = [r for r in rows if r['remat'] == 'per_cell'][0]
  assert cell['peak_vs_ref'] == pytest.approx(0.3) and cell['predicted_mb'] == (250, 320)
  peak, step = analysis.MemoryTargets(rows)
  assert peak.passed is True and step.passed is False
  assert '| 1 | 8 | per_cell | 300 | 250–320 | 0.30x | 1.400 | 1.40x |' in (
      analysis.RenderMemory(rows).splitlines())


def test_overhead_target():
  data = {'wrapped': _Entry(dict(baseline=False), dict(step_s_median=1.04)),
          'base': _Entry(dict(baseline=True), dict(step_s_median=1.0))}
  _, [target] = analysis.OverheadTargets(data)
  assert target.value == pytest.approx(1.04) and target.passed is True


def test_doc_renders_present_sections_and_notes_missing_ones(tmp_path):
  out = tmp_path / 'benchmarks'
  out.mkdir()
  capacity = dict(budget_mb=512, workload='transformer-act', k=1, m=8, policies={
      'none': dict(largest=2, probes=[dict(num_layers=1, bfc_peak_bytes=200 * MB, command='c'),
                                      dict(num_layers=2, bfc_peak_bytes=400 * MB, command='c'),
                                      dict(num_layers=3, error='OOM', command='c')])})
  (out / 'capacity.json').write_text(json.dumps(dict(repeats=1, steps=1, warmup=0,
                                                     data=capacity)))
  (out / 'profiles.md').write_text('My profile notes.')
  text = bench_doc.RenderDoc(out, dict(cpu='X', nproc='2'), predicted=None)
  assert '| none | 2 | 400 | 1 (200), 2 (400), 3 (–) |' in text.splitlines()
  assert '- none L=3: OOM' in text
  assert 'Not measured yet: run `python -m benchmarks.paper_tables --sections=speedup`.' in text
  assert 'My profile notes.' in text and '- cpu: X' in text
  assert 'Placeholder: docs/timeline.png' in text
