"""The tuner against an exhaustive grid of the same space; prints one JSON object.

Per workload ('uneven', partition_bench's stack where FLOPs mislead, and
docs/workloads.md's ffn and transformer), in one process on --devices
logical devices:
1. tuner.Measure (timed: what tuning costs beyond its verification).
2. tuner.Search without a budget: every candidate of the space predicted.
3. Every candidate trains (planning/trial.py), --passes times: the grid
   in the search's order, then reversed, and so on, so that a candidate's
   runs fall at different moments of the run; its measured step is the
   fastest of its passes (a shared machine's noise only adds time), its
   peak the allocator's largest over the timed steps (all devices: on CPU
   they share one allocator). `pass_spread`: per candidate its slowest
   pass over its fastest, less 1 (median and worst): how far one
   measurement of a step is from another in this run, the floor under
   any prediction's error.
4. Three budgets per device: the unpipelined step's (K=1, M=1, no remat;
   else the space's smallest M and least remat) predicted peak, half and a
   quarter of it. Under each, the candidates
   that fit are those whose predicted per-device peak does (the planner's
   model: a CPU's devices cannot be measured apart), and on one device
   whose measured peak does too (as the tuner judges: tuner.Record); the
   tuner's pick is tuner.Choose's (Search, Calibrate, Search, Verify), its
   trials looked up in the grid's runs; the grid's best is the fastest
   measured of all that fit; the JSON gives both, pick over best, and the
   pick's layout (device_peaks_bench runs it with a process per device).
   The grid's best is the fastest of some 90 noisy figures, and so the
   luckiest more often than the truly fastest: where the pick is another
   candidate, the two are also built together and timed alternately
   (--side_by_side_rounds, pick then best; each the fastest of 3 rounds),
   and `pick_over_best_side_by_side` is the median of the rounds' ratios.

Also per workload: Measure's layer costs per M (a replay of the tuner
on the grid's figures needs them), the calibrated prediction (no
budget) of every candidate's step but the calibration's own against its
measured one (median and worst relative error), and the measured peak
against the planner's predicted range for it (shared_peak_bytes, no two
devices' activation peaks at once, to total_peak_bytes, all at once).

  python -m benchmarks.tune_bench --workloads=uneven,ffn,transformer

--replay=FILE runs no trials: it takes a run's JSON (same workload flags)
and replays the tuner on its recorded layer costs, overheads and grid
(each trial looked up there), printing the same JSON: a change to the
prediction or calibration judged on a recorded grid in seconds per
workload, where a run takes an hour. A side-by-side ratio is the
recorded one where the replay picks the same pick and best, else None.
"""

import dataclasses
import json
import os
import statistics
import time
from typing import Any, Callable, Dict, List, Optional

os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')  # the allocator's peaks

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags

from benchmarks import partition_bench  # pylint: disable=g-import-not-at-top
from benchmarks import runner

FLAGS = flags.FLAGS
_MIB = 2.0**20
_UNBOUNDED = 1 << 50  # a budget every candidate fits


def _DefineFlags() -> None:
  flags.DEFINE_list('workloads', ['uneven', 'ffn', 'transformer'],
                    "'uneven' or workloads of docs/workloads.md.")
  flags.DEFINE_integer('devices', 4, 'Logical CPU devices (the largest K).')
  flags.DEFINE_list('micro_batches', ['1', '2', '4', '8'], 'Candidate M.')
  flags.DEFINE_list('remats', ['NONE', 'PER_CELL'], 'Candidate remat policies.')
  flags.DEFINE_integer('verify', 3, 'Candidates the tuner verifies by running them.')
  flags.DEFINE_integer('repeats', 3, "Measure's timed runs per layer and function.")
  flags.DEFINE_string('replay', None, "A tune_bench JSON to replay the tuner on (no trials).")
  flags.DEFINE_integer('passes', 2, 'Times every candidate of the grid trains.')
  flags.DEFINE_integer('side_by_side_rounds', 5,
                       'Alternate timings of a pick and the best it is compared with.')


