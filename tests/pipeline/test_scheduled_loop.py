"""The loss-inside step of any schedule as one tf.while_loop over its clocks
(scheduled_loop): transparent as the unrolled one, its graph does not grow
with M, and 1F1B's rings hold its micro-batches in flight, not M."""

import pytest
import tensorflow as tf

from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline import loop_tables
from lingvo_pipe.pipeline.schedules import built_in
from lingvo_pipe.pipeline import schedule
from lingvo_pipe.pipeline.schedule import ScheduleKind

from tests import transparency
from tests.pipeline import pipeline_models as models

ONE_F = ScheduleKind.ONE_F_ONE_B
# K in {1, 2, 4} x M in {2, 4, 8} (the loop needs M > 1): the diagonal in
# `make test`, the rest under the slow mark.
GRID = models.KMGrid(ks=(1, 2, 4), ms=(2, 4, 8))


def _LoopPipeline(layers, shape, k, m, **kwargs):
  return models.Pipeline(layers, shape, k, m, loop_min_micro_batches=2, **kwargs)


def _Check(pipe, inputs, m, step=7):
  return transparency.CheckTransparent(
      pipe, inputs, m, step=step, loss_fn=models.ConstantNormLoss,
      train_step=models.TrainStepWithLoss(pipe, step, m))


@pytest.mark.parametrize('k,m', GRID)
def test_one_f_one_b_convnet_with_batch_norm_and_dropout(k, m):
  layers, shape = models.ConvNetLayers(keep_prob=0.8)
  pipe = _LoopPipeline(layers, shape, k, m, schedule=ONE_F)
  ref = _Check(pipe, (tf.random.stateless_normal(shape, [k, m]),), m)
  transparency.CheckMovingAverages(pipe, ref.bn_inputs)


@pytest.mark.parametrize('k,m', [(2, 4), pytest.param(4, 8, marks=pytest.mark.slow)])
def test_one_f_one_b_transformer_stack_with_dropout(k, m):
  """Integer ids and labels ride along with the activations."""
  pipe = models.TransformerStackPipeline(k, m, schedule=ONE_F, loop_min_micro_batches=2)
  _Check(pipe, models.TransformerInputs(seed=k * 100 + m), m)


@pytest.mark.parametrize('v,k,m', [
    (2, 2, 4), (3, 2, 4), (2, 1, 2),
    pytest.param(2, 4, 8, marks=pytest.mark.slow),
    pytest.param(3, 2, 8, marks=pytest.mark.slow)])
def test_interleaved_convnet_with_batch_norm_and_dropout(v, k, m):
  """K*v cells, cell j on device j mod K: a device's switch picks among
  the forwards and backwards of its v cells."""
  layers, shape = models.ConvNetLayers(keep_prob=0.8)
  pipe = _LoopPipeline(layers, shape, k * v, m, schedule=ScheduleKind.INTERLEAVED,
                       cells_per_device=v)
  assert pipe.num_devices == k
  _Check(pipe, (tf.random.stateless_normal(shape, [k, m]),), m)


@pytest.mark.parametrize('remat', [gpipe.RematPolicy.NONE, pytest.param(
    gpipe.RematPolicy.PER_LAYER, marks=pytest.mark.slow)])
def test_other_remat_policies(remat):
  """NONE recomputes in the loop too; PER_LAYER recomputes per layer."""
  layers, shape = models.FfnLayers(keep_prob=0.7)
  pipe = _LoopPipeline(layers, shape, 2, 4, schedule=ONE_F, remat=remat)
  _Check(pipe, (tf.random.stateless_normal(shape, [5, 6]),), 4)


def test_fill_drain_through_the_loss_inside_loop():
  layers, shape = models.ConvNetLayers(keep_prob=0.8)
  pipe = _LoopPipeline(layers, shape, 2, 4, schedule=ScheduleKind.GPIPE)
  _Check(pipe, (tf.random.stateless_normal(shape, [2, 4]),), 4)


def _Nodes(pipe, shape, m):
  """Nodes of the traced step and its functions' bodies."""
  graph_def = models.TrainStepWithLoss(pipe, 0, m).get_concrete_function(
      tf.TensorSpec(shape)).graph.as_graph_def()
  return list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]


@pytest.mark.parametrize('kind,v', [(ONE_F, 1), (ScheduleKind.INTERLEAVED, 2)])
def test_step_graph_does_not_grow_with_m(kind, v):
  """Every op of the step, not just the cell calls: micro-batches enter and
  leave the loop as one gather per tensor, so M=16 holds as many ops as
  M=4 (fewer than the unrolled step at M=4)."""
  layers, shape = models.FfnLayers(dim=64)

  def Ops(m, loop):
    pipe = models.Pipeline(layers, shape, 2 * v, m, loop_min_micro_batches=loop,
                           schedule=kind, cells_per_device=v)
    nodes = _Nodes(pipe, shape, m)
    assert any(n.op == 'While' for n in nodes) == bool(loop)
    return len([n for n in nodes if n.op != 'Const'])

  looped = [Ops(m, 2) for m in (4, 16)]
  assert looped[0] == looped[1], looped
  assert Ops(4, 0) > looped[0]


