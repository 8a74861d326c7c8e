"""Measures the schedules side by side and writes docs/benchmarks/schedules.md.

Sections (fresh-process pipeline_bench runs, repeats alternating between
the configurations of a section, so a slow phase of a shared machine hits
all of them alike):
  memory  1F1B against fill-drain: allocator peak and step time,
          transformer-act K=4 M=8, without remat and with per-cell remat
  bubble  interleaved (v=2) against fill-drain: the bubble measured on the
          profiled timeline, ffn K in {4, 2} M=8, one thread per device,
          every micro-batch recomputed
  loop    the loop against the unrolled fill-drain step: time to the
          first step and step time, ffn K=4 at M in {4, 16, 64} and a
          16-layer transformer (batch 32) K=8 at M in {8, 32}
  loop_1f1b  the same for 1F1B, ffn K=4 at M in {4, 16, 64}
  loop_zb the same for ZB-H1 and ZB-V (v=2), ffn K=4 at M in {4, 16, 64}
  loop_k2 the same for every schedule at ffn B256 K=2, one intra-op thread
          per device (each device a core), M in {4, 16, 64}
  loop_default  the same at M in {32, 64, 128} with 4-row micro-batches:
          per schedule the M from which the loop step stays within 5% of
          the unrolled one (PipeliningLayer's loop default, plan.py)
  simulated  the simulator's bubble against the timeline's: every
          schedule at ffn B256 K=2 M=8, one intra-op thread per device,
          remat none and per cell, costs measured on the same timeline
          (profiling/bubble.PredictedBubble)

Raw JSON goes to docs/benchmarks/schedules.json; the page is rendered from
it, so --sections= only re-renders.

  python -m benchmarks.schedule_bench --repeats=3
  python -m benchmarks.schedule_bench --sections=   # re-render only
"""

import json
import pathlib
import re
import statistics
import sys
import tempfile
from typing import Dict, List, Optional, Sequence

from absl import app
from absl import flags

from benchmarks import analysis
from benchmarks import runner
from benchmarks import schedule_flags

SECTIONS = ('memory', 'bubble', 'loop', 'loop_1f1b', 'loop_zb', 'loop_k2', 'loop_default',
            'simulated')

FLAGS = flags.FLAGS


def _DefineFlags() -> None:
  """The program's flags, defined when it runs (other benchmark programs
  define flags of the same names; tests import several of them)."""
  flags.DEFINE_list('sections', list(SECTIONS), f'Which of {SECTIONS} to measure.')
  flags.DEFINE_integer('repeats', 3, 'Fresh-process runs per configuration.')
  flags.DEFINE_float('timeout_s', 1800, 'Per-run timeout.')
  flags.DEFINE_list('bench_args', [], 'Extra pipeline_bench flags for every run.')
  flags.DEFINE_string('out_dir', str(runner.REPO_ROOT / 'docs' / 'benchmarks'),
                      'Where schedules.json and schedules.md go.')


def _Log(text: str) -> None:
  print(text, file=sys.stderr, flush=True)


def MemoryEntries() -> Dict[str, List[str]]:
  return {f'{schedule}_{remat}': ['--workload=transformer-act', '--k=4', '--m=8',
                                  f'--schedule={schedule}', f'--remat={remat}']
          for remat in ('none', 'per_cell') for schedule in ('gpipe', 'one_f_one_b')}


BUBBLE_KS = (4, 2)


def BubbleEntries(timeline_root: str) -> Dict[str, List[str]]:
  """Fill-drain and interleaved v=2 at M=8, one thread per device, for K=4
  (the issue's configuration: 4 devices on this machine's 2 cores) and K=2
  (one device per core)."""
  # --remat_last_micro_batch: every cell task a function call, which the
  # timeline parser finds per device (kept, inlined micro-batches of
  # several cells on one device are one span to it).
  entries = {}
  for k in BUBBLE_KS:
    common = ['--workload=ffn', f'--k={k}', '--m=8', '--intra_op_threads=1',
              f'--inter_op_threads={k}', '--remat_last_micro_batch']
    for schedule, args in (('gpipe', ['--schedule=gpipe']),
                           ('interleaved_v2', ['--schedule=interleaved',
                                               '--cells_per_device=2'])):
      name = f'K{k}_{schedule}'
      entries[name] = common + args + [f'--timeline_dir={timeline_root}/{name}']
  return entries


