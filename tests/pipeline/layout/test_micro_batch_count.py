"""micro_batch_count: M from the params and the batch, and its errors."""

import pytest

from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.layout import micro_batch_count


def test_micro_batches_must_divide_batch():
  with pytest.raises(ValueError, match=r'num_micro_batches \(3\) must divide '
                     r'the batch size \(16\); try one of \[1, 2, 4, 8, 16\]'):
    micro_batch_count.CheckDivides(16, 3)
  with pytest.raises(ValueError, match=r'num_micro_batches \(0\)'):
    micro_batch_count.CheckDivides(16, 0)


def _Params(**kwargs):
  return gpipe.PipeliningLayer.Params().Set(name='pipe', **kwargs)


@pytest.mark.parametrize('kwargs,batch,m', [
    (dict(num_micro_batches=4), 16, 4),
    (dict(num_micro_batches=4), None, 4),
    (dict(micro_batch_size=4), 16, 4),
    (dict(micro_batch_size=4, num_micro_batches=2), 32, 8),
    (dict(micro_batch_size=4), None, None),
])
def test_num_micro_batches(kwargs, batch, m):
  assert micro_batch_count.NumMicroBatches(_Params(**kwargs), batch) == m


@pytest.mark.parametrize('kwargs,batch,match', [
    (dict(num_micro_batches=0), None, r'num_micro_batches \(0\) must be >= 1'),
    (dict(micro_batch_size=-1), 16, r'micro_batch_size \(-1\) > 0'),
    (dict(num_micro_batches=3), 16, r'num_micro_batches \(3\) must divide the batch size \(16\)'),
    (dict(micro_batch_size=5), 16,
     r'micro_batch_size \(5\) must divide the batch size \(16\); try one of \[1, 2, 4, 8, 16\]'),
])
def test_num_micro_batches_errors(kwargs, batch, match):
  with pytest.raises(ValueError, match=match):
    micro_batch_count.NumMicroBatches(_Params(**kwargs), batch)


@pytest.mark.parametrize('kwargs,batch,m', [
    (dict(num_micro_batches=4), 16, 4),  # of each replica's 8
    (dict(micro_batch_size=2), 16, 4),  # each replica's 8 in micro-batches of 2
    (dict(micro_batch_size=2), None, None),
])
def test_num_micro_batches_of_each_replica(kwargs, batch, m):
  assert micro_batch_count.NumMicroBatches(_Params(**kwargs), batch, replicas=2) == m


@pytest.mark.parametrize('kwargs,batch,match', [
    (dict(num_micro_batches=2), 10, r'num_replicas \(3\) must divide the batch size \(10\)'),
    (dict(num_micro_batches=4), 6,
     r"'pipe': with 3 replicas, each of 1/3 of the batch: num_micro_batches \(4\) must divide "
     r'the batch size \(2\); try one of \[1, 2\]'),
    (dict(micro_batch_size=4), 6, r'micro_batch_size \(4\) must divide the batch size \(2\)'),
])
def test_num_micro_batches_of_each_replica_errors(kwargs, batch, match):
  with pytest.raises(ValueError, match=match):
    micro_batch_count.NumMicroBatches(_Params(**kwargs), batch, replicas=3)


@pytest.mark.parametrize('kwargs,multiple', [
    (dict(num_micro_batches=4), 4),
    (dict(micro_batch_size=3), 3),
    (dict(micro_batch_size=3, num_micro_batches=2), 3),
])
def test_batch_multiple_is_what_sets_m(kwargs, multiple):
  """Decoders pad to it: with micro_batch_size M follows the batch, so a
  batch of any multiple of the size runs."""
  p = _Params(**kwargs)
  assert micro_batch_count.BatchMultiple(p) == multiple
  for batch in (multiple, 5 * multiple):
    micro_batch_count.NumMicroBatches(p, batch)


def test_batch_multiple_refuses_params_that_set_no_m():
  with pytest.raises(ValueError, match=r'num_micro_batches \(0\) must be >= 1'):
    micro_batch_count.BatchMultiple(_Params(num_micro_batches=0))
