"""Planner: per-device memory and step time of (schedule, K, M, remat) candidates.

The reasoning of the GPipe paper's Table 1, from the layers' FPropMeta
(nothing is built). Cells are partitioned exactly as PipeliningLayer's
automatic partition does (partition.LayerCosts, BalancedSplits, SplitLayers),
and micro-batches are its inputs split as its micro-batch contract says
(micro_batch.Contract: broadcast_inputs keep their shape).

Memory model of cell k (on device k), batch N, M micro-batches, n = N/M.
act(x) sums LayerMeta.act_bytes of the cell's layers at batch x; in(x) are
the bytes of the cell's inputs at batch x; in_l(x) those of layer l's inputs;
big(n) is the largest single layer's act_bytes at n, tmp(n) the largest
of what one layer's backward holds while it runs (below). Stashed inputs
take the dtype of the layer that reads them (fprop_dtype, else dtype).

    params(k) = sum of LayerMeta.param_bytes
    state(k)  = optimizer_slots * params(k) + summed(k) + factors(k) + upd(k)
    act(k)    = NONE:      act(N)                           + tmp(n)
                PER_CELL:  in(N) + act(n)                   + tmp(n)
                PER_LAYER: in(N) + sum_l in_l(n) + big(n)   + tmp(n)
    peak(k)   = params(k) + state(k) + act(k)

That is fill-drain, where cell k keeps all M micro-batches until its
drain. Under another schedule cell k keeps at most f(k) of them at once
(1F1B: K-k), and act(N) and in(N) become f(k) * act(n) and f(k) * in(n);
the zero-bubble schedules also keep the weight-gradient inputs of w(k)
micro-batches from their I to their W: the factors (input and output
gradient) of every LayerMeta.projections of the cell at n, but under
PER_LAYER or at M=1, where nothing is deferred. f(k) and w(k) are
the simulator's CellPeaks of the schedule's actions in unit time. Where a
device holds several cells (interleaved: j mod K; ZB-V: d and 2K-1-d), its
figures are the sums over the cells the schedule puts on it, but for the
part of act that only a running backward holds (the recomputed act(n) or
in_l(n), big(n) and tmp(n)): the device runs one backward at a time,
so it counts the largest of its cells'.

summed(k) are the gradient accumulators: params(k) but the weights whose
gradient is one product per step (where the program defers all of cell
k's backwards without splitting them, the cell's deferral.Deferred),
whose factors for all M micro-batches are held to the step's end
instead: factors(k), M * rows * (in + out) elements each. The
accumulators are all live at the step's end where the step reads every
gradient before it updates a weight (`gradients_held`: the trainer's
global norm and finiteness check). Where each weight is updated as soon
as its gradient exists (trial.Run's descent), an unrolled step with one
micro-batch accumulates nothing in a cell whose backward runs inline (no
recomputation: a recomputing cell's backward is one call that returns
all its gradients at once): summed(k) is then the largest layer's
params, the one gradient being made.

upd(k) is the largest layer's params: an update makes a temporary of a
weight's size (a scaled gradient, an optimizer's step; measured with a
worker process per device: benchmarks/device_peaks_bench.py).

act counts what each layer keeps for its backward: LayerMeta.act_bytes
(every tensor its forward makes), or where given, the bytes measured off
its traced gradient (measured_costs' kept_bytes, at n; at N, M times them).
tmp(n), the backward's gradient temporaries, is then the layer's output
bytes at n (the gradient it receives; what else it makes frees what it
kept), else its act_bytes again (backpropagating one layer of one
micro-batch holds about that layer's activations again).

Not modelled: the pipeline's own inputs and outputs, the loss, and
allocator fragmentation. On CPU all logical devices share one
allocator, so a measured BFC peak compares with the range from
`shared_peak_bytes` (every cell's params and state, one cell's activations:
the cells' activation peaks never coincide, as at M=1 where the backward
visits one cell after the other) to `total_peak_bytes` (they all coincide);
a device's own peak is measured with a process per device
(benchmarks/device_peaks_bench.py). FPropMeta's act_bytes estimate from
shapes what a forward makes (docs/benchmarks/profiles.md compares them
with measured peaks): 1.5x what TensorFlow keeps on the transformer
workload, 0.8x on the uneven stack; the tuner gives the measured
kept_bytes.

Both models read the step's program (program.Lower, for the emission the
pipeline would use at M: a loop per device from loop_min_micro_batches):
a cell whose forwards the program does not all keep (PER_CELL, PER_LAYER,
and NONE in a loop, which recomputes) is counted as under PER_CELL, and
weight-gradient inputs are held only where its backwards split.

Step-time model, in forward FLOPs: the simulator runs the schedule's
actions, each costing its cell's forward FLOPs at n times: F 1; B 2, plus
the recomputation of a micro-batch the program does not keep (the whole
cell 1, PER_LAYER 2); where the program splits a backward (zero-bubble
schedules) I 1 plus that recomputation and W 1, else I is the whole B and
W nothing. The bubble is schedule.Bubble: the idle share with F = I = W,
as the profile shows it.
"""

