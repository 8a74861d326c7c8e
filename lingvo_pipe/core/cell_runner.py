"""One pipeline cell on its device: traced forward and backward functions.

Each cell has one traced forward and one traced backward function, called
once per micro-batch, so the step's graph grows with K, not with K*M. Every
op of both functions, recomputation and gradient included, is created under
`tf.device(cell device)`: gradient tapes inside `tf.function` do not inherit
the forward's placement, so it is set explicitly.

The backward adds each micro-batch's weight gradients into accumulator
variables on the cell's device, in place, layer by layer as the tape
produces them: only one weight-sized sum per cell is alive, not the sum,
the micro-batch's gradients and their new sum (ffn, K=1, M=4: 385 MiB
allocator peak with sums as tensors).
"""

import enum
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.nested_map import NestedMap


class RematPolicy(enum.Enum):
  """What the backward pass recomputes instead of keeping."""
  NONE = 'none'            # keep every activation of every micro-batch
  PER_CELL = 'per_cell'    # keep cell inputs; recompute the cell in backward
  PER_LAYER = 'per_layer'  # as PER_CELL, and inside it keep only layer inputs


def IsDifferentiable(x: Any) -> bool:
  return tf.as_dtype(x.dtype).is_floating


def _Grads(tape: tf.GradientTape, ys: Sequence[Any], xs: Sequence[Any],
           dys: Sequence[Any]) -> List[Any]:
  """Vector-Jacobian product; unconnected inputs get zeros."""
  diff_ys = [(y, dy) for y, dy in zip(ys, dys) if IsDifferentiable(y)]
  return tape.gradient([y for y, _ in diff_ys], list(xs),
                       output_gradients=[dy for _, dy in diff_ys],
                       unconnected_gradients=tf.UnconnectedGradients.ZERO)