def SimulatedEntries(timeline_root: str) -> Dict[str, List[str]]:
  """Every schedule, remat none and per cell, profiled at K=2 M=8 with
  one intra-op thread per device; four inter-op threads, so that a
  device's accumulator updates never hold back the other device's next
  call (with two, they did: idle time the schedule does not have)."""
  entries = {}
  for remat in ('none', 'per_cell'):
    for schedule in schedule_flags.SCHEDULES:
      name = f'{schedule}_{remat}'
      entries[name] = ['--workload=ffn', '--batch=256', '--k=2', '--m=8',
                       _CellsPerDevice(schedule), f'--schedule={schedule}',
                       f'--remat={remat}', '--remat_last_micro_batch',
                       '--intra_op_threads=1', '--inter_op_threads=4',
                       f'--timeline_dir={timeline_root}/{name}']
  return entries


def _RenderSimulated(simulated: Dict[str, dict]) -> List[str]:
  lines = ['## The simulator against the timeline (ffn B256, K=2, M=8)', '',
           "Each run profiles one step; the simulator gets that step's costs "
           "(per cell the median forward and backward, per device its W time "
           "over its W actions: profiling/bubble.MeasuredCosts) and predicts "
           "the bubble of the schedule's actions; measured is the timeline's "
           "bubble of the same actions (bubble.MeasuredBubble: without the "
           "deferred product after the last backward of a schedule with no "
           "W). Replayed: the simulator given each action's own time "
           "instead of per-cell medians (per_action=True), so what differs "
           "from measured is its model of the step (dependencies, one "
           "action at a time per device), not its costs. Medians over the "
           "runs.", '']
  rows = []
  for name, entry in simulated.items():
    runs = [r for r in entry['runs'] if r.get('simulated_bubble') is not None]
    measured = runner.Median(runs, 'measured_bubble')
    predicted = runner.Median(runs, 'simulated_bubble')
    replayed = runner.Median(runs, 'replayed_bubble')
    rows.append([name, runner.Fmt(measured, '.3f'), runner.Fmt(predicted, '.3f'),
                 runner.Fmt(runner.Ratio(measured, predicted), '.2f', 'x'),
                 runner.Fmt(replayed, '.3f'),
                 runner.Fmt(runner.Ratio(measured, replayed), '.2f', 'x'),
                 runner.Fmt(runner.Median(runs, 'step_s_median'), '.3f'), str(len(runs))])
  lines += [runner.MarkdownTable(['configuration', 'measured bubble', 'simulated bubble',
                                  'measured / simulated', 'replayed bubble',
                                  'measured / replayed', 's/step', 'profiles'], rows),
            '', 'Commands:', '']
  lines += [f"    {entry['command']}" for entry in simulated.values()]
  return lines + ['']


# M of the loop_default section, and how much slower than the unrolled
# step a loop step may be from the M that section chooses on.
LOOP_DEFAULT_MS = (32, 64, 128)
LOOP_DEFAULT_TOLERANCE = 1.05

def _CellsPerDevice(schedule: str) -> str:
  """The --cells_per_device flag of `schedule`: v=2 where it interleaves."""
  return f"--cells_per_device={2 if schedule in ('interleaved', 'zb_v') else 1}"


def _EverySchedule(schedule: str) -> List[str]:
  """The flags of `schedule` at K=2 with one thread per device (each
  device a core), v=2 where it interleaves."""
  return [f'--schedule={schedule}', _CellsPerDevice(schedule),
          '--intra_op_threads=1', '--inter_op_threads=2']


# The loop sections: (row prefix, K, Ms, pipeline_bench flags, examples per
# micro-batch: the batch is that times M; 0: the flags' batch) per group.
LOOP_GROUPS = {
    'loop': (('ffn', 4, (4, 16, 64), ['--workload=ffn'], 0),
             ('transformer', 8, (8, 32),
              ['--workload=transformer', '--num_layers=16', '--batch=32'], 0)),
    'loop_1f1b': (('ffn_1f1b', 4, (4, 16, 64),
                   ['--workload=ffn', '--schedule=one_f_one_b'], 0),),
    'loop_zb': (('ffn_zb_h1', 4, (4, 16, 64), ['--workload=ffn', '--schedule=zb_h1'], 0),
                ('ffn_zb_v', 4, (4, 16, 64),
                 ['--workload=ffn', '--schedule=zb_v', '--cells_per_device=2'], 0)),
    'loop_k2': tuple(
        (f'ffn_b256_{schedule}', 2, (4, 16, 64),
         ['--workload=ffn', '--batch=256'] + _EverySchedule(schedule), 0)
        for schedule in schedule_flags.SCHEDULES),
    'loop_default': tuple(
        (f'ffn_rows4_{schedule}', 2, LOOP_DEFAULT_MS,
         ['--workload=ffn'] + _EverySchedule(schedule), 4)
        for schedule in schedule_flags.SCHEDULES),
}
LOOP_TITLES = {
    'loop': 'The loop against the unrolled step: fill-drain',
    'loop_1f1b': 'The loop against the unrolled step: 1F1B',
    'loop_zb': 'The loop against the unrolled step: ZB-H1 and ZB-V',
    'loop_k2': ('The loop against the unrolled step: every schedule, ffn B256, K=2, '
                'one thread per device'),
    'loop_default': ('Where the loop becomes the default: every schedule, ffn with '
                     '4-row micro-batches (B = 4M), K=2, one thread per device'),
}


