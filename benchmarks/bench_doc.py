"""Renders docs/benchmarks.md from the raw JSON in docs/benchmarks/.

Reads speedup.json, memory.json, capacity.json, overhead.json, table2.json,
speedup_b256.json (written by paper_tables) and compare_lingvo.json (written
by compare_lingvo); a missing file becomes a 'not measured yet' note.
Hand-written text lives beside the JSON (profiles.md); docs/timeline.png and
the schedules' pictures in docs/benchmarks/ are shown when present, so
regenerating never loses them.
"""

import json
import pathlib
from typing import Dict, List, Optional, Tuple

from benchmarks import analysis

PAPER_CMD = 'python -m benchmarks.paper_tables'
COMPARE_CMD = 'python -m benchmarks.compare_lingvo'
# One step of each schedule (docs/benchmarks/timeline_*.png): file, schedule,
# what the picture shows.
SCHEDULE_PICTURES = (
    ('timeline_gpipe.png', 'Fill-drain (GPipe)',
     'every forward first, then the backwards in reverse order; each backward '
     'starts with its recomputation.'),
    ('timeline_one_f_one_b.png', '1F1B (PipeDream-flush)',
     'cell k runs K−k−1 forwards ahead, then one forward and one backward in '
     'turn, so it holds at most K−k micro-batches; the same bubble as fill-drain.'),
    ('timeline_interleaved.png', 'Interleaved, v=2',
     '8 cells on 4 devices (cell j on device j mod 4): smaller tasks and a bubble '
     'of (K−1)/(vM+K−1) in the unit-time table; measured, 0.78x of fill-drain\'s '
     'with these 4 devices sharing 2 cores, 0.29x at K=2 (a core per device).'),
)
SCHEDULE_PICTURES_CMD = (
    'python -m benchmarks.pipeline_bench --workload=ffn --k=4 --m=8 '
    '--intra_op_threads=1 --inter_op_threads=4 --remat_last_micro_batch '
    '--schedule=SCHEDULE --timeline_dir=DIR')


def Load(out_dir: pathlib.Path, name: str) -> Optional[dict]:
  """docs/benchmarks/<name>.json, or None if it does not exist."""
  path = pathlib.Path(out_dir) / f'{name}.json'
  return json.loads(path.read_text()) if path.exists() else None


def _Commands(lines: List[str]) -> str:
  body = '\n'.join(lines)
  return f'<details><summary>exact commands</summary>\n\n```\n{body}\n```\n</details>'


def _Details(data: Dict[str, dict]) -> str:
  """Failed runs (if any) and the exact commands of a section's data."""
  failures = analysis.Failures(data)
  text = _Commands([e['command'] for e in data.values()])
  if failures:
    text = 'Failed runs:\n\n' + '\n'.join(f'- {f}' for f in failures) + '\n\n' + text
  return text


def _Protocol(section: dict) -> str:
  return (f"Median over {section['repeats']} fresh-process runs per row, runs "
          f"alternating between the rows; {section['steps']} measured steps after "
          f"{section['warmup']} warm-up steps.")


def _Missing(cmd: str) -> str:
  return f'Not measured yet: run `{cmd}`.'


def SpeedupSection(section: Optional[dict]) -> str:
  if section is None:
    return _Missing(f'{PAPER_CMD} --sections=speedup')
  rows = analysis.SpeedupRows(section['data'])
  return '\n\n'.join([
      _Protocol(section) + ' Speedup = step time of K=1 (or of the unpipelined '
      'baseline) with the same M and thread setting / step time. '
      '`one_per_device`: --intra_op_threads=1 --inter_op_threads=K, so each '
      'device runs one op at a time and K cells can run on K cores at once.',
      analysis.RenderSpeedup(rows), analysis.RenderTargets(analysis.SpeedupTargets(rows)),
      'ffn\'s batch is 64, so at M=16 a micro-batch has 4 rows: each product '
      'streams a 4 MiB weight for 4 rows of output, bound by memory bandwidth and '
      'per-op overhead rather than arithmetic, and two devices streaming at once '
      'slow each other down (Parallel speedup under Profiles). The row stays as '
      'measured; the K=2 target is held at 16-row micro-batches in "K=2 speedup '
      'at 16-row micro-batches" below.',
      _Details(section['data'])])


