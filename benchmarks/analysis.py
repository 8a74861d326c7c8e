"""Pure analysis of benchmark runs: medians, ratios, targets, markdown tables.

No TensorFlow and no processes here: every function takes the JSON objects
that the benchmark programs printed (or canned ones, in tests).

A section's data is {config name: {'config': {...}, 'command': str,
'runs': [JSON per run]}}; 'config' holds workload, k, m, remat, threads and
baseline, so nothing is parsed out of names.
"""

import dataclasses
import re
import statistics
from typing import Callable, Dict, List, Optional, Tuple

from benchmarks.runner import Fmt, MarkdownTable, Median, Ratio

MB = 2**20
ONE_PER_DEVICE = 'one_per_device'
_MEASURED_BUBBLE = re.compile(r'bubble: measured ([0-9.]+)')
_CELL_CALLS_BUBBLE = re.compile(r'cell calls alone ([0-9.]+)')


@dataclasses.dataclass(frozen=True)
class Target:
  """A goal such as 'step time ours/peer <= 0.35' and whether it is met."""
  name: str
  value: Optional[float]
  limit: float
  at_least: bool = False  # True: value >= limit passes; False: value <= limit

  @property
  def passed(self) -> Optional[bool]:
    if self.value is None:
      return None
    return self.value >= self.limit if self.at_least else self.value <= self.limit

  def Row(self) -> List[str]:
    verdict = {True: 'PASS', False: 'FAIL', None: 'no data'}[self.passed]
    op = '>=' if self.at_least else '<='
    return [self.name, Fmt(self.value, '.3f'), f'{op} {self.limit:g}', verdict]


def RenderTargets(targets: List[Target]) -> str:
  return MarkdownTable(['target', 'measured', 'goal', 'result'],
                       [t.Row() for t in targets])


def _Mb(num_bytes: Optional[float]) -> Optional[float]:
  return None if num_bytes is None else num_bytes / MB


def Failures(section: Dict[str, dict]) -> List[str]:
  """'name: error' for every failed run of a section."""
  return [f"{name}: {run['error']}" for name, entry in section.items()
          for run in entry['runs'] if 'error' in run]


def Medians(section: Dict[str, dict], key: str) -> Dict[str, Optional[float]]:
  return {name: Median(entry['runs'], key) for name, entry in section.items()}


# --- ours vs the Lingvo peer ----------------------------------------------

def PeerFirstStep(run: dict) -> Optional[float]:
  """The peer's time to first step: graph build plus the first sess.run."""
  if 'error' in run or run.get('first_step_s') is None:
    return None
  return run.get('graph_build_s', 0.0) + run['first_step_s']


def CompareRows(ours: Dict[str, dict], peer: Dict[str, dict]) -> List[dict]:
  """One row per config present in both: medians and ratios ours/peer."""
  rows = []
  for name in ours:
    if name not in peer:
      continue
    o_runs, p_runs = ours[name]['runs'], peer[name]['runs']
    peer_first = [{'first': PeerFirstStep(r)} for r in p_runs]
    row = dict(name=name, config=ours[name]['config'],
               ours_step=Median(o_runs, 'step_s_median'),
               peer_step=Median(p_runs, 'step_s_median'),
               ours_first=Median(o_runs, 'first_step_s'),
               peer_first=Median(peer_first, 'first'),
               ours_step_peak_mb=_Mb(Median(o_runs, 'bfc_peak_bytes')),
               ours_peak_mb=_Mb(Median(o_runs, 'bfc_process_peak_bytes')),
               peer_peak_mb=Median(p_runs, 'bfc_peak_mb'))
    if row['ours_peak_mb'] is None:  # JSON from before bfc_process_peak_bytes
      row['ours_peak_mb'] = row['ours_step_peak_mb']
    for what in ('step', 'first', 'peak_mb'):
      row[f'{what}_ratio'] = Ratio(row[f'ours_{what}'], row[f'peer_{what}'])
    rows.append(row)
  return rows


