"""Renders docs/benchmarks.md from the raw JSON in docs/benchmarks/.

Reads speedup.json, memory.json, capacity.json, overhead.json (written by
paper_tables) and compare_lingvo.json (written by compare_lingvo); a missing
file becomes a 'not measured yet' note. Hand-written text lives beside the
JSON (profiles.md) and docs/timeline.png is linked when present, so
regenerating never loses them.
"""

import json
import pathlib
from typing import Dict, List, Optional, Tuple

from benchmarks import analysis

PAPER_CMD = 'python -m benchmarks.paper_tables'
COMPARE_CMD = 'python -m benchmarks.compare_lingvo'


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
      _Details(section['data'])])


def MemorySection(section: Optional[dict],
                  predicted: Optional[Dict[str, Optional[Tuple[float, float]]]]) -> str:
  if section is None:
    return _Missing(f'{PAPER_CMD} --sections=memory')
  rows = analysis.MemoryRows(section['data'], predicted)
  note = ('`predicted MB` is lingvo_pipe.pipeline.planner.Estimate (SGD, no optimizer '
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


def RenderDoc(out_dir: pathlib.Path, machine: Dict[str, str],
              predicted: Optional[Dict[str, Optional[Tuple[float, float]]]]) -> str:
  """The whole of docs/benchmarks.md."""
  out_dir = pathlib.Path(out_dir)
  docs = out_dir.parent
  timeline = ('![pipeline timeline](timeline.png)' if (docs / 'timeline.png').exists()
              else '_Placeholder: docs/timeline.png (a traced step, one row per '
                   'device) is added separately._')
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
      '## Memory vs K, M and rematerialization (GPipe Table 1 style)',
      MemorySection(Load(out_dir, 'memory'), predicted),
      '## Largest stack within a memory budget',
      CapacitySection(Load(out_dir, 'capacity')),
      '## Wrapper overhead',
      OverheadSection(Load(out_dir, 'overhead')),
      "## Comparison with Lingvo's GPipe",
      CompareSection(Load(out_dir, 'compare_lingvo')),
      '## Timeline', timeline,
      '## Profiles', profiles,
  ]
  return '\n\n'.join(parts) + '\n'
