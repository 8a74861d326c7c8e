"""Splitting a mini-batch into micro-batches and merging them back."""

from typing import Any, List, Sequence

import tensorflow as tf


def BatchSize(flat_inputs: Sequence[Any], batch_dim: int) -> int:
  """The static batch size: the `batch_dim` size of the first tensor input.

  Raises:
    ValueError: if no input has a static size at batch_dim.
  """
  for x in flat_inputs:
    shape = tf.TensorShape(getattr(x, 'shape', None))
    if shape.rank is not None and shape.rank > batch_dim:
      size = shape[batch_dim]
      if size is not None:
        return int(size)
  raise ValueError(f'No pipeline input has a static size at batch_dim='
                   f'{batch_dim} (input shapes: '
                   f'{[getattr(x, "shape", None) for x in flat_inputs]}); give '
                   'inputs with a known batch size.')


def HasBatchDim(x: Any, batch_size: int, batch_dim: int) -> bool:
  """True if x is split into micro-batches; other inputs are broadcast."""
  shape = tf.TensorShape(getattr(x, 'shape', None))
  return (shape.rank is not None and shape.rank > batch_dim and
          shape[batch_dim] == batch_size)


def CheckDivides(batch_size: int, num_micro_batches: int) -> None:
  """Raises ValueError naming the values when M does not divide the batch."""
  if num_micro_batches < 1 or batch_size % num_micro_batches:
    divisors = [d for d in range(1, batch_size + 1) if batch_size % d == 0]
    raise ValueError(
        f'num_micro_batches ({num_micro_batches}) must divide the batch size '
        f'({batch_size}); try one of {divisors}.')


def Split(flat_inputs: Sequence[Any], num_micro_batches: int,
          batch_dim: int) -> List[List[Any]]:
  """Returns per micro-batch the list of inputs (batch entries split)."""
  batch_size = BatchSize(flat_inputs, batch_dim)
  CheckDivides(batch_size, num_micro_batches)
  columns = []
  for x in flat_inputs:
    if HasBatchDim(x, batch_size, batch_dim):
      columns.append(tf.split(x, num_micro_batches, axis=batch_dim))
    else:
      columns.append([x] * num_micro_batches)
  return [list(row) for row in zip(*columns)]


def Concat(per_micro_batch: Sequence[Sequence[Any]], batch_dim: int) -> List[Any]:
  """Merges per-micro-batch lists of tensors: entries with the micro-batch
  dimension are concatenated along batch_dim, others (e.g. per-micro-batch
  loss terms) are summed."""
  micro_size = BatchSize(per_micro_batch[0], batch_dim)
  return [tf.concat(list(column), axis=batch_dim)
          if HasBatchDim(column[0], micro_size, batch_dim) else
          tf.add_n(list(column)) for column in zip(*per_micro_batch)]


def MergeInputGradients(flat_inputs: Sequence[Any],
                        per_micro_batch: Sequence[Sequence[Any]],
                        batch_dim: int) -> List[Any]:
  """Gradients of the whole inputs: split inputs concatenate their
  micro-batch gradients, broadcast inputs sum them. None stays None."""
  batch_size = BatchSize(flat_inputs, batch_dim)
  merged = []
  for i, x in enumerate(flat_inputs):
    grads = [g[i] for g in per_micro_batch]
    if any(g is None for g in grads):
      merged.append(None)
    elif HasBatchDim(x, batch_size, batch_dim):
      merged.append(tf.concat(grads, axis=batch_dim))
    else:
      merged.append(tf.add_n(grads))
  return merged
