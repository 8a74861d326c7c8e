"""Tests MultiHeadedAttention against a per-head plain-TensorFlow reference."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core.layers import attention

B, T, S, D, H, N = 2, 5, 7, 8, 12, 3
VAR_NAMES = ('query_w', 'query_b', 'key_w', 'key_b', 'value_w', 'value_b',
             'post_w', 'post_b')


def _Layer(hidden_dim=H, num_heads=N):
  layer = attention.MultiHeadedAttention.Params().Set(
      name='atten', input_dim=D, hidden_dim=hidden_dim,
      num_heads=num_heads).Instantiate()
  # Biases start at zero; give them values so the test sees them.
  rng = np.random.RandomState(7)
  for name in ('query_b', 'key_b', 'value_b', 'post_b'):
    var = layer.vars[name]
    var.assign(rng.uniform(-0.5, 0.5, var.shape).astype(np.float32))
  return layer


def _Inputs(t, s, seed=0):
  rng = np.random.RandomState(seed)
  query = tf.constant(rng.randn(B, t, D).astype(np.float32))
  key = tf.constant(rng.randn(B, s, D).astype(np.float32))
  value = tf.constant(rng.randn(B, s, D).astype(np.float32))
  # Example 0 has its last two keys padded, example 1 none.
  paddings = np.zeros([B, s], np.float32)
  paddings[0, -2:] = 1.0
  return query, key, value, tf.constant(paddings)


def _Allowed(paddings, causal, t, s):
  """[B, T, S] bools: key s is not padded and (if causal) s <= t."""
  allowed = np.ones([B, t, s], bool)
  if paddings is not None:
    allowed &= (paddings.numpy() == 0.0)[:, None, :]
  if causal:
    allowed &= np.tril(np.ones([t, s], bool))[None]
  return allowed


def _Reference(layer, query, key, value, allowed):
  """Plain TF: one head at a time on column slices of the weights."""
  v = layer.vars
  head_dim = v.query_w.shape[1] // layer.params.num_heads
  contexts, probs = [], []
  for i in range(layer.params.num_heads):
    cols = slice(i * head_dim, (i + 1) * head_dim)
    q = tf.matmul(query, v.query_w[:, cols]) + v.query_b[cols]
    k = tf.matmul(key, v.key_w[:, cols]) + v.key_b[cols]
    val = tf.matmul(value, v.value_w[:, cols]) + v.value_b[cols]
    logits = tf.matmul(q, k, transpose_b=True) / np.sqrt(head_dim)
    if allowed is not None:
      logits = tf.where(allowed, logits, -np.inf)
    p = tf.nn.softmax(logits, axis=-1)
    probs.append(p)
    contexts.append(tf.matmul(p, val))
  out = tf.matmul(tf.concat(contexts, -1), v.post_w) + v.post_b
  return out, tf.stack(probs, axis=1)


CASES = [
    # (name, key length, use paddings, causal)
    ('self', T, False, False),
    ('self_padded', T, True, False),
    ('self_causal', T, False, True),
    ('self_causal_padded', T, True, True),
    ('cross', S, False, False),
    ('cross_padded', S, True, False),
]


@pytest.mark.parametrize('name,s,padded,causal', CASES,
                         ids=[c[0] for c in CASES])
def test_matches_reference(name, s, padded, causal):
  layer = _Layer()
  query, key, value, paddings = _Inputs(T, s)
  if name.startswith('self'):
    key = value = query
  paddings = paddings if padded else None
  out, probs = layer.FPropWithProbs(layer.theta, query, key, value, paddings,
                                    causal)
  ref_out, ref_probs = _Reference(layer, query, key, value,
                                  _Allowed(paddings, causal, T, s))
  np.testing.assert_allclose(out.numpy(), ref_out.numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(probs.numpy(), ref_probs.numpy(), rtol=1e-5,
                             atol=1e-7)
  fprop_out = layer.FProp(layer.theta, query, key, value, paddings, causal)
  np.testing.assert_array_equal(fprop_out.numpy(), out.numpy())


@pytest.mark.parametrize('causal', [False, True])
def test_gradients_match_reference(causal):
  layer = _Layer()
  s = T if causal else S
  query, key, value, paddings = _Inputs(T, s, seed=1)
  allowed = _Allowed(paddings, causal, T, s)
  weights = tf.constant(np.random.RandomState(2).randn(B, T, D), tf.float32)
  sources = [query, key, value] + [layer.vars[n] for n in VAR_NAMES]

  def Grads(fn):
    with tf.GradientTape() as tape:
      tape.watch([query, key, value])
      loss = tf.reduce_sum(fn() * weights)
    return tape.gradient(loss, sources)

  grads = Grads(lambda: layer.FProp(layer.theta, query, key, value, paddings,
                                    causal))
  ref_grads = Grads(lambda: _Reference(layer, query, key, value, allowed)[0])
  for name, g, ref in zip(['query', 'key', 'value'] + list(VAR_NAMES), grads,
                          ref_grads):
    assert g is not None, name
    np.testing.assert_allclose(g.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5,
                               err_msg=name)


def test_masked_keys_and_future_positions_do_not_matter():
  layer = _Layer()
  query, key, value, paddings = _Inputs(T, T, seed=3)
  out = layer.FProp(layer.theta, query, key, value, paddings, causal=True)
  # Change the padded keys of example 0 (its last two) and the last position
  # of example 1: all earlier positions of both examples stay the same.
  noise = np.zeros([B, T, D], np.float32)
  noise[0, -2:] = 5.0
  noise[1, -1] = 5.0
  changed = layer.FProp(layer.theta, query, key + noise, value + noise,
                        paddings, causal=True)
  np.testing.assert_allclose(changed.numpy()[:, :-2], out.numpy()[:, :-2],
                             rtol=1e-6)
  assert not np.allclose(changed.numpy()[1, -1], out.numpy()[1, -1])


def test_tf_function_equals_eager():
  layer = _Layer()
  query, key, value, paddings = _Inputs(T, S, seed=4)
  eager = layer.FProp(layer.theta, query, key, value, paddings)
  graph = tf.function(
      lambda q, k, v, p: layer.FProp(layer.theta, q, k, v, p))(
          query, key, value, paddings)
  np.testing.assert_allclose(graph.numpy(), eager.numpy(), rtol=1e-6)


def test_tf_function_with_unknown_batch_and_time():
  layer = _Layer()
  query, _, _, _ = _Inputs(T, T, seed=5)
  spec = tf.TensorSpec([None, None, D], tf.float32)
  fn = tf.function(lambda x: layer.FProp(layer.theta, x, x, x, causal=True),
                   input_signature=[spec])
  np.testing.assert_allclose(
      fn(query).numpy(),
      layer.FProp(layer.theta, query, query, query, causal=True).numpy(),
      rtol=1e-6)


def test_variable_shapes_and_default_hidden_dim():
  layer = _Layer(hidden_dim=0, num_heads=2)
  shapes = {n: layer.vars[n].shape.as_list() for n in VAR_NAMES}
  assert shapes == {'query_w': [D, D], 'query_b': [D], 'key_w': [D, D],
                    'key_b': [D], 'value_w': [D, D], 'value_b': [D],
                    'post_w': [D, D], 'post_b': [D]}


def test_fprop_meta():
  layer = _Layer()
  p = layer.params
  query, key, value, paddings = _Inputs(T, S)
  meta = attention.MultiHeadedAttention.FPropMeta(p, query.shape, key.shape,
                                                  value.shape, paddings.shape)
  out = layer.FProp(layer.theta, query, key, value, paddings)
  assert meta.out_shapes == (out.shape,)
  q_rows, kv_rows = B * T, B * S  # 10, 14
  logits = B * N * T * S  # 210
  head_dim = H // N  # 4
  flops = (q_rows * (2 * D * H + H)  # query projection and bias
           + 2 * kv_rows * (2 * D * H + H)  # key and value projections
           + q_rows * (2 * H * D + D)  # post projection and bias
           + q_rows * H  # query scaling
           + logits * 2 * head_dim  # q.k
           + logits * 2 * head_dim  # probs.v
           + logits * 3)  # softmax
  assert flops == 13862
  assert meta.flops == flops
  assert meta.param_bytes == 4 * (3 * (D * H + H) + H * D + D) == 1712
  # q, k, v, logits, probs, merged context, output.
  assert meta.act_bytes == 4 * (q_rows * H + 2 * kv_rows * H + 2 * logits
                                + q_rows * H + q_rows * D) == 4304


def test_fprop_meta_defaults_key_and_value_to_query():
  p = _Layer().params
  meta = attention.MultiHeadedAttention.FPropMeta(p, [B, T, D])
  full = attention.MultiHeadedAttention.FPropMeta(p, [B, T, D], [B, T, D],
                                                  [B, T, D])
  assert meta == full
  assert meta.out_shapes == (tf.TensorShape([B, T, D]),)


@pytest.mark.parametrize('input_dim,hidden_dim,num_heads,match', [
    (D, 12, 5,
     r'num_heads \(5\) must be positive and divide hidden_dim \(12\)'),
    (D, 0, 3, r'num_heads \(3\) .* hidden_dim \(8\)'),
    (D, 12, 0, r'num_heads \(0\)'),
    (0, 12, 3, r'input_dim \(0\) must be positive'),
])
def test_bad_dims_raise(input_dim, hidden_dim, num_heads, match):
  p = attention.MultiHeadedAttention.Params().Set(
      name='atten', input_dim=input_dim, hidden_dim=hidden_dim,
      num_heads=num_heads)
  with pytest.raises(ValueError, match=match):
    p.Instantiate()
  with pytest.raises(ValueError, match=match):
    attention.MultiHeadedAttention.FPropMeta(p, [B, T, D])


def test_wrong_input_dim_raises():
  layer = _Layer()
  query, key, value, _ = _Inputs(T, S)
  with pytest.raises(ValueError, match=r'key_vec must be \[batch, time, '
                     r'input_dim=8\], got shape \(2, 7, 3\)'):
    layer.FProp(layer.theta, query, key[..., :3], value)
  with pytest.raises(ValueError, match=r'query_vec must be .* got shape '
                     r'\(2, 5, 8, 1\)'):
    attention.MultiHeadedAttention.FPropMeta(layer.params, [B, T, D, 1])
