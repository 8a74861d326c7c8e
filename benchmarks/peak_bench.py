"""Predicted against measured peaks of every schedule, emission and remat policy; prints one JSON object.

For one (K, M) on each workload (docs/workloads.md), every schedule x
{unrolled, loop} x remat {none, per_cell} runs pipeline_bench in a fresh
process (a step after the first, so the peak is a step's), and the
planner's Estimate predicts it from the same program (program.Lower of
the emission the step runs: a loop per device from M). On CPU every
logical device shares one allocator, so the measured BFC peak compares
with the planner's range for it: from shared_peak_bytes (no two cells'
activation peaks coincide) to total_peak_bytes (all of them do).

Per configuration the JSON gives the measured MB, the predicted range and
the measured peak over each end of it; per workload, emission and remat
policy whether the six schedules rank alike by the predicted range's
middle and by the measured peak (Spearman's rho, ties averaged).

  python -m benchmarks.peak_bench --workloads=ffn,transformer --k=2 --m=4
"""

import dataclasses
import json
import sys
from typing import Dict, List, Optional, Sequence

from absl import app
from absl import flags

from benchmarks import runner
from benchmarks import schedule_flags

FLAGS = flags.FLAGS
MB = 2.0**20


def _DefineFlags() -> None:
  flags.DEFINE_list('workloads', ['ffn', 'transformer'], 'Workloads of docs/workloads.md.')
  flags.DEFINE_integer('k', 2, 'Devices.')
  flags.DEFINE_integer('m', 4, 'Micro-batches (a loop from this M: loop_min_micro_batches=M).')
  flags.DEFINE_list('schedules', list(schedule_flags.SCHEDULES), 'pipeline_bench --schedule values.')
  flags.DEFINE_list('remats', ['none', 'per_cell'], 'Remat policies.')
  flags.DEFINE_list('emissions', ['unrolled', 'loop'], 'unrolled, and a loop per device from M.')
  flags.DEFINE_integer('num_layers', 0, "Override the workloads' L (0: keep).")
  flags.DEFINE_integer('batch', 0, "Override the workloads' batch size (0: keep).")
  flags.DEFINE_float('timeout_s', 900, 'Per run.')


def Workload(name: str):
  """The workload `name` with the --num_layers and --batch overrides."""
  from benchmarks import workloads  # pylint: disable=g-import-not-at-top
  overrides = dict(num_layers=FLAGS.num_layers, batch=FLAGS.batch)
  return dataclasses.replace(workloads.WORKLOADS[name],
                             **{k: v for k, v in overrides.items() if v})


def Predicted(workload: str, schedule: str, emission: str, remat: str, k: int, m: int):
  """The planner's (shared, total) peak bytes of a configuration."""
  from benchmarks import workloads  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.planning import planner  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.pipeline.lowering.remat import RematPolicy  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.pipeline.schedules import built_in  # pylint: disable=g-import-not-at-top
  w = Workload(workload)
  kind = built_in.ScheduleKind(schedule)
  v = built_in.CellsPerDeviceParam(kind, 2 if kind == built_in.ScheduleKind.INTERLEAVED else 1)
  row = planner.Estimate(workloads.Layers(w), [w.input_shape], k * v, m, RematPolicy(remat),
                         schedule_kind=kind, cells_per_device=v,
                         loop_min_micro_batches=m if emission == 'loop' else 0)
  return float(row.shared_peak_bytes), float(row.total_peak_bytes)


def Ranks(values: Sequence[float]) -> List[float]:
  """1-based ranks, ties given their average rank."""
  order = sorted(range(len(values)), key=lambda i: values[i])
  ranks = [0.0] * len(values)
  i = 0
  while i < len(order):
    j = i
    while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
      j += 1
    for t in range(i, j + 1):
      ranks[order[t]] = (i + j) / 2 + 1
    i = j + 1
  return ranks


def Spearman(a: Sequence[float], b: Sequence[float]) -> Optional[float]:
  """Spearman's rank correlation of a and b (Pearson's of their ranks);
  None where either ties every value (it orders nothing to compare)."""
  ra, rb = Ranks(a), Ranks(b)
  n = len(a)
  ma, mb = sum(ra) / n, sum(rb) / n
  cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
  var = (sum((x - ma)**2 for x in ra) * sum((y - mb)**2 for y in rb))**0.5
  return cov / var if var else None


def Rankings(rows: List[Dict]) -> List[Dict]:
  """Per workload, emission and remat: the schedules' order by predicted
  middle and by measured peak, and Spearman's rho of the two."""
  groups: Dict[tuple, List[Dict]] = {}
  for r in rows:
    if r.get('measured_mb') is not None:
      groups.setdefault((r['workload'], r['emission'], r['remat']), []).append(r)
  out = []
  for (workload, emission, remat), group in groups.items():
    middle = [(r['predicted_low_mb'] + r['predicted_high_mb']) / 2 for r in group]
    measured = [r['measured_mb'] for r in group]
    rho = Spearman(middle, measured)
    out.append(dict(
        workload=workload, emission=emission, remat=remat,
        by_predicted=[g['schedule'] for _, g in sorted(zip(middle, group), key=lambda t: t[0])],
        by_measured=[g['schedule'] for _, g in sorted(zip(measured, group), key=lambda t: t[0])],
        spearman=None if rho is None else round(rho, 3)))
  return out


def main(argv):
  del argv
  rows = []
  for workload in FLAGS.workloads:
    for schedule in FLAGS.schedules:
      cells_per_device = ['--cells_per_device=2'] if schedule == 'interleaved' else []
      for emission in FLAGS.emissions:
        for remat in FLAGS.remats:
          loop_min = FLAGS.m if emission == 'loop' else 0
          args = [f'--workload={workload}', f'--k={FLAGS.k}', f'--m={FLAGS.m}',
                  f'--schedule={schedule}', f'--remat={remat}',
                  f'--loop_min_micro_batches={loop_min}', f'--num_layers={FLAGS.num_layers}',
                  f'--batch={FLAGS.batch}'] + cells_per_device
          result = runner.Execute(runner.OursCommand(args, steps=1, warmup=0), FLAGS.timeout_s)
          low, high = Predicted(workload, schedule, emission, remat, FLAGS.k, FLAGS.m)
          measured = None if 'error' in result else result['bfc_peak_bytes'] / MB
          rows.append(dict(
              workload=workload, schedule=schedule, emission=emission, remat=remat,
              k=FLAGS.k, m=FLAGS.m, measured_mb=measured, error=result.get('error'),
              predicted_low_mb=low / MB, predicted_high_mb=high / MB,
              measured_over_low=None if measured is None else measured / (low / MB),
              measured_over_high=None if measured is None else measured / (high / MB)))
          print(f'{workload} {schedule} {emission} {remat}: measured '
                f'{runner.Fmt(measured, ".1f")} MB, predicted {low / MB:.1f}-{high / MB:.1f}',
                file=sys.stderr)
  print(json.dumps(dict(machine=runner.MachineInfo(), rows=rows, rankings=Rankings(rows))))


if __name__ == '__main__':
  _DefineFlags()
  app.run(main)
