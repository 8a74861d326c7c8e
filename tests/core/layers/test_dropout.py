"""Tests of DropoutLayer: reproducible masks, statistics, gradients, meta."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core import eval_mode
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.layers import dropout
from lingvo_pipe.core.layers import linear
from lingvo_pipe.core import step_seeds

KEEP = 0.75


def _Dropout(name='drop', keep_prob=KEEP, **kwargs):
  return dropout.DropoutLayer.Params().Set(
      name=name, keep_prob=keep_prob, **kwargs).Instantiate()


def _X(*shape):
  """Inputs with no zero, so the mask can be read off the output."""
  x = np.random.RandomState(0).uniform(0.5, 1.5, size=shape)
  return tf.constant(x.astype(np.float32))


def _Mask(layer, step_seed, x=None):
  x = _X(4, 16) if x is None else x
  y = layer.FProp(step_seeds.WithStepSeed(layer.theta, step_seed), x)
  return (y.numpy() != 0).astype(np.float32)


def test_same_step_seed_gives_same_mask_eager_and_in_function():
  layer = _Dropout()
  x = _X(4, 16)
  theta = step_seeds.WithStepSeed(layer.theta, [3, 1])
  eager = layer.FProp(theta, x)
  np.testing.assert_array_equal(eager, layer.FProp(theta, x))
  np.testing.assert_array_equal(eager, tf.function(layer.FProp)(theta, x))
  assert 0 < np.count_nonzero(eager) < eager.shape.num_elements()


def test_recompute_grad_reproduces_the_forward_mask():
  layer = _Dropout()
  x = _X(8, 32)
  theta = step_seeds.WithStepSeed(layer.theta, [7, 2])
  recomputed = tf.recompute_grad(lambda v: layer.FProp(theta, v))
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = recomputed(x)
  grad = tape.gradient(y, x)
  mask = (y.numpy() != 0).astype(np.float32)
  np.testing.assert_allclose(grad, mask / KEEP, rtol=1e-6)
  np.testing.assert_allclose(y, x.numpy() * mask / KEEP, rtol=1e-6)


def test_different_step_seeds_give_different_masks():
  layer = _Dropout()
  masks = [_Mask(layer, s) for s in ([0, 0], [1, 0], [0, 1], [1, 1])]
  for i in range(len(masks)):
    for j in range(i):
      assert not np.array_equal(masks[i], masks[j]), (i, j)


def test_different_paths_and_seeds_give_different_masks():
  seed = [5, 0]
  base = _Mask(_Dropout('a'), seed)
  np.testing.assert_array_equal(base, _Mask(_Dropout('a'), seed))
  assert not np.array_equal(base, _Mask(_Dropout('b'), seed))
  assert not np.array_equal(base, _Mask(_Dropout('a', random_seed=1), seed))
  p = dropout.DropoutLayer.Params().Set(keep_prob=KEEP)
  seq = containers.SequentialLayer.Params().Set(
      name='seq', sub=[p.Copy(), p.Copy()]).Instantiate()
  assert seq.sub[0].path != seq.sub[1].path
  assert not np.array_equal(_Mask(seq.sub[0], seed), _Mask(seq.sub[1], seed))


@pytest.mark.parametrize('keep_prob', [0.3, 0.9])
def test_keep_fraction_and_scale(keep_prob):
  layer = _Dropout(keep_prob=keep_prob)
  x = _X(100, 200)
  y = layer.FProp(step_seeds.WithStepSeed(layer.theta, [1, 2]), x).numpy()
  kept = y != 0
  # 20000 Bernoulli draws: the standard deviation of the fraction is < 0.0035.
  assert abs(kept.mean() - keep_prob) < 0.02
  np.testing.assert_allclose(y[kept], x.numpy()[kept] / keep_prob, rtol=1e-6)


def test_eval_mode_and_keep_prob_one_are_identity():
  x = _X(4, 16)
  layer = _Dropout()
  with eval_mode.EvalMode():
    np.testing.assert_array_equal(layer(x), x)
    np.testing.assert_array_equal(tf.function(layer.FProp)(layer.theta, x), x)
  np.testing.assert_array_equal(_Dropout(keep_prob=1.0)(x), x)


def test_gradients_are_mask_times_scale():
  layer = _Dropout()
  x = _X(6, 10)
  w = tf.constant(np.random.RandomState(1).randn(6, 10).astype(np.float32))
  theta = step_seeds.WithStepSeed(layer.theta, [2, 3])
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = layer.FProp(theta, x)
    loss = tf.reduce_sum(y * w)
  mask = (y.numpy() != 0).astype(np.float32)
  np.testing.assert_allclose(tape.gradient(loss, x), w.numpy() * mask / KEEP,
                             rtol=1e-6)


@pytest.mark.parametrize('dims', [[1], [-2]])
def test_broadcast_dims_share_the_mask(dims):
  layer = _Dropout(noise_shape_broadcast_dims=dims)
  mask = _Mask(layer, [4, 4], _X(3, 20, 8))
  np.testing.assert_array_equal(mask, np.broadcast_to(mask[:, :1], mask.shape))
  assert 0 < mask.sum() < mask.size


@pytest.mark.parametrize('keep_prob', [0.0, -0.5, 1.5])
def test_rejects_bad_keep_prob(keep_prob):
  p = dropout.DropoutLayer.Params().Set(name='drop', keep_prob=keep_prob)
  match = rf'keep_prob must be in \(0, 1\], got {keep_prob}'
  with pytest.raises(ValueError, match=match):
    p.Instantiate()
  with pytest.raises(ValueError, match='keep_prob must be in'):
    p.cls.FPropMeta(p, [2, 3])


def test_rejects_broadcast_dim_out_of_range():
  layer = _Dropout(noise_shape_broadcast_dims=[2])
  match = r'noise_shape_broadcast_dims = \[2\] must index .* rank 2'
  with pytest.raises(ValueError, match=match):
    layer(_X(4, 5))
  with pytest.raises(ValueError, match=match):
    layer.FPropMeta(layer.params, [4, 5])


@pytest.mark.parametrize('dims, mask_elements', [(None, 3 * 20 * 8),
                                                 ([1], 3 * 8)])
def test_meta(dims, mask_elements):
  p = dropout.DropoutLayer.Params().Set(
      name='drop', keep_prob=KEEP, noise_shape_broadcast_dims=dims)
  meta = p.cls.FPropMeta(p, [3, 20, 8])
  assert meta.out_shapes == (_Dropout()(_X(3, 20, 8)).shape,)
  n = 3 * 20 * 8
  assert meta.flops == 2 * mask_elements + n
  assert meta.param_bytes == 0
  assert meta.act_bytes == (n + mask_elements) * 4


def test_meta_of_identity():
  p = dropout.DropoutLayer.Params().Set(name='drop', keep_prob=1.0)
  meta = p.cls.FPropMeta(p, [3, 4])
  assert (meta.out_shapes, meta.flops, meta.act_bytes) == (
      (tf.TensorShape([3, 4]),), 0, 0)


@pytest.mark.parametrize('shape,dims', [((8, 16), None), ((8, 3, 5), None),
                                        ((8, 3, 5), [1]), ((8, 7), None)])
def test_mask_of_examples_is_the_same_in_any_split_of_the_batch(shape, dims):
  """Examples i..j draw the same mask whole or in micro-batches (step seed
  [step, index of the first example]), also when an example's mask has a
  number of values that is not a multiple of Philox's 4 per counter."""
  layer = _Dropout(noise_shape_broadcast_dims=dims)
  x = _X(*shape)
  whole = _Mask(layer, [3, 0], x)
  for parts in (2, 4, 8):
    size = shape[0] // parts
    split = [_Mask(layer, [3, m * size], x[m * size:(m + 1) * size])
             for m in range(parts)]
    np.testing.assert_array_equal(np.concatenate(split), whole)
  assert 0 < whole.sum() < whole.size


