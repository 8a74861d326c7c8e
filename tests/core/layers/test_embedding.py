"""Tests of EmbeddingLayer and SoftmaxLayer (untied and tied) against NumPy."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core.layers import embedding
from lingvo_pipe.core.nested_map import NestedMap

RTOL = 1e-5
VOCAB, DIM = 7, 4
IDS = np.array([[0, 3, 6], [2, 2, 5]], np.int32)


def _Rand(*shape, seed=0):
  return np.random.RandomState(seed).randn(*shape).astype(np.float32)


def _Embedding(scale=False):
  return embedding.EmbeddingLayer.Params().Set(
      name='emb', vocab_size=VOCAB, embedding_dim=DIM,
      scale_sqrt_depth=scale).Instantiate()


def _Softmax(label_smoothing=0.0, tied=False):
  layer = embedding.SoftmaxLayer.Params().Set(
      name='softmax', input_dim=DIM, num_classes=VOCAB,
      label_smoothing=label_smoothing, tie_with_embedding=tied).Instantiate()
  if not tied:
    layer.b.assign(_Rand(VOCAB, seed=3))
  return layer


def _NumpyLoss(logits, labels, eps):
  logits = logits.astype(np.float64)
  shifted = logits - logits.max(axis=-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
  targets = np.full(logits.shape, eps / VOCAB)
  np.put_along_axis(targets, labels[..., None], 1 - eps + eps / VOCAB, axis=-1)
  per_example = -(targets * log_probs).sum(axis=-1)
  return log_probs, per_example


def _TfLoss(logits, labels, eps):
  """Plain-TF reference of the mean smoothed cross entropy."""
  log_probs = logits - tf.reduce_logsumexp(logits, axis=-1, keepdims=True)
  onehot = tf.one_hot(labels, VOCAB)
  targets = onehot * (1 - eps) + eps / VOCAB
  return tf.reduce_mean(-tf.reduce_sum(targets * log_probs, axis=-1))


def _OneHotLookup(table):
  """Plain-TF reference of a scaled embedding lookup of IDS."""
  return tf.einsum('btv,vd->btd', tf.one_hot(IDS, VOCAB), table) * np.sqrt(DIM)


# --- EmbeddingLayer ----------------------------------------------------------


@pytest.mark.parametrize('scale', [False, True])
def test_embedding_matches_numpy_gather(scale):
  layer = _Embedding(scale)
  want = layer.emb.numpy()[IDS] * (np.sqrt(DIM) if scale else 1.0)
  np.testing.assert_allclose(layer(IDS), want, rtol=RTOL)
  np.testing.assert_allclose(
      tf.function(layer.FProp)(layer.theta, tf.constant(IDS)), want, rtol=RTOL)


def test_embedding_gradient_matches_one_hot_matmul():
  layer = _Embedding(scale=True)
  w = tf.constant(_Rand(2, 3, DIM, seed=1))
  with tf.GradientTape() as tape:
    loss = tf.reduce_sum(layer(IDS) * w)
  got = tf.convert_to_tensor(tape.gradient(loss, layer.emb))
  with tf.GradientTape() as tape:
    ref = _OneHotLookup(layer.emb)
    loss = tf.reduce_sum(ref * w)
  np.testing.assert_allclose(got, tape.gradient(loss, layer.emb), rtol=RTOL)


@pytest.mark.parametrize('scale', [False, True])
def test_embedding_meta(scale):
  p = embedding.EmbeddingLayer.Params().Set(
      name='emb', vocab_size=VOCAB, embedding_dim=DIM, scale_sqrt_depth=scale)
  meta = p.cls.FPropMeta(p, IDS.shape)
  assert meta.out_shapes == (_Embedding(scale)(IDS).shape,)
  n = IDS.size * DIM
  assert meta.flops == (n if scale else 0)
  assert meta.param_bytes == VOCAB * DIM * 4
  assert meta.act_bytes == (2 if scale else 1) * n * 4


def test_embedding_rejects_bad_params_and_ids():
  p = embedding.EmbeddingLayer.Params().Set(name='emb', vocab_size=0,
                                            embedding_dim=DIM)
  with pytest.raises(ValueError, match=r'p.vocab_size must be positive, got 0'):
    p.Instantiate()
  with pytest.raises(ValueError, match=r'p.vocab_size must be positive'):
    p.cls.FPropMeta(p, [2])
  with pytest.raises(TypeError, match=r'ids must be integer ids, got float32'):
    _Embedding()(tf.zeros([2]))


# --- SoftmaxLayer ------------------------------------------------------------


@pytest.mark.parametrize('eps', [0.0, 0.1])
def test_softmax_matches_numpy(eps):
  layer = _Softmax(eps)
  x, labels = _Rand(2, 3, DIM, seed=1), IDS
  out = layer.FProp(layer.theta, tf.constant(x), labels)
  logits = x @ layer.w.numpy() + layer.b.numpy()
  log_probs, per_example = _NumpyLoss(logits, labels, eps)
  np.testing.assert_allclose(out.logits, logits, rtol=RTOL, atol=1e-6)
  np.testing.assert_allclose(layer.Logits(layer.theta, x), logits, rtol=RTOL,
                             atol=1e-6)
  np.testing.assert_allclose(out.log_probs, log_probs, rtol=RTOL)
  np.testing.assert_allclose(out.per_example_loss, per_example, rtol=RTOL)
  np.testing.assert_allclose(out.loss, per_example.mean(), rtol=RTOL)


def test_softmax_function_equals_eager():
  layer = _Softmax(0.1)
  x = tf.constant(_Rand(2, 3, DIM, seed=1))
  eager = layer.FProp(layer.theta, x, IDS)
  graph = tf.function(layer.FProp)(layer.theta, x, tf.constant(IDS))
  for key in eager:
    np.testing.assert_allclose(graph[key], eager[key], rtol=RTOL)


@pytest.mark.parametrize('eps', [0.0, 0.2])
def test_softmax_gradients_match_plain_tf(eps):
  layer = _Softmax(eps)
  x = tf.constant(_Rand(2, 3, DIM, seed=1))
  sources = [x, layer.w, layer.b]
  with tf.GradientTape() as tape:
    tape.watch(x)
    got = tape.gradient(layer.FProp(layer.theta, x, IDS).loss, sources)
  with tf.GradientTape() as tape:
    tape.watch(x)
    logits = tf.einsum('btd,dv->btv', x, layer.w) + layer.b
    want = tape.gradient(_TfLoss(logits, IDS, eps), sources)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


def test_tied_softmax_shares_the_embedding_matrix():
  emb, softmax = _Embedding(scale=True), _Softmax(0.1, tied=True)
  assert not softmax.variables and softmax.theta == NestedMap()
  labels = IDS[:, ::-1].copy()
  with tf.GradientTape() as tape:
    theta = emb.theta
    out = softmax.FProp(NestedMap(emb=theta.emb), emb.FProp(theta, IDS), labels)
  got = tf.convert_to_tensor(tape.gradient(out.loss, emb.emb))
  x = emb.emb.numpy()[IDS] * np.sqrt(DIM)
  log_probs, per_example = _NumpyLoss(x @ emb.emb.numpy().T, labels, 0.1)
  np.testing.assert_allclose(out.log_probs, log_probs, rtol=RTOL)
  np.testing.assert_allclose(out.loss, per_example.mean(), rtol=RTOL)
  with tf.GradientTape() as tape:
    ref_x = _OneHotLookup(emb.emb)
    ref_loss = _TfLoss(tf.einsum('btd,vd->btv', ref_x, emb.emb), labels, 0.1)
  np.testing.assert_allclose(got, tape.gradient(ref_loss, emb.emb), rtol=1e-4,
                             atol=1e-6)


def test_tied_softmax_needs_the_embedding_in_theta():
  softmax = _Softmax(tied=True)
  x = tf.zeros([2, DIM])
  with pytest.raises(ValueError, match=r'pass its matrix \[7, 4\] as theta.emb'
                     r'.*got nothing'):
    softmax(x, [0, 1])
  with pytest.raises(ValueError, match=r'got shape \(4, 7\)'):
    softmax.FProp(NestedMap(emb=tf.zeros([DIM, VOCAB])), x, [0, 1])


@pytest.mark.parametrize('tied', [False, True])
def test_softmax_meta(tied):
  p = embedding.SoftmaxLayer.Params().Set(
      name='softmax', input_dim=DIM, num_classes=VOCAB, tie_with_embedding=tied)
  meta = p.cls.FPropMeta(p, [2, 3, DIM], [2, 3])
  theta = NestedMap(emb=tf.zeros([VOCAB, DIM])) if tied else None
  layer = _Softmax(tied=tied)
  out = layer.FProp(theta or layer.theta, tf.zeros([2, 3, DIM]), IDS)
  assert meta.out_shapes == (tf.nest.map_structure(lambda t: t.shape, out),)
  rows, logits = 6, 6 * VOCAB
  want_flops = 2 * logits * DIM + 7 * logits + (0 if tied else logits)
  assert meta.flops == want_flops
  assert meta.param_bytes == (0 if tied else (DIM * VOCAB + VOCAB) * 4)
  assert meta.act_bytes == (2 * logits + rows + 1) * 4


@pytest.mark.parametrize('kwargs, match', [
    (dict(input_dim=0), r'p.input_dim must be positive, got 0'),
    (dict(num_classes=-1), r'p.num_classes must be positive, got -1'),
    (dict(label_smoothing=1.0), r'smoothing must be in \[0, 1\), got 1.0'),
])
def test_softmax_rejects_bad_params(kwargs, match):
  p = embedding.SoftmaxLayer.Params().Set(name='softmax', input_dim=DIM,
                                          num_classes=VOCAB).Set(**kwargs)
  with pytest.raises(ValueError, match=match):
    p.Instantiate()
  with pytest.raises(ValueError, match=match):
    p.cls.FPropMeta(p, [2, DIM], [2])


def test_softmax_rejects_bad_inputs_and_labels():
  layer = _Softmax()
  x = tf.zeros([2, 3, DIM])
  with pytest.raises(ValueError, match=r'do not end in p.input_dim = 4'):
    layer(tf.zeros([2, 5]), [0, 1])
  with pytest.raises(TypeError, match=r'labels must be integer ids'):
    layer(x, tf.zeros([2, 3]))
  with pytest.raises(ValueError, match=r'labels of shape \(2,\) must have'):
    layer(x, [0, 1])
  with pytest.raises(ValueError, match=r'labels \(2,\) must be \(2, 3\)'):
    layer.FPropMeta(layer.params, [2, 3, DIM], [2])
