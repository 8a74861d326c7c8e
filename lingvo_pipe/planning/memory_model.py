"""The planner's memory model: each device's peak bytes under a step's program.

Memory model of cell k (on device k), batch N, M micro-batches, n = N/M.
act(x) sums LayerMeta.act_bytes of the cell's layers at batch x; in(x) are
the bytes of the cell's inputs at batch x; in_l(x) those of layer l's inputs;
big(n) is the largest single layer's act_bytes at n, tmp(n) the largest
of what one layer's backward holds while it runs (below). Stashed inputs
take the dtype of the layer that reads them (fprop_dtype, else dtype).

    params(k) = sum of LayerMeta.param_bytes
    state(k)  = optimizer_slots * params(k) + summed(k) + factors(k)
    act(k)    = NONE:      act(N)                           + tmp(n)
                PER_CELL:  in(N) + act(n)                   + tmp(n)
                PER_LAYER: in(N) + sum_l in_l(n) + big(n)   + tmp(n)
    peak(k)   = params(k) + state(k) + max(act(k), upd(k))  gradients held
                params(k) + state(k) + act(k) + upd(k)      updated as made

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
in_l(n), big(n) and tmp(n)) and the one gradient being made (below): the
device runs one backward at a time, so it counts the largest of its
cells'.

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
params, the one gradient being made (ffn's K=4 v=2 M=1 interleaved,
worker per device: 57.4 MiB at the fullest device, 68.2 predicted with
one such gradient per cell).

upd(k) is the two largest layers' params of the device (one layer's on a
device of one, the largest over all its cells on a device of several): an
update makes a temporary of a weight's size (a scaled gradient, an
optimizer's step), and TensorFlow runs two at once where two are ready
(its inter-op threads), whatever cells they belong to. Where the step
holds every gradient to its end, the updates run after the activations
are freed, and their temporaries take the place of act: peak_bench's
held-gradient steps (ffn, K=2 M=4, all 24 schedule rows) measure
0.92-1.04 of the range's low end so, 0.71-0.94 of it counted on top.
Where each weight is updated as its gradient is made
(trial.Run), updates run while other activations live: measured with a
worker process per device (benchmarks/device_peaks_bench.py), the uneven
stack's devices of two projections at K=4 M=8 1F1B held a weight
(4.5 MiB) above one update's temporary, its unpipelined step 5 MiB.

act counts what each layer keeps for its backward: LayerMeta.act_bytes
(every tensor its forward makes), or where given, the bytes measured off
its traced gradient (measured_costs' kept_bytes, at n; at N, M times them).
tmp(n), the backward's gradient temporaries, is then the layer's output
bytes at n (the gradient it receives; what else it makes frees what it
kept), else its act_bytes again (backpropagating one layer of one
micro-batch holds about that layer's activations again).

Not modelled: the pipeline's own inputs and outputs, the loss, and
allocator fragmentation. On CPU all logical devices share one allocator,
so a measured BFC peak compares with the range from planner.PlanRow's
`shared_peak_bytes` (every cell's params and state, one cell's
activations: the cells' activation peaks never coincide, as at M=1 where
the backward visits one cell after the other) to `total_peak_bytes`
(they all coincide); a device's own peak is measured with a process per
device (benchmarks/device_peaks_bench.py). FPropMeta's act_bytes
estimate from shapes what a forward makes (docs/benchmarks/profiles.md
compares them with measured peaks): 1.5x what TensorFlow keeps on the
transformer workload, 0.8x on the uneven stack; the tuner gives the
measured kept_bytes.

The model reads the step's program (program.Lower, for the emission the
pipeline would use at M): a cell whose forwards the program does not all
keep (PER_CELL, PER_LAYER, and NONE in a loop, which recomputes) is
counted as under PER_CELL, and weight-gradient inputs are held only where
its backwards split.
"""

import dataclasses
from typing import List, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.pipeline.lowering import program
from lingvo_pipe.pipeline.lowering.remat import RematPolicy
from lingvo_pipe.pipeline.schedules import simulate
from lingvo_pipe.planning import deferral


@dataclasses.dataclass(frozen=True)
class Layer:
  """One layer's metadata and input bytes at batch N and at N/M (micro),
  and what its backward holds while it runs at n (module docstring)."""
  full: layer_meta.LayerMeta
  micro: layer_meta.LayerMeta
  in_bytes: int
  micro_in_bytes: int
  temporaries: int


def Profile(layers: Sequence[hyperparams.Params], shapes: tuple, micro_shapes: tuple,
            num_micro: int, kept_bytes: Sequence[int] = ()) -> List[Layer]:
  """Each layer of the chain `layers` at the batch (`shapes`, the
  pipeline's inputs) and at the micro-batch (`micro_shapes`); with
  `kept_bytes` (per layer, measured at the micro-batch), those as what its
  forward keeps."""
  full = Chain(layers, shapes)
  micro = Chain(layers, micro_shapes)
  profile = [Layer(f, m, _InBytes(p, f_in), _InBytes(p, m_in), m.act_bytes)
             for p, (f_in, f), (m_in, m) in zip(layers, full, micro)]
  if kept_bytes:
    profile = [_Measured(l, kept, num_micro, _InBytes(p, l.micro.out_shapes))
               for p, l, kept in zip(layers, profile, kept_bytes)]
  return profile


