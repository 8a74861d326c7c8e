"""Tune: the fastest layout of a pipeline that fits a memory budget, chosen
from measured costs and confirmed by running it.

1. Measure (measured_costs, overheads): every layer's forward, input- and
   weight-gradient seconds at each candidate micro-batch size, and what
   a pipelined step costs beyond its layers.
2. Search: every schedule x devices K x micro-batches M x remat (x the
   schedule's v cells per device), split where the measured seconds
   balance in that step (measured_costs.StepShares: with the forwards it
   recomputes; partition.BalancedSplits), predicted: the step's seconds by
   step_prediction from those costs, each device's peak by the planner's
   memory model of the same program, with the activations each layer's
   traced gradient keeps (measured_costs' kept_bytes). A candidate fits
   if its largest per-device peak is within the budget. Candidates whose
   steps are the same program (same splits, actions and remat decisions:
   e.g. any schedule on one device) count once, as the first of the
   space's.
3. Calibrate (calibration.py): a few fitting candidates run whole
   training steps (`trials`: planning/trial.py's, or the trainer's): the
   unpipelined step at each M (how much faster the layers run together
   than alone; under a budget it exceeds, the step on the fewest devices
   that fits without remat, else with the least) and a
   step on each number of devices, without remat and with it (how much
   they gain by running at once: on logical CPU devices they share the
   cores), 1F1B where it fits, else fill-drain, and ZB-H1 beside the
   largest of each (how much more or less for split backwards); Search
   again.
4. Verify: the `verify` fastest fitting candidates run too, and the next
   `verify` while one not run is predicted faster than all that ran (up to
   twice more); the pick is the fastest measured. Its override can be
   pasted back as is.
A candidate on one device whose measured peak exceeds the budget does
not fit, whatever was predicted (Record): on one device the allocator's
peak is the device's own.
"""

import dataclasses
import itertools
import time
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.pipeline.layout import micro_batch
from lingvo_pipe.pipeline.layout import partition
from lingvo_pipe.pipeline.layout import plan as plan_lib
from lingvo_pipe.pipeline.lowering.remat import RematPolicy
from lingvo_pipe.pipeline.schedules import schedule
from lingvo_pipe.planning import calibration
from lingvo_pipe.planning import candidates
from lingvo_pipe.planning import deferral
from lingvo_pipe.planning import measured_costs
from lingvo_pipe.planning import memory_model
from lingvo_pipe.planning import overheads as overheads_lib
from lingvo_pipe.planning import planner

Kind = schedule.ScheduleKind
# (ScheduleKind, cells per device v) of the built-in schedules: what the
# tuner and inspect_model's planner table weigh.
ALL_SCHEDULES = ((Kind.GPIPE, 1), (Kind.ONE_F_ONE_B, 1), (Kind.INTERLEAVED, 2),
                 (Kind.ZB_H1, 1), (Kind.ZB_H2, 1), (Kind.ZB_V, 2))


@dataclasses.dataclass(frozen=True)
class Space:
  """The candidates: every combination of these that can run."""
  schedules: Sequence[Tuple[Kind, int]] = ALL_SCHEDULES
  devices: Sequence[int] = (1, 2, 4)
  micro_batches: Sequence[int] = (1, 2, 4, 8, 16)
  remats: Sequence[RematPolicy] = tuple(RematPolicy)



def _Batch(pipeline: hyperparams.Params) -> int:
  """The pipeline's batch, if it can be tuned."""
  if not pipeline.layers or not pipeline.input_shapes:
    raise ValueError(f'PipeliningLayer {pipeline.name!r}: tuning needs p.layers and '
                     'p.input_shapes (the automatic partition); a cell_tpl pipeline is '
                     'partitioned by hand.')
  if pipeline.num_replicas != 1:
    raise ValueError(f'PipeliningLayer {pipeline.name!r} has num_replicas='
                     f'{pipeline.num_replicas}; the tuner lays out one replica: tune with '
                     'num_replicas=1 and 1/R of the batch, then set R back.')
  return micro_batch.Contract.FromParams(pipeline).InputLayout(
      layer_meta.Shapes(*pipeline.input_shapes)).batch_size


def MicroBatchCounts(pipeline: hyperparams.Params, space: Space) -> List[int]:
  """The space's M that divide the pipeline's batch."""
  batch = _Batch(pipeline)
  return sorted(m for m in set(space.micro_batches) if m >= 1 and batch % m == 0)


