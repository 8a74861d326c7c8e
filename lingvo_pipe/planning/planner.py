"""Planner: per-device memory and step time of (schedule, K, M, remat) candidates.

The reasoning of the GPipe paper's Table 1, from the layers' FPropMeta
(nothing is built). Cells are partitioned exactly as PipeliningLayer's
automatic partition does (partition.LayerCosts, BalancedSplits, SplitLayers),
and micro-batches are its inputs split as its micro-batch contract says
(micro_batch.Contract: broadcast_inputs keep their shape).

Each device's peak is memory_model's (params, state and activations per
cell, its docstring). Both models read the step's program (program.Lower,
for the emission the pipeline would use at M: a loop per device from
loop_min_micro_batches).

Step-time model, in forward FLOPs: the simulator runs the schedule's
actions, each costing its cell's forward FLOPs at the micro-batch times:
F 1; B 2, plus the recomputation of a micro-batch the program does not
keep (the whole cell 1, PER_LAYER 2); where the program splits a backward
(zero-bubble schedules) I 1 plus that recomputation and W 1, else I is
the whole B and W nothing. The bubble is schedule.Bubble: the idle share with F = I = W,
as the profile shows it.
"""

import dataclasses
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.pipeline.layout import micro_batch
from lingvo_pipe.pipeline.layout import micro_batch_count
from lingvo_pipe.pipeline.layout import partition
from lingvo_pipe.pipeline.lowering import program
from lingvo_pipe.pipeline.lowering.remat import RematPolicy
from lingvo_pipe.pipeline.schedules import schedule
from lingvo_pipe.pipeline.schedules import simulate
from lingvo_pipe.pipeline.schedules.actions import ActionKind as Kind
from lingvo_pipe.planning import memory_model


@dataclasses.dataclass
class PlanRow:
  """The prediction for one candidate; per-device lists are indexed by
  device (by cell, but for the interleaved schedule's v cells per device).

  Attributes:
    param_bytes, state_bytes, act_bytes, peak_bytes: params(k), state(k),
      act(k) and peak(k) of memory_model's docstring, one entry per device;
      upd(k) in act_bytes (their max) where the gradients are held, else
      in state_bytes.
    total_peak_bytes: sum of peak_bytes: a shared allocator's (CPU's) peak
      if the devices' peaks coincide.
    shared_peak_bytes: params and state of every cell plus the largest
      act_bytes: a shared allocator's peak if no two cells' activation
      peaks coincide.
    bubble: idle share of the devices with F = I = W (module docstring)
      (fill-drain and 1F1B: (K-1)/(M+K-1)).
    relative_step_time: the step-time model, in forward FLOPs.
    fits: max(peak_bytes) <= the budget; set by Plan.
    schedule_kind: the ScheduleKind.
    cells_per_device: v (the interleaved schedule's); num_cells is K*v.
    emission: how the step is built (a loop per device from
      loop_min_micro_batches).
  """
  num_cells: int
  num_micro_batches: int
  remat: RematPolicy
  param_bytes: List[int]
  state_bytes: List[int]
  act_bytes: List[int]
  peak_bytes: List[int]
  total_peak_bytes: int
  shared_peak_bytes: int
  bubble: float
  relative_step_time: float
  fits: bool = False
  schedule_kind: schedule.ScheduleKind = schedule.ScheduleKind.GPIPE
  cells_per_device: int = 1
  emission: program.Emission = program.Emission.UNROLLED

  @property
  def num_devices(self) -> int:
    return self.num_cells // self.cells_per_device

  @property
  def max_peak_bytes(self) -> int:
    return max(self.peak_bytes)


def _CheckLayers(layers: Sequence[hyperparams.Params]) -> None:
  if not layers:
    raise ValueError('The planner needs at least one layer; layers is empty.')


def _StepFlops(step: program.Program, cell_flops: Sequence[int]) -> float:
  """The step-time model of the module docstring: the simulated step time."""
  per_action = {}
  for _, _, a in step.schedule.Positions():
    flops = float(cell_flops[a.cell])
    if a.kind == Kind.F:
      per_action[a] = flops
      continue
    split = step.decisions[(a.cell, a.micro)].split
    recompute = step.RecomputeUnits(a.cell, a.micro)
    if a.kind == Kind.W:
      per_action[a] = flops if split else 0.0
    elif a.kind == Kind.I and split:
      per_action[a] = (1 + recompute) * flops
    else:
      per_action[a] = (2 + recompute) * flops
  return simulate.Simulate(step.schedule, simulate.Costs(per_action=per_action)).step_time


