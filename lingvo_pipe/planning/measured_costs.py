"""What each layer of a pipeline costs on this machine, measured.

FLOPs mislead where layers are not matmul-bound (elementwise, memory
bound, small or badly shaped products), so the partition can balance
measured seconds instead: `Measure` times every layer of a
PipeliningLayer's `layers` alone, on one device, at the micro-batch size,
feeding each the previous one's real outputs; `Balanced` gives the params
that balance them in the pipeline's own step (cost=CostKind.GIVEN,
layer_costs: StepShares, where the forwards that remat runs again count).

Per layer four traced functions run after a warm-up: its forward (F),
the forward and the gradient of its floating inputs (F + I), the forward
and the gradients of its inputs and its weights (F + I + W), and adding
weight-sized tensors into accumulators (LayerCost.accumulate_s), each
once per round in `repeats` rounds over all the layers (so that drift, a
machine growing busier, falls alike on every layer: timed layer after
layer, identical layers of ffn measured 8-12 ms), the fastest kept (as
trial.StepSeconds: other work on the machine only adds time), and
layers of one kind (_Kind) get the median of their fastest; each
returns one element of each result, not the results (_FirstElements),
and a layer that draws dropout masks draws new ones each run, as in
training (step_seeds.Counter: from a constant seed Grappler would fold
them into constants, never drawn). The gradients' cotangent is the
layer's outputs, so that they wait for the whole forward, as in a step,
where it arrives after it: with a constant one Grappler pruned the
forward's last product from the gradient functions and ran the rest
beside them (x @ W's input gradient measured about 0, now 0.9 of its
forward; ffn's input gradients at 64 rows 27 ms, now 40). I and W are the
differences, at least 0 (a difference of two noisy timings can go below
it). Each layer is built from its params with fresh
variables: what it costs does not depend on their values. The third
function's graph also tells what the forward keeps for the backward
(kept_bytes): the planner's activations, where FPropMeta estimates them
from shapes.
"""

import contextlib
import dataclasses
import logging
import statistics
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_params
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core import step_seeds
from lingvo_pipe.core.layers import containers
from lingvo_pipe.pipeline.layout import micro_batch
from lingvo_pipe.pipeline.layout import micro_batch_count
from lingvo_pipe.pipeline.layout import partition
from lingvo_pipe.pipeline.layout import plan as plan_lib
from lingvo_pipe.pipeline.lowering import program
from lingvo_pipe.planning import kept_bytes


# A measured time is at least this (a layer's cost must be positive to
# be balanced: partition.CheckGivenCosts).
_MIN_SECONDS = 1e-6


@dataclasses.dataclass(frozen=True)
class LayerCost:
  """Measured seconds of one layer on one micro-batch, the bytes its
  forward keeps for its backward (kept_bytes.Chain; None: unknown), and the
  seconds of adding its weight gradients into accumulators (what a
  backward does after a step's first when it does not defer them: on ffn
  at M=8, 16 layers of 8 MiB each, the 7 adds took 55 ms of a 0.27 s
  step)."""
  forward_s: float
  input_grad_s: float
  weight_grad_s: float
  kept_bytes: Optional[int] = None
  accumulate_s: float = 0.0

  @property
  def step_s(self) -> float:
    """Its share of a training step: forward, input and weight gradients."""
    return self.forward_s + self.input_grad_s + self.weight_grad_s