def Measure(pipeline: hyperparams.Params, inputs: Sequence[Any], space: Space,
            devices: Sequence[str], repeats: int = 3) -> candidates.Measurements:
  """Each layer timed alone at every M of the space (on devices[0]), and
  the overheads (with two devices or more); not yet calibrated."""
  costs = {}
  for m in MicroBatchCounts(pipeline, space):
    p = pipeline.Copy().Set(num_micro_batches=m, micro_batch_size=0)
    costs[m] = measured_costs.Measure(p, inputs, repeats, devices[0])
  extra = overheads_lib.Measure(devices) if len(devices) > 1 else overheads_lib.Overheads()
  return candidates.Measurements(costs, extra, deferred_shares=DeferredShares(pipeline, costs))


def DeferredShares(pipeline: hyperparams.Params,
                   micro_batch_counts: Iterable[int]) -> Dict[int, List[float]]:
  """Per M, each layer's share of weights whose gradients a deferring
  backward defers (deferral.Shares of the layers' FPropMeta)."""
  contract = micro_batch.Contract.FromParams(pipeline)
  shares = {}
  for m in micro_batch_counts:
    micro_shapes = contract.SplitShapes(layer_meta.Shapes(*pipeline.input_shapes), m)
    shares[m] = deferral.Shares(
        [meta for _, meta in memory_model.Chain(pipeline.layers, micro_shapes)], m)
  return shares


def Search(pipeline: hyperparams.Params, measured: candidates.Measurements,
           budget_bytes: int, space: Space = Space(), optimizer_slots: int = 0,
           gradients_held: bool = True) -> List[candidates.Row]:
  """Every runnable candidate of the space with measured costs, predicted
  (module docstring); fitting rows first, each group fastest first.
  `optimizer_slots` and `gradients_held` say what the trial's step holds
  besides the pipeline (planner.Estimate)."""
  if budget_bytes <= 0:
    raise ValueError(f'The memory budget must be > 0 bytes, got {budget_bytes}.')
  counts = MicroBatchCounts(pipeline, space)  # raises for a pipeline it cannot tune
  num_layers = len(pipeline.layers)
  # What a layout changes and the step's program reads, without the
  # layers' params (copying those for every candidate took most of a Search).
  unlayered = pipeline.Copy().Set(layers=[])
  contract = micro_batch.Contract.FromParams(pipeline)
  shapes = layer_meta.Shapes(*pipeline.input_shapes)
  profiles: Dict[int, List[memory_model.Layer]] = {}  # per M, for all its candidates
  rows, seen = [], set()
  for (kind, v), d, m, remat in itertools.product(
      space.schedules, sorted(set(space.devices)), counts, space.remats):
    if d * v > num_layers or (v > 1 and d == 1) or m not in measured.costs:
      continue
    if m not in profiles:
      profiles[m] = memory_model.Profile(pipeline.layers, shapes, contract.SplitShapes(shapes, m),
                                         m, _KeptBytes(measured.costs[m]))
    unsplit = candidates.Candidate(kind, d, v, m, remat, ())
    p = unsplit.Apply(unlayered)  # the splits change no action
    step = candidates.Program(unsplit, p)
    costs = measured_costs.StepShares(measured.costs[m], step)
    candidate = dataclasses.replace(unsplit,
                                    splits=tuple(partition.BalancedSplits(costs, d * v)))
    same = (candidate.splits, step.emission, step.order, tuple(sorted(step.decisions.items())))
    if same in seen:  # e.g. every schedule on one device: the same step as GPIPE's
      continue
    seen.add(same)
    row = planner.Estimate(
        pipeline.layers, p.input_shapes, d * v, m, remat, optimizer_slots, p.batch_dim,
        partition.CostKind.GIVEN, p.remat_last_micro_batch, p.broadcast_inputs, kind, v,
        plan_lib.LoopFromM(p), costs, _KeptBytes(measured.costs[m]), gradients_held,
        profiles[m])
    rows.append(candidates.Row(candidate, candidates.Predict(candidate, step, measured),
                               row.max_peak_bytes, row.shared_peak_bytes,
                               row.total_peak_bytes, row.max_peak_bytes <= budget_bytes))
  # Ties (within a microsecond) go to fewer devices, then fewer micro-batches.
  rows.sort(key=lambda r: (not r.fits, round(r.predicted.seconds, 6), r.peak_bytes,
                           r.candidate.num_devices, r.candidate.num_micro_batches))
  return rows


