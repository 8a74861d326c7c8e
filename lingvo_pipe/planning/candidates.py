"""A candidate layout of a pipeline, and its step predicted from measured costs.

`Candidate` is one layout (schedule, devices, micro-batches, remat, split
points); `Measurements` what the tuner measured (measured_costs, overheads)
and calibrated by whole steps (calibration.Calibrate); `Predict` the
seconds of a candidate's training step (its lowered `Program`) by
step_prediction from those costs, scaled by the calibration; `Row` a
candidate with its prediction and, once it ran, its measured figures.
"""

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

from lingvo_pipe.core import hyperparams
from lingvo_pipe.pipeline.layout import plan as plan_lib
from lingvo_pipe.pipeline.lowering import program
from lingvo_pipe.pipeline.lowering.remat import RematPolicy
from lingvo_pipe.pipeline.schedules import schedule
from lingvo_pipe.planning import measured_costs
from lingvo_pipe.planning import overheads as overheads_lib
from lingvo_pipe.planning import step_prediction

Kind = schedule.ScheduleKind
# The zero-bubble schedules: each backward runs as an input gradient (I)
# and a weight gradient (W) of their own, which devices sharing cores
# overlap otherwise than whole backwards (Measurements.split_backward,
# split_backward_remat).
SPLIT_BACKWARD = frozenset({Kind.ZB_H1, Kind.ZB_H2, Kind.ZB_V})


@dataclasses.dataclass(frozen=True)
class Candidate:
  """One layout of the pipeline."""
  schedule_kind: Kind
  num_devices: int
  cells_per_device: int
  num_micro_batches: int
  remat: RematPolicy
  splits: Tuple[int, ...]

  def Apply(self, pipeline: hyperparams.Params) -> hyperparams.Params:
    """A copy of the PipeliningLayer params `pipeline` with this layout."""
    return pipeline.Copy().Set(**self._Values())

  def Override(self, prefix: str) -> str:
    """The layout as --model_params_override items of the pipeline at `prefix`."""
    return '; '.join(f'{prefix}.{k}={_Text(v)}' for k, v in self._Values().items())

  def _Values(self) -> Dict[str, Any]:
    return dict(num_partitions=self.num_devices * self.cells_per_device,
                num_micro_batches=self.num_micro_batches, micro_batch_size=0,
                remat=self.remat, schedule=self.schedule_kind,
                cells_per_device=self.cells_per_device, splits=list(self.splits))

  def __str__(self) -> str:
    v = f' v={self.cells_per_device}' if self.cells_per_device > 1 else ''
    return (f'K={self.num_devices}{v} M={self.num_micro_batches} {self.remat.name} '
            f'{self.schedule_kind.name}')


def _Text(value: Any) -> str:
  return value.name if hasattr(value, 'name') else str(value)


@dataclasses.dataclass
class Row:
  """A candidate, predicted and (if it ran) measured. `peak_bytes` is the
  predicted peak of its fullest device; `shared_peak_bytes` and
  `total_peak_bytes` the planner's range for one allocator that all its
  devices share (planner.PlanRow); `measured_peak_bytes` is the
  allocator's over every device of the trial (on CPU they share one)."""
  candidate: Candidate
  predicted: step_prediction.StepSeconds
  peak_bytes: int
  shared_peak_bytes: int
  total_peak_bytes: int
  fits: bool
  measured_s: Optional[float] = None
  measured_peak_bytes: Optional[int] = None


@dataclasses.dataclass(frozen=True)
class Measurements:
  """Per micro-batch count M the layers' costs at its micro-batch size, the
  step's overheads, per M each layer's share of weights whose gradients a
  deferring backward defers (deferral.Shares; none given: all), and the
  calibration by whole steps (calibration.Calibrate): per M the factor from the
  layers' seconds alone to the unpipelined step's (`scale`), per device
  count and remat policy the devices' concurrency, and the factor on it
  of the schedules that split their backwards, without remat
  (`split_backward`) and with it (`split_backward_remat`)."""
  costs: Dict[int, List[measured_costs.LayerCost]]
  overheads: overheads_lib.Overheads = overheads_lib.Overheads()
  scale: Dict[int, float] = dataclasses.field(default_factory=dict)
  concurrency: Dict[Tuple[int, RematPolicy], float] = dataclasses.field(default_factory=dict)
  deferred_shares: Dict[int, List[float]] = dataclasses.field(default_factory=dict)
  split_backward: float = 1.0
  split_backward_remat: float = 1.0


def Program(candidate: Candidate, p: hyperparams.Params) -> program.Program:
  """The training step `candidate` (applied as `p`) runs."""
  c = candidate
  return program.Lower(schedule.Actions(c.schedule_kind, c.num_devices, c.num_micro_batches,
                                        c.cells_per_device),
                       c.remat, p.remat_last_micro_batch, 1, program.Step.LOSS_INSIDE,
                       program.EmissionOf(plan_lib.LoopFromM(p), c.num_micro_batches))


def Predict(candidate: Candidate, step: program.Program,
            measured: Measurements) -> step_prediction.StepSeconds:
  """The seconds of `candidate`'s training step `step` (Program)."""
  m = candidate.num_micro_batches
  micro = _Scaled(measured, m)
  whole = (_Scaled(measured, 1) if 1 in measured.costs else
           [dataclasses.replace(c, weight_grad_s=m * c.weight_grad_s) for c in micro])
  deferring, deferred = step_prediction.DeferringCosts(
      micro, whole, measured.deferred_shares.get(m, [1.0] * len(micro)))
  cells = [step_prediction.CellCosts(c, candidate.splits) for c in (micro, deferring, deferred)]
  return step_prediction.Predict(step, cells[0], Concurrency(measured, candidate),
                                 measured.overheads, cells[1], cells[2])


def Concurrency(measured: Measurements, candidate: Candidate) -> float:
  """The calibrated concurrency of `candidate`'s devices under its remat
  policy (without one, the least recomputing policy's on as many devices,
  else 1), times `split_backward` for a schedule in SPLIT_BACKWARD
  without remat, `split_backward_remat` with it, within [1, K]."""
  found = [measured.concurrency.get((candidate.num_devices, r))
           for r in [candidate.remat] + list(RematPolicy)]
  concurrency = next((c for c in found if c is not None), 1.0)
  if candidate.schedule_kind in SPLIT_BACKWARD:
    factor = (measured.split_backward if candidate.remat == RematPolicy.NONE
              else measured.split_backward_remat)
    concurrency = min(max(concurrency * factor, 1.0), float(candidate.num_devices))
  return concurrency


def _Scaled(measured: Measurements, m: int) -> List[measured_costs.LayerCost]:
  """The layers' costs at M=`m`, times its calibration factor."""
  scale = measured.scale.get(m, 1.0)
  return [dataclasses.replace(c, forward_s=c.forward_s * scale,
                              input_grad_s=c.input_grad_s * scale,
                              weight_grad_s=c.weight_grad_s * scale,
                              accumulate_s=c.accumulate_s * scale)
          for c in measured.costs[m]]