def Estimate(layers: Sequence[hyperparams.Params], input_shapes: Sequence[Any],
             num_cells: int, num_micro_batches: int, remat: RematPolicy,
             optimizer_slots: int = 0, batch_dim: int = 0,
             cost: partition.CostKind = partition.CostKind.FLOPS,
             remat_last_micro_batch: bool = False,
             broadcast_inputs: Sequence[Any] = (),
             schedule_kind: schedule.ScheduleKind = schedule.ScheduleKind.GPIPE,
             cells_per_device: int = 1, loop_min_micro_batches: int = 0,
             layer_costs: Sequence[float] = (), kept_bytes: Sequence[int] = (),
             gradients_held: bool = True,
             profile: Optional[Sequence[memory_model.Layer]] = None) -> PlanRow:
  """Predicts memory and step time of `layers` in K cells and M micro-batches.

  Args:
    layers: params of the pipeline's layers, in order (PipeliningLayer's
      p.layers).
    input_shapes: shapes of the pipeline inputs, batch included.
    num_cells: K, partitioned as PipeliningLayer does with num_partitions.
    num_micro_batches: M; must divide the batch.
    remat: a RematPolicy.
    optimizer_slots: optimizer state per parameter (SGD 0, momentum 1, Adam 2).
    batch_dim: 0 for batch-major inputs, 1 for time-major.
    cost: what the partition balances (PipeliningLayer's p.cost).
    remat_last_micro_batch: PipeliningLayer's p.remat_last_micro_batch: with
      PER_CELL, recompute each cell's last micro-batch too.
    broadcast_inputs: PipeliningLayer's p.broadcast_inputs: inputs that
      every micro-batch gets whole; all others are split.
    schedule_kind: PipeliningLayer's p.schedule.
    cells_per_device: PipeliningLayer's p.cells_per_device, v: num_cells
      cells on num_cells / v devices.
    loop_min_micro_batches: from which M the step is a loop per device
      (plan.LoopFromM's figure; 0: never).
    layer_costs: PipeliningLayer's p.layer_costs, balanced under
      cost=CostKind.GIVEN.
    kept_bytes: per layer, the bytes its forward keeps for its backward at
      the micro-batch (measured_costs.LayerCost.kept_bytes), in place of
      LayerMeta.act_bytes; empty: the latter.
    gradients_held: whether the step reads every gradient before it
      updates any weight (the trainer: its global norm); False where each
      weight is updated as its gradient is made (trial.Run).
    profile: memory_model.Profile of these layers, shapes, M and
      kept_bytes, if made already (the tuner's Search makes one per M for
      all its candidates); else Estimate makes it.

  Returns:
    The PlanRow (fits is left False; Plan sets it).

  Raises:
    ValueError: if layers is empty, num_cells exceeds the number of layers,
      M does not divide the batch, optimizer_slots < 0, batch_dim is not
      0 or 1, the inputs break the micro-batch contract (micro_batch), or
      the schedule cannot run the cells (schedule.Actions).
    TypeError: if remat is not a RematPolicy.
  """
  if not isinstance(remat, RematPolicy):
    raise TypeError(f'remat must be a RematPolicy, got {remat!r}.')
  _CheckLayers(layers)
  if optimizer_slots < 0 or batch_dim not in (0, 1):
    raise ValueError(f'optimizer_slots ({optimizer_slots}) must be >= 0 and '
                     f'batch_dim ({batch_dim}) 0 or 1.')
  contract = micro_batch.Contract(batch_dim, broadcast_inputs)
  shapes = layer_meta.Shapes(*input_shapes)
  micro_batch_count.CheckDivides(contract.InputLayout(shapes).batch_size,
                           num_micro_batches)
  if kept_bytes and len(kept_bytes) != len(layers):
    raise ValueError(f'kept_bytes has {len(kept_bytes)} entries for {len(layers)} layers.')
  if cells_per_device < 1 or num_cells % cells_per_device:
    raise ValueError(f'num_cells ({num_cells}) must be a multiple of '
                     f'cells_per_device ({cells_per_device}).')
  num_devices = num_cells // cells_per_device
  schedule_actions = schedule.Actions(schedule_kind, num_devices, num_micro_batches,
                                      cells_per_device)
  emission = program.EmissionOf(loop_min_micro_batches, num_micro_batches)
  step = program.Lower(schedule_actions, remat, remat_last_micro_batch, 1,
                       program.Step.LOSS_INSIDE, emission)
  splits = partition.BalancedSplits(
      partition.LayerCosts(layers, input_shapes, cost, layer_costs), num_cells)
  if profile is None:
    profile = memory_model.Profile(layers, shapes,
                                   contract.SplitShapes(shapes, num_micro_batches),
                                   num_micro_batches, kept_bytes)
  cells = partition.SplitLayers(profile, splits)
  params, state, act = memory_model.DeviceBytes(cells, step, optimizer_slots, gradients_held)
  peak = [p + s + a for p, s, a in zip(params, state, act)]
  step_flops = _StepFlops(step, [sum(l.micro.flops for l in c) for c in cells])
  return PlanRow(
      num_cells, num_micro_batches, remat, params, state, act, peak, sum(peak),
      sum(params) + sum(state) + max(act), schedule.Bubble(schedule_actions), step_flops,
      schedule_kind=schedule_kind, cells_per_device=cells_per_device, emission=emission)


