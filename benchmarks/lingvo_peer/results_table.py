"""Prints the markdown table of the peer's runs written by run_all.sh.

  python3 -m benchmarks.lingvo_peer.results_table logs/lingvo_peer

Standard library only: it runs with any Python 3.
"""

import json
import pathlib
import sys
from typing import List, Optional, Tuple

HEADERS = ['run', 'K', 'M', 'step median s', 'step min s', 'vs baseline',
           'graph build s', 'graph nodes (main+fn)', 'peak RSS MB', 'BFC peak MB',
           'MatMul-type ops per device fwd/bwd', '|dloss|', '|dgradnorm|', 'max|dgrad|']


def LoadRuns(directory: pathlib.Path) -> List[Tuple[str, Optional[dict], str]]:
  """(name, JSON or None, error) per <name>.json; a run without JSON gets the
  last line of its log that names an error."""
  runs = []
  for path in sorted(directory.glob('*.json')):
    text = path.read_text().strip()
    if text:
      runs.append((path.stem, json.loads(text.splitlines()[-1]), ''))
      continue
    log_path = path.with_suffix('.log')
    lines = log_path.read_text().strip().splitlines() if log_path.exists() else []
    error = next((l for l in reversed(lines) if 'Error' in l),
                 lines[-1] if lines else 'no output')
    runs.append((path.stem, None, error))
  return runs


def _Order(run: Tuple[str, Optional[dict], str]) -> tuple:
  name, result, _ = run
  return (name.startswith('tr'), 'baseline' not in name,
          result['K'] if result else 99, result['M'] if result else 99)


def _Sci(value: Optional[float], spec: str = '.2e') -> str:
  return '' if value is None else format(value, spec)


def Row(name: str, r: dict, baseline_step: Optional[float]) -> List[str]:
  pipelined = r['mode'] != 'baseline'
  matmuls = ' '.join(f"{dev.replace('CPU:', 'c')}:{c.get('fwd', 0)}/{c.get('bwd', 0)}"
                     for dev, c in r['matmul_ops_per_device'].items()
                     if isinstance(c, dict))
  return [name, str(r['K']) if pipelined else '-', str(r['M']) if pipelined else '-',
          f"{r['step_s_median']:.3f}", f"{r['step_s_min']:.3f}",
          f"{r['step_s_median'] / baseline_step:.2f}x" if baseline_step else '',
          f"{r['graph_build_s']:.1f}",
          f"{r['graph_nodes']}+{r['library_function_nodes']}",
          f"{r['peak_rss_mb']:.0f}", _Sci(r.get('bfc_peak_mb'), '.0f'), matmuls,
          _Sci(r.get('max_abs_diff_loss')), _Sci(r.get('max_abs_diff_grad_norm')),
          _Sci(r.get('max_abs_diff_grad_elem'))]


def Table(runs: List[Tuple[str, Optional[dict], str]]) -> str:
  runs = sorted(runs, key=_Order)
  baselines = {r['workload']: r['step_s_median'] for _, r, _ in runs
               if r and r['mode'] == 'baseline'}
  lines = ['| ' + ' | '.join(HEADERS) + ' |', '|' + '---|' * len(HEADERS)]
  for name, r, error in runs:
    if r is None:
      cells = [name, '', '', 'FAILED: ' + error.replace('|', '/')[:160]]
      cells += [''] * (len(HEADERS) - len(cells))
    else:
      cells = Row(name, r, baselines.get(r['workload']))
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)


if __name__ == '__main__':
  print(Table(LoadRuns(pathlib.Path(sys.argv[1] if len(sys.argv) > 1
                                    else 'logs/lingvo_peer'))))
