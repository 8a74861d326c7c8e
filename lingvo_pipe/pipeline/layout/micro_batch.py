"""The micro-batch contract: what is split, broadcast, concatenated or summed.

A PipeliningLayer's user declares it; nothing is guessed from shapes. Inputs
and outputs are named by paths: the index of a positional input of FProp
(or of an output in the last cell's output tuple), then, inside a nested
input, one '.'-separated component per level, a NestedMap or dict key or a
list or tuple index. '1' is all of input 1; '1.mask' is the entry `mask` of
NestedMap input 1; '2.0.ids' the key `ids` of the first element of tuple
input 2. A path names every tensor under it.

Inputs in broadcast_inputs reach every micro-batch whole and their
gradient is the sum over micro-batches; every other input is split along
batch_dim and must carry the same batch size there. Outputs in
summed_outputs (auxiliary losses, metrics) are summed over micro-batches;
every other output is concatenated along batch_dim and must carry the
micro-batch size there. Anything else is a ValueError naming the input or
output and the fix.
"""

import collections.abc
import dataclasses
import re
from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import hyperparams

_PATH_RE = re.compile(r'^(0|[1-9][0-9]*)(\.[^.]+)*$')


def CheckPaths(entries: Any, param: str) -> Tuple[str, ...]:
  """The entries of `param` (broadcast_inputs or summed_outputs) as paths;
  an int i is the path 'i'.

  Raises:
    ValueError: for an entry that is neither an index >= 0 nor a path, or
      one given twice.
  """
  if not isinstance(entries, (list, tuple)):
    raise ValueError(f'{param} must be a list of indices or paths (e.g. '
                     f"[1, '2.mask']), got {entries!r}.")
  paths: List[str] = []
  for entry in entries:
    path = str(entry) if type(entry) is int and entry >= 0 else entry
    if not isinstance(path, str) or not _PATH_RE.match(path):
      raise ValueError(
          f'{param} entry {entry!r} is malformed: give an index >= 0 (e.g. '
          f"1) or a path of an index and keys or indices inside it, joined "
          f"by dots (e.g. '1.mask').")
    if path in paths:
      raise ValueError(f'{param} names {path!r} twice.')
    paths.append(path)
  return tuple(paths)


def _PathTree(x: Any, path: str) -> Any:
  """x with each leaf replaced by its path."""
  def Join(key: Any) -> str:
    return f'{path}.{key}' if path else str(key)
  if isinstance(x, collections.abc.Mapping):
    return {k: _PathTree(v, Join(k)) for k, v in x.items()}
  if isinstance(x, (list, tuple)):
    return [_PathTree(v, Join(i)) for i, v in enumerate(x)]
  return path


def LeafPaths(structure: tuple) -> List[str]:
  """The path of each leaf of tf.nest.flatten(structure), in that order."""
  paths = tf.nest.flatten(_PathTree(structure, ''))
  if len(paths) != len(tf.nest.flatten(structure)):
    raise TypeError(f'Cannot name the tensors of {structure!r}: use tensors, '
                    'NestedMaps, dicts, lists and tuples.')
  return paths


def _Within(path: str, declared: str) -> bool:
  return path == declared or path.startswith(declared + '.')


def _Select(structure: tuple, declared: Tuple[str, ...], param: str,
            what: str) -> Tuple[bool, ...]:
  """Per leaf of structure whether a declared path names it.

  Raises:
    ValueError: if a declared path names no leaf.
  """
  paths = LeafPaths(structure)
  for d in declared:
    if any(_Within(p, d) for p in paths):
      continue
    index = int(d.split('.')[0])
    if index >= len(structure):
      raise ValueError(f'{param} index {index} (in {d!r}) is out of range: '
                       f'there are {len(structure)} {what}.')
    raise ValueError(f'{param} names {d!r}, which is not among the {what}; '
                     f'their paths are {paths}.')
  return tuple(any(_Within(p, d) for d in declared) for p in paths)


def _Shape(x: Any) -> tf.TensorShape:
  return x if isinstance(x, tf.TensorShape) else tf.TensorShape(
      getattr(x, 'shape', None))


def _SizeAt(shape: tf.TensorShape, dim: int) -> Optional[int]:
  if shape.rank is None or shape.rank <= dim:
    return None
  return shape[dim]