def Plan(layers: Sequence[hyperparams.Params], input_shapes: Sequence[Any],
         budget_bytes: int, cells: Iterable[int] = (1, 2, 4, 8),
         micro_batches: Iterable[int] = (1, 2, 4, 8, 16),
         remats: Iterable[RematPolicy] = tuple(RematPolicy),
         optimizer_slots: int = 0, batch_dim: int = 0,
         cost: partition.CostKind = partition.CostKind.FLOPS,
         remat_last_micro_batch: bool = False,
         broadcast_inputs: Sequence[Any] = (),
         schedules: Iterable[Tuple[schedule.ScheduleKind, int]] = (
             (schedule.ScheduleKind.GPIPE, 1),),
         loop_from: Optional[Callable[[schedule.ScheduleKind, RematPolicy], int]] = None,
         layer_costs: Sequence[float] = ()) -> List[PlanRow]:
  """Estimates every possible candidate and marks those within the budget.

  Combinations with more cells than layers, with M not dividing the batch
  or that the schedule cannot run (v cells on one device) are
  skipped. Other arguments are as for Estimate.

  Args:
    budget_bytes: memory of each device.
    cells: candidate K, devices (each with v cells under the interleaved
      schedule).
    schedules: candidate (ScheduleKind, cells_per_device v) pairs.
    loop_from: (schedule, remat) -> Estimate's loop_min_micro_batches, as
      the pipeline's params would resolve it (plan.LoopFromM); None: never
      a loop.

  Returns:
    The rows in the order of cells, micro_batches, schedules, remats.

  Raises:
    ValueError: if budget_bytes <= 0, or as Estimate for other bad values.
  """
  if budget_bytes <= 0:
    raise ValueError(f'budget_bytes must be > 0, got {budget_bytes}.')
  _CheckLayers(layers)
  batch = micro_batch.Contract(batch_dim, broadcast_inputs).InputLayout(
      layer_meta.Shapes(*input_shapes)).batch_size
  rows = []
  schedules = list(schedules)
  remats = list(remats)
  for k in cells:
    for m in micro_batches:
      if k > len(layers) or m < 1 or batch % m:
        continue
      for kind, v in schedules:
        # v cells a device on one device is no pipeline (plan.Make refuses it).
        if k * v > len(layers) or (v > 1 and k == 1):
          continue
        for remat in remats:
          row = Estimate(layers, input_shapes, k * v, m, remat, optimizer_slots,
                         batch_dim, cost, remat_last_micro_batch, broadcast_inputs,
                         kind, v, loop_from(kind, remat) if loop_from else 0,
                         layer_costs)
          row.fits = row.max_peak_bytes <= budget_bytes
          rows.append(row)
  return rows
