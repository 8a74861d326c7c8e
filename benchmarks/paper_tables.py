"""Measures the GPipe-paper-style tables and regenerates docs/benchmarks.md.

Sections (each a set of fresh-process pipeline_bench runs, repeats
alternating between the configurations of the section):
  speedup   step time vs K and M, default threads and one thread per device
  memory    allocator peak and step time vs K, M and remat (transformer-act)
  capacity  largest stack (layers) per remat policy within a memory budget
  overhead  PipeliningLayer K=1 M=1 remat none vs the unpipelined baseline
  table2    the GPipe paper's Table 2 shape: transformer (16 layers, batch
            32) K in {2, 4, 8} at M=32, one thread per device: time to the
            first step, step time, throughput relative to K=2
  speedup_b256  the K=2 speedup target at 16-row micro-batches: ffn batch
            256, K in {1, 2} at M=16, one thread per device; the K=2 runs
            also profile a step for the measured bubble

Raw JSON goes to docs/benchmarks/<section>.json; the markdown is rendered
from every JSON present, so --sections= only re-renders.

  python -m benchmarks.paper_tables                       # everything
  python -m benchmarks.paper_tables --sections=overhead --repeats=1 --steps=2
  python -m benchmarks.paper_tables --sections=           # re-render only
  python -m benchmarks.paper_tables --sections=table2,speedup_b256 --repeats=3 --steps=5 --warmup=1
"""

import dataclasses
import json
import pathlib
import re
import sys
import tempfile
from typing import Dict, List, Optional, Tuple

from absl import app
from absl import flags

from benchmarks import analysis
from benchmarks import bench_doc
from benchmarks import runner

SECTIONS = ('speedup', 'memory', 'capacity', 'overhead', 'table2', 'speedup_b256')
# The paper's Table 2 shape on this machine: the transformer of the tick-loop
# rows of docs/benchmarks/schedules.md, K cells at M micro-batches.
TABLE2_LAYERS = 16
TABLE2_BATCH = 32
TABLE2_KS = (2, 4, 8)
TABLE2_M = 32
# ffn at batch 256: 16-row micro-batches at M=16 (batch 64 gives 4 rows).
B256_BATCH = 256
B256_KS = (1, 2)
B256_M = 16

FLAGS = flags.FLAGS


def _DefineFlags() -> None:
  """The program's flags, defined when it runs (other benchmark programs
  define flags of the same names; tests import several of them)."""
  flags.DEFINE_list('sections', list(SECTIONS), f'Which of {SECTIONS} to measure.')
  flags.DEFINE_integer('repeats', 3, 'Fresh-process runs per configuration.')
  flags.DEFINE_integer('steps', 10, 'Measured steps per run.')
  flags.DEFINE_integer('warmup', 2, 'Warm-up steps per run.')
  flags.DEFINE_float('timeout_s', 900, 'Per-run timeout.')
  flags.DEFINE_list('bench_args', [], 'Extra pipeline_bench flags for every run, '
                    'e.g. --num_layers=4,--batch=16 for a quick try.')
  flags.DEFINE_list('speedup_workloads', ['ffn'], 'Workloads of the speedup table.')
  flags.DEFINE_list('ks', ['1', '2', '4'], 'K values of the speedup table.')
  flags.DEFINE_list('ms', ['1', '4', '16'], 'M values of the speedup table.')
  flags.DEFINE_list('threads', ['default', analysis.ONE_PER_DEVICE],
                    'Thread settings: default (TF pools) and/or one_per_device '
                    '(intra-op 1, inter-op K: one op per device at a time).')
  flags.DEFINE_string('speedup_remat', 'per_cell', 'Remat policy of the speedup table.')
  flags.DEFINE_string('memory_workload', 'transformer-act', 'Workload of memory/capacity.')
  flags.DEFINE_list('memory_ks', ['1', '4'], 'K values of the memory table.')
  flags.DEFINE_list('memory_ms', ['1', '8'], 'M values of the memory table.')
  flags.DEFINE_integer('memory_steps', 3, 'Measured steps per memory-table run '
                       '(transformer-act steps take seconds).')
  flags.DEFINE_integer('memory_warmup', 1, 'Warm-up steps per memory-table run.')
  flags.DEFINE_list('remats', ['none', 'per_cell', 'per_layer'], 'Remat policies compared.')
  flags.DEFINE_integer('budget_mb', 512, 'Memory budget of the capacity table.')
  flags.DEFINE_integer('min_layers', 1, 'Capacity search: smallest L.')
  flags.DEFINE_integer('max_layers', 32, 'Capacity search: largest L.')
  flags.DEFINE_integer('capacity_m', 8, 'Capacity search: micro-batches (K=1).')
  flags.DEFINE_string('out_dir', str(runner.REPO_ROOT / 'docs' / 'benchmarks'), 'Raw JSON.')
  flags.DEFINE_string('doc', str(runner.REPO_ROOT / 'docs' / 'benchmarks.md'), 'Markdown out.')