def Table2Section(section: Optional[dict], cores: Optional[int]) -> str:
  """The paper's Table 2 shape: first step, step time and throughput vs K=2."""
  if section is None:
    return _Missing(f'{PAPER_CMD} --sections=table2')
  rows = analysis.Table2Rows(section['data'], cores)
  m = rows[0]['m'] if rows else None
  bound = ('' if cores != 2 or m is None else
           ' This machine has 2 cores, so K=2 already gives each core a device: '
           'larger K adds no cores, only more and smaller cells, more calls and '
           'more transfers between devices, and the paper\'s near-linear growth '
           '(the ideal column) needs a device per cell. If K=2 kept both cores busy '
           "outside its bubble, larger K could win at most that bubble, (M+1)/M = "
           f'{(m + 1) / m:.2f}x at M={m} (the bound column). A ratio above it means '
           'K=2 leaves cores idle at other times too; note that the inter-op pool '
           'grows with K (K=8 runs 8 threads on the 2 cores), so independent ops of '
           'one cell can also overlap at larger K.')
  return '\n\n'.join([
      _Protocol(section) + ' Transformer, 16 layers, batch 32 (one 64-token '
      'sequence per micro-batch at M=32), per-cell remat, one thread per device '
      '(--intra_op_threads=1 --inter_op_threads=K). Build + first step: from '
      'building the model to the end of the first step (tracing included). '
      'Throughput vs K=2 = step time at K=2 / step time (the same batch). '
      'Ideal: GPipe\'s K·M/(M+K−1) relative to K=2, what K accelerators '
      'would give. Bound: the same with only as many devices busy at once as '
      'the machine has cores (analysis.CoreBoundSpeedup).' + bound,
      analysis.RenderTable2(rows, cores), _Details(section['data'])])


def SpeedupB256Section(section: Optional[dict]) -> str:
  """The K=2 targets at 16-row micro-batches: speedup and measured bubble."""
  if section is None:
    return _Missing(f'{PAPER_CMD} --sections=speedup_b256')
  rows = analysis.BubbleSpeedupRows(section['data'])
  return '\n\n'.join([
      _Protocol(section) + ' ffn at batch 256: 16-row micro-batches at M=16, '
      'per-cell remat, one thread per device. Speedup = step time of K=1 / step '
      'time. The K=2 runs profile one more step after the measured ones '
      '(pipeline_bench --timeline_dir); measured bubble = 1 − busy / (K × span) '
      'of that step\'s timeline, median over the runs, against the schedule\'s '
      '(K−1)/(M+K−1).',
      analysis.RenderBubbleSpeedup(rows),
      analysis.RenderTargets(analysis.BubbleSpeedupTargets(rows)),
      _Details(section['data'])])


def MemorySection(section: Optional[dict],
                  predicted: Optional[Dict[str, Optional[Tuple[float, float]]]]) -> str:
  if section is None:
    return _Missing(f'{PAPER_CMD} --sections=memory')
  rows = analysis.MemoryRows(section['data'], predicted)
  note = ('`predicted MB` is lingvo_pipe.planning.planner.Estimate (SGD, no optimizer '
          'slots) for one allocator shared by all devices: from `shared_peak_bytes` '
          '(the cells\' activation peaks apart) to `total_peak_bytes` (all at once).')
  return '\n\n'.join([
      _Protocol(section) + ' BFC peak = allocator peak of one training step '
      '(TF_CPU_ALLOCATOR_USE_BFC=true, reset after warm-up). ' + note,
      analysis.RenderMemory(rows), analysis.RenderTargets(analysis.MemoryTargets(rows)),
      _Details(section['data'])])


def CapacitySection(section: Optional[dict]) -> str:
  if section is None:
    return _Missing(f'{PAPER_CMD} --sections=capacity')
  capacity = section['data']
  probes = [(policy, p) for policy, e in capacity['policies'].items() for p in e['probes']]
  failed = [f"- {policy} L={p['num_layers']}: {p['error']}" for policy, p in probes
            if 'error' in p]
  return '\n\n'.join([
      f"{capacity['workload']}, K={capacity['k']}, M={capacity['m']}: bisection over "
      'the number of layers; one run (one measured step) per probe.',
      analysis.RenderCapacity(capacity),
      *(['Failed runs:\n\n' + '\n'.join(failed)] if failed else []),
      _Commands([p['command'] for _, p in probes])])


