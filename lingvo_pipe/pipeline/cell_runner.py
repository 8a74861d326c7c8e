"""One pipeline cell on its device: traced forward and backward functions.

Each cell has one traced forward function and a traced backward function
per GradSink, called once per micro-batch, so the step's graph grows with K,
not with K*M. Every op, recomputation and gradient included, is created under
`tf.device(cell device)`: gradient tapes inside `tf.function` do not inherit
the forward's placement, so it is set explicitly.

With several micro-batches the backward adds each one's weight gradients
into accumulator variables on the cell's device, in place, layer by layer
as the tape produces them: only one weight-sized sum per cell is alive, not
the sum, the micro-batch's gradients and their new sum (ffn, K=1, M=4:
385 MiB allocator peak with sums as tensors). With one micro-batch it hands
them on, so that the optimizer updates a weight as soon as its gradient is
ready, as without the pipeline. Projections with few rows per step may
defer theirs to one product per step (deferred_grads).

How a micro-batch runs is the remat.Decision the pipeline passes: a recorded
forward keeps its activations on a tape and its backward reads them; an
inlined one (with its backward) is built in the step's graph, not called;
otherwise the backward recomputes the cell, per layer or whole.
"""

import contextlib
import dataclasses
import enum
import functools
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline import deferred_grads
from lingvo_pipe.pipeline import remat
from lingvo_pipe.pipeline import scope_names


class GradSink(enum.Enum):
  """Where a backward call puts the cell's theta gradients."""
  RETURN = 'return'  # the step's only micro-batch: returns them
  ASSIGN = 'assign'  # the first of several: replaces the accumulators
  ADD = 'add'        # a later one: adds to the accumulators

  @classmethod
  def For(cls, first: bool, num_micro: int) -> 'GradSink':
    if num_micro == 1:
      return cls.RETURN
    return cls.ASSIGN if first else cls.ADD


# A traced function's key: (GradSink or None for the forward, eval mode, M,
# the remat.Decision of a backward).
_FunctionKey = Tuple[Optional[GradSink], bool, int, Optional[remat.Decision]]


@dataclasses.dataclass
class Recording:
  """A forward kept for its backward: the tape of its activations, the
  collector of the projections that defer their weight gradients, if any,
  whether its ops are inlined (under trace_calls' kept scopes), and the
  tensors the tape watched (the differentiable theta, then inputs)."""
  tape: tf.GradientTape
  collector: Optional[deferred_grads.Collector]
  inlined: bool
  sources: List[Any]


def IsDifferentiable(x: Any) -> bool:
  return tf.as_dtype(x.dtype).is_floating


def _Differentiable(flat_theta: Sequence[Any], flat_in: Sequence[Any]
                    ) -> Tuple[List[Any], List[Any]]:
  """(floating-point theta, floating-point theta then inputs): a cell's
  weights and the sources of its gradient."""
  weights = [x for x in flat_theta if IsDifferentiable(x)]
  return weights, weights + [x for x in flat_in if IsDifferentiable(x)]


def _Grads(tape: tf.GradientTape, ys: Sequence[Any], xs: Sequence[Any],
           dys: Sequence[Any],
           unconnected=tf.UnconnectedGradients.ZERO) -> List[Any]:
  """Vector-Jacobian product; unconnected inputs get zeros (or None)."""
  diff_ys = [(y, dy) for y, dy in zip(ys, dys) if IsDifferentiable(y)]
  return tape.gradient([y for y, _ in diff_ys], list(xs),
                       output_gradients=[dy for _, dy in diff_ys],
                       unconnected_gradients=unconnected)


