"""Tests of balancing layers into cells and of manual split points."""

import itertools

import pytest
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import layer_meta
from lingvo_pipe.pipeline.layout import partition


def _BruteForceBest(costs, k):
  n = len(costs)
  best = None
  for splits in itertools.combinations(range(1, n), k - 1):
    bounds = (0,) + splits + (n,)
    worst = max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
    best = worst if best is None else min(best, worst)
  return best


def _MaxCell(costs, splits):
  bounds = [0] + splits + [len(costs)]
  return max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))


@pytest.mark.parametrize('costs,k', [
    ([1, 1, 1, 1], 2), ([5, 1, 1, 1, 1, 1], 2), ([1, 2, 3, 4, 5, 6, 7, 8], 3),
    ([9, 1, 1, 9, 1, 1, 9], 4), ([3, 3, 3], 3), ([2, 7, 1, 8, 2, 8, 1, 8], 4)])
def test_balanced_splits_are_optimal(costs, k):
  splits = partition.BalancedSplits(costs, k)
  assert len(splits) == k - 1
  assert _MaxCell(costs, splits) == _BruteForceBest(costs, k)


def test_balanced_splits_equal_costs():
  assert partition.BalancedSplits([1] * 16, 4) == [4, 8, 12]


def test_more_cells_than_layers_is_an_error():
  with pytest.raises(ValueError, match='Cannot split 3 layers into 4 cells'):
    partition.BalancedSplits([1, 1, 1], 4)


def test_manual_splits():
  assert partition.CheckSplits([3, 7, 12], 16) == [3, 7, 12]
  assert partition.SplitLayers(list('abcdef'), [2, 5]) == [['a', 'b'],
                                                          ['c', 'd', 'e'], ['f']]
  for bad in ([0, 4], [4, 4], [5, 3], [3, 16]):
    with pytest.raises(ValueError, match='strictly increasing'):
      partition.CheckSplits(bad, 16)


class _Costly(base_layer.BaseLayer):
  """A layer whose FLOPs are its `cost` param times the batch."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('cost', 1, 'FLOPs per example.')
    return p

  @classmethod
  def FPropMeta(cls, params, shape):
    shape = tf.TensorShape(shape)
    return layer_meta.LayerMeta((shape,), flops=params.cost * shape[0],
                                param_bytes=4 * params.cost)


def test_layer_costs_from_metadata():
  layers = [_Costly.Params().Set(cost=c) for c in (1, 5, 2)]
  assert partition.LayerCosts(layers, [[8, 3]]) == [8, 40, 16]
  assert partition.LayerCosts(layers, [[8, 3]], partition.CostKind.PARAM_BYTES) == [4, 20, 8]