def LoopEntries(section: str = 'loop') -> Dict[str, List[str]]:
  """Each group's configurations at each M, unrolled and looped."""
  entries = {}
  for prefix, k, ms, args, rows in LOOP_GROUPS[section]:
    for m in ms:
      batch = [f'--batch={rows * m}'] if rows else []
      for emission, loop in (('unrolled', 0), ('loop', 2)):
        entries[LoopName(prefix, k, m, emission)] = args + batch + [
            f'--k={k}', f'--m={m}', f'--loop_min_micro_batches={loop}']
  return entries


def LoopName(prefix: str, k: int, m: int, emission: str) -> str:
  """The name of a loop section's configuration ('unrolled' or 'loop')."""
  return f'{prefix}_K{k}_M{m}_{emission}'


def LoopStepRatios(loop: Dict[str, dict], prefix: str, k: int,
                   ms: Sequence[int]) -> Dict[int, Optional[float]]:
  """Per M of a loop section's group (`loop`: the section's results) the
  loop's median step over the unrolled one's."""
  def Step(m, emission):
    entry = loop.get(LoopName(prefix, k, m, emission))
    return runner.Median(entry['runs'], 'step_s_median') if entry else None
  return {m: runner.Ratio(Step(m, 'loop'), Step(m, 'unrolled')) for m in ms}


def ChooseLoopFromM(step_ratios: Dict[int, Optional[float]]) -> Optional[int]:
  """The smallest M from which the loop's step is at most
  LOOP_DEFAULT_TOLERANCE times the unrolled one at every measured M
  (`step_ratios`: M -> loop / unrolled), None if not even at the largest:
  plan.LOOP_FROM_M's entry of the schedule."""
  chosen = None
  for m in sorted(step_ratios, reverse=True):
    ratio = step_ratios[m]
    if ratio is None or ratio > LOOP_DEFAULT_TOLERANCE:
      break
    chosen = m
  return chosen


def Measure(entries: Dict[str, List[str]], steps: int, warmup: int) -> Dict[str, dict]:
  commands = {name: runner.OursCommand(args + FLAGS.bench_args, steps, warmup)
              for name, args in entries.items()}
  runs = runner.Alternate(commands, FLAGS.repeats, FLAGS.timeout_s, log=_Log)
  return {name: dict(command=_Portable(commands[name].Text()), runs=runs[name])
          for name in entries}


def _Portable(command: str) -> str:
  """The command as a reader runs it: `python`, and DIR for the timeline's
  temporary directory."""
  command = command.replace(sys.executable, 'python')
  return re.sub(r'--timeline_dir=\S*/', '--timeline_dir=DIR/', command)


def _WithSetup(runs: List[dict]) -> List[dict]:
  """The runs with setup_s: time to the first step less one step's time."""
  return [dict(r, setup_s=r['first_step_s'] - r['step_s_median'])
          if r.get('first_step_s') is not None and r.get('step_s_median') is not None
          else r for r in runs]


def _Mb(value: Optional[float]) -> Optional[float]:
  return None if value is None else value / 1e6


def _Median(values: List[float]) -> Optional[float]:
  return statistics.median(values) if values else None