def Measure(pipeline: hyperparams.Params, inputs: Sequence[Any], repeats: int = 5,
            device: str = '/device:CPU:0') -> List[LayerCost]:
  """Each of `pipeline`'s layers (PipeliningLayer params with `layers`)
  timed on the first micro-batch of `inputs` (the pipeline's inputs, a
  whole batch), on `device`.

  Raises:
    ValueError: if the pipeline has no `layers` (a cell_tpl pipeline is
      partitioned by hand), repeats < 1, or the inputs do not split into
      its micro-batches.
  """
  if not pipeline.layers:
    raise ValueError(f'PipeliningLayer {pipeline.name!r}: Measure times the entries of '
                     'p.layers; this pipeline has none (cell_tpl is a manual partition).')
  if repeats < 1:
    raise ValueError(f'repeats ({repeats}) must be >= 1.')
  contract = micro_batch.Contract.FromParams(pipeline)
  batch = contract.InputLayout(tuple(inputs)).batch_size
  num_micro = micro_batch_count.NumMicroBatches(pipeline, batch)
  x = contract.SplitInputs(tuple(inputs), num_micro)[0]
  functions, kept, kinds = [], [], []
  with tf.device(device), _QuietRetracing():
    seeds = step_seeds.Counter()
    for p in base_params.WithInheritedBaseParams(pipeline).layers:
      layer = p.Instantiate()
      fns, layer_kept = _TracedFunctions(layer, x, seeds)
      functions.append(fns)
      kept.append(layer_kept)
      kinds.append(_Kind(p, x))
      x = containers.AsTuple(layer.FProp(layer.theta, *x))
    times: List[List[List[float]]] = [[[] for _ in fns] for fns in functions]
    for _ in range(repeats):
      for per_layer, fns in zip(times, functions):
        for per_fn, fn in zip(per_layer, fns):
          per_fn.append(_Seconds(fn))
  call = _CallSeconds(repeats * len(functions))
  held: Sequence[Optional[int]] = [None] * len(kept)
  if all(k is not None for k in kept):
    held = kept_bytes.Chain([k for k in kept if k is not None])
  alike: Dict[Tuple[str, Tuple[Any, ...]], List[List[float]]] = {}
  for kind, per_layer in zip(kinds, times):
    alike.setdefault(kind, []).append([max(min(t) - call, _MIN_SECONDS) for t in per_layer])
  median = {kind: [statistics.median(runs) for runs in zip(*fastest)]
            for kind, fastest in alike.items()}
  costs = []
  for kind, layer_held in zip(kinds, held):
    forward, with_inputs, with_weights, accumulate = median[kind]
    costs.append(LayerCost(forward, max(with_inputs - forward, 0.0),
                           max(with_weights - with_inputs, 0.0), layer_held, accumulate))
  return costs


def _Kind(p: hyperparams.Params, x: tuple) -> Tuple[str, Tuple[Any, ...]]:
  """What a layer computes: its params but its name, and its inputs'
  shapes and dtypes. Layers of one kind cost the same, so each gets the
  median of their timings: timed apart, ffn's 16 identical layers'
  forwards measured 2.5-3.2 ms, and a partition by those timings split
  them 9 + 7 on two devices, 6% slower than FLOPs' 8 + 8."""
  text = p.Copy().Set(name='').ToText()
  return text, tuple((tuple(t.shape), t.dtype.name) for t in tf.nest.flatten(x))


def StepShares(costs: Sequence[LayerCost], step: program.Program) -> List[float]:
  """Per layer, its seconds in one training step of the program `step`,
  wherever it sits: its forward, input and weight gradients per
  micro-batch, and its forward again as often as the program recomputes
  a cell's micro-batches (Program.RecomputeUnits), on average over the
  cells (the split is chosen before a layer's cell is). Under per-cell
  remat a layer whose forward is most of its cost weighs more than its
  step_s says: fill-drain at M=4 runs 3 of 4 forwards twice."""
  cells, micro = step.schedule.num_cells, step.schedule.num_micro_batches
  again = sum(step.RecomputeUnits(c, m) for c in range(cells) for m in range(micro)) / cells
  return [micro * c.step_s + again * c.forward_s for c in costs]


