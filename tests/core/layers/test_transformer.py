"""Tests the pre-LN Transformer layers against a plain-TensorFlow reference."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core import eval_mode
from lingvo_pipe.core.layers import dropout
from lingvo_pipe.core.layers import transformer
from lingvo_pipe.core import step_seeds

B, T, S, D, N, FFN = 2, 5, 7, 8, 2, 16
EPS = 1e-6


def _Build(cls, keep_prob=1.0, **kwargs):
  layer = cls.Params().Set(name='tr', input_dim=D, num_heads=N, hidden_dim=FFN,
                           residual_keep_prob=keep_prob, ln_epsilon=EPS,
                           **kwargs).Instantiate()
  # Move every variable (zero biases, unit scales too) off its initial value.
  rng = np.random.RandomState(11)
  for var in layer.vars.Flatten():
    var.assign_add(rng.uniform(-0.3, 0.3, var.shape).astype(np.float32))
  return layer


def _Inputs(seed=0):
  rng = np.random.RandomState(seed)
  x = tf.constant(rng.randn(B, T, D).astype(np.float32))
  aux = tf.constant(rng.randn(B, S, D).astype(np.float32))
  paddings = np.zeros([B, T], np.float32)
  paddings[1, -2:] = 1.0
  aux_paddings = np.zeros([B, S], np.float32)
  aux_paddings[0, -3:] = 1.0
  return x, aux, tf.constant(paddings), tf.constant(aux_paddings)


def _Allowed(paddings, t, s, causal):
  """[B, T, S] bools: which keys each query may attend to."""
  keys = np.ones([B, s]) if paddings is None else 1.0 - paddings.numpy()
  order = np.tril(np.ones([t, s])) if causal else np.ones([t, s])
  return (keys[:, None, :] * order[None]) > 0


def _LayerNormRef(v, x):
  mean = tf.reduce_mean(x, -1, keepdims=True)
  var = tf.reduce_mean(tf.square(x - mean), -1, keepdims=True)
  return (x - mean) / tf.sqrt(var + EPS) * v.scale + v.bias


def _AttentionRef(v, x, mem, allowed):
  """Batched heads: reshape to [B, N, length, D / N], attend, merge."""
  hd = v.query_w.shape[1] // N

  def Heads(y, w, bias):
    y = tf.tensordot(y, w, 1) + bias
    return tf.transpose(tf.reshape(y, [B, -1, N, hd]), [0, 2, 1, 3])

  q = Heads(x, v.query_w, v.query_b)
  k = Heads(mem, v.key_w, v.key_b)
  val = Heads(mem, v.value_w, v.value_b)
  logits = tf.matmul(q, k, transpose_b=True) / np.sqrt(hd)
  logits = tf.where(allowed[:, None], logits, -np.inf)
  ctx = tf.matmul(tf.nn.softmax(logits, -1), val)
  ctx = tf.reshape(tf.transpose(ctx, [0, 2, 1, 3]), [B, -1, N * hd])
  return tf.tensordot(ctx, v.post_w, 1) + v.post_b


def _FeedForwardRef(v, x):
  hidden = tf.nn.relu(tf.tensordot(x, v.fc0.w, 1) + v.fc0.b)
  return tf.tensordot(hidden, v.fc1.w, 1) + v.fc1.b


def _SelfAttentionBlockRef(v, x, paddings, causal):
  y = _LayerNormRef(v.self_atten_ln, x)
  return x + _AttentionRef(v.self_atten, y, y, _Allowed(paddings, T, T, causal))


def _EncoderRef(layer, x, paddings, causal):
  v = layer.vars
  x = _SelfAttentionBlockRef(v, x, paddings, causal)
  return x + _FeedForwardRef(v.ffn, _LayerNormRef(v.ffn_ln, x))


def _DecoderRef(layer, x, aux, aux_paddings, paddings):
  v = layer.vars
  x = _SelfAttentionBlockRef(v, x, paddings, True)
  y = _LayerNormRef(v.cross_atten_ln, x)
  x = x + _AttentionRef(v.cross_atten, y, aux,
                        _Allowed(aux_paddings, T, S, False))
  return x + _FeedForwardRef(v.ffn, _LayerNormRef(v.ffn_ln, x))


def _AssertGradsMatch(fn, ref_fn, inputs, layer):
  weights = tf.constant(np.random.RandomState(5).randn(B, T, D), tf.float32)
  sources = list(inputs) + layer.vars.Flatten()

  def Grads(f):
    with tf.GradientTape() as tape:
      tape.watch(inputs)
      loss = tf.reduce_sum(f() * weights)
    return tape.gradient(loss, sources)

  names = [f'input{i}' for i in range(len(inputs))] + [
      k for k, _ in layer.vars.FlattenItems()]
  for name, g, ref in zip(names, Grads(fn), Grads(ref_fn)):
    assert g is not None, name
    np.testing.assert_allclose(g.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5,
                               err_msg=name)


@pytest.mark.parametrize('padded', [False, True])
@pytest.mark.parametrize('causal', [False, True])
def test_encoder_matches_reference(causal, padded):
  layer = _Build(transformer.TransformerEncoderLayer, causal=causal)
  x, _, paddings, _ = _Inputs()
  paddings = paddings if padded else None
  out = layer.FProp(layer.theta, x, paddings)
  ref = _EncoderRef(layer, x, paddings, causal)
  np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)


def test_encoder_gradients_match_reference():
  layer = _Build(transformer.TransformerEncoderLayer, causal=True)
  x, _, paddings, _ = _Inputs(seed=1)
  _AssertGradsMatch(lambda: layer.FProp(layer.theta, x, paddings),
                    lambda: _EncoderRef(layer, x, paddings, True), [x], layer)


@pytest.mark.parametrize('padded', [False, True])
def test_decoder_matches_reference(padded):
  layer = _Build(transformer.TransformerDecoderLayer)
  x, aux, paddings, aux_paddings = _Inputs(seed=2)
  if not padded:
    paddings = aux_paddings = None
  out = layer.FProp(layer.theta, x, aux, aux_paddings, paddings)
  ref = _DecoderRef(layer, x, aux, aux_paddings, paddings)
  np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)


def test_decoder_gradients_match_reference():
  layer = _Build(transformer.TransformerDecoderLayer)
  x, aux, paddings, aux_paddings = _Inputs(seed=3)
  _AssertGradsMatch(
      lambda: layer.FProp(layer.theta, x, aux, aux_paddings, paddings),
      lambda: _DecoderRef(layer, x, aux, aux_paddings, paddings), [x, aux],
      layer)


def test_tf_function_equals_eager():
  enc = _Build(transformer.TransformerEncoderLayer, keep_prob=0.5)
  dec = _Build(transformer.TransformerDecoderLayer, keep_prob=0.5)
  x, aux, paddings, aux_paddings = _Inputs(seed=4)

  def Both(seed):
    enc_out = enc.FProp(step_seeds.WithStepSeed(enc.theta, seed), x, paddings)
    dec_out = dec.FProp(step_seeds.WithStepSeed(dec.theta, seed), x, aux,
                        aux_paddings, paddings)
    return enc_out, dec_out

  seed = tf.constant([4, 2], tf.int64)
  for graph, eager in zip(tf.function(Both)(seed), Both(seed)):
    np.testing.assert_allclose(graph.numpy(), eager.numpy(), rtol=1e-6)


@pytest.mark.parametrize('cls', [transformer.TransformerEncoderLayer,
                                 transformer.TransformerDecoderLayer])
def test_dropout_follows_step_seed_and_eval_mode(cls):
  layer = _Build(cls, keep_prob=0.5)
  x, aux, paddings, aux_paddings = _Inputs(seed=6)
  decoder = cls is transformer.TransformerDecoderLayer
  extra = (aux, aux_paddings, paddings) if decoder else (paddings,)

  def Run(step_seed):
    return layer.FProp(step_seeds.WithStepSeed(layer.theta, step_seed), x,
                       *extra).numpy()

  if decoder:
    ref = _DecoderRef(layer, x, aux, aux_paddings, paddings).numpy()
  else:
    ref = _EncoderRef(layer, x, paddings, False).numpy()
  first = Run([7, 0])
  np.testing.assert_array_equal(Run([7, 0]), first)
  assert not np.allclose(Run([7, 1]), first)
  assert not np.allclose(first, ref)
  with eval_mode.EvalMode():
    np.testing.assert_allclose(Run([7, 0]), ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('cls', [transformer.TransformerEncoderLayer,
                                 transformer.TransformerDecoderLayer])
def test_dropouts_say_their_inputs_are_batch_major(cls):
  """Attention takes [batch, time, dim], so the dropouts draw per example
  along axis 0, and a time-major pipeline does not refuse them as unset."""
  layer = _Build(cls, keep_prob=0.5)
  assert dropout.UnsetExampleAxes(layer) == []
  assert {c.params.example_axis for _, c in layer.Children()
          if isinstance(c, dropout.DropoutLayer)} == {0}


def _LayerNormCost(rows):
  # 7 flops an element; scale and bias; output, centered input, mean, rsqrt.
  n = rows * D
  return 7 * n, 4 * 2 * D, 4 * (2 * n + 2 * rows)


def _AttentionCost(q_rows, kv_rows, key_len):
  logits = q_rows * N * key_len
  flops = ((q_rows + 2 * kv_rows) * (2 * D * D + D)  # q, k, v projections
           + q_rows * (2 * D * D + D)  # post projection
           + q_rows * D  # query scaling
           + 2 * logits * 2 * (D // N)  # q.k and probs.v
           + 3 * logits)  # softmax
  acts = (q_rows + 2 * kv_rows) * D + 2 * logits + q_rows * 2 * D
  return flops, 4 * (4 * D * D + 4 * D), 4 * acts


def _FeedForwardCost(rows):
  flops = (rows * (2 * D * FFN + FFN)  # fc0 and bias
           + rows * FFN  # relu
           + rows * (2 * FFN * D + D))  # fc1 and bias
  params = 4 * (D * FFN + FFN + FFN * D + D)
  acts = 4 * (3 * rows * FFN + 2 * rows * D)  # matmul, bias, relu; matmul, bias
  return flops, params, acts


def _BlockCost(body, rows, keep_prob):
  """A residual block: layer norm, body, dropout and the residual add."""
  n = rows * D
  dropout_flops = 0 if keep_prob == 1.0 else 3 * n  # draw, compare/scale, mul
  dropout_acts = 0 if keep_prob == 1.0 else 4 * 2 * n  # mask and output
  ln = _LayerNormCost(rows)
  return (ln[0] + body[0] + dropout_flops + n, ln[1] + body[1],
          ln[2] + body[2] + dropout_acts + 4 * n)


@pytest.mark.parametrize('keep_prob', [1.0, 0.5])
def test_encoder_fprop_meta(keep_prob):
  layer = _Build(transformer.TransformerEncoderLayer, keep_prob=keep_prob)
  x, _, paddings, _ = _Inputs()
  meta = transformer.TransformerEncoderLayer.FPropMeta(layer.params, x.shape,
                                                       paddings.shape)
  assert meta.out_shapes == (layer.FProp(layer.theta, x, paddings).shape,)
  rows = B * T
  blocks = [_BlockCost(_AttentionCost(rows, rows, T), rows, keep_prob),
            _BlockCost(_FeedForwardCost(rows), rows, keep_prob)]
  expected = tuple(sum(c) for c in zip(*blocks))
  assert (meta.flops, meta.param_bytes, meta.act_bytes) == expected
  if keep_prob == 1.0:
    assert expected == (14220, 2400, 7040)  # Worked out on paper.
  variable_bytes = sum(4 * v.shape.num_elements() for v in layer.vars.Flatten())
  assert meta.param_bytes == variable_bytes


def test_decoder_fprop_meta():
  layer = _Build(transformer.TransformerDecoderLayer, keep_prob=0.5)
  x, aux, paddings, aux_paddings = _Inputs()
  meta = transformer.TransformerDecoderLayer.FPropMeta(
      layer.params, x.shape, aux.shape, aux_paddings.shape, paddings.shape)
  out = layer.FProp(layer.theta, x, aux, aux_paddings, paddings)
  assert meta.out_shapes == (out.shape,)
  rows = B * T
  blocks = [_BlockCost(_AttentionCost(rows, rows, T), rows, 0.5),
            _BlockCost(_AttentionCost(rows, B * S, S), rows, 0.5),
            _BlockCost(_FeedForwardCost(rows), rows, 0.5)]
  expected = tuple(sum(c) for c in zip(*blocks))
  assert (meta.flops, meta.param_bytes, meta.act_bytes) == expected
  variable_bytes = sum(4 * v.shape.num_elements() for v in layer.vars.Flatten())
  assert meta.param_bytes == variable_bytes


def test_fprop_meta_follows_dtype():
  p = transformer.TransformerDecoderLayer.Params().Set(
      name='tr', input_dim=D, num_heads=N, hidden_dim=FFN)
  shapes = ([B, T, D], [B, S, D])
  fp32 = transformer.TransformerDecoderLayer.FPropMeta(p, *shapes)
  fp64 = transformer.TransformerDecoderLayer.FPropMeta(
      p.Copy().Set(dtype=tf.float64), *shapes)
  assert fp64.flops == fp32.flops
  assert fp64.param_bytes == 2 * fp32.param_bytes
  assert fp64.act_bytes == 2 * fp32.act_bytes


def test_children_and_variable_paths():
  layer = _Build(transformer.TransformerDecoderLayer)
  blocks = ('self_atten', 'cross_atten', 'ffn')
  assert [n for n, _ in layer.Children()] == [
      f'{b}{suffix}' for b in blocks for suffix in ('_ln', '', '_dropout')]
  assert layer.vars.cross_atten.query_w.name.startswith('tr/cross_atten/')


@pytest.mark.parametrize('cls', [transformer.TransformerEncoderLayer,
                                 transformer.TransformerDecoderLayer])
@pytest.mark.parametrize('overrides,match', [
    (dict(hidden_dim=0), r'hidden_dim > 0 .* got input_dim=8, hidden_dim=0'),
    (dict(input_dim=0), r'needs input_dim > 0 .* got input_dim=0'),
    (dict(num_heads=3), r'num_heads \(3\) must be positive and divide '
     r'hidden_dim \(8\)'),
    (dict(residual_keep_prob=0.0), r'keep_prob must be in \(0, 1\], got 0.0'),
])
def test_bad_params_raise(cls, overrides, match):
  p = cls.Params().Set(name='tr', input_dim=D, num_heads=N, hidden_dim=FFN)
  p.Set(**overrides)
  with pytest.raises(ValueError, match=match):
    p.Instantiate()
  shapes = [[B, T, D]] if cls is transformer.TransformerEncoderLayer else [
      [B, T, D], [B, S, D]]
  with pytest.raises(ValueError, match=match):
    cls.FPropMeta(p, *shapes)
