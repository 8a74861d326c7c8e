"""One cell's theta gradients over a training step: sink, sums, deferrals.

A step runs each cell's backward once per micro-batch. With one
micro-batch the backward returns the theta gradients (GradSink.RETURN), so
that the optimizer updates a weight as soon as its gradient is ready, as
without the pipeline. With several, each backward adds its weight gradients
into accumulators on the cell's device, in place, layer by layer as the
tape produces them (ASSIGN for the step's first backward, ADD after): only
one weight-sized sum per cell is alive, not the sum, the micro-batch's
gradients and their new sum. The accumulators are resources of the step,
not variables: a step's first backward creates them, and StepGradients
destroys them once read, so they hold no memory between steps. (Assigning
an empty tensor to a variable instead does not work: Grappler's constant
folding then infers the variable's reads with the wrong shape.)

Projections that defer their weight gradients (deferred_grads) hand over
factor pairs instead, and the step's gradient of such a weight is its
accumulator (if the tape gave it a part too) plus one product of the pairs
of all micro-batches. A backward split into I and W (remat.Decision.split)
hands its factor pairs to its W instead (TakeSplitFactors), which adds
their product into a sum of the step (AddProducts), or, in a loop step,
into a sum the loop carries (Products), handed back after it (PutSums).
These sums are tensors, not the accumulators: an update inside a loop
iteration holds the next iteration back until it is done.

Per step: StartStep; per backward NextSink (the backward is traced per
sink), Put inside the backward, Keep with the BackwardResult after it; per
W AddProducts; then StepGradients.
"""

import enum
import uuid
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Set, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import precision
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline.cell import deferred_grads
from lingvo_pipe.pipeline.cell import scope_names


class GradSink(enum.Enum):
  """Where a backward puts the cell's theta gradients."""
  RETURN = 'return'  # the step's only micro-batch: returns them
  ASSIGN = 'assign'  # the first of several: replaces the accumulators
  ADD = 'add'        # a later one: adds to the accumulators


def IsDifferentiable(x: Any) -> bool:
  """Whether `x` has a gradient: it is floating point."""
  return tf.as_dtype(x.dtype).is_floating


FactorPairs = Dict[int, List[Tuple[tf.Tensor, tf.Tensor]]]


class BackwardResult(NamedTuple):
  """What one backward of a cell produces; weights are the cell's floating
  theta, by index.

  A nest, so that a traced backward returns it: the call gives it back with
  the tensors replaced by the call's outputs and the rest of the structure
  as traced. Which weights deferred is structure (dict keys), not tensors.

  Attributes:
    weight_grads: with GradSink.RETURN the gradient of each weight (None if
      all of it is deferred); else [] (they are in the accumulators).
    input_grads: the gradient of each floating-point cell input.
    factors: the deferred factor pairs of each deferring weight.
    deferred_only: keys: the weights whose gradient is all deferred (the
      tape gave them none); values None.
    done: a scalar made after every gradient and every put of them: what
      the device's next action waits for (a gradient op still to run holds
      the activations it reads).
  """
  weight_grads: List[Optional[tf.Tensor]]
  input_grads: List[tf.Tensor]
  factors: FactorPairs
  deferred_only: Dict[int, None]
  done: tf.Tensor