def CompareTargets(rows: List[dict]) -> List[Target]:
  """The issue's goals for the comparison with Lingvo."""
  by_name = {r['name']: r for r in rows}
  targets = []
  for r in rows:
    if r['config'].get('baseline'):
      continue
    targets.append(Target(f"{r['name']}: step time ours/peer", r['step_ratio'], 0.35))
    targets.append(Target(f"{r['name']}: first step ours/peer", r['first_ratio'], 1.0))
  m4, m16 = by_name.get('ffn_K4_M4'), by_name.get('ffn_K4_M16')
  if m4 and m16:
    targets.append(Target('ours: first step ffn K=4 M=16 / M=4',
                          Ratio(m16['ours_first'], m4['ours_first']), 1.5))
  if m16:
    targets.append(Target('ffn K=4 M=16: allocator peak ours/peer',
                          m16['peak_mb_ratio'], 0.5))
  return targets


def RenderComparison(rows: List[dict]) -> str:
  headers = ['config', 'step s ours', 'step s peer', 'ours/peer',
             'first step s ours', 'first step s peer', 'ours/peer',
             'BFC step peak MB ours', 'BFC process peak MB ours',
             'BFC process peak MB peer', 'ours/peer']
  body = [[r['name'], Fmt(r['ours_step']), Fmt(r['peer_step']),
           Fmt(r['step_ratio'], '.2f', 'x'), Fmt(r['ours_first'], '.1f'),
           Fmt(r['peer_first'], '.1f'), Fmt(r['first_ratio'], '.2f', 'x'),
           Fmt(r['ours_step_peak_mb'], '.0f'), Fmt(r['ours_peak_mb'], '.0f'),
           Fmt(r['peer_peak_mb'], '.0f'),
           Fmt(r['peak_mb_ratio'], '.2f', 'x')] for r in rows]
  return MarkdownTable(headers, body)


def RenderComparisonSection(result: dict) -> str:
  """Note, table and targets of a compare_lingvo result."""
  rows = CompareRows(result['ours'], result['peer'])
  return '\n\n'.join([
      f"Medians over {result['repeats']} alternating fresh-process runs per side "
      f"({result['steps']} steps after {result['warmup']} warm-up). Our first step "
      'is build + trace + first step; the peer\'s is graph_build_s + first_step_s. '
      'Allocator (BFC) peaks: our step peak is measured after warm-up; process '
      'peaks (ours and the peer\'s) include graph build and the first steps; '
      'the peak ratio compares process peaks.',
      RenderComparison(rows), RenderTargets(CompareTargets(rows))])


# --- paper tables ------------------------------------------------------------

def _Find(section: Dict[str, dict], **want) -> Optional[str]:
  for name, entry in section.items():
    if all(entry['config'].get(k) == v for k, v in want.items()):
      return name
  return None


def IdealSpeedup(k: int, m: int) -> float:
  """GPipe's bubble-limited speedup K*M/(M+K-1)."""
  return k * m / (m + k - 1)


def SpeedupRows(section: Dict[str, dict]) -> List[dict]:
  """Step time per (workload, threads, K, M), normalized to K=1 at the same
  M and to the unpipelined baseline with the same thread setting."""
  steps = Medians(section, 'step_s_median')
  rows = []
  for name, entry in section.items():
    c = entry['config']
    if c.get('baseline'):
      continue
    k1 = _Find(section, workload=c['workload'], threads=c['threads'], k=1,
               m=c['m'], baseline=False)
    base = _Find(section, workload=c['workload'], threads=c['threads'], baseline=True)
    rows.append(dict(
        name=name, workload=c['workload'], threads=c['threads'], k=c['k'],
        m=c['m'], step=steps[name],
        speedup_vs_k1=Ratio(steps.get(k1), steps[name]),
        speedup_vs_baseline=Ratio(steps.get(base), steps[name]),
        ideal=IdealSpeedup(c['k'], c['m'])))
  return sorted(rows, key=lambda r: (r['workload'], r['threads'], r['m'], r['k']))


