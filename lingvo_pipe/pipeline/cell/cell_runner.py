"""One pipeline cell on its device: traced forward and backward functions.

Each cell has one traced forward function and a traced backward function
per GradSink, called once per micro-batch, so the step's graph grows with K,
not with K*M. Every op, recomputation and gradient included, is created under
`tf.device(cell device)`: gradient tapes inside `tf.function` do not inherit
the forward's placement, so it is set explicitly.

How a micro-batch runs is the remat.Decision the pipeline passes: a recorded
forward keeps its activations on a tape and its backward reads them; an
inlined one (with its backward) is built in the step's graph, not called;
otherwise the backward recomputes the cell, per layer or whole, and
projections may defer their weight gradients (deferred_grads); a split
backward (an I) defers all of them to its W (WeightBackward). Where theta
gradients go is the cell's CellGradients' choice (cell_gradients).

Traced functions take their inputs and return their results as nests, and
keep no other state: tf.function traces again for another structure, and a
call gives back the nest the function returned, its tensors replaced by the
call's outputs. The forward returns (outputs, statistics), the backward a
cell_gradients.BackwardResult, whose structure also says which weights
deferred their gradients.
"""

import contextlib
import dataclasses
import functools
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import custom_gradients
from lingvo_pipe.core import eval_mode
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline.cell import cell_gradients
from lingvo_pipe.pipeline.cell import deferred_grads
from lingvo_pipe.pipeline.cell import scope_names
from lingvo_pipe.pipeline.cell.cell_gradients import GradSink
from lingvo_pipe.pipeline.cell.cell_gradients import IsDifferentiable
from lingvo_pipe.pipeline.lowering import remat

# A traced function's key: (sink, eval mode, M, decision); the forward's has
# sink None, M 1 and decision None. Per eval mode: layers read it while
# tracing; per M: which projections defer depends on it.
_FunctionKey = Tuple[Optional[GradSink], bool, int, Optional[remat.Decision]]


class Backwarded(NamedTuple):
  """A backward's input gradients, flat as the cell's inputs (None for
  those not floating point), and its BackwardResult.done."""
  input_grads: List[Any]
  done: tf.Tensor


@dataclasses.dataclass
class Recording:
  """A forward kept for its backward: the tape of its activations, the
  collector of the projections that defer their weight gradients, if any,
  whether its ops are inlined (under trace_calls' kept scopes), and the
  tensors the tape watched (the first num_weights are the differentiable
  theta, then the inputs), and whether its backward is split (an I)."""
  tape: tf.GradientTape
  collector: Optional[deferred_grads.Collector]
  inlined: bool
  sources: List[Any]
  num_weights: int
  split: bool


def _Differentiable(theta: NestedMap, inputs: tuple
                    ) -> Tuple[List[Any], List[Any]]:
  """(floating-point theta, floating-point theta then inputs): a cell's
  weights and the sources of its gradient."""
  weights = [x for x in tf.nest.flatten(theta) if IsDifferentiable(x)]
  return weights, weights + [x for x in tf.nest.flatten(inputs)
                             if IsDifferentiable(x)]


def _Grads(tape: tf.GradientTape, ys: Any, xs: Sequence[Any],
           dys: Any) -> List[Any]:
  """Vector-Jacobian product of nests `ys`, `dys`; None for unconnected
  `xs`."""
  diff_ys = [(y, dy) for y, dy in zip(tf.nest.flatten(ys), tf.nest.flatten(dys))
             if IsDifferentiable(y)]
  return tape.gradient([y for y, _ in diff_ys], list(xs),
                       output_gradients=[dy for _, dy in diff_ys],
                       unconnected_gradients=tf.UnconnectedGradients.NONE)