class CellGradients:
  """The theta gradients of one cell: its sinks, accumulators and the
  deferred factor pairs of the current step."""

  def __init__(self, cell: base_layer.BaseLayer, device: str) -> None:
    self._device = device
    self._specs = [tf.TensorSpec(v.shape, v.dtype) for v in tf.nest.flatten(cell.theta)
                   if IsDifferentiable(v)]
    # Handles made once, outside any function, as a variable's are: every
    # step's graph and traced backward captures the same ones (ops on one
    # resource are then ordered), and TensorFlow's custom gradients find
    # no variable-creating op in the step to look up. A handle takes no
    # memory; its resource does from its first assignment (a returned or
    # deferred gradient's never) until StepGradients destroys it.
    # Named by their owner alone: no two CellGradients share a resource.
    name = f'{cell.params.name}_grad_sum_{uuid.uuid4().hex[:12]}'
    with tf.init_scope(), tf.device(device):
      self._accumulators = [
          tf.raw_ops.VarHandleOp(dtype=spec.dtype, shape=spec.shape,
                                 shared_name=f'{name}_{i}')
          for i, spec in enumerate(self._specs)]
    self.StartStep(1)

  def StartStep(self, num_micro: int) -> None:
    """Forgets the previous step; `num_micro` backwards follow."""
    self._num_micro = num_micro
    self._backwards = 0
    self._returned: List[Optional[tf.Tensor]] = []
    self._factors: FactorPairs = {}
    self._split_factors: FactorPairs = {}
    self._sums: Dict[int, tf.Tensor] = {}
    self._deferred_only: Set[int] = set()
    self._written: Set[int] = set()  # accumulators holding this step's sum

  def StartLoopStep(self, num_micro: int) -> None:
    """Starts a step whose `num_micro` backwards are one backward function
    called in a loop (loop_executor): every backward adds
    (GradSink.ADD). Trace the backward, then ZeroAccumulators."""
    self.StartStep(max(num_micro, 2))  # accumulated, never returned
    self._backwards = 1

  def ZeroAccumulators(self) -> None:
    """Sets to zero, for a loop step, the accumulators its backwards add
    to: not those of weights whose gradient is all deferred (known once a
    backward is traced), which thus take no memory, as in an unrolled step
    (a loop's W's add into sums it carries). The zeros are made when the
    step runs: a tf.zeros of static shape is folded into a constant that
    the graph holds between steps, one weight-sized per weight shape and
    device."""
    with tf.device(self._device):
      for i, (acc, spec) in enumerate(zip(self._accumulators, self._specs)):
        if i not in self._deferred_only:
          tf.raw_ops.AssignVariableOp(resource=acc, value=FreshZeros([spec])[0])
          self._written.add(i)

  def TakeFactors(self) -> FactorPairs:
    """Removes and returns the factor pairs kept so far this step (a loop
    carries them out of its body itself, then hands them back with
    PutFactors)."""
    factors, self._factors = self._factors, {}
    return factors

  def PutFactors(self, factors: FactorPairs) -> None:
    """Adds factor pairs to this step's, as Keep does."""
    for i, pairs in factors.items():
      self._factors.setdefault(i, []).extend(pairs)

  def PutSums(self, sums: Dict[int, tf.Tensor]) -> None:
    """Weight gradient sums (of Products) that StepGradients adds in."""
    self._sums.update(sums)

  def SumSpecs(self, indices: Sequence[int]) -> List[tf.TensorSpec]:
    """The specs of Products' sums of weights `indices`."""
    return [self._specs[i] for i in indices]

  def NextSink(self) -> GradSink:
    """The sink of the step's next backward."""
    if self._num_micro == 1:
      return GradSink.RETURN
    return GradSink.ADD if self._backwards else GradSink.ASSIGN

  def Put(self, weight_grads: Sequence[Optional[tf.Tensor]],
          sink: GradSink) -> Tuple[List[Optional[tf.Tensor]], List[Any]]:
    """Inside a backward: puts the weights' gradients (None: all deferred)
    into `sink`. Returns BackwardResult.weight_grads and the ops that put
    them into the accumulators."""
    if sink == GradSink.RETURN:
      return list(weight_grads), []
    assign = (tf.raw_ops.AssignVariableOp if sink == GradSink.ASSIGN
              else tf.raw_ops.AssignAddVariableOp)
    return [], [assign(resource=acc, value=precision.CastGradients([g], [spec])[0])
                for acc, spec, g in zip(self._accumulators, self._specs, weight_grads)
                if g is not None]

  def Keep(self, sink: GradSink, result: BackwardResult, split: bool = False) -> None:
    """After a backward into `sink`: keeps what StepGradients sums, or with
    `split` (an I) the factor pairs for its W (TakeSplitFactors). The
    backwards of one step that are not split defer the same weights."""
    if sink == GradSink.RETURN:
      self._returned = list(result.weight_grads)
    else:
      self._written |= set(range(len(self._specs))) - set(result.deferred_only)
    self._deferred_only = set(result.deferred_only)
    if split:
      self._split_factors = dict(result.factors)
    else:
      for i, pairs in result.factors.items():
        self._factors.setdefault(i, []).extend(pairs)
    self._backwards += 1

  def TakeSplitFactors(self) -> FactorPairs:
    """The factor pairs of the last split backward (an I), for its W."""
    factors, self._split_factors = self._split_factors, {}
    return factors

  def Products(self, factors: FactorPairs) -> Dict[int, tf.Tensor]:
    """A W's weight gradients: each weight's product of `factors` (one
    micro-batch's, from TakeSplitFactors), in its accumulator's dtype, on
    the cell's device."""
    with tf.device(self._device), tf.name_scope(scope_names.WEIGHT_GRADIENTS_SCOPE):
      return self._Products(factors)

  def AddProducts(self, factors: FactorPairs) -> List[tf.Tensor]:
    """A W: adds Products into this step's sums, tensors that StepGradients
    adds in (an accumulator variable would hold its weight-sized memory
    between steps too). Returns the new sums."""
    with tf.device(self._device), tf.name_scope(scope_names.WEIGHT_GRADIENTS_SCOPE):
      for i, g in self._Products(factors).items():
        self._sums[i] = self._sums[i] + g if i in self._sums else g
    return [self._sums[i] for i in sorted(factors)]

  def _Products(self, factors: FactorPairs) -> Dict[int, tf.Tensor]:
    """Products' tensors, in the caller's device and scope."""
    return {i: precision.CastGradients([deferred_grads.Product(factors[i])],
                                       [self._specs[i]])[0] for i in sorted(factors)}

  def StepGradients(self, theta: NestedMap) -> List[Optional[tf.Tensor]]:
    """The theta gradients summed over this step's backwards (returned or
    accumulated, plus the deferred products), flat as theta; None where
    theta is not floating point. Each is in its variable's dtype (float32
    under a reduced compute dtype: core/precision), cast on the cell's
    device. Call after the step's last backward, once: the reads of the
    accumulators are ordered after it, and their destruction after the
    reads."""
    weights = iter(range(len(self._specs)))
    grads: List[Optional[tf.Tensor]] = []
    with tf.device(self._device), tf.name_scope(scope_names.WEIGHT_GRADIENTS_SCOPE):
      for x in tf.nest.flatten(theta):
        if not IsDifferentiable(x):
          grads.append(None)
          continue
        i = next(weights)
        taped = self._Taped(i, x)
        parts = [] if taped is None else [taped]
        if i in self._factors:
          parts.append(deferred_grads.Product(self._factors[i]))
        if i in self._sums:
          parts.append(self._sums[i])
        parts = precision.CastGradients(parts, [self._specs[i]] * len(parts))
        grads.append(tf.add_n(parts) if len(parts) > 1 else parts[0])
      with tf.control_dependencies([g for g in grads if g is not None]):
        for acc in self._accumulators:
          tf.raw_ops.DestroyResourceOp(resource=acc, ignore_lookup_error=True)
    return grads

  def _Taped(self, i: int, x: tf.Tensor) -> Optional[tf.Tensor]:
    """Weight i's gradient from the tapes and the W's: returned, or
    accumulated; None if there is none (all deferred to the step's end)."""
    if self._num_micro == 1:
      return self._returned[i]
    if i not in self._written:
      return None
    return tf.ensure_shape(tf.raw_ops.ReadVariableOp(
        resource=self._accumulators[i], dtype=self._specs[i].dtype), x.shape)


def FreshZeros(specs: Sequence[tf.TensorSpec]) -> List[tf.Tensor]:
  """Zeros of `specs` made when the step runs, never folded into constants
  (as tf.zeros of a static shape is) that the graph would hold between
  steps."""
  return [tf.raw_ops.Empty(shape=s.shape.as_list(), dtype=s.dtype, init=True) for s in specs]
