"""measured_costs: each layer timed alone at the micro-batch size, and a
partition that balances the measured seconds."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core.layers import linear
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.layout import partition
from lingvo_pipe.pipeline.lowering import program
from lingvo_pipe.pipeline.lowering.remat import RematPolicy
from lingvo_pipe.pipeline.schedules import schedule
from lingvo_pipe.pipeline.schedules.schedule import ScheduleKind
from lingvo_pipe.planning import measured_costs

from tests.pipeline import pipeline_models as models


def _Params(layers, shape, k=2, m=2):
  return gpipe.PipeliningLayer.Params().Set(name='pipe', layers=layers, num_partitions=k,
                                            num_micro_batches=m, input_shapes=[shape])


def test_every_layer_measured_on_a_micro_batch_and_balanced():
  """The feed-forward stack with dropout (four layers): a cost each, and
  a pipeline whose cells are the balanced split of their step seconds."""
  layers, shape = models.FfnLayers()
  p = _Params(layers, shape)
  costs = measured_costs.Measure(p, [tf.random.stateless_normal(shape, [1, 2])], repeats=2)
  assert len(costs) == len(layers)
  assert all(c.forward_s > 0 and c.input_grad_s >= 0 and c.weight_grad_s >= 0 and
             c.accumulate_s > 0 for c in costs)
  balanced = measured_costs.Balanced(p, costs)
  assert balanced.cost == partition.CostKind.GIVEN and p.cost == partition.CostKind.FLOPS
  # Its own step, fill-drain at M=2 under per-cell remat, runs each cell's
  # first micro-batch's forward again.
  assert balanced.layer_costs == [2 * c.step_s + c.forward_s for c in costs]
  pipe = balanced.Instantiate()
  splits = partition.BalancedSplits(balanced.layer_costs, 2)
  assert pipe.CellLayerIndices() == [list(range(splits[0])), list(range(splits[0], 4))]


def test_balanced_takes_m_from_the_params_and_refuses_where_it_is_unknown():
  """Without input_shapes M is num_micro_batches (fill-drain at M=4 under
  per-cell remat: 3 forwards again); with micro_batch_size instead, M
  needs the batch, and the refusal says so."""
  layers, _ = models.FfnLayers()
  costs = [measured_costs.LayerCost(1.0, 1.0, 1.0)] * len(layers)
  p = gpipe.PipeliningLayer.Params().Set(name='pipe', layers=layers, num_partitions=2,
                                         num_micro_batches=4)
  assert measured_costs.Balanced(p, costs).layer_costs == [4 * 3 + 3] * len(layers)
  with pytest.raises(ValueError, match=r"'pipe': Balanced needs the step's M; with "
                                       r'micro_batch_size=2 set input_shapes'):
    measured_costs.Balanced(p.Copy().Set(micro_batch_size=2), costs)


def test_step_shares_count_the_forwards_that_remat_runs_again():
  """A forward-only layer and one of F = I = W: alike by step_s; at K=2
  M=4 fill-drain with per-cell remat each cell runs 3 of its 4 forwards
  again, 1F1B on one device none, and without remat nothing is run again."""
  costs = [measured_costs.LayerCost(3.0, 0.0, 0.0), measured_costs.LayerCost(1.0, 1.0, 1.0)]
  assert costs[0].step_s == costs[1].step_s

  def Step(kind, k, remat):
    return program.Lower(schedule.Actions(kind, k, 4), remat, False, 1,
                         program.Step.LOSS_INSIDE, program.Emission.UNROLLED)

  fill_drain = Step(ScheduleKind.GPIPE, 2, RematPolicy.PER_CELL)
  assert measured_costs.StepShares(costs, fill_drain) == [4 * 3 + 3 * 3, 4 * 3 + 3 * 1]
  assert measured_costs.StepShares(costs, Step(ScheduleKind.ONE_F_ONE_B, 1,
                                               RematPolicy.PER_CELL)) == [12, 12]
  assert measured_costs.StepShares(costs, Step(ScheduleKind.GPIPE, 2,
                                               RematPolicy.NONE)) == [12, 12]


def test_a_layer_of_many_more_flops_measures_more():
  """8 -> 8 against 1024 -> 1024 on 64 rows (16,384 times the FLOPs)."""
  layers = [linear.ProjectionLayer.Params().Set(name='small', input_dim=8, output_dim=8),
            linear.ProjectionLayer.Params().Set(name='wide', input_dim=8, output_dim=1024),
            linear.ProjectionLayer.Params().Set(name='big', input_dim=1024, output_dim=1024)]
  costs = measured_costs.Measure(_Params(layers, [64, 8], k=1, m=1),
                                 [tf.ones([64, 8])], repeats=3)
  assert costs[2].step_s > costs[0].step_s
  assert costs[2].accumulate_s > costs[0].accumulate_s  # 1024 x 1024 weights against 8 x 8


def test_layers_of_one_kind_get_one_cost():
  """Three 64 -> 64 projections (one of them after a 64 -> 32 -> 64 pair
  of other kinds) get the same cost, the median of their timings; the
  others, of other params or input shapes, their own."""
  def Projection(name, d_in, d_out):
    return linear.ProjectionLayer.Params().Set(name=name, input_dim=d_in, output_dim=d_out)

  layers = [Projection('a', 64, 64), Projection('b', 64, 64), Projection('down', 64, 32),
            Projection('up', 32, 64), Projection('c', 64, 64)]
  costs = measured_costs.Measure(_Params(layers, [16, 64], k=1, m=1),
                                 [tf.ones([16, 64])], repeats=2)
  # (what a layer keeps depends on where it sits: kept_bytes.Chain)
  seconds = [dataclasses.replace(c, kept_bytes=None) for c in costs]
  assert seconds[0] == seconds[1] == seconds[4]
  assert seconds[2] != seconds[0] and seconds[3] != seconds[0]


def test_a_backward_is_timed_after_its_whole_forward():
  """The input gradient of x @ W, dy @ W^T, costs what its forward does:
  measured after the forward it needs (its cotangent the outputs, as a
  step's arrives after them), not beside it; with a constant cotangent
  the forward's product was pruned from the timed gradient (I about 0)."""
  layers = [linear.ProjectionLayer.Params().Set(name='big', input_dim=2048, output_dim=2048)]
  (cost,) = measured_costs.Measure(_Params(layers, [256, 2048], k=1, m=1),
                                   [tf.ones([256, 2048])], repeats=3)
  assert cost.input_grad_s > 0.4 * cost.forward_s


def test_bad_requests_are_named():
  layers, shape = models.FfnLayers()
  with pytest.raises(ValueError, match=r'repeats \(0\) must be >= 1'):
    measured_costs.Measure(_Params(layers, shape), [tf.ones(shape)], repeats=0)
  cell_tpl = gpipe.PipeliningLayer.Params().Set(name='manual', cell_tpl=layers[:2])
  with pytest.raises(ValueError, match=r"'manual'.*has none \(cell_tpl"):
    measured_costs.Measure(cell_tpl, [tf.ones(shape)])


def test_given_costs_move_the_split_and_are_checked():
  """Four equal layers split 2 + 2 by FLOPs; given costs 1, 1, 1, 10 put
  the costly one alone. Wrong counts, bad values and costs without
  CostKind.GIVEN are one line naming the pipeline."""
  layers, shape = models.FfnLayers()
  assert models.Pipeline(layers, shape, 2, 2).CellLayerIndices() == [[0, 1], [2, 3]]
  given = models.Pipeline(layers, shape, 2, 2, cost=partition.CostKind.GIVEN,
                          layer_costs=[1, 1, 1, 10])
  assert given.CellLayerIndices() == [[0, 1, 2], [3]]
  for costs, match in (([1, 1], r"'pipe': .*layer_costs has 2 for 4 layers"),
                       ([1, 1, 0, 1], r"'pipe': layer_costs\[2\] is 0; every cost must be")):
    with pytest.raises(ValueError, match=match):
      models.Pipeline(layers, shape, 2, 2, cost=partition.CostKind.GIVEN, layer_costs=costs)
  with pytest.raises(ValueError, match=r"'pipe': layer_costs are set but cost is .*FLOPS"):
    models.Pipeline(layers, shape, 2, 2, layer_costs=[1, 1, 1, 10])


def test_given_costs_may_be_numpy_numbers_not_booleans():
  layers, shape = models.FfnLayers()
  given = dict(cost=partition.CostKind.GIVEN)
  pipe = models.Pipeline(layers, shape, 2, 2, layer_costs=list(np.float32([1, 1, 1, 10])),
                         **given)
  assert pipe.CellLayerIndices() == [[0, 1, 2], [3]]
  with pytest.raises(ValueError, match=r'layer_costs\[0\] is True'):
    models.Pipeline(layers, shape, 2, 2, layer_costs=[True, 1, 1, 1], **given)