def test_below_the_switch_point_the_step_is_unrolled():
  layers, shape = models.FfnLayers()
  pipe = models.Pipeline(layers, shape, 2, 4, loop_min_micro_batches=8, schedule=ONE_F)
  assert not any(n.op == 'While' for n in _Nodes(pipe, shape, 4))


def test_each_clock_runs_on_the_cells_devices():
  """Inside the loop body, every switch, micro-batch gather and array
  read and write is placed on a cell's device."""
  layers, shape = models.FfnLayers(dim=64)
  pipe = _LoopPipeline(layers, shape, 2, 4, schedule=ONE_F)
  graph_def = models.TrainStepWithLoss(pipe, 0, 4).get_concrete_function(
      tf.TensorSpec(shape)).graph.as_graph_def()
  bodies = [f for f in graph_def.library.function if '_body_' in f.signature.name]
  assert len(bodies) == 1, [f.signature.name for f in bodies]
  placed = ('TensorListGetItem', 'TensorListSetItem', 'GatherV2', 'Case', 'StatelessCase')
  ops = [(n.op, n.device) for n in bodies[0].node_def if n.op in placed]
  assert {device.split(':')[-1] for _, device in ops if device} == {'0', '1'}, ops
  assert all(device for _, device in ops), [op for op, device in ops if not device]


def test_one_f_one_b_rings_hold_the_micro_batches_in_flight():
  """1F1B K=4 M=16: each boundary's ring holds at most K micro-batches (the
  ones in flight), not M, whether the last cell's backwards run with their
  forwards (per-cell remat) or at their own clocks; fill-drain's
  activations need all M."""
  one_f = built_in.Build(ONE_F, 4, 16)
  kept = loop_tables.Build(one_f, keep_last=True)
  assert kept.kept == frozenset(range(16))
  for rings in (loop_tables.Build(one_f, keep_last=False).rings, kept.rings):
    assert all(1 <= s <= 4 for s in rings.activations + rings.gradients), rings
    assert rings.loss_gradients == 1, rings
  fill_drain = loop_tables.Build(built_in.Build(ScheduleKind.GPIPE, 4, 16), False).rings
  assert fill_drain.activations == [16] * 3, fill_drain


def test_ring_depth_is_the_smallest_without_overwrite():
  # Micro-batch m written at clock m, last read at clock m + 2: the write
  # of m + 3 (clock m + 3) is the first after it.
  assert loop_tables.RingDepth([0, 1, 2, 3, 4], [2, 3, 4, 5, 6]) == 3
  assert loop_tables.RingDepth([0, 2, 4], [1, 3, 5]) == 1
  assert loop_tables.RingDepth([0, 1], [5, 6]) == 2


@pytest.mark.parametrize('kind,k,v,m', [
    (ONE_F, 2, 1, 4), pytest.param(ONE_F, 4, 1, 8, marks=pytest.mark.slow),
    (ScheduleKind.INTERLEAVED, 2, 2, 4)])
def test_deferred_weight_gradients_leave_the_loop(kind, k, v, m):
  """64 -> 128 -> 64 feed-forward layers at 16/M rows per micro-batch:
  per-cell remat defers their weight gradients (deferred_grads), whose
  factors leave the loop in M-sized arrays; the gradients still equal the
  reference's."""
  layers, shape = models.FfnLayers(keep_prob=0.8, dim=64)
  pipe = _LoopPipeline(layers, shape, k * v, m, schedule=kind, cells_per_device=v)
  _Check(pipe, (tf.random.stateless_normal(shape, [k, 9]),), m)
  graph = models.TrainStepWithLoss(pipe, 0, m).get_concrete_function(
      tf.TensorSpec(shape)).graph.as_graph_def()
  # One gather for the outputs, one for the input gradients; the others
  # take the deferred factors out of the loop.
  gathers = [n for n in graph.node if n.op == 'TensorListGather']
  assert len(gathers) > 2, 'no deferred factors leave the loop'


def test_one_f_one_b_keeps_the_last_cell_and_recomputes_the_others():
  """Per-cell remat under 1F1B (K=2, M=4): the last cell runs each
  micro-batch's backward right after its forward, so the loop runs both in
  one branch from the forward's tape and never calls its recomputing
  backward; cell 0's backward is called in the loop (once, whatever M)."""
  layers, shape = models.FfnLayers()
  pipe = _LoopPipeline(layers, shape, 2, 4, schedule=ONE_F)
  called = [n.attr['f'].func.name for n in _Nodes(pipe, shape, 4) if 'f' in n.attr]
  assert not [f for f in called if 'cell_1_backward_' in f], called
  assert len([f for f in called if 'cell_0_backward_' in f]) == 1, called