def _Log(text: str) -> None:
  print(text, file=sys.stderr, flush=True)


def _ThreadArgs(threads: str, k: int) -> List[str]:
  if threads == 'default':
    return []
  if threads == analysis.ONE_PER_DEVICE:
    return ['--intra_op_threads=1', f'--inter_op_threads={k}']
  raise ValueError(f'threads {threads!r} must be default or {analysis.ONE_PER_DEVICE}.')


def SpeedupConfigs() -> Dict[str, tuple]:
  entries = {}
  for w in FLAGS.speedup_workloads:
    for threads in FLAGS.threads:
      entries[f'{w}_baseline_{threads}'] = (
          dict(workload=w, threads=threads, baseline=True, k=1, m=1, remat='none'),
          [f'--workload={w}', '--baseline', *_ThreadArgs(threads, 1)])
      for k in map(int, FLAGS.ks):
        for m in map(int, FLAGS.ms):
          entries[f'{w}_K{k}_M{m}_{threads}'] = (
              dict(workload=w, threads=threads, baseline=False, k=k, m=m,
                   remat=FLAGS.speedup_remat),
              [f'--workload={w}', f'--k={k}', f'--m={m}',
               f'--remat={FLAGS.speedup_remat}', *_ThreadArgs(threads, k)])
  return entries


def MemoryConfigs() -> Dict[str, tuple]:
  w = FLAGS.memory_workload
  return {f'K{k}_M{m}_{remat}': (
      dict(workload=w, k=k, m=m, remat=remat, baseline=False),
      [f'--workload={w}', f'--k={k}', f'--m={m}', f'--remat={remat}'])
          for k in map(int, FLAGS.memory_ks) for m in map(int, FLAGS.memory_ms)
          for remat in FLAGS.remats}


def OverheadConfigs() -> Dict[str, tuple]:
  return {'pipelined_K1_M1_none': (
      dict(workload='ffn', k=1, m=1, remat='none', baseline=False),
      ['--workload=ffn', '--k=1', '--m=1', '--remat=none']),
          'baseline': (dict(workload='ffn', k=1, m=1, remat='none', baseline=True),
                       ['--workload=ffn', '--baseline'])}


def Table2Configs() -> Dict[str, tuple]:
  """The paper's Table 2 shape: K in TABLE2_KS at M=TABLE2_M, one thread
  per device, per-cell remat."""
  threads = analysis.ONE_PER_DEVICE
  return {f'transformer_K{k}_M{TABLE2_M}_{threads}': (
      dict(workload='transformer', num_layers=TABLE2_LAYERS, batch=TABLE2_BATCH,
           threads=threads, baseline=False, k=k, m=TABLE2_M, remat='per_cell'),
      ['--workload=transformer', f'--num_layers={TABLE2_LAYERS}',
       f'--batch={TABLE2_BATCH}', f'--k={k}', f'--m={TABLE2_M}', '--remat=per_cell',
       *_ThreadArgs(threads, k)]) for k in TABLE2_KS}


def SpeedupB256Configs(timeline_root: str) -> Dict[str, tuple]:
  """ffn at batch B256_BATCH, K in B256_KS at M=B256_M, one thread per
  device, per-cell remat; runs with K > 1 profile one more step into
  timeline_root/<name> for the measured bubble."""
  threads = analysis.ONE_PER_DEVICE
  entries = {}
  for k in B256_KS:
    name = f'ffn_B{B256_BATCH}_K{k}_M{B256_M}_{threads}'
    timeline = [f'--timeline_dir={timeline_root}/{name}'] if k > 1 else []
    entries[name] = (
        dict(workload='ffn', batch=B256_BATCH, threads=threads, baseline=False, k=k,
             m=B256_M, remat='per_cell'),
        ['--workload=ffn', f'--batch={B256_BATCH}', f'--k={k}', f'--m={B256_M}',
         '--remat=per_cell', *_ThreadArgs(threads, k), *timeline])
  return entries


def PortableCommand(text: str) -> str:
  """A command with DIR for its timeline's temporary directory."""
  return re.sub(r'--timeline_dir=\S*/', '--timeline_dir=DIR/', text)


def MeasureTable(entries: Dict[str, tuple], steps: int, warmup: int) -> Dict[str, dict]:
  """Runs (config, pipeline_bench args) entries with --bench_args added,
  repeats alternating."""
  commands = {name: runner.OursCommand(args + FLAGS.bench_args, steps, warmup)
              for name, (_, args) in entries.items()}
  runs = runner.Alternate(commands, FLAGS.repeats, FLAGS.timeout_s, log=_Log)
  return {name: dict(config=config, command=PortableCommand(commands[name].Text()),
                     runs=runs[name])
          for name, (config, _) in entries.items()}