class CellRunner:
  """Runs cell k: forward per micro-batch, backward with recomputation."""

  def __init__(self, cell: base_layer.BaseLayer, device: str,
               jit_compile: bool = False) -> None:
    """The traced functions are named '<cell name>_forward' /
    '_backward_<GradSink value>'. With jit_compile the forward and the
    gradient part of the backward are compiled with XLA
    (cell_compilation)."""
    self.cell = cell
    self.device = device
    self.jit_compile = jit_compile
    self.gradients = cell_gradients.CellGradients(cell, device)
    self._functions: Dict[_FunctionKey, Any] = {}

  def Forward(self, theta: NestedMap, inputs: tuple,
              decision: Optional[remat.Decision] = None, num_micro: int = 1
              ) -> Tuple[tuple, NestedMap, Optional[Recording]]:
    """Returns (cell outputs as a tuple, additive statistics, recording);
    `decision` None for a forward that no backward follows (evaluation).

    An inlined forward builds the cell's ops in the caller's graph instead
    of calling the traced function, for a recorded forward that no
    recomputation of the same micro-batch follows (an inlined forward could
    otherwise be merged with its recomputation): its ops and their gradients
    are then optimized with the rest of the step, as in the unpipelined
    network. Inlined ops go under the name scope
    scope_names.KEPT_FORWARD_SCOPE, by which the timeline finds them.

    A recorded forward's Recording holds its activations for
    BackwardFromTape; its tape watches only this cell's theta and inputs, so
    its gradient stops at the cell boundary. A recorded call (a compiled
    cell's: remat.Decide inlines the others) reads them through
    tf.stop_gradient, hidden from the caller's tapes (which record the
    pipeline's ops too): with two tapes watching its inputs, TensorFlow
    prepares the call for higher-order gradients, and its backward then
    takes a zero-filled gradient of every intermediate, gigabytes of zeros
    per step (docs/benchmarks/profiles.md). Otherwise the recording is None.
    """
    decision = self._Compilable(decision)
    inline = decision is not None and decision.inline
    with tf.device(self.device), _KeptScope(scope_names.KEPT_FORWARD_SCOPE, inline):
      forward = self._Forward if inline else self._ForwardFunction()
      if decision is None or not decision.record:
        outputs, updates = forward(theta, inputs)
        return outputs, updates, None
      if not inline:
        theta, inputs = _StopGradient(theta), _StopGradient(inputs)
      weights, sources = _Differentiable(theta, inputs)
      # Only inlined forwards defer (remat.Decision): the factors must be
      # tensors of the step's graph.
      with deferred_grads.Deferring(weights if decision.defer else [], num_micro,
                                    decision.split) as collector:
        with tf.GradientTape(watch_accessed_variables=False) as tape:
          tape.watch(sources)
          outputs, updates = forward(theta, inputs)
    recording = Recording(tape, collector if decision.defer else None, inline,
                          sources, len(weights), decision.split)
    return outputs, updates, recording

  def Backward(self, theta: NestedMap, inputs: tuple, output_grads: tuple,
               decision: remat.Decision, num_micro: int) -> Backwarded:
    """Recomputes the cell as `decision` says and hands its theta gradients
    to self.gradients (a split backward's factor pairs wait there for its
    WeightBackward)."""
    sink = self.gradients.NextSink()
    decision = self._Compilable(decision) or decision
    with tf.device(self.device):
      result = self._BackwardFunction(sink, num_micro, decision)(
          theta, inputs, output_grads)
    self.gradients.Keep(sink, result, decision.split)
    return Backwarded(_InputGrads(result.input_grads, inputs), result.done)

  def BackwardFromTape(self, recording: Recording, inputs: tuple,
                       outputs: tuple, output_grads: tuple) -> Backwarded:
    """Backward without recomputation, from the Recording of a Forward; the
    gradient ops are placed on the cell's device, those of an inlined
    forward under the name scope scope_names.KEPT_BACKWARD_SCOPE. Hands
    and returns gradients as Backward does."""
    sink = self.gradients.NextSink()
    with tf.device(self.device), _KeptScope(scope_names.KEPT_BACKWARD_SCOPE,
                                            recording.inlined):
      grads = _Grads(recording.tape, outputs, recording.sources, output_grads)
      result = self._Result(sink, recording.sources, recording.num_weights,
                            grads, recording.collector)
    self.gradients.Keep(sink, result, recording.split)
    return Backwarded(_InputGrads(result.input_grads, inputs), result.done)

  def WeightBackward(self, factors: cell_gradients.FactorPairs) -> List[tf.Tensor]:
    """A W: the weight gradients of a split backward's factor pairs
    (gradients.TakeSplitFactors after it) added into the step's sums of
    the cell's weight gradients on its device. Returns the new sums."""
    return self.gradients.AddProducts(factors)

  def _Compilable(self, decision: Optional[remat.Decision]
                  ) -> Optional[remat.Decision]:
    """`decision` as compiled cells run it: nothing inlined (an inlined
    forward is no function to compile), nothing deferred (the factors would
    be tensors of a compiled function); see cell_compilation."""
    if not self.jit_compile or decision is None:
      return decision
    return dataclasses.replace(decision, inline=False, defer=False, split=False)

  def _ForwardFunction(self) -> Any:
    """The traced forward, named '<cell name>_forward'."""
    return self._Traced((None, eval_mode.IsEvalMode(), 1, None),
                        self._Forward, 'forward')

  def _BackwardFunction(self, sink: GradSink, num_micro: int,
                        decision: remat.Decision) -> Any:
    """The traced backward into `sink`, named
    '<cell name>_backward_<GradSink value>'."""
    return self._Traced(
        (sink, eval_mode.IsEvalMode(), num_micro, decision),
        functools.partial(self._Backward, sink=sink, decision=decision,
                          num_micro=num_micro), f'backward_{sink.value}')

  def _Traced(self, key: _FunctionKey, method: Callable[..., Any], kind: str) -> Any:
    """The tf.function of `method` under `key` (eval mode is part of it:
    layers read it while tracing), made on first use."""
    if key not in self._functions:
      # A backward compiles its gradient part only (_GradientFunction): its
      # accumulator updates stay outside XLA.
      jit = self.jit_compile and not kind.startswith('backward')
      self._functions[key] = _NamedFunction(
          method, f'{self.cell.params.name}_{kind}', jit)
    return self._functions[key]

  def _GradientFunction(self, decision: remat.Decision) -> Any:
    """The compiled recomputation and gradient of a backward, named
    '<cell name>_gradient': (theta, inputs, output grads) -> the gradients
    of the floating theta then inputs (None where unconnected)."""
    return self._Traced(
        (None, eval_mode.IsEvalMode(), 1, decision),
        functools.partial(self._Gradients, decision=decision), 'gradient')

  def _Gradients(self, theta: NestedMap, inputs: tuple, output_grads: tuple,
                 decision: remat.Decision) -> List[Any]:
    with tf.device(self.device):
      _, sources = _Differentiable(theta, inputs)
      with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(sources)
        outputs = self._RecomputedForward(theta, inputs, decision)
      return _Grads(tape, containers.AsTuple(outputs), sources, output_grads)

  def _RecomputedForward(self, theta: NestedMap, inputs: tuple,
                         decision: remat.Decision) -> Any:
    if decision.per_layer:
      return self._LayerwiseRematFProp(theta, inputs)
    return self.cell.FPropWithUpdates(theta, *inputs)[0]

  # --- traced bodies ------------------------------------------------------

  def _Forward(self, theta: NestedMap, inputs: tuple) -> Tuple[tuple, NestedMap]:
    with tf.device(self.device):
      outputs, updates = self.cell.FPropWithUpdates(theta, *inputs)
      return containers.AsTuple(outputs), updates

  def _Backward(self, theta: NestedMap, inputs: tuple, output_grads: tuple,
                sink: GradSink, decision: remat.Decision,
                num_micro: int) -> cell_gradients.BackwardResult:
    with tf.device(self.device):
      weights, sources = _Differentiable(theta, inputs)
      if self.jit_compile:
        grads = self._GradientFunction(decision)(theta, inputs, output_grads)
        return self._Result(sink, sources, len(weights), grads, None)
      with deferred_grads.Deferring(weights if decision.defer else [], num_micro,
                                    decision.split) as collector:
        with tf.GradientTape(watch_accessed_variables=False) as tape:
          tape.watch(sources)
          outputs = self._RecomputedForward(theta, inputs, decision)
        grads = _Grads(tape, containers.AsTuple(outputs), sources, output_grads)
      return self._Result(sink, sources, len(weights), grads, collector)

  def _Result(self, sink: GradSink, sources: Sequence[Any], num_weights: int,
              grads: Sequence[Any],
              collector: Optional[deferred_grads.Collector]
              ) -> cell_gradients.BackwardResult:
    """The BackwardResult of the tape's `grads` of `sources` (weights
    first), putting the weights' into `sink`: unconnected sources get zeros,
    weights whose gradient is all deferred into `collector` stay None."""
    factors = collector.factors if collector is not None else {}
    deferred_only = {i: None for i in sorted(factors) if grads[i] is None}
    grads = [g if g is not None or i in deferred_only else tf.zeros_like(x)
             for i, (x, g) in enumerate(zip(sources, grads))]
    weight_grads, puts = self.gradients.Put(grads[:num_weights], sink)
    with tf.control_dependencies([g for g in grads if g is not None] + puts):
      done = tf.constant(0)
    return cell_gradients.BackwardResult(
        weight_grads=weight_grads, input_grads=grads[num_weights:], factors=factors,
        deferred_only=deferred_only, done=done)

  def _LayerwiseRematFProp(self, theta: NestedMap, inputs: tuple) -> Any:
    """The cell's forward with each sublayer under tf.recompute_grad."""
    sublayers = getattr(self.cell, 'sub', None)
    if sublayers is None:
      raise ValueError(f'RematPolicy.PER_LAYER needs cells with sublayers '
                       f'(SequentialLayer); cell {self.cell.path!r} is a '
                       f'{type(self.cell).__name__}.')
    outputs = tuple(inputs)
    for layer, layer_theta in zip(sublayers, theta.sub):
      outputs = _RecomputedLayer(layer, layer_theta, outputs)
    return containers.UnwrapSingle(outputs)