def _RenderLoop(section: str, loop: Dict[str, dict]) -> List[str]:
  """The lines of one loop section: its table, growth and ratio lines, and
  commands."""
  lines = [f'## {LOOP_TITLES[section]}', '',
           'Time to the first step (build, trace, first run) and step time, '
           'medians; graph ops count the step and every function body. '
           'Ratios: loop / unrolled at the same M, and first step at the '
           "largest M / at the smallest M of each emission.", '']
  loop = {name: dict(entry, runs=_WithSetup(entry['runs'])) for name, entry in loop.items()}
  rows = []
  for name, entry in loop.items():
    runs = entry['runs']
    rows.append([name, runner.Fmt(runner.Median(runs, 'first_step_s'), '.2f'),
                 runner.Fmt(runner.Median(runs, 'setup_s'), '.2f'),
                 runner.Fmt(runner.Median(runs, 'step_s_median'), '.3f'),
                 runner.Fmt(runner.Median(runs, 'graph_ops'), '.0f'),
                 runner.Fmt(_Mb(runner.Median(runs, 'bfc_peak_bytes')), '.0f'),
                 runner.Fmt(_Mb(runner.Median(runs, 'bfc_held_bytes')), '.1f')])
  lines += [runner.MarkdownTable(['configuration', 'first step s',
                                  'first step less one step s', 's/step',
                                  'graph ops', 'peak MB', 'held MB'], rows), '',
            'Peak: the allocator peak of the measured steps; held: what '
            'stays allocated between steps (the run before `bfc_held_bytes` '
            'was measured shows a dash).', '',
            '"First step less one step" takes the run of one step out of the '
            'time to the first step: what is left is building, tracing and '
            'TensorFlow\'s graph setup, the part that grows with the graph. '
            'With B fixed, M=64 makes micro-batches of B/64 rows, and each streams every '
            'weight through the cache once per cell call, so the step itself '
            'grows with M in either emission.', '']
  for workload, k, ms, _, _ in LOOP_GROUPS[section]:
    def Get(m, emission, key):
      entry = loop.get(LoopName(workload, k, m, emission))
      return runner.Median(entry['runs'], key) if entry else None
    if section == 'loop_default':
      ratios = LoopStepRatios(loop, workload, k, ms)
      chosen = ChooseLoopFromM(ratios)
      lines.append(f'- {workload} K={k}: the loop step within {LOOP_DEFAULT_TOLERANCE:.2f}x '
                   'of the unrolled one ' + (f'from M={chosen}' if chosen else
                                             f'not even at M={ms[-1]}') +
                   ' (loop / unrolled at M=' + ', '.join(str(m) for m in ms) + ': ' +
                   ', '.join(runner.Fmt(ratios[m], '.3f', 'x') for m in ms) + ')')
    for emission in ('unrolled', 'loop'):
      growth = runner.Ratio(Get(ms[-1], emission, 'first_step_s'),
                            Get(ms[0], emission, 'first_step_s'))
      setup_growth = runner.Ratio(Get(ms[-1], emission, 'setup_s'),
                                  Get(ms[0], emission, 'setup_s'))
      lines.append(f'- {workload} K={k} {emission}: first step at M={ms[-1]} / '
                   f'M={ms[0]}: {runner.Fmt(growth, ".2f", "x")}; less one step: '
                   f'{runner.Fmt(setup_growth, ".2f", "x")}')
    for m in ms:
      def LoopOverUnrolled(key):
        return runner.Fmt(runner.Ratio(Get(m, 'loop', key), Get(m, 'unrolled', key)), '.2f', 'x')
      lines.append(f'- {workload} K={k} M={m}: loop / unrolled step time '
                   f"{LoopOverUnrolled('step_s_median')}, first step "
                   f"{LoopOverUnrolled('first_step_s')}, peak {LoopOverUnrolled('bfc_peak_bytes')}")
  lines += ['', 'Commands:', '']
  lines += [f"    {entry['command']}" for entry in loop.values()]
  lines.append('')
  return lines


