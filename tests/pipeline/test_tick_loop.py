"""The fill-drain step as a tf.while_loop over clock ticks (tick_loop):
transparent as the unrolled one, and its graph does not grow with M."""

import pytest
import tensorflow as tf

from lingvo_pipe.pipeline import gpipe

from tests import transparency
from tests.pipeline import pipeline_models as models

# K in {1, 2, 4} x M in {2, 4, 8, 16} (the loop needs M > 1): the diagonal
# in `make test`, the rest under the slow mark.
GRID = models.KMGrid(ks=(1, 2, 4), ms=(2, 4, 8, 16))


def _LoopPipeline(layers, shape, k, m, **kwargs):
  return models.Pipeline(layers, shape, k, m, loop_min_micro_batches=2, **kwargs)


@pytest.mark.parametrize('k,m', GRID)
def test_convnet_with_batch_norm_and_dropout(k, m):
  layers, shape = models.ConvNetLayers(keep_prob=0.8)
  pipe = _LoopPipeline(layers, shape, k, m)
  x = tf.random.stateless_normal(shape, [k, m])
  ref = transparency.CheckTransparent(pipe, (x,), m)
  transparency.CheckMovingAverages(pipe, ref.bn_inputs)


@pytest.mark.parametrize('k,m', [(2, 4), pytest.param(4, 8, marks=pytest.mark.slow)])
def test_transformer_stack_with_dropout(k, m):
  """Integer ids and labels ride along with the activations."""
  pipe = models.TransformerStackPipeline(k, m, loop_min_micro_batches=2)
  transparency.CheckTransparent(pipe, models.TransformerInputs(seed=k * 100 + m), m)


@pytest.mark.parametrize('remat', [gpipe.RematPolicy.NONE, pytest.param(
    gpipe.RematPolicy.PER_LAYER, marks=pytest.mark.slow)])  # make test: NONE
def test_other_remat_policies(remat):
  """NONE recomputes in the loop too; PER_LAYER recomputes per layer."""
  layers, shape = models.FfnLayers(keep_prob=0.7)
  pipe = _LoopPipeline(layers, shape, 2, 4, remat=remat)
  transparency.CheckTransparent(pipe, (tf.random.stateless_normal(shape, [5, 6]),), 4)


def _CallOps(pipe, shape):
  """Function call ops in the traced step, its functions' bodies included."""
  graph_def = models.TrainStep(pipe, step=0).get_concrete_function(
      tf.TensorSpec(shape)).graph.as_graph_def()
  nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
  return len([n for n in nodes if n.op in ('PartitionedCall', 'StatefulPartitionedCall')
              and 'cell_' in n.attr['f'].func.name])


def test_step_holds_the_same_cell_calls_whatever_m():
  """K=2: each cell's forward and backward called once in the loops (plus
  the structure probe's forwards), M=4 as M=8; unrolled, they grow with M."""
  layers, shape = models.FfnLayers()
  looped = [_CallOps(_LoopPipeline(layers, shape, 2, m), shape) for m in (4, 8)]
  unrolled = [_CallOps(models.Pipeline(layers, shape, 2, m), shape) for m in (4, 8)]
  assert looped[0] == looped[1], looped
  assert unrolled[1] > unrolled[0] > looped[0], (unrolled, looped)


def test_below_the_switch_point_the_step_is_unrolled():
  layers, shape = models.FfnLayers()
  pipe = models.Pipeline(layers, shape, 2, 4, loop_min_micro_batches=8)
  assert _CallOps(pipe, shape) == _CallOps(models.Pipeline(layers, shape, 2, 4), shape)


@pytest.mark.parametrize('k,m', [(2, 4), pytest.param(4, 8, marks=pytest.mark.slow)])
def test_deferred_weight_gradients_leave_the_loop(k, m):
  """64 -> 128 -> 64 feed-forward layers at 16/M rows per micro-batch:
  M * rows * (64 + 128) <= 64 * 128, so per-cell remat defers their weight
  gradients (deferred_grads), whose factors the backward loop carries out
  in TensorArrays; the gradients still equal the reference's."""
  layers, shape = models.FfnLayers(keep_prob=0.8, dim=64)
  pipe = _LoopPipeline(layers, shape, k, m)
  transparency.CheckTransparent(pipe, (tf.random.stateless_normal(shape, [k, 9]),), m)
  graph_def = models.TrainStep(pipe, step=0).get_concrete_function(
      tf.TensorSpec(shape)).graph.as_graph_def()
  nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
  transposed = [n for n in nodes if n.op == 'MatMul' and n.attr['transpose_a'].b]
  assert transposed, 'no deferred product after the loop'


def _ComputingOps(pipe, shape):
  """Ops of the traced step and its functions' bodies, constants aside."""
  graph_def = models.TrainStep(pipe, step=0).get_concrete_function(
      tf.TensorSpec(shape)).graph.as_graph_def()
  nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
  return len([n for n in nodes if n.op != 'Const'])


def test_step_graph_does_not_grow_with_m():
  """Every op of the step, not just the cell calls: micro-batches enter and
  leave the loops (outputs, input gradients, deferred weight-gradient
  factors) as one gather per tensor, so M=16 holds as many ops as M=4."""
  layers, shape = models.FfnLayers(dim=64)
  ops = [_ComputingOps(_LoopPipeline(layers, shape, 2, m), shape) for m in (4, 16)]
  assert ops[0] == ops[1], ops


def test_each_tick_reads_and_writes_on_the_cells_devices():
  """Inside the loop bodies, every stash read and write, micro-batch gather
  and cell call is placed on a cell's device, so a tick sends only the
  registers between cells (not every read through device 0)."""
  layers, shape = models.FfnLayers(dim=64)
  graph_def = models.TrainStep(_LoopPipeline(layers, shape, 2, 4), step=0).get_concrete_function(
      tf.TensorSpec(shape)).graph.as_graph_def()
  bodies = [f for f in graph_def.library.function if '_body_' in f.signature.name]
  assert len(bodies) == 2, [f.signature.name for f in bodies]
  placed = ('TensorListGetItem', 'TensorListSetItem', 'GatherV2', 'If', 'StatelessIf')
  ops = [(n.op, n.device) for f in bodies for n in f.node_def if n.op in placed]
  assert {device.split(':')[-1] for _, device in ops if device} == {'0', '1'}, ops
  assert all(device for _, device in ops), [op for op, device in ops if not device]