import dataclasses
from typing import Any, Callable, Iterable, List, Optional, Sequence, Tuple

import tensorflow as tf

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
from lingvo_pipe.planning import deferral


@dataclasses.dataclass
class PlanRow:
  """The prediction for one candidate; per-device lists are indexed by
  device (by cell, but for the interleaved schedule's v cells per device).

  Attributes:
    param_bytes, state_bytes, act_bytes, peak_bytes: params(k), state(k),
      act(k) and peak(k) of the module docstring, one entry per cell.
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


@dataclasses.dataclass(frozen=True)
class _Layer:
  """One layer's metadata and input bytes at batch N and at N/M (micro),
  and what its backward holds while it runs at n (module docstring)."""
  full: layer_meta.LayerMeta
  micro: layer_meta.LayerMeta
  in_bytes: int
  micro_in_bytes: int
  temporaries: int


def _Chain(layers: Sequence[hyperparams.Params],
           shapes: tuple) -> List[Tuple[tuple, layer_meta.LayerMeta]]:
  """(input shapes, meta) of each layer, chaining output shapes."""
  chain = []
  for p in layers:
    meta = p.cls.FPropMeta(p, *shapes)
    chain.append((shapes, meta))
    shapes = meta.out_shapes
  return chain


def _Measured(layer: _Layer, kept: int, num_micro: int, out_bytes: int) -> _Layer:
  """`layer` with the measured bytes its forward keeps at n (and M times
  them at N) as its act_bytes, and its output's bytes at n (the gradient
  its backward receives) as its temporaries."""
  return dataclasses.replace(
      layer, full=dataclasses.replace(layer.full, act_bytes=num_micro * kept),
      micro=dataclasses.replace(layer.micro, act_bytes=kept), temporaries=out_bytes)


def _InBytes(p: hyperparams.Params, shapes: tuple) -> int:
  return layer_meta.Bytes(tf.nest.flatten(shapes), p.fprop_dtype or p.dtype)


def _CheckLayers(layers: Sequence[hyperparams.Params]) -> None:
  if not layers:
    raise ValueError('The planner needs at least one layer; layers is empty.')


def _CellActBytes(cell: Sequence[_Layer], remat: RematPolicy, in_flight: int,
                  num_micro: int, weight_inputs: int) -> Tuple[int, int]:
  """act(k) of the module docstring, with `in_flight` micro-batches kept
  and the weight-gradient inputs of `weight_inputs` ones, as (held, one
  backward's): what the cell holds across its actions, and what one of
  its backwards adds while it runs (its recomputation and temporaries)."""
  big = max(l.micro.act_bytes for l in cell)
  temporaries = max(l.temporaries for l in cell)
  held = weight_inputs * sum(_FactorBytes(p) for l in cell for p in l.micro.projections)

  def Kept(full: int, micro: int) -> int:
    return full if in_flight >= num_micro else in_flight * micro

  if remat == RematPolicy.NONE:
    return sum(Kept(l.full.act_bytes, l.micro.act_bytes) for l in cell) + held, temporaries
  stash = Kept(cell[0].in_bytes, cell[0].micro_in_bytes)
  if remat == RematPolicy.PER_CELL:
    return stash + held, sum(l.micro.act_bytes for l in cell) + temporaries
  return stash, sum(l.micro_in_bytes for l in cell) + big + temporaries


def _DeviceAct(per_cell: Sequence[Tuple[int, int]],
               placement: Sequence[Sequence[int]]) -> List[int]:
  """Per device act: what its cells hold, plus the largest of their
  backwards (a device runs one backward at a time)."""
  return [sum(per_cell[c][0] for c in cells) + max(per_cell[c][1] for c in cells)
          for cells in placement]


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


def _CellPolicy(step: program.Program, cell: int) -> RematPolicy:
  """The policy whose memory model the cell's forwards follow: NONE only
  where the program keeps every one of them."""
  if step.policy != RematPolicy.NONE:
    return step.policy
  return RematPolicy.NONE if step.KeepsAll(cell) else RematPolicy.PER_CELL


def _FactorBytes(p: layer_meta.Projection) -> int:
  """The bytes of a deferred projection's factors for one micro-batch."""
  return p.rows * (p.in_dim + p.out_dim) * p.bytes_per_element


def _CellState(cell: Sequence[_Layer], step: program.Program, k: int,
               optimizer_slots: int, gradients_held: bool) -> int:
  """state(k) of the module docstring."""
  params = sum(l.full.param_bytes for l in cell)
  largest = max(l.full.param_bytes for l in cell)
  num_micro = step.schedule.num_micro_batches
  if (not gradients_held and num_micro == 1 and step.emission == program.Emission.UNROLLED
      and _CellPolicy(step, k) == RematPolicy.NONE):
    return optimizer_slots * params + 2 * largest
  deferred = []
  if step.DefersToStepEnd(k):
    deferred = [p for l in cell for p in deferral.Deferred(l.micro, num_micro)]
  summed = params - sum(p.in_dim * p.out_dim * p.bytes_per_element for p in deferred)
  factors = num_micro * sum(_FactorBytes(p) for p in deferred)
  return optimizer_slots * params + summed + factors + largest


def _PerDevice(per_cell: Sequence[int], placement: Sequence[Sequence[int]]) -> List[int]:
  """Per device the sum of the per-cell figures of the cells it holds."""
  return [sum(per_cell[c] for c in cells) for cells in placement]


def Estimate(layers: Sequence[hyperparams.Params], input_shapes: Sequence[Any],
             num_cells: int, num_micro_batches: int, remat: RematPolicy,
             optimizer_slots: int = 0, batch_dim: int = 0,
             cost: partition.CostKind = partition.CostKind.FLOPS,
             remat_last_micro_batch: bool = False,
             broadcast_inputs: Sequence[Any] = (),
             schedule_kind: schedule.ScheduleKind = schedule.ScheduleKind.GPIPE,
             cells_per_device: int = 1, loop_min_micro_batches: int = 0,
             layer_costs: Sequence[float] = (), kept_bytes: Sequence[int] = (),
             gradients_held: bool = True) -> PlanRow:
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
  peaks = simulate.Simulate(schedule_actions, simulate.UNIT_COSTS).CellPeaks(num_cells)
  placement = [sorted({a.cell for a in row}) for row in schedule_actions.devices]
  splits = partition.BalancedSplits(
      partition.LayerCosts(layers, input_shapes, cost, layer_costs), num_cells)
  full = _Chain(layers, shapes)
  micro = _Chain(layers, contract.SplitShapes(shapes, num_micro_batches))
  profile = [_Layer(f, m, _InBytes(p, f_in), _InBytes(p, m_in), m.act_bytes)
             for p, (f_in, f), (m_in, m) in zip(layers, full, micro)]
  if kept_bytes:
    profile = [_Measured(l, kept, num_micro_batches, _InBytes(p, l.micro.out_shapes))
               for p, l, kept in zip(layers, profile, kept_bytes)]
  cells = partition.SplitLayers(profile, splits)
  params = _PerDevice([sum(l.full.param_bytes for l in c) for c in cells], placement)
  state = _PerDevice([_CellState(c, step, k, optimizer_slots, gradients_held)
                      for k, c in enumerate(cells)], placement)
  act = _DeviceAct([_CellActBytes(c, _CellPolicy(step, k), f, num_micro_batches,
                                  w if step.Splits(k) else 0)
                    for k, (c, (f, w)) in enumerate(zip(cells, peaks))], placement)
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