def MeasureSpeedupB256(steps: int, warmup: int) -> Dict[str, dict]:
  with tempfile.TemporaryDirectory() as root:
    return MeasureTable(SpeedupB256Configs(root), steps, warmup)


def MeasureCapacity() -> dict:
  """Bisects the number of layers per remat policy under the budget (one
  run per probe: peaks barely vary between runs)."""
  budget = FLAGS.budget_mb * analysis.MB
  bench_args = [a for a in FLAGS.bench_args if not a.startswith('--num_layers')]
  policies = {}
  for remat in FLAGS.remats:
    probes = []

    def Fits(num_layers: int) -> bool:
      cmd = runner.OursCommand(
          [f'--workload={FLAGS.memory_workload}', '--k=1', f'--m={FLAGS.capacity_m}',
           f'--remat={remat}', *bench_args, f'--num_layers={num_layers}'],
          steps=1, warmup=0)
      result = runner.Execute(cmd, FLAGS.timeout_s)
      probes.append(dict(result, num_layers=num_layers, command=cmd.Text()))
      status = result.get('error') or f"{result['bfc_peak_bytes'] / analysis.MB:.0f} MB"
      _Log(f'capacity {remat} L={num_layers}: {status}')
      return 'error' not in result and result['bfc_peak_bytes'] <= budget

    largest, _ = analysis.LargestFitting(FLAGS.min_layers, FLAGS.max_layers, Fits)
    policies[remat] = dict(largest=largest, probes=probes)
  return dict(budget_mb=FLAGS.budget_mb, workload=FLAGS.memory_workload, k=1,
              m=FLAGS.capacity_m, max_layers=FLAGS.max_layers, policies=policies)


def PredictedPeaks(memory: Dict[str, dict]) -> Dict[str, Optional[Tuple[float, float]]]:
  """Planner-predicted (lowest, highest) peak bytes of the shared CPU
  allocator per memory config, from lingvo_pipe.planning.planner.Estimate
  (SGD: optimizer_slots=0).
  """
  from lingvo_pipe.planning import planner  # pylint: disable=g-import-not-at-top
  from benchmarks import workloads  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.pipeline.lowering.remat import RematPolicy  # pylint: disable=g-import-not-at-top
  predicted = {}
  for name, entry in memory.items():
    ok = [r for r in entry['runs'] if 'error' not in r]
    if not ok:
      predicted[name] = None
      continue
    c, run = entry['config'], ok[0]
    w = dataclasses.replace(workloads.WORKLOADS[c['workload']],
                            num_layers=run['num_layers'], batch=run['batch'], seq=run['seq'])
    row = planner.Estimate(workloads.Layers(w), [w.input_shape], c['k'], c['m'],
                           RematPolicy(c['remat']), optimizer_slots=0)
    predicted[name] = (float(row.shared_peak_bytes), float(row.total_peak_bytes))
  return predicted


def main(argv):
  del argv
  unknown = set(FLAGS.sections) - set(SECTIONS)
  if unknown:
    raise ValueError(f'unknown sections {sorted(unknown)}; choose from {SECTIONS}.')
  out = pathlib.Path(FLAGS.out_dir)
  out.mkdir(parents=True, exist_ok=True)
  timing = (FLAGS.steps, FLAGS.warmup)
  measure = dict(  # section -> (repeats, steps, warmup, measure)
      speedup=(FLAGS.repeats, *timing, lambda: MeasureTable(SpeedupConfigs(), *timing)),
      memory=(FLAGS.repeats, FLAGS.memory_steps, FLAGS.memory_warmup,
              lambda: MeasureTable(MemoryConfigs(), FLAGS.memory_steps, FLAGS.memory_warmup)),
      capacity=(1, 1, 0, MeasureCapacity),
      overhead=(FLAGS.repeats, *timing, lambda: MeasureTable(OverheadConfigs(), *timing)),
      table2=(FLAGS.repeats, *timing, lambda: MeasureTable(Table2Configs(), *timing)),
      speedup_b256=(FLAGS.repeats, *timing, lambda: MeasureSpeedupB256(*timing)))
  for section in SECTIONS:
    if section in FLAGS.sections:
      repeats, steps, warmup, run = measure[section]
      data = dict(repeats=repeats, steps=steps, warmup=warmup, data=run())
      (out / f'{section}.json').write_text(json.dumps(data, indent=1))
  memory = bench_doc.Load(out, 'memory')
  predicted = PredictedPeaks(memory['data']) if memory else None
  text = bench_doc.RenderDoc(out, runner.MachineInfo(), predicted)
  pathlib.Path(FLAGS.doc).write_text(text)
  print(f'wrote {FLAGS.doc}')


if __name__ == '__main__':
  _DefineFlags()
  app.run(main)