def _Space():
  from lingvo_pipe.pipeline.lowering.remat import RematPolicy  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.planning import tuner  # pylint: disable=g-import-not-at-top
  return tuner.Space(devices=[d for d in (1, 2, 4, 8) if d <= FLAGS.devices],
                     micro_batches=[int(m) for m in FLAGS.micro_batches],
                     remats=[RematPolicy[r.upper()] for r in FLAGS.remats])


def _Errors(pairs: List[tuple]) -> Dict[str, Any]:
  """Median and worst |predicted - measured| / measured (None: no pairs)."""
  errors = [abs(p - m) / m for p, m in pairs]
  if not errors:
    return dict(median=None, worst=None)
  return dict(median=statistics.median(errors), worst=max(errors))


def _Spread(passes: List[List[float]]) -> Dict[str, Any]:
  """Median and worst of each candidate's slowest pass over its fastest,
  less 1 (None: no candidate ran twice)."""
  spreads = [max(p) / min(p) - 1 for p in passes if len(p) > 1]
  if not spreads:
    return dict(median=None, worst=None)
  return dict(median=statistics.median(spreads), worst=max(spreads))


def _Search(pipeline, measured, budget: int, space) -> List[Any]:
  """tuner.Search for steps run by trial.Run (its gradient use)."""
  from lingvo_pipe.planning import trial  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.planning import tuner  # pylint: disable=g-import-not-at-top
  return tuner.Search(pipeline, measured, budget, space,
                      gradients_held=trial.GRADIENTS_HELD)


def _Tuned(pipeline, measured, space, budget: int, runs) -> Any:
  """tuner.Choose under `budget` (the tuner's steps after Measure), each
  trial looked up in the grid's runs (the same trial.Run)."""
  from lingvo_pipe.planning import trial  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.planning import tuner  # pylint: disable=g-import-not-at-top

  def Lookup(candidates):
    return [(runs[c]['step_s'], runs[c]['peak_bytes']) for c in candidates]

  return tuner.Choose(pipeline, measured, budget, Lookup, space, verify=FLAGS.verify,
                      gradients_held=trial.GRADIENTS_HELD)


def _Fits(row, run, budget: int) -> bool:
  """As the tuner judges: the predicted peak of the fullest device, and on
  one device the measured peak too (tuner.Record)."""
  measured = run['peak_bytes'] if row.candidate.num_devices == 1 else None
  return row.peak_bytes <= budget and (measured is None or measured <= budget)


def _Layout(candidate) -> Dict[str, Any]:
  """A candidates.Candidate as JSON (device_peaks_bench runs it)."""
  return dict(schedule=candidate.schedule_kind.name, devices=candidate.num_devices,
              v=candidate.cells_per_device, micro_batches=candidate.num_micro_batches,
              remat=candidate.remat.name, splits=list(candidate.splits))


def _Budgets(pipeline, measured, space, rows, runs,
             side_by_side: Callable[[Any, Any], Optional[float]]) -> List[Dict[str, Any]]:
  """The tuner's pick against the grid's best under three budgets;
  `side_by_side(pick, best)` their steps' ratio timed alternately."""
  from lingvo_pipe.pipeline.lowering.remat import RematPolicy  # pylint: disable=g-import-not-at-top
  order = list(RematPolicy)
  single = min((r for r in rows if r.candidate.num_devices == 1),
               key=lambda r: (r.candidate.num_micro_batches, order.index(r.candidate.remat)))
  out = []
  for share in (1.0, 0.5, 0.25):
    budget = int(single.peak_bytes * share)
    fitting = [r for r in rows if _Fits(r, runs[r.candidate], budget)]
    if not fitting:
      out.append(dict(budget_mb=budget / _MIB, share=share, fits=0))
      continue
    pick = _Tuned(pipeline, measured, space, budget, runs).pick
    best = min(fitting, key=lambda r: runs[r.candidate]['step_s'])
    step = runs[pick.candidate]['step_s']
    out.append(dict(
        budget_mb=budget / _MIB, share=share, fits=len(fitting), pick=str(pick.candidate),
        pick_step_s=step, best=str(best.candidate), best_step_s=runs[best.candidate]['step_s'],
        pick_over_best=step / runs[best.candidate]['step_s'],
        pick_over_best_side_by_side=(1.0 if pick.candidate == best.candidate else
                                     side_by_side(pick.candidate, best.candidate)),
        pick_layout=_Layout(pick.candidate), pick_predicted_peak_mb=pick.peak_bytes / _MIB,
        pick_measured_peak_mb=(runs[pick.candidate]['peak_bytes'] or 0) / _MIB))
  return out