def test_time_major_example_axis():
  """example_axis=1: [time, batch, dim] inputs split along the batch draw the
  batch-major masks, transposed."""
  time_major = _Dropout(example_axis=1)
  batch_major = _Dropout()
  x = _X(8, 3, 5)  # [batch, time, dim]
  whole = _Mask(batch_major, [4, 0], x)
  halves = [_Mask(time_major, [4, 4 * h], tf.transpose(x[4 * h:4 * (h + 1)], [1, 0, 2]))
            for h in range(2)]
  np.testing.assert_array_equal(np.concatenate(halves, axis=1),
                                np.transpose(whole, [1, 0, 2]))


def test_batch_axis_broadcast_shares_one_mask_over_examples():
  layer = _Dropout(noise_shape_broadcast_dims=[0])
  x = _X(8, 16)
  whole = _Mask(layer, [2, 0], x)
  np.testing.assert_array_equal(whole, np.broadcast_to(whole[:1], whole.shape))
  np.testing.assert_array_equal(_Mask(layer, [2, 4], x[4:]), whole[4:])


def test_rejects_example_axis_out_of_range():
  layer = _Dropout(example_axis=2)
  with pytest.raises(ValueError, match='example_axis=2 is not an axis of its inputs of rank 2'):
    _Mask(layer, [1, 0])


def test_xla_draws_the_same_mask_at_an_offset():
  layer = _Dropout()
  x = _X(4, 6)
  theta = step_seeds.WithStepSeed(layer.theta, [7, 12])
  compiled = tf.function(layer.FProp, jit_compile=True)(theta, x)
  np.testing.assert_array_equal(compiled.numpy(), layer.FProp(theta, x).numpy())


def test_unknown_shape_draws_the_static_shape_mask():
  layer = _Dropout()
  x = _X(6, 7)
  theta = step_seeds.WithStepSeed(layer.theta, [2, 6])
  dynamic = tf.function(layer.FProp, input_signature=[
      tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), theta),
      tf.TensorSpec([None, None], tf.float32)])
  np.testing.assert_array_equal(dynamic(theta, x).numpy(), layer.FProp(theta, x).numpy())


def test_a_step_seed_counter_draws_new_masks_each_step_in_a_function():
  """step_seeds.Counter: step n of a traced step draws the masks of seed
  [n, 0], not the theta's constant zeros (which Grappler would fold into
  one mask for every step); a theta without step seeds is left as is."""
  layer, x, seeds = _Dropout(), _X(4, 16), step_seeds.Counter()
  step = tf.function(lambda: layer.FProp(seeds.Next(layer.theta), x), autograph=False)
  masks = [(step().numpy() != 0).astype(np.float32) for _ in range(3)]
  for n, mask in enumerate(masks, start=1):
    np.testing.assert_array_equal(mask, _Mask(layer, [n, 0]))
  assert not np.array_equal(masks[0], masks[1])
  plain = linear.ProjectionLayer.Params().Set(name='plain', input_dim=2,
                                              output_dim=2).Instantiate().theta
  assert seeds.Next(plain) is plain
