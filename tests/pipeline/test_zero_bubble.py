"""Zero-bubble schedules and schedules as text, run by the executor: each
equals the unpartitioned network (outputs, loss, every gradient) at K in
{2, 3, 4} and M a multiple of K or not, a W really runs apart from its I,
and a text that cannot run fails at build naming the action. (Every
schedule under both emissions, bfloat16 and replicas: test_conformance.)"""

import pytest
import tensorflow as tf

from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.cell import scope_names
from lingvo_pipe.pipeline.schedules import built_in
from lingvo_pipe.pipeline.schedules import schedule_text
from lingvo_pipe.pipeline.schedules.built_in import ScheduleKind

from tests import transparency
from tests.pipeline import pipeline_models as models


def _CheckLayers(layers, shape, cells, m, batch=None, **kwargs):
  shape = [batch or shape[0]] + shape[1:]
  pipe = models.Pipeline(layers, shape, cells, m, **kwargs)
  x = tf.random.stateless_normal(shape, [cells, m])
  return pipe, transparency.CheckTransparentWithLoss(pipe, (x,), m)


# K in {2, 3, 4}, M a multiple of K and not (a batch of 12).
_ZB_GRID = [(2, 2), (2, 3), (3, 3), (3, 4), (4, 4), (4, 6)]


def _ZbCases():
  """make test runs each K once per schedule, each schedule at an M that
  K divides and one it does not; make test-slow the rest of the grid."""
  kinds = [ScheduleKind.ZB_H1, ScheduleKind.ZB_H2]
  return [pytest.param(kind, k, m, id=f'{k}-{m}-{kind.name}',
                       marks=() if (i + i // 2 + j) % 2 == 0 else pytest.mark.slow)
          for i, (k, m) in enumerate(_ZB_GRID) for j, kind in enumerate(kinds)]


@pytest.mark.parametrize('kind,k,m', _ZbCases())
def test_zero_bubble_ffn_with_dropout(kind, k, m):
  layers, shape = models.FfnLayers(keep_prob=0.7)
  _CheckLayers(layers, shape, k, m, batch=12, schedule=kind)


@pytest.mark.parametrize('k,m', [(2, 3), (2, 4), (4, 6)])
def test_zero_bubble_v_convnet_with_batch_norm_and_dropout(k, m):
  """2K cells in a V: cells d and 2K-1-d on device d."""
  layers, shape = models.ConvNetLayers(keep_prob=0.8)
  if 2 * k > len(layers):
    layers, shape = models.FfnLayers(keep_prob=0.8)
  pipe, ref = _CheckLayers(layers, shape, 2 * k, m, batch=12, schedule=ScheduleKind.ZB_V)
  assert pipe.num_devices == k
  names = [d.name for d in pipe.devices]
  assert names == [names[min(c, 2 * k - 1 - c)] for c in range(2 * k)]
  if ref.bn_inputs:
    transparency.CheckMovingAverages(pipe, ref.bn_inputs)


@pytest.mark.parametrize('remat', list(gpipe.RematPolicy), ids=lambda r: r.name)
def test_zb_h1_every_remat_policy(remat):
  layers, shape = models.FfnLayers(keep_prob=0.7)
  _CheckLayers(layers, shape, 3, 4, batch=12, schedule=ScheduleKind.ZB_H1, remat=remat)


def test_zb_h1_transformer_stack_with_dropout():
  pipe = models.TransformerStackPipeline(2, 4, schedule=ScheduleKind.ZB_H1)
  transparency.CheckTransparentWithLoss(pipe, models.TransformerInputs(24), 4,
                                        labels=models.TransformerLabels(24))


def _WeightGradientOpTypes(pipe, shape, m):
  """The type of each op under the weight-gradient scope of the step."""
  graph = models.TrainStepWithLoss(pipe, 0, m).get_concrete_function(
      tf.TensorSpec(shape)).graph
  return [op.type for op in graph.get_operations()
          if scope_names.WEIGHT_GRADIENTS_SCOPE in op.name]


@pytest.mark.parametrize('remat', [gpipe.RematPolicy.PER_CELL, gpipe.RematPolicy.NONE],
                         ids=lambda r: r.name)
def test_each_w_adds_its_own_micro_batch_products(remat):
  """ZB-H1, K=2, M=4, per-cell remat or none: each W multiplies the factors
  of its cell's projections (two per ffn layer) at its own place, not one
  product per step; cell 1's last two W's, next to each other on its
  device (1W2,1W3), are one product. The products add into tensors: no W
  assigns a gradient accumulator."""
  layers, shape = models.FfnLayers()
  pipe = models.Pipeline(layers, shape, 2, 4, schedule=ScheduleKind.ZB_H1, remat=remat)
  assert schedule_text.Format(built_in.Build(ScheduleKind.ZB_H1, 2, 4)).splitlines()[1] == (
      '1F0,1I0,1F1,1I1,1W0,1F2,1I2,1W1,1F3,1I3,1W2,1W3')
  projections = [len([v for v in cell.vars.Flatten() if v.shape.rank == 2])
                 for cell in pipe.cells]
  expected = 4 * projections[0] + 3 * projections[1]
  op_types = _WeightGradientOpTypes(pipe, shape, 4)
  assert op_types.count('MatMul') == expected
  for op_type in ('AssignAddVariableOp', 'AssignVariableOp'):
    assert op_type not in op_types


def test_a_text_schedule_equals_the_built_in_one():
  """ZB-H1 written by hand in PyTorch's notation runs and gives the
  built-in's numbers."""
  text = schedule_text.Format(built_in.Build(ScheduleKind.ZB_H1, 2, 3))
  assert '1W0' in text
  layers, shape = models.FfnLayers(keep_prob=0.7)
  _CheckLayers(layers, shape, 2, 3, batch=12, schedule_text=text)


@pytest.mark.parametrize('text,m,match', [
    ('0F0,0I0,0W0,0F1,0I1\n1F0,1I0,1W0,1F1,1I1,1W1', 2, '0I1: has no W: add 0W1'),
    ('0F0,0W0,0I0\n1F0,1I0,1W0', 1, '0W0: runs before its I 0I0'),
    ('0F0,0F1,0B0,0B1\n1F0,1F1,1B1', 2, '1F0: has no backward'),
    ('0F0,0B0;1B0,1F0', 1, '1B0: runs before its forward 1F0'),
    ('0F0,1F0,0B0,1B0\n1F0', 1, '1F0: cell 1 is on device 0, not on device 1'),
    ('0F0,0B0,0F1,0B1\n1F0,1F1,1B0,1B1', 4, 'runs 2 micro-batches but the step has M=4'),
    ('0F0,0B0\n1F0,1B0\n2F0,2B0', 1, 'names 3 cells but the pipeline has 2'),
])
def test_a_bad_text_schedule_fails_at_build_naming_the_action(text, m, match):
  layers, shape = models.FfnLayers()
  with pytest.raises(ValueError, match=match):
    models.Pipeline(layers, shape, 2, m, schedule_text=text)


def test_fprop_of_a_zero_bubble_pipeline_says_to_use_fprop_with_loss():
  layers, shape = models.FfnLayers()
  pipe = models.Pipeline(layers, shape, 2, 2, schedule=ScheduleKind.ZB_H1)
  with pytest.raises(ValueError, match='call FPropWithLoss'):
    pipe.FProp(pipe.theta, tf.ones(shape))
