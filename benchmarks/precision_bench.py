"""bfloat16 against float32 and XLA cells against uncompiled, side by side.

Runs benchmarks/pipeline_bench.py once per configuration and repeat, in
fresh processes, round robin over the configurations (runner.Alternate), so
a slow phase of a shared machine hits every configuration alike. Prints one
JSON object: per workload and variant the medians of step time, allocator
peak and build + first step, and the ratios of each variant to float32
uncompiled. docs/precision.md has the figures and the commands.

  python -m benchmarks.precision_bench --repeats=3
  python -m benchmarks.precision_bench --workloads=ffn-m4 --variants=f32,bf16
"""

import json
import sys
from typing import Dict, List

from absl import app
from absl import flags

from benchmarks import runner

FLAGS = flags.FLAGS

# The workloads of issue 18 (docs/workloads.md), as pipeline_bench flags.
WORKLOADS = {
    'transformer-act-k4m8': ['--workload=transformer-act', '--k=4', '--m=8',
                             '--remat=per_cell'],
    'ffn-k4m4': ['--workload=ffn', '--k=4', '--m=4'],
    'ffn-k4m16': ['--workload=ffn', '--k=4', '--m=16'],
}
# Variants: compute dtype and cell compilation; 'f32' is the reference.
VARIANTS = {
    'f32': ['--fprop_dtype=float32', '--jit_compile=none'],
    'bf16': ['--fprop_dtype=bfloat16', '--jit_compile=none'],
    'f32-xla': ['--fprop_dtype=float32', '--jit_compile=xla'],
    'bf16-xla': ['--fprop_dtype=bfloat16', '--jit_compile=xla'],
}
_KEYS = ('step_s_median', 'bfc_peak_bytes', 'first_step_s')


def DefineFlags() -> None:
  """The program's flags; defined when it runs, so that importing this
  module (tests) does not clash with other benchmarks' flags."""
  flags.DEFINE_list('workloads', list(WORKLOADS), 'Workloads to run.')
  flags.DEFINE_list('variants', list(VARIANTS), 'Variants to run; ratios are '
                    'to f32 (run it too).')
  flags.DEFINE_integer('repeats', 3, 'Runs of each configuration, alternating.')
  flags.DEFINE_integer('steps', 5, 'Measured steps per run.')
  flags.DEFINE_integer('warmup', 1, 'Steps before measuring (after the first).')
  flags.DEFINE_float('timeout_s', 1200, 'Timeout of one run.')


def Summary(runs: Dict[str, List[dict]], workloads: List[str],
            variants: List[str]) -> Dict[str, Dict[str, dict]]:
  """Per workload and variant: the medians of _KEYS and, for the variants
  other than f32, their ratios to f32's, and the ratios of each run to the
  f32 run of the same round (adjacent in time: runner.Alternate), None
  where either failed."""
  out: Dict[str, Dict[str, dict]] = {}
  for w in workloads:
    out[w] = {}
    for v in variants:
      rows = runs[f'{w}/{v}']
      medians = {k: runner.Median(rows, k) for k in _KEYS}
      entry: dict = dict(medians, runs=len([r for r in rows if 'error' not in r]),
                         errors=[r['error'] for r in rows if 'error' in r])
      if v != 'f32' and f'{w}/f32' in runs:
        base_rows = runs[f'{w}/f32']
        base = {k: runner.Median(base_rows, k) for k in _KEYS}
        entry['ratio_to_f32'] = {k: runner.Ratio(medians[k], base[k]) for k in _KEYS}
        entry['pair_ratios_to_f32'] = {
            k: [runner.Ratio(_Value(row, k), _Value(ref, k))
                for row, ref in zip(rows, base_rows)] for k in _KEYS}
      out[w][v] = entry
  return out


def _Value(row: dict, key: str):
  """row[key], or None for a failed run."""
  return None if 'error' in row else row.get(key)


def main(argv):
  del argv
  unknown = sorted(set(FLAGS.workloads) - set(WORKLOADS)) + sorted(
      set(FLAGS.variants) - set(VARIANTS))
  if unknown:
    sys.exit(f'error: unknown workloads or variants {unknown}; choose from '
             f'{sorted(WORKLOADS)} and {sorted(VARIANTS)}.')
  commands = {
      f'{w}/{v}': runner.OursCommand(WORKLOADS[w] + VARIANTS[v], FLAGS.steps,
                                     FLAGS.warmup)
      for w in FLAGS.workloads for v in FLAGS.variants}
  runs = runner.Alternate(commands, FLAGS.repeats, FLAGS.timeout_s,
                          log=lambda line: print(line, file=sys.stderr, flush=True))
  print(json.dumps(dict(
      machine=runner.MachineInfo(), repeats=FLAGS.repeats, steps=FLAGS.steps,
      summary=Summary(runs, FLAGS.workloads, FLAGS.variants), runs=runs)),
        flush=True)


if __name__ == '__main__':
  DefineFlags()
  app.run(main)