class CellRunner:
  """Runs cell k: forward per micro-batch, backward with recomputation."""

  def __init__(self, cell: base_layer.BaseLayer, device: str) -> None:
    """The traced functions are named '<cell name>_forward' /
    '_backward_<GradSink value>'."""
    self.cell = cell
    self.device = device
    self.theta_structure: Optional[NestedMap] = None
    self.in_structure: Any = None
    self.out_structure: Any = None
    self.updates_structure: Any = None
    self._functions: Dict[_FunctionKey, Any] = {}
    # Per traced backward: the weight index of each deferred factor pair it
    # returns, and the weights whose gradient is all deferred.
    self._deferrals: Dict[_FunctionKey, Tuple[List[int], Set[int]]] = {}
    # This step's deferred factor pairs by weight index, and that set.
    self._step_factors: Dict[int, List[Tuple[Any, Any]]] = {}
    self._step_deferred_only: Set[int] = set()
    # Shapeless and empty until first assigned: the sum of a gradient that
    # is handed on (M=1) or deferred never takes memory.
    with tf.device(device):
      self._accumulators = [
          tf.Variable(tf.zeros([0], v.dtype), shape=tf.TensorShape(None),
                      trainable=False, name=f'{cell.params.name}_grad_sum_{i}')
          for i, v in enumerate(tf.nest.flatten(cell.theta))
          if IsDifferentiable(v)]

  # --- called by the pipeline ---------------------------------------------

  def Forward(self, theta: NestedMap, inputs: tuple,
              decision: Optional[remat.Decision] = None, num_micro: int = 1
              ) -> Tuple[tuple, NestedMap, Optional[Recording]]:
    """Returns (cell outputs as a tuple, additive statistics, recording);
    `decision` None for a forward that no backward follows (evaluation).

    An inlined forward builds the cell's ops in the caller's graph instead of calling
    the traced function, for a recorded forward that no recomputation of
    the same micro-batch follows (an inlined forward could otherwise be
    merged with its recomputation): its ops and their gradients are then
    optimized with the rest of the step, as in the unpipelined network.
    Inlined ops go under the name scope scope_names.KEPT_FORWARD_SCOPE, by
    which the timeline finds them.

    A recorded forward's Recording holds this forward's activations for
    BackwardFromTape; its tape watches only this cell's theta and inputs, so
    its gradient stops at the cell boundary. A recorded call reads them
    through tf.stop_gradient, hidden from the caller's tapes (which record
    the pipeline's ops too): with two tapes watching its inputs, TensorFlow
    prepares the call for higher-order gradients, and its backward then
    takes a zero-filled gradient of every intermediate (ffn, K=1, M=4, no
    remat: 753 Fill ops, 1.2 GB of zeros per step). Otherwise the recording
    is None.
    """
    self.theta_structure = theta
    self.in_structure = inputs
    flat_theta, flat_in = tf.nest.flatten(theta), tf.nest.flatten(inputs)
    recording = None
    inline = decision is not None and decision.inline
    with tf.device(self.device), _KeptScope(scope_names.KEPT_FORWARD_SCOPE, inline):
      forward = self._Forward if inline else self._Function(self._Key(None))
      if decision is not None and decision.record:
        if not inline:
          flat_theta, flat_in = _StopGradient(flat_theta), _StopGradient(flat_in)
        weights, sources = _Differentiable(flat_theta, flat_in)
        # Only inlined forwards defer (remat.Decision): the factors must be
        # tensors of the step's graph.
        defer = decision.defer
        with deferred_grads.Deferring(weights if defer else [], num_micro) as collector:
          with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(sources)
            flat = forward(flat_theta, flat_in)
        recording = Recording(tape, collector if defer else None, inline, sources)
      else:
        flat = forward(flat_theta, flat_in)
    num_out = len(tf.nest.flatten(self.out_structure))
    outputs = tf.nest.pack_sequence_as(self.out_structure, flat[:num_out])
    updates = tf.nest.pack_sequence_as(self.updates_structure, flat[num_out:])
    return outputs, updates, recording

  def Backward(self, theta: NestedMap, inputs: tuple, output_grads: tuple,
               sink: GradSink, decision: remat.Decision, num_micro: int
               ) -> Tuple[List[Any], Optional[List[Any]]]:
    """Recomputes the cell as `decision` says and puts its theta gradients
    into `sink`; projections may defer their weight gradients to
    SummedGradients (deferred_grads).

    Returns the input gradients, flat (None for inputs that are not floating
    point), and with GradSink.RETURN the theta gradients, flat as theta
    (None where theta is not floating point), else None.
    """
    flat_theta, flat_in = tf.nest.flatten(theta), tf.nest.flatten(inputs)
    key = self._Key(sink, num_micro, decision)
    with tf.device(self.device):
      grads = self._Function(key)(flat_theta, flat_in,
                                  tf.nest.flatten(output_grads))
    owners, deferred_only = self._deferrals[key]
    factors = grads[len(grads) - 2 * len(owners):]
    pairs: Dict[int, List[Tuple[Any, Any]]] = {}
    for i, owner in enumerate(owners):
      pairs.setdefault(owner, []).append((factors[2 * i], factors[2 * i + 1]))
    self._KeepFactors(pairs, deferred_only, sink)
    return self._Split(grads[:len(grads) - len(factors)], flat_theta, flat_in, sink)

  def BackwardFromTape(self, recording: Recording, theta: NestedMap,
                       inputs: tuple, outputs: tuple, output_grads: tuple,
                       sink: GradSink) -> Tuple[List[Any], Optional[List[Any]]]:
    """Backward without recomputation, from the Recording of a Forward; the
    gradient ops are placed on the cell's device, those of an inlined
    forward under the name scope scope_names.KEPT_BACKWARD_SCOPE. Puts and
    returns gradients as Backward does."""
    flat_theta, flat_in = tf.nest.flatten(theta), tf.nest.flatten(inputs)
    sources = recording.sources
    with tf.device(self.device), _KeptScope(scope_names.KEPT_BACKWARD_SCOPE,
                                            recording.inlined):
      grads = _Grads(recording.tape, tf.nest.flatten(outputs), sources,
                     tf.nest.flatten(output_grads), tf.UnconnectedGradients.NONE)
      collector = recording.collector
      grads, deferred_only = _SettleDeferred(sources, grads, collector)
      self._KeepFactors(collector.factors if collector else {}, deferred_only, sink)
      return self._Split(self._Put(grads, sink), flat_theta, flat_in, sink)

  def SummedGradients(self, theta: NestedMap) -> List[Any]:
    """The theta gradients summed over this step's backward calls (the
    accumulators plus the deferred products), flat as theta; None where
    theta is not floating point. Call after the last Backward: reads of the
    accumulators are ordered after it."""
    sums = iter(enumerate(self._accumulators))
    grads = []
    with tf.device(self.device):
      for x in tf.nest.flatten(theta):
        if not IsDifferentiable(x):
          grads.append(None)
          continue
        i, acc = next(sums)
        parts = ([] if i in self._step_deferred_only else
                 [tf.ensure_shape(acc.read_value(), x.shape)])
        if i in self._step_factors:
          parts.append(deferred_grads.Product(self._step_factors[i]))
        grads.append(tf.add_n(parts) if len(parts) > 1 else parts[0])
    return grads

  @staticmethod
  def _Key(sink: Optional[GradSink], num_micro: int = 1,
           decision: Optional[remat.Decision] = None) -> _FunctionKey:
    """A traced function's key: the forward's (sink None) or a backward's,
    per eval mode (layers read it while tracing) and per M (which
    projections defer depends on it)."""
    return sink, base_layer.IsEvalMode(), num_micro, decision

  def _Function(self, key: _FunctionKey):
    """The traced forward or backward of `key`, named '<cell name>_forward'
    or '<cell name>_backward_<GradSink value>'."""
    if key not in self._functions:
      sink, _, num_micro, decision = key
      if sink is None:
        method, kind = self._Forward, 'forward'
      else:
        method = functools.partial(self._Backward, key=key, sink=sink,
                                   decision=decision, num_micro=num_micro)
        kind = f'backward_{sink.value}'
      self._functions[key] = _NamedFunction(
          method, f'{self.cell.params.name}_{kind}')
    return self._functions[key]

  # --- traced bodies ------------------------------------------------------

  def _Forward(self, flat_theta: List[Any], flat_in: List[Any]) -> List[Any]:
    with tf.device(self.device):
      theta, inputs = self._Pack(flat_theta, flat_in)
      outputs, updates = self.cell.FPropWithUpdates(theta, *inputs)
      outputs = containers.AsTuple(outputs)
      self.out_structure = outputs
      self.updates_structure = updates
      return tf.nest.flatten(outputs) + tf.nest.flatten(updates)

  def _Backward(self, flat_theta: List[Any], flat_in: List[Any],
                flat_dys: List[Any], key: _FunctionKey, sink: GradSink,
                decision: remat.Decision, num_micro: int) -> List[Any]:
    """Returns the gradients of the floating-point inputs, after those of
    the floating-point theta with GradSink.RETURN, then the deferred factor
    pairs (recorded in self._deferrals[key])."""
    with tf.device(self.device):
      weights, sources = _Differentiable(flat_theta, flat_in)
      with deferred_grads.Deferring(weights if decision.defer else [], num_micro) as collector:
        with tf.GradientTape(watch_accessed_variables=False) as tape:
          tape.watch(sources)
          theta, inputs = self._Pack(flat_theta, flat_in)
          if decision.per_layer:
            outputs = self._LayerwiseRematFProp(theta, inputs)
          else:
            outputs = self.cell.FPropWithUpdates(theta, *inputs)[0]
        grads = _Grads(tape, tf.nest.flatten(containers.AsTuple(outputs)),
                       sources, flat_dys, tf.UnconnectedGradients.NONE)
      grads, deferred_only = _SettleDeferred(sources, grads, collector)
      owners, factors = [], []
      for i, pairs in sorted(collector.factors.items()):
        for a, b in pairs:
          owners.append(i)
          factors += [a, b]
      self._deferrals[key] = (owners, deferred_only)
      return self._Put(grads, sink) + factors

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

  # --- helpers -------------------------------------------------------------

  def _KeepFactors(self, pairs: Dict[int, List[Tuple[Any, Any]]],
                   deferred_only: Set[int], sink: GradSink) -> None:
    """Adds one backward's deferred factor pairs (by weight index) to the
    step's; the step's first backward (GradSink.ASSIGN) starts them anew.
    The backwards of one step defer the same weights."""
    if sink == GradSink.ASSIGN:
      self._step_factors = {}
    self._step_deferred_only = deferred_only
    for owner, owner_pairs in pairs.items():
      self._step_factors.setdefault(owner, []).extend(owner_pairs)

  def _Pack(self, flat_theta: List[Any], flat_in: List[Any]) -> Tuple[NestedMap, tuple]:
    theta = tf.nest.pack_sequence_as(self.theta_structure, flat_theta)
    inputs = tf.nest.pack_sequence_as(self.in_structure, flat_in)
    return theta, tuple(inputs)

  def _Put(self, grads: Sequence[Any], sink: GradSink) -> List[Any]:
    """Puts the leading theta gradients of `grads` into `sink`; returns the
    input gradients, after the theta ones with GradSink.RETURN."""
    if sink == GradSink.RETURN:
      return list(grads)
    for acc, g in zip(self._accumulators, grads):
      if g is None:  # deferred
        continue
      if sink == GradSink.ASSIGN:
        acc.assign(g)
      else:
        acc.assign_add(g)
    return list(grads[len(self._accumulators):])

  @staticmethod
  def _Split(grads: Sequence[Any], flat_theta: List[Any], flat_in: List[Any],
             sink: GradSink) -> Tuple[List[Any], Optional[List[Any]]]:
    """(input gradients, theta gradients or None) from what _Put returned,
    with None for what is not floating point."""
    it = iter(grads)
    theta_grads = None
    if sink == GradSink.RETURN:
      theta_grads = [next(it) if IsDifferentiable(x) else None
                     for x in flat_theta]
    return [next(it) if IsDifferentiable(x) else None for x in flat_in], theta_grads