def OverheadSection(section: Optional[dict]) -> str:
  if section is None:
    return _Missing(f'{PAPER_CMD} --sections=overhead')
  table, targets = analysis.OverheadTargets(section['data'])
  return '\n\n'.join([_Protocol(section), table, analysis.RenderTargets(targets),
                      _Details(section['data'])])


def CompareSection(result: Optional[dict]) -> str:
  if result is None:
    return _Missing(COMPARE_CMD)
  return '\n\n'.join([analysis.RenderComparisonSection(result),
                      _Details({f'ours {n}': e for n, e in result['ours'].items()}),
                      _Details({f'peer {n}': e for n, e in result['peer'].items()})])


def TimelineSection(out_dir: pathlib.Path) -> str:
  """docs/timeline.png, one picture per schedule, and where the schedules'
  measured figures are."""
  docs = out_dir.parent
  parts = [('![pipeline timeline](timeline.png)\n\nFill-drain, ffn K=4 M=4, '
            'default threads: read under The timeline in Profiles below.')
           if (docs / 'timeline.png').exists() else
           '_Placeholder: docs/timeline.png (a traced step, one row per device) '
           'is added separately._']
  parts.append('One step of each schedule: ffn K=4 M=8, one thread per device, '
               'every micro-batch recomputed, on the shared 2-core machine; each '
               'title gives the measured bubble and the schedule\'s. W: a device\'s '
               'step gradients after its last backward (the deferred weight-gradient '
               'products), work the bubble counts as busy. Made with '
               f'`{SCHEDULE_PICTURES_CMD}` (SCHEDULE: gpipe, one_f_one_b, or '
               'interleaved with --cells_per_device=2), which writes '
               '`DIR/timeline.png`.')
  for file, schedule, what in SCHEDULE_PICTURES:
    if (out_dir / file).exists():
      parts.append(f'**{schedule}**: {what}\n\n'
                   f'![{schedule} timeline]({out_dir.name}/{file})')
    else:
      parts.append(f'**{schedule}**: _not drawn yet: docs/benchmarks/{file}._')
  parts.append(
      f'The schedules\' measured figures are in [docs/benchmarks/schedules.md]'
      f'({out_dir.name}/schedules.md): 1F1B against fill-drain (allocator peak '
      'and step time, transformer-act K=4 M=8), interleaved against fill-drain '
      '(the measured bubble, ffn K=4 M=8) and the loop against the unrolled '
      'step (first step and step time); the zero-bubble schedules against 1F1B '
      'are in [docs/benchmarks/zero_bubble.md](benchmarks/zero_bubble.md); '
      '[docs/schedules.md](schedules.md) describes the schedules.')
  return '\n\n'.join(parts)


