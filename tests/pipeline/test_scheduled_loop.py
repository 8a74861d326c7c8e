"""The loss-inside step of any schedule as one tf.while_loop over its clocks
(scheduled_loop): transparent as the unrolled one, its graph does not grow
with M, and 1F1B's rings hold its micro-batches in flight, not M."""

import pytest
import tensorflow as tf

from lingvo_pipe.pipeline import scheduled_loop
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
  expected = models.ExpectedMovingAverages(ref.bn_inputs, models.BN_DECAY)
  assert len(expected) == 2
  variables = {v.name: v for v in pipe.variables}
  for path, (mean, var) in expected.items():
    transparency.AssertClose(variables[f'{path}/moving_mean:0'], mean)
    transparency.AssertClose(variables[f'{path}/moving_variance:0'], var)
