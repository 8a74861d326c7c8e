"""What a layer's forward keeps for its backward, read off its traced gradient.

In one traced function that runs a layer's forward and then its
gradients, every tensor the forward makes that a gradient op reads stays
in memory from the forward to that op: what a micro-batch holds while it
waits for its backward (the planner's act). FPropMeta's act_bytes counts
every tensor a forward makes; TensorFlow keeps only these (on the
transformer workload about two thirds of them).

Counted once per buffer: views (Reshape, Identity, ExpandDims, Squeeze,
StopGradient, Snapshot) share their input's; ops that read only a shape
(Shape, ShapeN, Size, Rank) keep nothing; weights, constants and casts of
weights are the params' bytes, not activations; a gradient op whose result
no returned gradient needs reads nothing, as Grappler prunes it before the
step runs (the gradient of x * mask to a dropout mask, a cast of random
bits, reads x and leads nowhere: on the uneven stack of
docs/benchmarks/tuning.md it counted 20 MiB of 140 that no step held). A
layer's outputs are held if its own gradient reads them or the next
layer's reads its inputs (`Chain`).
"""

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Set

import tensorflow as tf

_VIEWS = frozenset({'Reshape', 'Identity', 'ExpandDims', 'Squeeze', 'StopGradient',
                    'Snapshot'})
_SHAPE_READERS = frozenset({'Shape', 'ShapeN', 'Size', 'Rank'})
_WEIGHTS = frozenset({'ReadVariableOp', 'Const', 'VarHandleOp'})


@dataclasses.dataclass(frozen=True)
class Kept:
  """What one layer's gradient reads of its forward, in bytes.

  Attributes:
    inner_bytes: tensors the forward makes, but its outputs.
    output_bytes: all its outputs' bytes.
    reads_outputs: its gradient reads one of its outputs.
    reads_inputs: its gradient reads one of its inputs.
  """
  inner_bytes: int
  output_bytes: int
  reads_outputs: bool
  reads_inputs: bool


class Marks:
  """Where, in the graph being traced, the forward starts and ends and the
  gradient starts and ends: call Forward() before the layer's forward,
  Outputs(y) after it, Gradient() before tape.gradient and Gradients(g)
  with what it returned."""

  def __init__(self) -> None:
    self.forward_start = self.forward_end = self.gradient_start = 0
    self.gradient_end: Optional[int] = None
    self.outputs: List[str] = []
    self.gradients: List[tf.Tensor] = []

  def Forward(self) -> None:
    self.forward_start = _OpCount()

  def Outputs(self, outputs: Sequence[Any]) -> None:
    """An output that is a captured input passed through is no tensor of
    the forward's: it is left out."""
    self.forward_end = _OpCount()
    self.outputs = [t.name for t in tf.nest.flatten(outputs) if tf.is_symbolic_tensor(t)]

  def Gradient(self) -> None:
    self.gradient_start = _OpCount()

  def Gradients(self, gradients: Any) -> None:
    self.gradient_end = _OpCount()
    self.gradients = [t for t in tf.nest.flatten(gradients, expand_composites=True)
                      if tf.is_symbolic_tensor(t)]


def _OpCount() -> int:
  return len(tf.compat.v1.get_default_graph().get_operations())


def Read(graph: tf.Graph, marks: Marks) -> Optional[Kept]:
  """What the gradient ops of `graph` (a traced function, marked by
  `marks`) read of the forward's tensors; None if one of them has no static
  shape (its bytes are unknown).

  Raises:
    ValueError: if `marks` never saw Gradients (no gradient op would count).
  """
  if marks.gradient_end is None:
    raise ValueError('kept_bytes.Read: call marks.Gradients(g) with what tape.gradient '
                     'returned; without it no gradient op is known to be needed.')
  ops = graph.get_operations()
  forward = {op.name for op in ops[marks.forward_start:marks.forward_end]}
  outputs = set(marks.outputs)
  kept: Dict[str, tf.Tensor] = {}
  reads_inputs = False
  for op in _Live(ops[marks.gradient_start:marks.gradient_end], marks.gradients):
    if op.type in _SHAPE_READERS:
      continue
    for t in op.inputs:
      t = _Buffer(t, forward)
      if t.op.type == 'Placeholder' and t.dtype != tf.resource:
        reads_inputs = True
      elif t.op.name in forward and not _IsWeight(t):
        kept[t.name] = t
  if any(not t.shape.is_fully_defined() for t in kept.values()):
    return None
  output_bytes = 0
  for name in outputs:
    t = graph.get_tensor_by_name(name)
    if not t.shape.is_fully_defined():
      return None
    output_bytes += _Bytes(t)
  return Kept(inner_bytes=sum(_Bytes(t) for name, t in kept.items() if name not in outputs),
              output_bytes=output_bytes,
              reads_outputs=any(name in outputs for name in kept),
              reads_inputs=reads_inputs)


def Chain(layers: Sequence[Kept]) -> List[int]:
  """Per layer of a chain (each feeding the next) the bytes its forward
  keeps: its inner tensors, and its outputs where its own gradient or the
  next layer's reads them (the last layer's: where its own does)."""
  held = []
  for i, k in enumerate(layers):
    next_reads = i + 1 < len(layers) and layers[i + 1].reads_inputs
    held.append(k.inner_bytes + (k.output_bytes if k.reads_outputs or next_reads else 0))
  return held


def _Live(gradient_ops: Sequence[tf.Operation], gradients: Sequence[tf.Tensor]
          ) -> List[tf.Operation]:
  """The ops of `gradient_ops` that `gradients` depend on, in order."""
  section = {op.name for op in gradient_ops}
  live: Set[str] = set()
  pending = [t.op for t in gradients]
  while pending:
    op = pending.pop()
    if op.name in live or op.name not in section:
      continue
    live.add(op.name)
    pending += [t.op for t in op.inputs] + list(op.control_inputs)
  return [op for op in gradient_ops if op.name in live]


def _Buffer(t: tf.Tensor, forward: Set[str]) -> tf.Tensor:
  """The tensor whose buffer `t` views (itself if none)."""
  while t.op.type in _VIEWS and t.op.inputs and t.op.name in forward:
    t = t.op.inputs[0]
  return t


def _IsWeight(t: tf.Tensor) -> bool:
  """A weight read, a constant, or a cast of one (the params' bytes)."""
  while t.op.type == 'Cast' or t.op.type in _VIEWS:
    t = t.op.inputs[0]
  return t.op.type in _WEIGHTS


def _Bytes(t: tf.Tensor) -> int:
  return t.shape.num_elements() * t.dtype.size