def DeviceBytes(cells: Sequence[Sequence[Layer]], step: program.Program,
                optimizer_slots: int, gradients_held: bool
                ) -> Tuple[List[int], List[int], List[int]]:
  """Per device of `step`'s schedule params, state and act (module
  docstring) of `cells` (the Profile of each cell's layers), the updates'
  temporaries counted in act where `gradients_held`, else in state."""
  num_micro = step.schedule.num_micro_batches
  peaks = simulate.Simulate(step.schedule, simulate.UNIT_COSTS).CellPeaks(len(cells))
  placement = [sorted({a.cell for a in row}) for row in step.schedule.devices]
  params = _PerDevice([sum(l.full.param_bytes for l in c) for c in cells], placement)
  state = _HeldAndOneRunning([_CellState(c, step, k, optimizer_slots, gradients_held)
                              for k, c in enumerate(cells)], placement)
  act = _HeldAndOneRunning([_CellActBytes(c, _CellPolicy(step, k), f, num_micro,
                                          w if step.Splits(k) else 0)
                            for k, (c, (f, w)) in enumerate(zip(cells, peaks))], placement)
  updates = [_Updates([l for c in device for l in cells[c]]) for device in placement]
  if gradients_held:
    return params, state, [max(a, u) for a, u in zip(act, updates)]
  return params, [s + u for s, u in zip(state, updates)], act


def Chain(layers: Sequence[hyperparams.Params],
           shapes: tuple) -> List[Tuple[tuple, layer_meta.LayerMeta]]:
  """(input shapes, meta) of each layer, chaining output shapes."""
  chain = []
  for p in layers:
    meta = p.cls.FPropMeta(p, *shapes)
    chain.append((shapes, meta))
    shapes = meta.out_shapes
  return chain


def _Measured(layer: Layer, kept: int, num_micro: int, out_bytes: int) -> Layer:
  """`layer` with the measured bytes its forward keeps at n (and M times
  them at N) as its act_bytes, and its output's bytes at n (the gradient
  its backward receives) as its temporaries."""
  return dataclasses.replace(
      layer, full=dataclasses.replace(layer.full, act_bytes=num_micro * kept),
      micro=dataclasses.replace(layer.micro, act_bytes=kept), temporaries=out_bytes)


def _InBytes(p: hyperparams.Params, shapes: tuple) -> int:
  return layer_meta.Bytes(tf.nest.flatten(shapes), p.fprop_dtype or p.dtype)


def _CellActBytes(cell: Sequence[Layer], remat: RematPolicy, in_flight: int,
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


def _HeldAndOneRunning(per_cell: Sequence[Tuple[int, int]],
                       placement: Sequence[Sequence[int]]) -> List[int]:
  """Per device, of per-cell (held, one backward's) figures: what its
  cells hold, plus the largest of their backwards' (a device runs one
  backward at a time)."""
  return [sum(per_cell[c][0] for c in cells) + max(per_cell[c][1] for c in cells)
          for cells in placement]


def _CellPolicy(step: program.Program, cell: int) -> RematPolicy:
  """The policy whose memory model the cell's forwards follow: NONE only
  where the program keeps every one of them."""
  if step.policy != RematPolicy.NONE:
    return step.policy
  return RematPolicy.NONE if step.KeepsAll(cell) else RematPolicy.PER_CELL


def _FactorBytes(p: layer_meta.Projection) -> int:
  """The bytes of a deferred projection's factors for one micro-batch."""
  return p.rows * (p.in_dim + p.out_dim) * p.bytes_per_element


def _CellState(cell: Sequence[Layer], step: program.Program, k: int,
               optimizer_slots: int, gradients_held: bool) -> Tuple[int, int]:
  """state(k) of the module docstring, as (held, one backward's): the
  gradient being made where summed(k) is that alone."""
  params = sum(l.full.param_bytes for l in cell)
  largest = max(l.full.param_bytes for l in cell)
  num_micro = step.schedule.num_micro_batches
  if (not gradients_held and num_micro == 1 and step.emission == program.Emission.UNROLLED
      and _CellPolicy(step, k) == RematPolicy.NONE):
    return optimizer_slots * params, largest
  deferred = []
  if step.DefersToStepEnd(k):
    deferred = [p for l in cell for p in deferral.Deferred(l.micro, num_micro)]
  summed = params - sum(deferral.WeightBytes(p) for p in deferred)
  factors = num_micro * sum(_FactorBytes(p) for p in deferred)
  return optimizer_slots * params + summed + factors, 0


def _Updates(layers: Sequence[Layer]) -> int:
  """upd of a device holding `layers` (module docstring)."""
  return sum(sorted(l.full.param_bytes for l in layers)[-2:])


def _PerDevice(per_cell: Sequence[int], placement: Sequence[Sequence[int]]) -> List[int]:
  """Per device the sum of the per-cell figures of the cells it holds."""
  return [sum(per_cell[c] for c in cells) for cells in placement]