class CellRunner:
  """Runs cell k: forward per micro-batch, backward with recomputation."""

  def __init__(self, cell: base_layer.BaseLayer, device: str,
               remat: RematPolicy) -> None:
    """The traced functions are named '<cell name>_forward' / '_backward'."""
    self.cell = cell
    self.device = device
    self.remat = remat
    self.theta_structure: Optional[NestedMap] = None
    self.in_structure: Any = None
    self.out_structure: Any = None
    self.updates_structure: Any = None
    self._functions: Dict[Tuple[str, bool, bool], Any] = {}
    with tf.device(device):
      self._accumulators = [
          tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False,
                      name=f'{cell.params.name}_grad_sum_{i}')
          for i, v in enumerate(tf.nest.flatten(cell.theta))
          if IsDifferentiable(v)]

  # --- called by the pipeline ---------------------------------------------

  def Forward(self, theta: NestedMap, inputs: tuple, record: bool = False,
              inline: bool = False
              ) -> Tuple[tuple, NestedMap, Optional[tf.GradientTape]]:
    """Returns (cell outputs as a tuple, additive statistics, tape).

    `inline` lets TensorFlow inline the traced function: right only without
    recomputation and with one micro-batch, where nothing needs ordering (an
    inlined forward could otherwise be merged with its recomputation).

    With `record` (RematPolicy.NONE) the tape holds this call's activations
    for BackwardFromTape; it watches only this cell's theta and inputs, so
    its gradient stops at the cell boundary. Otherwise the tape is None.
    """
    self.theta_structure = theta
    self.in_structure = inputs
    flat_theta, flat_in = tf.nest.flatten(theta), tf.nest.flatten(inputs)
    tape = None
    with tf.device(self.device):
      if record:
        with tf.GradientTape(watch_accessed_variables=False) as tape:
          tape.watch([x for x in flat_theta + flat_in if IsDifferentiable(x)])
          flat = self._Function('forward', inline)(flat_theta, flat_in)
      else:
        flat = self._Function('forward', inline)(flat_theta, flat_in)
    num_out = len(tf.nest.flatten(self.out_structure))
    outputs = tf.nest.pack_sequence_as(self.out_structure, flat[:num_out])
    updates = tf.nest.pack_sequence_as(self.updates_structure, flat[num_out:])
    return outputs, updates, tape

  def Backward(self, theta: NestedMap, inputs: tuple, output_grads: tuple,
               first: bool) -> List[Any]:
    """Recomputes the cell, adds its theta gradients to the accumulators
    (`first`: replaces them) and returns the input gradients, flat; inputs
    that are not floating point get None."""
    flat_theta, flat_in = tf.nest.flatten(theta), tf.nest.flatten(inputs)
    kind = 'backward_first' if first else 'backward'
    with tf.device(self.device):
      grads = self._Function(kind, False)(flat_theta, flat_in,
                                          tf.nest.flatten(output_grads))
    return self._InputGrads(grads, flat_in)

  def BackwardFromTape(self, tape: tf.GradientTape, theta: NestedMap,
                       inputs: tuple, outputs: tuple, output_grads: tuple,
                       first: bool) -> List[Any]:
    """Backward without recomputation (RematPolicy.NONE), from a tape that
    recorded Forward; the gradient ops are placed on the cell's device.
    Accumulates and returns as Backward does."""
    flat_theta, flat_in = tf.nest.flatten(theta), tf.nest.flatten(inputs)
    sources = [x for x in flat_theta + flat_in if IsDifferentiable(x)]
    with tf.device(self.device):
      grads = _Grads(tape, tf.nest.flatten(outputs), sources,
                     tf.nest.flatten(output_grads))
      return self._InputGrads(self._Accumulate(grads, first), flat_in)

  def AccumulatedGradients(self, theta: NestedMap) -> List[Any]:
    """The theta gradients summed over this step's backward calls, flat as
    theta; None where theta is not floating point. Call after the last
    Backward: reads of the accumulators are ordered after it."""
    sums = iter(self._accumulators)
    with tf.device(self.device):
      return [next(sums).read_value() if IsDifferentiable(x) else None
              for x in tf.nest.flatten(theta)]

  def _Function(self, kind: str, inline: bool):
    """The traced 'forward', 'backward' or 'backward_first': one per eval
    mode (layers read it while tracing) and per inlining choice, named
    '<cell name>_<kind>'."""
    key = (kind, base_layer.IsEvalMode(), inline)
    if key not in self._functions:
      methods = {'forward': self._Forward, 'backward': self._Backward,
                 'backward_first': self._BackwardFirst}
      self._functions[key] = _NamedFunction(
          methods[kind], f'{self.cell.params.name}_{kind}', inline)
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

  def _BackwardFirst(self, flat_theta: List[Any], flat_in: List[Any],
                     flat_dys: List[Any]) -> List[Any]:
    return self._Backward(flat_theta, flat_in, flat_dys, first=True)

  def _Backward(self, flat_theta: List[Any], flat_in: List[Any],
                flat_dys: List[Any], first: bool = False) -> List[Any]:
    """Returns the gradients of the floating-point inputs."""
    with tf.device(self.device):
      sources = [x for x in flat_theta + flat_in if IsDifferentiable(x)]
      with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(sources)
        theta, inputs = self._Pack(flat_theta, flat_in)
        if self.remat == RematPolicy.PER_LAYER:
          outputs = self._LayerwiseRematFProp(theta, inputs)
        else:
          outputs = self.cell.FPropWithUpdates(theta, *inputs)[0]
      grads = _Grads(tape, tf.nest.flatten(containers.AsTuple(outputs)),
                     sources, flat_dys)
      return self._Accumulate(grads, first)

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

  def _Pack(self, flat_theta: List[Any], flat_in: List[Any]) -> Tuple[NestedMap, tuple]:
    theta = tf.nest.pack_sequence_as(self.theta_structure, flat_theta)
    inputs = tf.nest.pack_sequence_as(self.in_structure, flat_in)
    return theta, tuple(inputs)

  def _Accumulate(self, grads: Sequence[Any], first: bool) -> List[Any]:
    """Adds (`first`: assigns) the leading theta gradients of `grads` to the
    accumulators; returns the rest, the input gradients."""
    num_theta = len(self._accumulators)
    for acc, g in zip(self._accumulators, grads[:num_theta]):
      if first:
        acc.assign(g)
      else:
        acc.assign_add(g)
    return list(grads[num_theta:])

  @staticmethod
  def _InputGrads(grads: Sequence[Any], flat_in: List[Any]) -> List[Any]:
    it = iter(grads)
    return [next(it) if IsDifferentiable(x) else None for x in flat_in]


def _NamedFunction(method, name: str, inline: bool):
  """A tf.function of `method` whose graph functions carry `name`.

  Unless `inline`, it is never inlined into the caller's graph: the pipeline
  orders the calls on one device with control dependencies, and once inlined
  (Grappler's default) every micro-batch's ops started at once, which kept
  all of their activations alive (transformer-act at batch 8, K=1, M=8,
  per-cell remat: 227 MB allocator peak inlined, 89 MB not inlined).
  """

  def Body(*args):
    return method(*args)

  Body.__name__ = name
  attributes = {} if inline else {'_noinline': True}
  return tf.function(Body, autograph=False, experimental_attributes=attributes)


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