def _KeptBytes(costs: Sequence[measured_costs.LayerCost]) -> List[int]:
  """Every layer's measured kept bytes; empty if one is unknown (the
  planner then counts FPropMeta's act_bytes for all)."""
  kept = [c.kept_bytes for c in costs]
  return [k for k in kept if k is not None] if None not in kept else []


def CheckFits(rows: Sequence[candidates.Row], budget_bytes: int) -> None:
  """Raises ValueError naming the smallest predicted peak if no row fits."""
  if not rows or rows[0].fits:
    return
  smallest = min(rows, key=lambda r: r.peak_bytes)
  raise ValueError(
      f'No layout fits {budget_bytes / 2**20:.1f} MiB per device: the smallest predicted '
      f'peak is {smallest.peak_bytes / 2**20:.1f} MiB ({smallest.candidate}). Give a budget '
      f'of at least {smallest.peak_bytes / 2**20:.1f} MiB, or more devices.')


def Verify(rows: Sequence[candidates.Row], trials: calibration.Trials, budget_bytes: int,
           top: int = 3, more: int = 2) -> candidates.Row:
  """Runs the `top` fastest predicted fitting rows not measured yet (in
  one call of `trials`: calibration.Trialled; their figures kept by
  Record) and returns the fastest measured fitting row. Rows that turn
  out not to fit (Record) are replaced by the next, in another call.
  Where the next row not run is predicted faster than every measured
  one, the predictions were wrong about those that ran, and it may be the
  fastest: the next `top` run too, up to `more` times (the uneven stack's
  M=4 layouts, predicted 20-24% fast, were the first three, all slower
  than a layout the calibration ran; docs/benchmarks/tuning.md).

  Raises:
    ValueError: if no row fits, predicted or measured.
  """
  step = max(top, 1)
  count = step
  for _ in range(max(more, 0) + 1):
    _RunFirst(rows, trials, budget_bytes, count)
    measured = [r for r in rows if r.fits and r.measured_s is not None]
    waiting = [r for r in rows if r.fits and r.measured_s is None]
    if not measured or not waiting or (
        waiting[0].predicted.seconds >= min(r.measured_s or 0.0 for r in measured)):
      break
    count += step
  if not measured:
    raise ValueError(f'No candidate fits {budget_bytes / 2**20:.1f} MiB per device: those '
                     'predicted to fit measured more on one device; give a larger budget.')
  return min(measured, key=lambda r: r.measured_s or 0.0)


def _RunFirst(rows: Sequence[candidates.Row], trials: calibration.Trials,
              budget_bytes: int, count: int) -> None:
  """Runs the `count` fastest predicted fitting rows not measured yet,
  and the next in place of any that turns out not to fit."""
  while True:
    first = [r for r in rows if r.fits][:count]
    todo = [r for r in first if r.measured_s is None]
    if not todo:
      return
    for r, result in zip(todo, calibration.Trialled([r.candidate for r in todo], trials)):
      Record(r, result, budget_bytes)


def Record(row: candidates.Row, result: Tuple[float, Optional[int]],
           budget_bytes: int) -> None:
  """Keeps a trial's (seconds, peak bytes) in `row`. A one-device row whose
  measured peak exceeds the budget no longer fits: that peak is its
  device's own (on several logical devices it is all of theirs together,
  and the prediction decides). The planner's model misses some of what
  TensorFlow holds (the transformer's K=1 M=4 1F1B step: 102.5 MiB
  measured, 88.3 predicted; docs/benchmarks/tuning.md)."""
  row.measured_s, row.measured_peak_bytes = result
  if (row.candidate.num_devices == 1 and row.measured_peak_bytes is not None
      and row.measured_peak_bytes > budget_bytes):
    row.fits = False


