"""CellGradients: the sink of each backward, and the step's theta gradients
against NumPy sums of what the backwards handed over."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.layers import dropout
from lingvo_pipe.core.layers import linear
from lingvo_pipe.pipeline.cell import cell_gradients
from lingvo_pipe.pipeline.cell.cell_gradients import BackwardResult
from lingvo_pipe.pipeline.cell.cell_gradients import GradSink


def _Cell():
  """theta, flat: sub.0.b [3], sub.0.w [4, 3] (weights 0 and 1), then the
  dropout's int64 step seed (not a weight)."""
  return containers.SequentialLayer.Params().Set(name='cell', sub=[
      linear.ProjectionLayer.Params().Set(name='proj', input_dim=4, output_dim=3),
      dropout.DropoutLayer.Params().Set(name='drop', keep_prob=0.5)]).Instantiate()


def _Normal(shape, seed):
  return tf.random.stateless_normal(shape, [seed, 7])


def test_sinks_return_with_one_micro_batch_else_assign_then_add():
  grads = cell_gradients.CellGradients(_Cell(), '/device:CPU:0')
  empty = BackwardResult([], [], {}, {}, tf.constant(0))
  grads.StartStep(1)
  assert grads.NextSink() == GradSink.RETURN
  sinks = []
  grads.StartStep(3)
  for _ in range(3):
    sinks.append(grads.NextSink())
    assert grads.NextSink() == sinks[-1]  # asking again changes nothing
    grads.Keep(sinks[-1], empty)
  assert sinks == [GradSink.ASSIGN, GradSink.ADD, GradSink.ADD]
  grads.StartStep(2)
  assert grads.NextSink() == GradSink.ASSIGN


@pytest.mark.parametrize('w_deferred_only', [False, True])
def test_step_gradients_sum_accumulators_and_deferred_products(w_deferred_only):
  """Three backwards: b's gradient is accumulated; w's is deferred as one
  factor pair per micro-batch, and also accumulated unless all of it is
  deferred."""
  cell = _Cell()
  grads = cell_gradients.CellGradients(cell, '/device:CPU:0')
  grads.StartStep(3)
  expected_b, expected_w = np.zeros([3]), np.zeros([4, 3])
  for m in range(3):
    g_b, g_w = _Normal([3], m), _Normal([4, 3], 10 + m)
    a, c = _Normal([2, 4], 20 + m), _Normal([2, 3], 30 + m)
    expected_b += g_b.numpy()
    expected_w += a.numpy().T @ c.numpy()
    if not w_deferred_only:
      expected_w += g_w.numpy()
    sink = grads.NextSink()
    handed, puts = grads.Put([g_b, None if w_deferred_only else g_w], sink)
    assert handed == [] and len(puts) == (1 if w_deferred_only else 2)
    grads.Keep(sink, BackwardResult(handed, [], {1: [(a, c)]},
                                    {1: None} if w_deferred_only else {}, tf.constant(0)))
  got = grads.StepGradients(cell.theta)
  assert got[2] is None
  np.testing.assert_allclose(got[0].numpy(), expected_b, rtol=1e-5)
  np.testing.assert_allclose(got[1].numpy(), expected_w, rtol=1e-5, atol=1e-6)


def test_step_gradients_of_one_micro_batch_are_the_returned_ones():
  cell = _Cell()
  grads = cell_gradients.CellGradients(cell, '/device:CPU:0')
  grads.StartStep(1)
  g_b, g_w = _Normal([3], 1), _Normal([4, 3], 2)
  handed, puts = grads.Put([g_b, g_w], GradSink.RETURN)
  assert handed[0] is g_b and handed[1] is g_w and puts == []
  grads.Keep(GradSink.RETURN, BackwardResult(handed, [], {}, {}, tf.constant(0)))
  got = grads.StepGradients(cell.theta)
  assert got[0] is g_b and got[1] is g_w and got[2] is None