@dataclasses.dataclass(frozen=True)
class InputLayout:
  """Per flat input whether it is broadcast; the others' batch size."""
  broadcast: Tuple[bool, ...]
  batch_size: int


class Contract:
  """How a PipeliningLayer micro-batches (see the module docstring)."""

  def __init__(self, batch_dim: int, broadcast_inputs: Sequence[Any] = (),
               summed_outputs: Sequence[Any] = ()) -> None:
    if batch_dim not in (0, 1):
      raise ValueError(f'batch_dim must be 0 (batch-major) or 1 '
                       f'(time-major), got {batch_dim}.')
    self.batch_dim = batch_dim
    self.broadcast_inputs = CheckPaths(broadcast_inputs, 'broadcast_inputs')
    self.summed_outputs = CheckPaths(summed_outputs, 'summed_outputs')

  @classmethod
  def FromParams(cls, p: hyperparams.Params) -> 'Contract':
    return cls(p.batch_dim, p.broadcast_inputs, p.summed_outputs)

  def BroadcastInputs(self, inputs: tuple) -> Tuple[bool, ...]:
    """Per flat input (tensors or shapes) whether it is broadcast.

    Raises:
      ValueError: if a path of broadcast_inputs names no input.
    """
    return _Select(inputs, self.broadcast_inputs, 'broadcast_inputs',
                   'pipeline inputs')

  def InputLayout(self, inputs: tuple) -> InputLayout:
    """Checks the inputs (tensors or shapes) against the contract.

    Raises:
      ValueError: if a broadcast path names no input, or an input not
        declared broadcast has no static size at batch_dim or a size
        there other than the other such inputs'.
    """
    broadcast = self.BroadcastInputs(inputs)
    split = [(path, _Shape(x)) for path, x, b in zip(
        LeafPaths(inputs), tf.nest.flatten(inputs), broadcast) if not b]
    if not split:
      raise ValueError(f'Every pipeline input is in broadcast_inputs '
                       f'{list(self.broadcast_inputs)}: at least one must '
                       f'carry the batch at batch_dim={self.batch_dim}.')
    for path, shape in split:
      if _SizeAt(shape, self.batch_dim) is None:
        raise ValueError(
            f'Pipeline input {path!r} (shape {shape}) has no static size at '
            f'batch_dim={self.batch_dim}, so it cannot be split into '
            'micro-batches. If every micro-batch should get it whole, '
            f'declare it: broadcast_inputs=[{path!r}].')
    first_path, first = split[0]
    batch_size = first[self.batch_dim]
    for path, shape in split[1:]:
      if shape[self.batch_dim] != batch_size:
        raise ValueError(
            f'Pipeline inputs split into micro-batches must share the batch '
            f'size at batch_dim={self.batch_dim}, but input {first_path!r} '
            f'(shape {first}) has {batch_size} and input {path!r} (shape '
            f'{shape}) has {shape[self.batch_dim]}. If every micro-batch '
            f'should get one of them whole, declare it in broadcast_inputs '
            f'(e.g. broadcast_inputs=[{path!r}]).')
    return InputLayout(broadcast, int(batch_size))

  def CheckLossInputs(self, loss_inputs: Any, batch_size: int) -> None:
    """Checks FPropWithLoss's loss_inputs (tensors or shapes): each carries
    the pipeline's batch, `batch_size` examples, at batch_dim.

    Raises:
      ValueError: naming the first that does not, its shape and the fix.
    """
    for path, x in zip(LeafPaths(loss_inputs), tf.nest.flatten(loss_inputs)):
      name, shape = 'loss_inputs' + (f'.{path}' if path else ''), _Shape(x)
      size = _SizeAt(shape, self.batch_dim)
      if size is None:
        raise ValueError(
            f'{name} (shape {shape}) has no static size at batch_dim={self.batch_dim}: '
            'loss inputs are per-example tensors (labels, weights, masks) cut into '
            'micro-batches as the pipeline inputs are. A tensor the loss uses whole '
            'needs no cutting: let loss_fn read it directly.')
      if size != batch_size:
        raise ValueError(
            f'{name} (shape {shape}) has {size} examples at batch_dim={self.batch_dim} '
            f'where the pipeline inputs have {batch_size}: give it one entry per '
            'example of the pipeline\'s batch, in the same order.')

  def SplitShapes(self, shapes: tuple, num_micro: int) -> tuple:
    """The input shapes of one micro-batch."""
    layout = self.InputLayout(shapes)

    def Micro(shape: tf.TensorShape, broadcast: bool) -> tf.TensorShape:
      if broadcast:
        return shape
      dims = shape.as_list()
      dims[self.batch_dim] //= num_micro
      return tf.TensorShape(dims)
    return tf.nest.pack_sequence_as(shapes, [
        Micro(_Shape(s), b)
        for s, b in zip(tf.nest.flatten(shapes), layout.broadcast)])

  def SplitInputs(self, inputs: tuple, num_micro: int) -> List[tuple]:
    """The inputs of each micro-batch: slices along batch_dim, broadcast
    inputs whole."""
    rows = _Split(tf.nest.flatten(inputs), self.InputLayout(inputs).broadcast,
                  num_micro, self.batch_dim)
    return [tuple(tf.nest.pack_sequence_as(inputs, r)) for r in rows]

  def MergeInputGrads(self, micro_inputs: tuple,
                      per_micro: Sequence[Sequence[Any]]) -> List[Any]:
    """Gradients of the flat inputs from each micro-batch's (`micro_inputs`:
    any micro-batch's inputs): a split input's are concatenated, a
    broadcast input's summed. None stays None."""
    return _Merge(per_micro, self.BroadcastInputs(micro_inputs), self.batch_dim)

  def SummedOutputs(self, outputs: tuple) -> Tuple[bool, ...]:
    """Per flat output (tensors or shapes) of the last cell whether it is
    summed over micro-batches.

    Raises:
      ValueError: if a path of summed_outputs names no output.
    """
    return _Select(outputs, self.summed_outputs, 'summed_outputs',
                   'outputs of the last cell')

  def MergeOutputs(self, per_micro: Sequence[tuple], micro_size: int) -> tuple:
    """The last cell's outputs of the whole batch from each micro-batch's.

    Raises:
      ValueError: if an output not in summed_outputs lacks the micro-batch
        size `micro_size` at batch_dim.
    """
    summed = self.SummedOutputs(per_micro[0])
    for path, y, s in zip(LeafPaths(per_micro[0]),
                          tf.nest.flatten(per_micro[0]), summed):
      if not s and _SizeAt(_Shape(y), self.batch_dim) != micro_size:
        raise ValueError(
            f"Output {path!r} of the last cell (shape {_Shape(y)} per "
            f'micro-batch) lacks the micro-batch size {micro_size} at '
            f'batch_dim={self.batch_dim}, so it cannot be concatenated over '
            'micro-batches. If it is a loss term or metric to sum over '
            f'micro-batches, declare it: summed_outputs=[{path!r}].')
    merged = _Merge([tf.nest.flatten(o) for o in per_micro], summed,
                    self.batch_dim)
    return tf.nest.pack_sequence_as(per_micro[0], merged)

  def SplitOutputGrads(self, outputs: tuple, flat_grads: Sequence[Any],
                       num_micro: int) -> List[List[Any]]:
    """Per micro-batch the gradients of its flat outputs (`outputs`: any
    micro-batch's): slices of a concatenated output's, a summed output's
    whole (the gradient of a sum reaches each term unchanged)."""
    return _Split(flat_grads, self.SummedOutputs(outputs), num_micro,
                  self.batch_dim)


def _Split(flat: Sequence[Any], whole: Sequence[bool], num_micro: int,
           batch_dim: int) -> List[List[Any]]:
  """Per micro-batch the entries of `flat`: slices along batch_dim, or the
  entry itself where `whole`."""
  columns = [[x] * num_micro if w else tf.split(x, num_micro, axis=batch_dim)
             for x, w in zip(flat, whole)]
  return [list(row) for row in zip(*columns)]


def _Merge(per_micro: Sequence[Sequence[Any]], summed: Sequence[bool],
           batch_dim: int) -> List[Any]:
  """Entry-wise over micro-batches: the sum where `summed`, else the
  concatenation along batch_dim. None stays None."""
  merged: List[Any] = []
  for column, s in zip(zip(*per_micro), summed):
    if any(x is None for x in column):
      merged.append(None)
    else:
      merged.append(tf.add_n(list(column)) if s else
                    tf.concat(list(column), axis=batch_dim))
  return merged