def FormatTable(rows: Sequence[candidates.Row], pick: Optional[candidates.Row] = None,
                limit: int = 20) -> str:
  """The fitting rows, fastest predicted first: the first `limit` and
  every one that ran (a calibration run predicted slower can be the
  pick), the pick marked '*'; then how many fit but are not shown, and
  how many did not fit."""
  fitting = [r for r in rows if r.fits]
  shown = [r for i, r in enumerate(fitting) if i < limit or r.measured_s is not None or r is pick]
  lines = [f'  {"K":>2} {"v":>2} {"M":>3} {"remat":<9} {"schedule":<11} {"predicted s":>11} '
           f'{"peak MiB":>9} {"measured s":>10} {"meas. MiB":>9}  splits']
  for r in shown:
    c = r.candidate
    measured = (f'{r.measured_s:>10.4f}' if r.measured_s is not None else f'{"-":>10}')
    mib = (f'{r.measured_peak_bytes / 2**20:>9.1f}' if r.measured_peak_bytes is not None
           else f'{"-":>9}')
    lines.append(f'{"*" if r is pick else " "} {c.num_devices:>2} {c.cells_per_device:>2} '
                 f'{c.num_micro_batches:>3} {c.remat.name:<9} {c.schedule_kind.name:<11} '
                 f'{r.predicted.seconds:>11.4f} {r.peak_bytes / 2**20:>9.1f} {measured} '
                 f'{mib}  {list(c.splits)}')
  unshown = len(fitting) - len(shown)
  if unshown:
    lines.append(f'  ({unshown} more candidates fit, predicted slower, not run)')
  others = len([r for r in rows if not r.fits])
  if others:
    lines.append(f'  ({others} more candidates do not fit the budget)')
  return '\n'.join(lines)


@dataclasses.dataclass(frozen=True)
class Phases:
  """Where a tune's seconds went: timing the layers alone (Tune's
  Measure; 0 in Choose), the calibration's and the verification's trials
  (Search's seconds are in neither: about a second for the demo LM), and
  how many candidates each ran."""
  measure_s: float
  calibration_s: float
  calibration_trials: int
  verification_s: float
  verification_trials: int

  def __str__(self) -> str:
    return (f'layers timed alone {self.measure_s:.0f} s, {self.calibration_trials} '
            f'calibration trials {self.calibration_s:.0f} s, {self.verification_trials} '
            f'verification trials {self.verification_s:.0f} s')


@dataclasses.dataclass(frozen=True)
class Tuned:
  """What Choose found: every row (the calibrated Search's, with the
  trials' figures), the pick, the calibrated measurements, the
  candidates that ran for the calibration, and where the time went."""
  rows: List[candidates.Row]
  pick: candidates.Row
  measured: candidates.Measurements
  probes: FrozenSet[candidates.Candidate]
  phases: Phases


def Choose(pipeline: hyperparams.Params, measured: candidates.Measurements,
           budget_bytes: int, trials: calibration.Trials, space: Space = Space(),
           optimizer_slots: int = 0, verify: int = 3,
           gradients_held: bool = True) -> Tuned:
  """Search, Calibrate, Search again and Verify (module docstring), from
  `measured` (Measure's).

  Raises:
    ValueError: if no candidate fits the budget (naming the smallest
      predicted peak).
  """
  rows = Search(pipeline, measured, budget_bytes, space, optimizer_slots, gradients_held)
  CheckFits(rows, budget_bytes)
  start = time.perf_counter()
  calibrated = calibration.Calibrate(pipeline, measured, rows, trials)
  calibration_s = time.perf_counter() - start
  probes = {r.candidate: r for r in rows if r.measured_s is not None}
  rows = Search(pipeline, calibrated, budget_bytes, space, optimizer_slots, gradients_held)
  for r in rows:
    if r.candidate in probes:
      probe = probes[r.candidate]
      Record(r, (probe.measured_s or 0.0, probe.measured_peak_bytes), budget_bytes)
  start = time.perf_counter()
  pick = Verify(rows, trials, budget_bytes, verify)
  verified = sum(r.measured_s is not None and r.candidate not in probes for r in rows)
  phases = Phases(0.0, calibration_s, len(probes), time.perf_counter() - start, verified)
  return Tuned(rows, pick, calibrated, frozenset(probes), phases)


def Tune(pipeline: hyperparams.Params, inputs: Sequence[Any], budget_bytes: int,
         devices: Sequence[str], trials: calibration.Trials, space: Space = Space(),
         optimizer_slots: int = 0, verify: int = 3, repeats: int = 3,
         gradients_held: bool = True) -> Tuned:
  """Measure, then Choose (its Phases with Measure's seconds).

  Raises:
    ValueError: if the pipeline cannot be tuned (no p.layers or
      p.input_shapes), or no candidate fits the budget (naming the
      smallest predicted peak).
  """
  space = dataclasses.replace(space, devices=[d for d in space.devices if d <= len(devices)])
  start = time.perf_counter()
  measured = Measure(pipeline, inputs, space, devices, repeats)
  measure_s = time.perf_counter() - start
  tuned = Choose(pipeline, measured, budget_bytes, trials, space, optimizer_slots, verify,
                 gradients_held)
  return dataclasses.replace(tuned, phases=dataclasses.replace(tuned.phases,
                                                               measure_s=measure_s))