def Render(results: dict, machine: Dict[str, str]) -> str:
  """The markdown page of the measured sections."""
  mb = 2**20
  lines = ['# Schedules: 1F1B and interleaved against fill-drain', '',
           'Generated by `python -m benchmarks.schedule_bench` from '
           '`docs/benchmarks/schedules.json`. Machine: '
           f"{machine.get('cpu', '?')}, {machine.get('nproc', '?')} cores, shared "
           'with other jobs while measured: ratios of configurations run '
           'alternating in one run are the figures to read, not absolute times.', '']
  memory = results.get('memory')
  if memory:
    lines += ['## 1F1B against fill-drain (transformer-act, K=4, M=8)', '',
              'Allocator (BFC) peak of a training step and step time, medians '
              f"over {len(next(iter(memory.values()))['runs'])} "
              'fresh processes per row, rows alternating.', '']
    rows = []
    for remat in ('none', 'per_cell'):
      base = memory.get(f'gpipe_{remat}')
      one_f = memory.get(f'one_f_one_b_{remat}')
      if not base or not one_f:
        continue
      peaks = [runner.Median(r['runs'], 'bfc_peak_bytes') for r in (base, one_f)]
      steps = [runner.Median(r['runs'], 'step_s_median') for r in (base, one_f)]
      firsts = [runner.Median(r['runs'], 'first_step_s') for r in (base, one_f)]
      rows.append([remat, runner.Fmt(peaks[0] and peaks[0] / mb, '.0f'),
                   runner.Fmt(peaks[1] and peaks[1] / mb, '.0f'),
                   runner.Fmt(runner.Ratio(peaks[1], peaks[0]), '.2f', 'x'),
                   runner.Fmt(steps[0], '.2f'), runner.Fmt(steps[1], '.2f'),
                   runner.Fmt(runner.Ratio(steps[1], steps[0]), '.2f', 'x'),
                   runner.Fmt(runner.Ratio(firsts[1], firsts[0]), '.2f', 'x')])
    lines += [runner.MarkdownTable(
        ['remat', 'GPipe peak MB', '1F1B peak MB', 'peak ratio', 'GPipe s/step',
         '1F1B s/step', 'step ratio', 'first-step ratio'], rows), '']
    lines += ['The planner (`planning/planner.py`, each schedule\'s model) brackets '
              'every measured peak between its shared_peak_bytes and '
              'total_peak_bytes (one allocator serves all CPU devices): '
              'tests/benchmarks/test_schedule_bench.py checks it on these rows.', '']
    lines += ['Commands:', '']
    lines += [f"    {entry['command']}" for entry in memory.values()]
    lines.append('')
  bubble = results.get('bubble')
  if bubble:
    lines += ['## Interleaved (v=2) against fill-drain (ffn, M=8, one thread '
              'per device)', '',
              'The bubble measured on the profiled timeline of one step '
              '(pipeline_bench --timeline_dir): 1 - busy / (K x span), medians. '
              'K=4 is the issue\'s configuration, with four one-thread devices '
              'on two cores; K=2 gives each device a core of its own.', '']
    rows = []
    medians = {}
    for name, entry in bubble.items():
      medians[name] = _Median(analysis.MeasuredBubbles(entry['runs']))
      rows.append([name, runner.Fmt(medians[name], '.3f'),
                   runner.Fmt(runner.Median(entry['runs'], 'step_s_median'), '.3f'),
                   str(len(analysis.MeasuredBubbles(entry['runs'])))])
    lines += [runner.MarkdownTable(['configuration', 'measured bubble', 's/step',
                                    'profiles'], rows), '']
    for k in BUBBLE_KS:
      ratio = runner.Ratio(medians.get(f'K{k}_interleaved_v2'), medians.get(f'K{k}_gpipe'))
      fill_drain, interleaved = (k - 1) / (8 + k - 1), (k - 1) / (2 * 8 + k - 1)
      lines.append(f'- K={k}: interleaved / fill-drain measured bubble '
                   f'{runner.Fmt(ratio, ".2f", "x")} (unit-time model: '
                   f'(K-1)/(vM+K-1) = {interleaved:.3f} against (K-1)/(M+K-1) = '
                   f'{fill_drain:.3f}, {interleaved / fill_drain:.2f}x)')
    lines += ['', 'Commands:', '']
    lines += [f"    {entry['command']}" for entry in bubble.values()]
    lines.append('')
  for section in LOOP_GROUPS:
    if results.get(section):
      lines += _RenderLoop(section, results[section])
  if results.get('simulated'):
    lines += _RenderSimulated(results['simulated'])
  return '\n'.join(lines)


def main(argv):
  del argv
  out_dir = pathlib.Path(FLAGS.out_dir)
  json_path = out_dir / 'schedules.json'
  results = json.loads(json_path.read_text()) if json_path.exists() else {}
  if 'memory' in FLAGS.sections:
    results['memory'] = Measure(MemoryEntries(), steps=3, warmup=1)
  if 'bubble' in FLAGS.sections:
    with tempfile.TemporaryDirectory() as root:
      results['bubble'] = Measure(BubbleEntries(root), steps=3, warmup=1)
  for section in LOOP_GROUPS:
    if section in FLAGS.sections:
      results[section] = Measure(LoopEntries(section), steps=5, warmup=1)
  if 'simulated' in FLAGS.sections:
    with tempfile.TemporaryDirectory() as root:
      results['simulated'] = Measure(SimulatedEntries(root), steps=3, warmup=1)
  if FLAGS.sections:
    results['repeats'] = FLAGS.repeats
    results['machine'] = runner.MachineInfo()
    json_path.write_text(json.dumps(results, indent=1) + '\n')
  (out_dir / 'schedules.md').write_text(Render(results, results.get('machine', {})))


if __name__ == '__main__':
  _DefineFlags()
  app.run(main)