def SpeedupTargets(rows: List[dict]) -> List[Target]:
  hit = [r['speedup_vs_k1'] for r in rows if r['threads'] == ONE_PER_DEVICE
         and r['k'] == 2 and r['m'] == 16 and r['workload'] == 'ffn']
  return [Target('ffn B=64 K=2 M=16 (4-row micro-batches), one thread per device: '
                 'speedup vs K=1', hit[0] if hit else None, 1.7, at_least=True)]


def RenderSpeedup(rows: List[dict]) -> str:
  headers = ['workload', 'threads', 'K', 'M', 'step s', 'speedup vs K=1',
             'speedup vs baseline', 'ideal K·M/(M+K−1)']
  return MarkdownTable(headers, [
      [r['workload'], r['threads'], r['k'], r['m'], Fmt(r['step']),
       Fmt(r['speedup_vs_k1'], '.2f', 'x'), Fmt(r['speedup_vs_baseline'], '.2f', 'x'),
       f"{r['ideal']:.2f}x"] for r in rows])


def FillDrainBubble(k: int, m: int) -> float:
  """The idle share of each device in GPipe's schedule: (K-1)/(M+K-1)."""
  return (k - 1) / (m + k - 1)


def MeasuredBubbles(runs: List[dict], cell_calls_alone: bool = False) -> List[float]:
  """The measured bubble of every run that profiled a step (pipeline_bench
  --timeline_dir puts the timeline's summary line under 'timeline'): of
  the whole step, or of its cell calls alone (bubble.Summary)."""
  pattern = _CELL_CALLS_BUBBLE if cell_calls_alone else _MEASURED_BUBBLE
  found = [pattern.search(r.get('timeline', '')) for r in runs if 'error' not in r]
  return [float(m.group(1)) for m in found if m]


def BubbleSpeedupRows(section: Dict[str, dict]) -> List[dict]:
  """SpeedupRows plus the rows per micro-batch and, for profiled rows, the
  median measured bubble against (K-1)/(M+K-1)."""
  rows = SpeedupRows(section)
  for row in rows:
    entry = section[row['name']]
    batch = Median(entry['runs'], 'batch') or entry['config'].get('batch')
    bubbles = MeasuredBubbles(entry['runs'])
    cell_bubbles = MeasuredBubbles(entry['runs'], cell_calls_alone=True)
    row['batch'] = None if batch is None else int(batch)
    row['micro_rows'] = None if batch is None else int(batch) // row['m']
    row['bubble'] = statistics.median(bubbles) if bubbles else None
    row['cell_bubble'] = statistics.median(cell_bubbles) if cell_bubbles else None
    row['bubble_schedule'] = FillDrainBubble(row['k'], row['m'])
    row['bubble_ratio'] = Ratio(row['bubble'], row['bubble_schedule'])
    row['cell_bubble_ratio'] = Ratio(row['cell_bubble'], row['bubble_schedule'])
  return rows


def BubbleSpeedupTargets(rows: List[dict], k: int = 2, m: int = 16) -> List[Target]:
  """The K=2 targets at micro-batches that are not bandwidth-bound: speedup
  at least 1.7x of K=1, measured bubble at most 1.1x of (K-1)/(M+K-1)."""
  hit = [r for r in rows if (r['k'], r['m'], r['threads']) == (k, m, ONE_PER_DEVICE)]
  row = hit[0] if hit else {}
  what = f"{row.get('workload', 'ffn')} B={row.get('batch')} K={k} M={m}"
  return [Target(f'{what}, one thread per device: speedup vs K=1',
                 row.get('speedup_vs_k1'), 1.7, at_least=True),
          Target(f'{what}: measured bubble / (K-1)/(M+K-1)', row.get('bubble_ratio'), 1.1)]