def Balanced(pipeline: hyperparams.Params, costs: Sequence[LayerCost]) -> hyperparams.Params:
  """A copy of `pipeline` whose automatic partition balances its layers'
  measured seconds in its own training step (StepShares of its program).

  Raises:
    ValueError: if its M is unknown (micro_batch_size set, no input_shapes).
  """
  batch = None
  if pipeline.input_shapes:
    contract = micro_batch.Contract.FromParams(pipeline)
    batch = contract.InputLayout(layer_meta.Shapes(*pipeline.input_shapes)).batch_size
  num_micro = micro_batch_count.NumMicroBatches(pipeline, batch)
  if num_micro is None:
    raise ValueError(f'PipeliningLayer {pipeline.name!r}: Balanced needs the step\'s M; with '
                     f'micro_batch_size={pipeline.micro_batch_size} set input_shapes, or '
                     'set num_micro_batches instead.')
  step = plan_lib.FromParams(pipeline, pipeline.num_partitions, check_devices=False).Program(
      num_micro, program.Step.LOSS_INSIDE)
  return pipeline.Copy().Set(cost=partition.CostKind.GIVEN,
                             layer_costs=StepShares(costs, step))


def _TracedFunctions(layer: Any, x: tuple, seeds: step_seeds.Counter
                     ) -> Tuple[List[Callable[[], Any]], Optional[kept_bytes.Kept]]:
  """The layer's forward, forward + input gradients, forward + all
  gradients and the adds of weight-sized gradients into accumulators,
  traced and run once; and what the third keeps of its forward."""
  weights = list(layer.trainable_variables)
  accumulators = [tf.Variable(tf.zeros_like(w), trainable=False) for w in weights]
  floats = [t for t in tf.nest.flatten(x) if t.dtype.is_floating]
  marks = kept_bytes.Marks()

  def Forward():
    return tf.nest.flatten(layer.FProp(seeds.Next(layer.theta), *x))

  def Gradients(sources: List[Any]) -> Callable[[], Any]:
    def Run():
      with tf.GradientTape() as tape:
        tape.watch(floats)
        marks.Forward()
        out = Forward()
        marks.Outputs(out)
      floating = [t for t in out if t.dtype.is_floating]
      # Made after the forward: kept_bytes counts no output read for them.
      cotangents = [tf.identity(t) for t in floating]
      marks.Gradient()
      grads = [tf.convert_to_tensor(g) for g in
               tape.gradient(floating, sources, output_gradients=cotangents) if g is not None]
      marks.Gradients(grads)
      return _FirstElements(grads)
    return Run

  def Accumulate():
    return _FirstElements([acc.assign_add(w) for acc, w in zip(accumulators, weights)])

  fns = [tf.function(f, autograph=False)
         for f in (lambda: _FirstElements(Forward()),
                   Gradients(floats) if floats else lambda: _FirstElements(Forward()),
                   Gradients(floats + weights), Accumulate)]
  for fn in fns:
    _Seconds(fn)
  return fns, kept_bytes.Read(fns[2].get_concrete_function().graph, marks)


def _FirstElements(tensors: List[Any]) -> List[Any]:
  """Each tensor's first element (none of an empty one): what a timed
  function returns, so that its time is the computation's, not a copy of
  its results to the host (fetching ffn's weight gradients, 8 MiB a
  layer, took 2.2x the computation of all its gradients at 8 rows)."""
  return [tf.reshape(t, [-1])[:1] for t in tensors]


class _OwnRetracing(logging.Filter):
  """Drops TensorFlow's warning that this module's functions retrace: each
  is traced once by design, but they share their Python code."""

  def filter(self, record: logging.LogRecord) -> bool:
    return '_TracedFunctions' not in record.getMessage()


@contextlib.contextmanager
def _QuietRetracing() -> Iterator[None]:
  logger, quiet = tf.get_logger(), _OwnRetracing()
  logger.addFilter(quiet)
  try:
    yield
  finally:
    logger.removeFilter(quiet)


def _CallSeconds(repeats: int) -> float:
  """The fastest time of calling a traced function that computes nothing
  and fetching its result."""
  nothing = tf.function(lambda: tf.constant(0.0), autograph=False)
  _Seconds(nothing)
  return min(_Seconds(nothing) for _ in range(max(repeats, 3)))


def _Seconds(fn: Callable[[], Any]) -> float:
  """The wall time of one run of `fn`, its results fetched."""
  start = time.perf_counter()
  tf.nest.map_structure(lambda t: t.numpy(), fn())
  return time.perf_counter() - start
