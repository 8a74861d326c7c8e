"""A training step's seconds predicted from measured layer costs.

The simulator (schedules/simulate) runs the step's program with each
action costing what its cell's layers measured (measured_costs.Measure at
the micro-batch size): F the forwards; a backward the program splits, I
the input gradients plus its recomputation (Program.RecomputeUnits
forwards) and W the weight gradients; one it does not split, B all of
them. A cell whose program defers weight gradients to one product per
step (Program.DefersToStepEnd: PER_CELL at M > 1) defers those of the
projections that pass cell/deferred_grads' size rule (deferral.Shares:
on ffn and the uneven stack all their projections, on the transformer
none): it runs their product once, in its last backward, over the whole
batch (measured on ffn, 64 rows, the whole batch's took 0.6 of 8
micro-batches' of 8 rows each), and the rest per micro-batch
(DeferringCosts). Every backward that makes weight gradients but a
cell's first adds them into its accumulators (LayerCost.accumulate_s).
That is the step if the devices were separate machines (`critical`). On
one machine they share its cores: the simulator runs the same actions
with the devices' concurrency c (1 where each op already fills the
cores, K for separate machines; calibration.Calibrate measures it from
whole steps), each of n busy devices at min(1, c / n) (`shared`, the
prediction). Only what the schedule lets run at once overlaps, so a
step of few micro-batches gains less from c than one of many, as
measured (docs/benchmarks/tuning.md), where a bound of all actions
over c has them gain alike.
"""

import dataclasses
from typing import Any, Dict, List, Sequence, Tuple

from lingvo_pipe.pipeline.layout import partition
from lingvo_pipe.pipeline.lowering import program
from lingvo_pipe.pipeline.schedules import simulate
from lingvo_pipe.pipeline.schedules.actions import ActionKind as Kind
from lingvo_pipe.planning import measured_costs
from lingvo_pipe.planning import overheads as overheads_lib


@dataclasses.dataclass(frozen=True)
class StepSeconds:
  """`critical` the simulated step with the devices as separate machines,
  `shared` with them sharing one machine's cores at their concurrency
  (never less than `critical`): the prediction."""
  critical: float
  shared: float

  @property
  def seconds(self) -> float:
    return max(self.critical, self.shared)


def CellCosts(layer_costs: Sequence[measured_costs.LayerCost],
              splits: Sequence[int]) -> List[measured_costs.LayerCost]:
  """Per cell of `splits` (partition's split points) its layers' costs summed."""
  return [measured_costs.LayerCost(sum(c.forward_s for c in cell),
                                   sum(c.input_grad_s for c in cell),
                                   sum(c.weight_grad_s for c in cell),
                                   accumulate_s=sum(c.accumulate_s for c in cell))
          for cell in partition.SplitLayers(list(layer_costs), list(splits))]


def DeferringCosts(micro: Sequence[measured_costs.LayerCost],
                   whole_batch: Sequence[measured_costs.LayerCost],
                   shares: Sequence[float]) -> Tuple[List[measured_costs.LayerCost],
                                                     List[measured_costs.LayerCost]]:
  """Per layer, what a backward that defers weight gradients costs at the
  micro-batch (`micro` but the weight gradients and adds of the share of
  its weights deferred) and what the deferred share's product costs once
  per step (of `whole_batch`'s weight gradients, at the whole batch);
  `shares` per layer (deferral.Shares)."""
  deferring = [dataclasses.replace(c, weight_grad_s=c.weight_grad_s * (1 - s),
                                   accumulate_s=c.accumulate_s * (1 - s))
               for c, s in zip(micro, shares)]
  deferred = [measured_costs.LayerCost(0.0, 0.0, c.weight_grad_s * s)
              for c, s in zip(whole_batch, shares)]
  return deferring, deferred


def Predict(step: program.Program, cells: Sequence[measured_costs.LayerCost],
            concurrency: float,
            overheads: overheads_lib.Overheads = overheads_lib.Overheads(),
            deferring: Sequence[measured_costs.LayerCost] = (),
            deferred: Sequence[measured_costs.LayerCost] = ()) -> StepSeconds:
  """The step's seconds (module docstring): `cells` per cell of the
  program's schedule (at the micro-batch), `concurrency` of its devices
  (>= 1); per cell where its backwards defer weight gradients, `deferring`
  and `deferred` (DeferringCosts, summed per cell; if not given, all its
  weight gradients defer, M micro-batches' worth)."""
  counts = {len(cells), len(deferring) or len(cells), len(deferred) or len(cells)}
  if counts != {step.schedule.num_cells} or concurrency < 1:
    raise ValueError(f'{len(cells)} cell costs ({len(deferring)} deferring, {len(deferred)} '
                     f'deferred) for {step.schedule.num_cells} cells, concurrency '
                     f'{concurrency}: give one cost per cell and a concurrency >= 1.')
  num_micro = step.schedule.num_micro_batches
  if not deferring:
    deferring = [dataclasses.replace(c, weight_grad_s=0.0, accumulate_s=0.0) for c in cells]
  if not deferred:
    deferred = [measured_costs.LayerCost(0.0, 0.0, num_micro * c.weight_grad_s) for c in cells]
  costs = [deferring[c] if step.DefersToStepEnd(c) else cells[c] for c in range(len(cells))]
  extra = (overheads.loop_action_s if step.emission == program.Emission.LOOP
           else overheads.action_s)
  per_action: Dict[Any, float] = {
      a: _ActionSeconds(step, a, costs[a.cell]) + extra
      for _, _, a in step.schedule.Positions()}
  for c, last in _LastBackwards(step).items():
    per_action[last] += deferred[c].weight_grad_s
  for a in _Accumulations(step):
    per_action[a] += costs[a.cell].accumulate_s
  timed = simulate.Costs(per_action=per_action)
  critical = simulate.Simulate(step.schedule, timed).step_time
  shared = simulate.Simulate(step.schedule, timed, concurrency=concurrency).step_time
  return StepSeconds(critical + overheads.step_s, shared + overheads.step_s)


def _LastBackwards(step: program.Program) -> Dict[int, Any]:
  """Per cell that defers its weight gradients to the step's end, its
  last backward action on its device."""
  last = {}
  for _, _, a in step.schedule.Positions():
    if a.kind in (Kind.B, Kind.I) and step.DefersToStepEnd(a.cell):
      last[a.cell] = a
  return last


def _Accumulations(step: program.Program) -> List[Any]:
  """The actions that add their weight gradients into the cell's
  accumulators: each that computes them but the cell's first on its
  device (which assigns)."""
  adds, seen = [], set()
  for _, _, a in step.schedule.Positions():
    if _MakesWeightGrads(step, a):
      if a.cell in seen:
        adds.append(a)
      seen.add(a.cell)
  return adds


def _MakesWeightGrads(step: program.Program, a) -> bool:
  """Whether action `a` computes its micro-batch's weight gradients (a W,
  or a backward not split into I and W; where they are deferred, those
  not deferred)."""
  if a.kind in (Kind.F, Kind.REDUCE):
    return False
  split = step.decisions[(a.cell, a.micro)].split
  return split if a.kind == Kind.W else not split


def _ActionSeconds(step: program.Program, a, cell: measured_costs.LayerCost) -> float:
  if a.kind == Kind.F:
    return cell.forward_s
  if a.kind == Kind.REDUCE:
    return 0.0
  weights = cell.weight_grad_s if _MakesWeightGrads(step, a) else 0.0
  if a.kind == Kind.W:
    return weights
  return cell.input_grad_s + weights + step.RecomputeUnits(a.cell, a.micro) * cell.forward_s
