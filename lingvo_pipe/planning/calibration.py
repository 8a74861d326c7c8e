"""Calibration (the tuner's step 3): how much whole training steps differ
from their layers timed alone, measured by running a few of them (one
call of `Trials`); Calibrate's docstring says which and what it keeps."""

import dataclasses
import itertools
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from lingvo_pipe.core import hyperparams
from lingvo_pipe.pipeline.lowering.remat import RematPolicy
from lingvo_pipe.planning import candidates
from lingvo_pipe.planning import overheads as overheads_lib

# (the candidates) -> (seconds per step, peak bytes or None) of a few steps
# of each, in order: one call runs several (planning/trial.Timed traces the
# next while one warms up).
Trials = Callable[[Sequence[candidates.Candidate]], List[Tuple[float, Optional[int]]]]


# The schedules a calibration step may run, preferred first: 1F1B keeps
# one micro-batch's activations at a time where fill-drain keeps all M, whose
# memory traffic the layers timed alone do not have (on the transformer
# workload at M=4 an unpipelined fill-drain step took 0.78 s, most other M=4
# steps 0.53 to 0.76 s: calibrated on it, M=4 predictions were 30-47% high).
_PROBE_SCHEDULES = (candidates.Kind.ONE_F_ONE_B, candidates.Kind.GPIPE)
# The largest M a concurrency is probed at, if it fits: a step's trace and
# first call grow with M (the demo LM's K=4 M=16 trial took twice an M=8
# one's).
_CONCURRENCY_PROBE_M = 8
# Halvings of [1, K] that fit a concurrency: 4 / 2**30, far below the
# noise of a measured step.
_BISECTIONS = 30


def _Probe(rows: Sequence[candidates.Row], devices: int, micro: int,
           remat: Optional[RematPolicy] = None,
           schedules: Sequence[candidates.Kind] = _PROBE_SCHEDULES) -> Optional[candidates.Row]:
  """The fitting row of `devices` x1 cells at M=`micro` (under `remat`,
  if given) to calibrate on: of `schedules` the first that fits (1F1B,
  else fill-drain); the least recomputing one."""
  found = [r for r in rows if r.fits and r.candidate.schedule_kind in schedules and
           r.candidate.num_devices == devices and r.candidate.cells_per_device == 1 and
           r.candidate.num_micro_batches == micro and remat in (None, r.candidate.remat)]
  order = list(RematPolicy)
  return min(found, key=lambda r: (list(schedules).index(r.candidate.schedule_kind),
                                   order.index(r.candidate.remat)), default=None)


def Calibrate(pipeline: hyperparams.Params, measured: candidates.Measurements,
              rows: Sequence[candidates.Row], trials: Trials) -> candidates.Measurements:
  """`measured` calibrated by whole steps, each a fitting row of `rows`
  (Search's, uncalibrated), all run by one call of `trials`, their measured
  figures kept in the rows:
  - per M, the step with the fewest devices that fits without remat, else
    the least recomputing one (_Probe's schedule; unpipelined if one fits):
    `scale` is its measured seconds over the prediction from the layers
    timed alone at concurrency 1 (less the overheads); they differ
    because a whole step overlaps its independent ops, which layers timed
    alone cannot. Where no unpipelined step fits the budget, the factor
    also holds that step's devices' concurrency (on these 2 cores
    1.03-1.19 where measured apart). Without remat first:
    one-device remat steps ran 1.1-1.25x their prediction on ffn, and that
    factor, taken for an M, also made the concurrency of the devices of
    that M's steps without remat 1.40 where 1.07 was measured (a pick
    1.26x the best). An M without a fitting step takes the nearest M's.
  - per device count K > 1, without remat and with it, _Probe's step at
    the largest M up to 8 (else the next larger that fits: a step's
    trace and first call grow with M): the concurrency that makes its
    prediction (the step simulated on devices sharing cores,
    step_prediction) its measured seconds, within [1, K] (K where the
    step simulated on separate machines alone explains them); the least
    recomputing remat policy that fits measures it for all. Remat runs
    the micro-batches it does not keep as calls of the cell's traced
    functions, where a kept one's ops are inlined into the step, and two
    devices' calls overlap more than their inlined ops (per-cell steps at
    K > 1 ran 0.7-0.9 of a prediction with the concurrency measured
    without remat).
  - ZB-H1 on the devices and M of the largest K's probe without remat,
    and again of the largest K's probe with remat: its concurrency over
    that probe's is `split_backward` (`split_backward_remat`), the factor
    on the concurrency of every step of a schedule that splits its
    backwards, without remat (with it). The devices overlap separate I
    and W actions otherwise than whole backwards: without remat better
    (ffn's K=4 M=8 ZB-H2 ran 0.74-0.84 of a prediction with 1F1B's
    concurrency in three runs; replayed on those runs' grids, picks
    within 5% of the best went from 18 to 22 of 24), with per-cell remat
    worse (ffn's K=2 per-cell zero-bubble steps ran 1.2-1.5x such a
    prediction on one grid; with their own factor, replayed on three
    grids, the ffn's worst row went from 20/41/32% off to 14/28/17%,
    the picks unchanged): two trials in all.
  """
  device_counts = sorted({r.candidate.num_devices for r in rows})
  scale_probes = {}
  for m in sorted(measured.costs):
    found = (_Probe(rows, d, m, remat) for remat in RematPolicy for d in device_counts)
    probe = next((p for p in found if p is not None), None)
    if probe is not None:
      scale_probes[m] = probe
  probes: Dict[Tuple[int, RematPolicy], candidates.Row] = {}
  same: Dict[Tuple[int, RematPolicy], Tuple[int, RematPolicy]] = {}  # measured by another
  remats = [r for r in RematPolicy if r in {row.candidate.remat for row in rows}]
  for d, remat in itertools.product([d for d in device_counts if d > 1], remats):
    alike = [(k, r) for k, r in probes
             if k == d and (r == RematPolicy.NONE) == (remat == RematPolicy.NONE)]
    if alike:
      same[d, remat] = alike[0]
      continue
    found = (_Probe(rows, d, m, remat) for m in _ConcurrencyProbeMs(measured.costs))
    probe = next((r for r in found if r is not None), None)
    if probe is not None:
      probes[d, remat] = probe
  # Per remat class (True: without remat), the largest K's probe and
  # ZB-H1 on its devices and micro-batches.
  splits: Dict[bool, Tuple[candidates.Row, candidates.Row]] = {}
  for without in (True, False):
    whole = max((p for (_, r), p in probes.items() if (r == RematPolicy.NONE) == without),
                key=lambda p: p.candidate.num_devices, default=None)
    if whole is None:
      continue
    split = _Probe(rows, whole.candidate.num_devices, whole.candidate.num_micro_batches,
                   whole.candidate.remat, (candidates.Kind.ZB_H1,))
    if split is not None:
      splits[without] = (whole, split)
  Run([*scale_probes.values(), *probes.values(), *[s for _, s in splits.values()]],
      trials)

  scale: Dict[int, float] = {}
  for m, probe in scale_probes.items():
    step = candidates.Program(probe.candidate, probe.candidate.Apply(pipeline))
    alone = dataclasses.replace(measured, overheads=overheads_lib.Overheads())
    layers = candidates.Predict(probe.candidate, step, alone).seconds
    overhead = probe.predicted.seconds - layers
    scale[m] = max((probe.measured_s or 0.0) - overhead, 0.0) / layers if layers > 0 else 1.0
  for m in measured.costs:
    if m not in scale and scale:
      scale[m] = scale[min(scale, key=lambda known: abs(known - m))]
  scaled = dataclasses.replace(measured, scale=scale)
  concurrency = {key: _FittedConcurrency(pipeline, scaled, probe)
                 for key, probe in probes.items()}
  concurrency.update({key: concurrency[other] for key, other in same.items()})
  factors = {without: _FittedConcurrency(pipeline, scaled, split) /
             concurrency[whole.candidate.num_devices, whole.candidate.remat]
             for without, (whole, split) in splits.items()}
  return dataclasses.replace(scaled, concurrency=concurrency,
                             split_backward=factors.get(True, 1.0),
                             split_backward_remat=factors.get(False, 1.0))