def RenderBubbleSpeedup(rows: List[dict]) -> str:
  headers = ['workload', 'batch', 'rows per micro-batch', 'K', 'M', 'step s',
             'speedup vs K=1', 'ideal K·M/(M+K−1)', 'measured bubble',
             '(K−1)/(M+K−1)', 'measured / schedule', 'cell calls alone',
             'cell calls / schedule']
  return MarkdownTable(headers, [
      [r['workload'], Fmt(r['batch'], 'd'), Fmt(r['micro_rows'], 'd'), r['k'], r['m'],
       Fmt(r['step']), Fmt(r['speedup_vs_k1'], '.2f', 'x'), f"{r['ideal']:.2f}x",
       Fmt(r['bubble']), f"{r['bubble_schedule']:.3f}", Fmt(r['bubble_ratio'], '.2f', 'x'),
       Fmt(r.get('cell_bubble')), Fmt(r.get('cell_bubble_ratio'), '.2f', 'x')]
      for r in rows])


def CoreBoundSpeedup(k: int, m: int, cores: int) -> float:
  """Upper bound of the speedup over one device when K one-thread devices
  share `cores` cores: GPipe's K·M/(M+K-1) while every device has a core of
  its own; with more devices than cores, all cores busy (other devices' work
  can fill a device's bubble)."""
  return IdealSpeedup(k, m) if k <= cores else float(cores)


def Table2Rows(section: Dict[str, dict], cores: Optional[int]) -> List[dict]:
  """Time to first step and step time per K at one M, with the throughput
  relative to K=2 (step time of K=2 / step time: the batch is the same),
  GPipe's ideal relative to K=2 and, given the machine's cores, the bound
  relative to K=2 on them."""
  steps = Medians(section, 'step_s_median')
  firsts = Medians(section, 'first_step_s')
  rows = []
  for name, entry in section.items():
    c = entry['config']
    ref = _Find(section, workload=c['workload'], threads=c['threads'], k=2, m=c['m'])
    rows.append(dict(
        name=name, workload=c['workload'], k=c['k'], m=c['m'], first=firsts[name],
        step=steps[name], throughput_vs_k2=Ratio(steps.get(ref), steps[name]),
        ideal_vs_k2=IdealSpeedup(c['k'], c['m']) / IdealSpeedup(2, c['m']),
        bound_vs_k2=None if not cores else (CoreBoundSpeedup(c['k'], c['m'], cores) /
                                            CoreBoundSpeedup(2, c['m'], cores))))
  return sorted(rows, key=lambda r: (r['workload'], r['m'], r['k']))


def RenderTable2(rows: List[dict], cores: Optional[int]) -> str:
  headers = ['K', 'M', 'build + first step s', 'step s', 'throughput vs K=2',
             'ideal vs K=2 (K devices)', f'bound vs K=2 ({cores or "?"} cores)']
  return MarkdownTable(headers, [
      [r['k'], r['m'], Fmt(r['first'], '.1f'), Fmt(r['step']),
       Fmt(r['throughput_vs_k2'], '.2f', 'x'), f"{r['ideal_vs_k2']:.2f}x",
       Fmt(r['bound_vs_k2'], '.2f', 'x')] for r in rows])


def MemoryRows(section: Dict[str, dict],
               predicted: Optional[Dict[str, Optional[Tuple[float, float]]]] = None
               ) -> List[dict]:
  """Peak and step time per (K, M, remat), relative to K=1 M=1 remat none.

  Args:
    section: the memory section's data.
    predicted: optional config name -> the planner's (lowest, highest)
      predicted peak bytes of one shared allocator.
  """
  peaks = Medians(section, 'bfc_peak_bytes')
  steps = Medians(section, 'step_s_median')
  ref = _Find(section, k=1, m=1, remat='none')
  rows = []
  for name, entry in section.items():
    c = entry['config']
    pred = (predicted or {}).get(name)
    rows.append(dict(
        name=name, k=c['k'], m=c['m'], remat=c['remat'],
        peak_mb=_Mb(peaks[name]),
        predicted_mb=None if pred is None else tuple(_Mb(b) for b in pred),
        peak_vs_ref=Ratio(peaks[name], peaks.get(ref)),
        step=steps[name], step_vs_ref=Ratio(steps[name], steps.get(ref))))
  return sorted(rows, key=lambda r: (r['k'], r['m'], r['remat']))


