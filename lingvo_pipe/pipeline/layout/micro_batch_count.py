"""How many micro-batches: M from a PipeliningLayer's params and the batch.

The only place M is derived from the params (num_micro_batches, or the
batch over micro_batch_size), so that the pipeline, the planner's table,
inspect_model and the decoders agree; the contract that cuts the inputs
into M micro-batches is micro_batch.py.
"""

import typing
from typing import List, Optional

from lingvo_pipe.core import hyperparams


def _Divisors(n: int) -> List[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def CheckDivides(batch_size: int, num_micro_batches: int, where: str = '') -> None:
  """Raises ValueError naming the values (after `where`, e.g. the layer)
  when M does not divide the batch."""
  if num_micro_batches < 1 or batch_size % num_micro_batches:
    raise ValueError(
        f'{where}num_micro_batches ({num_micro_batches}) must divide the batch size '
        f'({batch_size}); try one of {_Divisors(batch_size)}.')


@typing.overload
def NumMicroBatches(p: hyperparams.Params, batch_size: int, replicas: int = 1) -> int:
  ...


@typing.overload
def NumMicroBatches(p: hyperparams.Params, batch_size: None,
                    replicas: int = 1) -> Optional[int]:
  ...


def NumMicroBatches(p: hyperparams.Params, batch_size: Optional[int],
                    replicas: int = 1) -> Optional[int]:
  """M of PipeliningLayer params `p` for a batch of `batch_size` examples
  split over `replicas` (p.num_replicas in training, 1 in evaluation, which
  runs replica 0 on the whole batch): p.num_micro_batches, or each
  replica's batch / p.micro_batch_size when that is set. The only place M
  is derived from the params, so that the pipeline, the planner's table
  and inspect_model agree.

  Returns None only if micro_batch_size is set and batch_size is None.

  Raises:
    ValueError: if num_micro_batches < 1 (without micro_batch_size),
      micro_batch_size < 0, or the replicas, M or micro_batch_size do not
      divide the batch (each replica's).
  """
  where = f'PipeliningLayer {p.name!r}: '
  if p.micro_batch_size < 0 or (not p.micro_batch_size and
                                p.num_micro_batches < 1):
    raise ValueError(
        f'{where}num_micro_batches ({p.num_micro_batches}) must be >= 1, or '
        f'micro_batch_size ({p.micro_batch_size}) > 0.')
  if batch_size is not None and replicas > 1:
    if batch_size % replicas:
      raise ValueError(f'{where}num_replicas ({replicas}) must divide the batch size '
                       f'({batch_size}); try one of {_Divisors(batch_size)}.')
    batch_size //= replicas
    where += f'with {replicas} replicas, each of 1/{replicas} of the batch: '
  if not p.micro_batch_size:
    if batch_size is not None:
      CheckDivides(batch_size, p.num_micro_batches, where)
    return p.num_micro_batches
  if batch_size is None:
    return None
  if batch_size % p.micro_batch_size:
    raise ValueError(f'{where}micro_batch_size ({p.micro_batch_size}) must divide '
                     f'the batch size ({batch_size}); try one of '
                     f'{_Divisors(batch_size)}.')
  return batch_size // p.micro_batch_size


def BatchMultiple(p: hyperparams.Params) -> int:
  """What every batch an evaluation step of PipeliningLayer params `p`
  takes is a multiple of (replica 0 evaluates the whole batch alone):
  p.micro_batch_size if set, else p.num_micro_batches. Decoders pad their
  batches to it.

  Raises:
    ValueError: as NumMicroBatches, for values that set no M.
  """
  NumMicroBatches(p, None)
  return p.micro_batch_size or p.num_micro_batches