def _ConcurrencyProbeMs(micro_batch_counts: Iterable[int]) -> List[int]:
  """The M to probe a concurrency at, preferred first: the largest up to
  _CONCURRENCY_PROBE_M, then the next larger ones."""
  counts = sorted(micro_batch_counts)
  return ([m for m in reversed(counts) if m <= _CONCURRENCY_PROBE_M] +
          [m for m in counts if m > _CONCURRENCY_PROBE_M])


def _FittedConcurrency(pipeline: hyperparams.Params, scaled: candidates.Measurements,
                       probe: candidates.Row) -> float:
  """The concurrency within [1, K] at which `probe`'s prediction (from
  `scaled`, uncalibrated for concurrency) is its measured seconds; 1 if
  it ran slower than on one core's worth, K if no slower than on separate
  machines. Found by bisection: the prediction falls as it grows."""
  step = candidates.Program(probe.candidate, probe.candidate.Apply(pipeline))
  d, spent = probe.candidate.num_devices, probe.measured_s or 0.0

  def Seconds(concurrency: float) -> float:
    at = dataclasses.replace(scaled, concurrency={(d, probe.candidate.remat): concurrency},
                             split_backward=1.0, split_backward_remat=1.0)
    return candidates.Predict(probe.candidate, step, at).seconds

  low, high = 1.0, float(d)
  if Seconds(low) <= spent:
    return low
  if Seconds(high) >= spent:
    return high
  for _ in range(_BISECTIONS):
    middle = (low + high) / 2
    low, high = (middle, high) if Seconds(middle) > spent else (low, middle)
  return (low + high) / 2


def Run(rows: Sequence[candidates.Row], trials: Trials) -> None:
  """Runs the trials of the `rows` that did not run yet (in one call,
  Trialled), keeping their figures in them."""
  todo = list({id(r): r for r in rows if r.measured_s is None}.values())
  for row, (seconds, peak) in zip(todo, Trialled([r.candidate for r in todo], trials)):
    row.measured_s, row.measured_peak_bytes = seconds, peak


def Trialled(chosen: Sequence[candidates.Candidate], trials: Trials
             ) -> List[Tuple[float, Optional[int]]]:
  """The results of `trials` for `chosen`, in its order, run in one call
  in the order that hides the most of their traces and first calls
  behind each other's (trial.Timed: the first trace and the last first
  call run alone; both grow with M): the fewest micro-batches first,
  then the most, down to the next fewest."""
  order = sorted(range(len(chosen)), key=lambda i: chosen[i].num_micro_batches)
  order = order[:1] + order[:0:-1]
  results = dict(zip(order, trials([chosen[i] for i in order])))
  return [results[i] for i in range(len(chosen))]