def _Pipeline(name: str) -> Any:
  """The PipeliningLayer params of workload `name`, layout left to the tuner."""
  from lingvo_pipe.pipeline import gpipe  # pylint: disable=g-import-not-at-top
  layers, shape = partition_bench.Workload(name)
  return gpipe.PipeliningLayer.Params().Set(name='pipe', layers=layers, input_shapes=[shape])


def Run(name: str) -> Dict[str, Any]:
  """The tuner and the grid on workload `name` (module docstring)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.planning import trial  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.planning import tuner  # pylint: disable=g-import-not-at-top
  pipeline = _Pipeline(name)
  x = [tf.random.stateless_normal(pipeline.input_shapes[0], [1, 2])]
  devices = [d.name for d in tf.config.list_logical_devices('CPU')]
  space = _Space()
  start = time.perf_counter()
  measured = tuner.Measure(pipeline, x, space, devices, FLAGS.repeats)
  measure_s = time.perf_counter() - start
  grid = [r.candidate for r in _Search(pipeline, measured, _UNBOUNDED, space)]
  passes: Dict[Any, List[tuple]] = {c: [] for c in grid}
  for n in range(max(FLAGS.passes, 1)):
    order = grid if n % 2 == 0 else grid[::-1]
    for c, ran in zip(order, trial.Run([c.Apply(pipeline) for c in order], x)):
      passes[c].append(ran)
  runs = {c: dict(step_s=min(s for s, _ in ran), passes_s=[s for s, _ in ran],
                  peak_bytes=None if None in [b for _, b in ran] else max(b for _, b in ran))
          for c, ran in passes.items()}
  return _Report(name, pipeline, measured, measure_s, runs,
                 lambda pick, best: SideBySide(pipeline, x, pick, best,
                                               FLAGS.side_by_side_rounds))


def SideBySide(pipeline, x, pick, best, rounds: int) -> float:
  """The median over `rounds` of `pick`'s step over `best`'s (candidates
  of the PipeliningLayer params `pipeline`, on inputs `x`), both built at
  once and timed alternately, each the fastest of 3 rounds."""
  from lingvo_pipe.planning import trial  # pylint: disable=g-import-not-at-top
  steps = [trial.TrainingSteps(c.Apply(pipeline), x) for c in (pick, best)]
  for built in steps:
    built.run(1)  # traces
  ratios = []
  for _ in range(max(rounds, 1)):
    first, second = (trial.StepSeconds(built.run, rounds=3) for built in steps)
    ratios.append(first / second)
  return statistics.median(ratios)


def Replay(recorded: Dict[str, Any]) -> Dict[str, Any]:
  """Run's JSON row from `recorded` (a Run's row): its measurements and
  the grid's trials as recorded, the tuner's steps after Measure anew."""
  from lingvo_pipe.planning import candidates  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.planning import measured_costs  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.planning import overheads  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.planning import tuner  # pylint: disable=g-import-not-at-top
  name = recorded['workload']
  pipeline = _Pipeline(name)
  costs = {int(m): [measured_costs.LayerCost(**c) for c in layers]
           for m, layers in recorded['layer_costs'].items()}
  measured = candidates.Measurements(costs, overheads.Overheads(**recorded['overheads']),
                                     deferred_shares=tuner.DeferredShares(pipeline, costs))
  grid = {g['candidate']: g for g in recorded['grid']}
  runs = {}
  for r in _Search(pipeline, measured, _UNBOUNDED, _Space()):
    if str(r.candidate) not in grid:
      raise ValueError(f'{r.candidate} is not in the grid of {FLAGS.replay}: replay with '
                       'the flags (workload, space) of the run that wrote it.')
    g = grid[str(r.candidate)]
    if g['splits'] != list(r.candidate.splits):
      raise ValueError(f'{r.candidate} splits at {list(r.candidate.splits)} where the grid '
                       f"of {FLAGS.replay} ran {g['splits']}: the tuner's partition changed "
                       'since; run the grid again.')
    runs[r.candidate] = dict(step_s=g['measured_s'], passes_s=g.get('passes_s'),
                             peak_bytes=round(g['measured_peak_mb'] * _MIB) or None)
  timed = {(b['pick'], b['best']): b.get('pick_over_best_side_by_side')
           for b in recorded['budgets'] if b['fits']}
  return _Report(name, pipeline, measured, recorded['measure_s'], runs,
                 lambda pick, best: timed.get((str(pick), str(best))))


def _Report(name: str, pipeline, measured, measure_s: float, runs,
            side_by_side: Callable[[Any, Any], Optional[float]]) -> Dict[str, Any]:
  """Run's JSON row: the tuner (with `runs` as its trials) against the grid."""
  space = _Space()
  tuned = _Tuned(pipeline, measured, space, _UNBOUNDED, runs)
  calibrated, probes = tuned.measured, tuned.probes
  rows = _Search(pipeline, calibrated, _UNBOUNDED, space)
  grid = []
  for r in rows:
    run = runs[r.candidate]
    grid.append(dict(candidate=str(r.candidate), splits=list(r.candidate.splits),
                     calibration=r.candidate in probes,
                     predicted_s=r.predicted.seconds, critical_s=r.predicted.critical,
                     shared_s=r.predicted.shared, measured_s=run['step_s'],
                     passes_s=run['passes_s'],
                     predicted_peak_mb=r.peak_bytes / _MIB,
                     predicted_range_mb=[r.shared_peak_bytes / _MIB, r.total_peak_bytes / _MIB],
                     measured_peak_mb=(run['peak_bytes'] or 0) / _MIB))
  peaks = [(g['measured_peak_mb'], g['predicted_range_mb']) for g in grid if g['measured_peak_mb']]
  return dict(
      workload=name, measure_s=measure_s, candidates=len(rows),
      scale={str(m): f for m, f in calibrated.scale.items()},
      concurrency={f'{d} {remat.name}': c for (d, remat), c in calibrated.concurrency.items()},
      split_backward=calibrated.split_backward,
      split_backward_remat=calibrated.split_backward_remat,
      overheads=dataclasses.asdict(measured.overheads),
      layer_costs={str(m): [dataclasses.asdict(c) for c in costs]
                   for m, costs in measured.costs.items()},
      step_error=_Errors([(g['predicted_s'], g['measured_s']) for g in grid
                          if not g['calibration']]),
      peak_in_predicted_range=sum(lo * 0.85 <= m <= hi * 1.15 for m, (lo, hi) in peaks),
      pass_spread=_Spread([g['passes_s'] for g in grid if g['passes_s']]),
      peaks_measured=len(peaks),
      budgets=_Budgets(pipeline, measured, space, rows, runs, side_by_side), grid=grid)


def main(argv):
  del argv
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  cpu = tf.config.list_physical_devices('CPU')[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * FLAGS.devices)
  if FLAGS.replay:
    with open(FLAGS.replay) as f:
      recorded = json.load(f)
    print(json.dumps(dict(machine=recorded['machine'], replayed_from=FLAGS.replay,
                          rows=[Replay(row) for row in recorded['rows']
                                if row['workload'] in FLAGS.workloads])))
    return
  print(json.dumps(dict(machine=runner.MachineInfo(),
                        rows=[Run(name) for name in FLAGS.workloads])))


if __name__ == '__main__':
  _DefineFlags()
  partition_bench.DefineWorkloadFlags()
  app.run(main)