def MemoryTargets(rows: List[dict]) -> List[Target]:
  hit = [r for r in rows if (r['k'], r['m'], r['remat']) == (1, 8, 'per_cell')]
  row = hit[0] if hit else {}
  return [Target('K=1 M=8 per_cell: peak / (M=1 none)', row.get('peak_vs_ref'), 0.35),
          Target('K=1 M=8 per_cell: step time / (M=1 none)', row.get('step_vs_ref'), 1.35)]


def RenderMemory(rows: List[dict]) -> str:
  headers = ['K', 'M', 'remat', 'BFC peak MB', 'predicted MB (low–high)',
             'peak vs K=1 M=1 none', 'step s', 'step vs K=1 M=1 none']
  return MarkdownTable(headers, [
      [r['k'], r['m'], r['remat'], Fmt(r['peak_mb'], '.0f'), _Range(r['predicted_mb']),
       Fmt(r['peak_vs_ref'], '.2f', 'x'), Fmt(r['step']), Fmt(r['step_vs_ref'], '.2f', 'x')]
      for r in rows])


def _Range(bounds: Optional[Tuple[float, float]]) -> str:
  return '–' if bounds is None else f'{bounds[0]:.0f}–{bounds[1]:.0f}'


def LargestFitting(lo: int, hi: int, fits: Callable[[int], bool]
                   ) -> Tuple[Optional[int], List[int]]:
  """Largest n in [lo, hi] with fits(n), assuming fits is monotone
  (true up to some n, false above). Returns (n or None, the n probed).

  Raises:
    ValueError: if the range is empty.
  """
  if not 1 <= lo <= hi:
    raise ValueError(f'need 1 <= lo ({lo}) <= hi ({hi}).')
  probed = []

  def Probe(n: int) -> bool:
    probed.append(n)
    return fits(n)

  if not Probe(lo):
    return None, probed
  good, bad = lo, hi + 1
  while bad - good > 1:
    mid = (good + bad) // 2
    if Probe(mid):
      good = mid
    else:
      bad = mid
  return good, probed


def RenderCapacity(capacity: dict) -> str:
  headers = ['remat', f"largest L within {capacity['budget_mb']} MB",
             'BFC peak MB at that L', 'layers probed (peak MB)']
  rows = []
  for policy, entry in capacity['policies'].items():
    peak_mb = {p['num_layers']: _Mb(p.get('bfc_peak_bytes')) for p in entry['probes']}
    probes = ', '.join(f'{n} ({Fmt(mb, ".0f")})' for n, mb in peak_mb.items())
    largest = entry['largest']
    if largest and largest == capacity.get('max_layers'):
      largest = f'>= {largest} (search limit)'
    rows.append([policy, largest or 'none',
                 Fmt(peak_mb.get(entry['largest']), '.0f'), probes])
  return MarkdownTable(headers, rows)


def OverheadTargets(section: Dict[str, dict]) -> Tuple[str, List[Target]]:
  """Wrapper overhead: PipeliningLayer K=1 M=1 remat none vs the baseline."""
  steps = Medians(section, 'step_s_median')
  wrapped = _Find(section, baseline=False)
  base = _Find(section, baseline=True)
  ratio = Ratio(steps.get(wrapped), steps.get(base))
  table = MarkdownTable(['config', 'step s'], [
      [name, Fmt(steps[name])] for name in section])
  return table, [Target('ffn K=1 M=1 none / baseline step time', ratio, 1.05)]