def _InputGrads(grads: Sequence[Any], inputs: tuple) -> List[Any]:
  """`grads` of the floating-point inputs, flat as `inputs` with None for
  the others."""
  it = iter(grads)
  return [next(it) if IsDifferentiable(x) else None
          for x in tf.nest.flatten(inputs)]


def _StopGradient(nest: Any) -> Any:
  """`nest` with its differentiable tensors through tf.stop_gradient."""
  return tf.nest.map_structure(
      lambda x: tf.stop_gradient(x) if IsDifferentiable(x) else x, nest)


def _KeptScope(name: str, inlined: bool):
  """The name scope `name` for inlined ops, else no scope."""
  return tf.name_scope(name) if inlined else contextlib.nullcontext()


def _NamedFunction(method, name: str, jit_compile: bool = False):
  """A tf.function of `method` whose graph functions carry `name`,
  compiled with XLA if `jit_compile`.

  It is never inlined into the caller's graph: the pipeline
  orders the calls on one device with control dependencies, and once inlined
  (Grappler's default) every micro-batch's ops started at once, which kept
  all of their activations alive: about 2.5x the allocator peak
  (docs/benchmarks/profiles.md).
  """

  def Body(*args):
    return method(*args)

  Body.__name__ = name
  return tf.function(Body, autograph=False, jit_compile=jit_compile or None,
                     experimental_attributes={'_noinline': True})


def _RecomputedLayer(layer: base_layer.BaseLayer, theta: NestedMap,
                     inputs: tuple) -> tuple:
  """Applies one layer so that only its inputs are kept for the backward.
  Only the floating-point tensors pass through the recomputation; the
  others (the step seed, ids) have no gradient and are closed over."""
  flat = tf.nest.flatten((inputs, theta))
  floating = [i for i, x in enumerate(flat) if IsDifferentiable(x)]

  def Body(*args):
    full = list(flat)
    for i, x in zip(floating, args):
      full[i] = x
    layer_inputs, layer_theta = tf.nest.pack_sequence_as((inputs, theta), full)
    return containers.AsTuple(layer.FProp(layer_theta, *layer_inputs))

  return custom_gradients.RecomputeGrad(Body)(*[flat[i] for i in floating])
