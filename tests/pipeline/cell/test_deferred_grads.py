"""Deferred projection weight gradients: the size rule, the product, and
pipelines whose projections defer, against the unpartitioned network."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.layers import linear
from lingvo_pipe.core import weight_grad_deferral
from lingvo_pipe.core import weights
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.cell import deferred_grads

from tests import transparency
from tests.pipeline import pipeline_models as models


def test_claims_only_cell_weights_whose_step_factors_are_no_bigger():
  big, small, other = tf.ones([64, 256]), tf.ones([4, 4]), tf.ones([64, 256])
  collector = deferred_grads.Collector([small, big], num_micro=4)
  assert collector.Claim(big, rows=4) == 1     # 16 rows x 320 <= 64 x 256
  assert collector.Claim(big, rows=64) is None  # 256 rows x 320 > 64 x 256
  assert collector.Claim(small, rows=1) is None  # 4 rows x 8 > 4 x 4
  assert collector.Claim(other, rows=4) is None
  assert collector.Claim(big, rows=None) is None


def test_product_is_the_sum_of_the_pairs_products():
  pairs = [(tf.random.stateless_normal([n, 3], [n, 0]),
            tf.random.stateless_normal([n, 5], [n, 1])) for n in (2, 4)]
  expected = sum(tf.matmul(a, b, transpose_a=True) for a, b in pairs)
  np.testing.assert_allclose(deferred_grads.Product(pairs).numpy(),
                             expected.numpy(), rtol=1e-5, atol=1e-6)
  with deferred_grads.Deferring([], num_micro=2) as collector:
    assert weight_grad_deferral.Current() is collector
  assert weight_grad_deferral.Current() is None


def _CountProducts(monkeypatch):
  calls = []
  original = deferred_grads.Product

  def Counting(pairs):
    calls.append(len(pairs))
    return original(pairs)

  monkeypatch.setattr(deferred_grads, 'Product', Counting)
  return calls


@pytest.mark.parametrize('remat,remat_last,deferred', [
    (gpipe.RematPolicy.PER_CELL, False, 8), (gpipe.RematPolicy.PER_CELL, True, 8),
    (gpipe.RematPolicy.PER_LAYER, False, 0), (gpipe.RematPolicy.NONE, False, 0)])
def test_wide_ffn_defers_with_per_cell_remat_and_equals_reference(
    monkeypatch, remat, remat_last, deferred):
  """dim 32, hidden 64, 16 rows a step: each 32x64 weight's factors (16 x
  96) are smaller than it, so PER_CELL defers all 8 projections (two per
  layer), in the recomputing backwards and in the kept last micro-batch's (unless it is
  recomputed too); the other policies keep the tape's weight gradients.
  Dropout differs per micro-batch."""
  calls = _CountProducts(monkeypatch)
  layers, shape = models.FfnLayers(keep_prob=0.8, dim=32)
  pipe = models.Pipeline(layers, shape, 2, 4, remat=remat,
                         remat_last_micro_batch=remat_last)
  transparency.CheckTransparent(pipe, (tf.random.stateless_normal(shape, [3, 4]),), 4)
  assert len(calls) == deferred
  assert all(n == 4 for n in calls)  # one factor pair per micro-batch


class _ProjectPlusWeightMean(base_layer.BaseLayer):
  """x @ w + mean(w): w's gradient is the deferred product plus the tape's
  gradient of mean(w)."""

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable('w', weights.WeightParams([32, 32]))

  def FProp(self, theta, x):
    return linear.ProjectLastDim(x, theta.w) + tf.reduce_mean(theta.w)

  @classmethod
  def FPropMeta(cls, params, x_shape):
    return layer_meta.LayerMeta((tf.TensorShape(x_shape),))


@pytest.mark.parametrize('remat_last', [False, True])
def test_weight_also_used_outside_the_projection(monkeypatch, remat_last):
  calls = _CountProducts(monkeypatch)
  layers = [_ProjectPlusWeightMean.Params().Set(name=f'pw{i}') for i in range(4)]
  pipe = gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, splits=[2], num_micro_batches=4,
      remat_last_micro_batch=remat_last).Instantiate()
  transparency.CheckTransparent(pipe, (tf.random.stateless_normal([8, 32], [5, 6]),), 4)
  assert len(calls) == 4


@pytest.mark.parametrize('rows,num_micro,deferred', [(4, 4, 2), (64, 4, 0), (8, 1, 2)])
def test_layer_meta_names_the_projections_a_backward_defers(rows, num_micro, deferred):
  """The planner's view (LayerMeta.projections passing StepDefers) is what
  the collector claims while a residual feed-forward block (32 -> 128 -> 32)
  is differentiated: both projections, or none where their factors
  (num_micro * rows of 160) outgrow the 32 x 128 weights."""
  p = containers.ResidualLayer.Params().Set(
      name='block', body=linear.FeedForwardLayer.Params().Set(
          name='ff', input_dim=32, hidden_dim=128))
  layer = p.Instantiate()
  meta = p.cls.FPropMeta(p, tf.TensorShape([rows, 32]))
  planned = [(q.in_dim, q.out_dim) for q in meta.projections
             if deferred_grads.StepDefers(num_micro, q.rows, q.in_dim, q.out_dim)]
  theta = layer.theta
  weights_ = tf.nest.flatten(theta)
  x = tf.ones([rows, 32])
  with deferred_grads.Deferring(weights_, num_micro) as collector:
    with tf.GradientTape() as tape:
      tape.watch(weights_)
      y = layer.FProp(theta, x)
    tape.gradient(y, weights_)
  claimed = sorted(tuple(weights_[i].shape) for i in collector.factors)
  assert sorted(planned) == claimed
  assert (len(meta.projections), len(claimed)) == (2, deferred)