def DataParallelSection(data: Optional[dict]) -> str:
  """The headline figures of docs/benchmarks/data_parallel.json (R
  replicas on loopback workers, all-reduce against the parameter-server
  layout it replaced); docs/several_machines.md has the tables."""
  if data is None:
    return _Missing('python -m benchmarks.cluster_bench --configs=... '
                    '(docs/several_machines.md, "Data-parallel replicas")')
  s = data['summary']
  bytes_ratio = s['busiest_worker_bytes_ratio_allreduce_over_ps']
  speed = s['examples_per_s_medians']

  def Pairs(key: str) -> str:
    return ', '.join(f'{r:.2f}' for r in s[key])

  return '\n'.join([
      'Raw runs: [docs/benchmarks/data_parallel.json](benchmarks/data_parallel.json); '
      'protocol and profile: [docs/several_machines.md](several_machines.md), '
      '"Data-parallel replicas". ffn workload (134 MB of weights) on loopback '
      'worker processes.',
      '',
      '| figure | target | measured |',
      '|---|---|---|',
      f'| busiest worker bytes/step, R=4 x K=1, all-reduce / parameter server '
      f'| <= 0.5x | {bytes_ratio["R4K1"]:.2f}x |',
      f'| the same, R=2 x K=2 | <= 0.5x | {bytes_ratio["R2K2"]:.2f}x (an fp32 '
      'all-reduce cannot go below 1x at R=2) |',
      f'| examples/s R=2 x K=1 / R=1, batch 256, one core per worker '
      f'| >= 1.6x | {speed["workers_R2xK1_B256"] / speed["workers_R1xK1_B256"]:.2f}x '
      f'(pairs {Pairs("R2xK1_over_R1xK1_B256_pairs")}) |',
      f'| the same at batch 2048 | | '
      f'{speed["workers_R2xK1_B2048"] / speed["workers_R1xK1_B2048"]:.2f}x '
      f'(pairs {Pairs("R2xK1_over_R1xK1_B2048_pairs")}) |',
      f'| examples/s R=2 x K=2 on 4 workers / R=1 x K=2 on 2 (2 cores) | report '
      f'| {speed["workers_R2xK2_B256"] / speed["workers_R1xK2_B256"]:.2f}x |',
      f'| share of the step in all-reduce that no computation overlaps, R=2 x '
      f'K=2, one process | report | '
      f'{", ".join(f"{x:.1%}" for x in s["unoverlapped_all_reduce_share_R2xK2_local"])} |',
  ])


def _Cores(machine: Dict[str, str]) -> Optional[int]:
  nproc = machine.get('nproc', '')
  return int(nproc) if nproc.isdigit() else None


def RenderDoc(out_dir: pathlib.Path, machine: Dict[str, str],
              predicted: Optional[Dict[str, Optional[Tuple[float, float]]]]) -> str:
  """The whole of docs/benchmarks.md."""
  out_dir = pathlib.Path(out_dir)
  profiles_path = out_dir / 'profiles.md'
  profiles = (profiles_path.read_text().strip() if profiles_path.exists() else
              '_Placeholder: explanations of the profiles go in '
              'docs/benchmarks/profiles.md, which is included here._')
  machine_lines = '\n'.join(f'- {k}: {v}' for k, v in machine.items())
  parts = [
      '# Benchmarks',
      'Generated by `make bench-docs` (`python -m benchmarks.paper_tables`) from the '
      'raw JSON in `docs/benchmarks/`; do not edit by hand. Workloads are those of '
      '[docs/workloads.md](workloads.md): fp32, loss = mean of squared outputs, plain SGD, '
      'K logical CPU devices in one process.',
      '## Machine', machine_lines,
      '## Reproduce',
      '```\nmake bench-compare   # ' + COMPARE_CMD + ', then re-render\n'
      'make bench-docs      # ' + PAPER_CMD + '\n'
      'make bench-render    # ' + PAPER_CMD + ' --sections=  (re-render only)\n'
      '# quick try: make bench-docs BENCH_FLAGS="--repeats=1 --steps=2 --sections=overhead"\n```',
      '## Speedup vs K and M (GPipe Table 2 style)',
      SpeedupSection(Load(out_dir, 'speedup')),
      "## The paper's Table 2 shape: transformer, K in {2, 4, 8} at M=32",
      Table2Section(Load(out_dir, 'table2'), _Cores(machine)),
      '## K=2 speedup at 16-row micro-batches (ffn batch 256)',
      SpeedupB256Section(Load(out_dir, 'speedup_b256')),
      '## Memory vs K, M and rematerialization (GPipe Table 1 style)',
      MemorySection(Load(out_dir, 'memory'), predicted),
      '## Largest stack within a memory budget',
      CapacitySection(Load(out_dir, 'capacity')),
      '## Wrapper overhead',
      OverheadSection(Load(out_dir, 'overhead')),
      "## Comparison with Lingvo's GPipe",
      CompareSection(Load(out_dir, 'compare_lingvo')),
      '## Data-parallel replicas (several machines)',
      DataParallelSection(Load(out_dir, 'data_parallel')),
      '## Timeline', TimelineSection(out_dir),
      '## Profiles', profiles,
  ]
  return '\n\n'.join(parts) + '\n'