def _StopGradient(flat: Sequence[Any]) -> List[Any]:
  """The differentiable tensors of `flat` through tf.stop_gradient."""
  return [tf.stop_gradient(x) if IsDifferentiable(x) else x for x in flat]


def _KeptScope(name: str, inlined: bool):
  """The name scope `name` for inlined ops, else no scope."""
  return tf.name_scope(name) if inlined else contextlib.nullcontext()


def _SettleDeferred(sources: Sequence[Any], grads: Sequence[Any],
                    collector: Optional[deferred_grads.Collector]
                    ) -> Tuple[List[Any], Set[int]]:
  """(grads with zeros for unconnected sources, the indices of the weights
  whose gradient is all deferred into `collector`, which stay None)."""
  deferred_only = ({i for i in collector.factors if grads[i] is None}
                   if collector is not None else set())
  return ([g if g is not None or i in deferred_only else tf.zeros_like(x)
           for i, (x, g) in enumerate(zip(sources, grads))], deferred_only)


def _NamedFunction(method, name: str):
  """A tf.function of `method` whose graph functions carry `name`.

  It is never inlined into the caller's graph: the pipeline
  orders the calls on one device with control dependencies, and once inlined
  (Grappler's default) every micro-batch's ops started at once, which kept
  all of their activations alive (transformer-act at batch 8, K=1, M=8,
  per-cell remat: 227 MB allocator peak inlined, 89 MB not inlined).
  """

  def Body(*args):
    return method(*args)

  Body.__name__ = name
  return tf.function(Body, autograph=False,
                     experimental_attributes={'_noinline': True})


def _RecomputedLayer(layer: base_layer.BaseLayer, theta: NestedMap,
                     inputs: tuple) -> tuple:
  """Applies one layer so that only its inputs are kept for the backward."""
  flat_theta = tf.nest.flatten(theta)
  num_in = len(inputs)
  out_structure = []

  def Body(*args):
    layer_theta = tf.nest.pack_sequence_as(theta, list(args[num_in:]))
    outputs = containers.AsTuple(layer.FProp(layer_theta, *args[:num_in]))
    out_structure[:] = [outputs]
    return tf.nest.flatten(outputs)

  flat = tf.recompute_grad(Body)(*inputs, *flat_theta)
  flat = flat if isinstance(flat, (list, tuple)) else [flat]
  return tuple(tf.nest.pack_sequence_as(out_structure[0], list(flat)))
