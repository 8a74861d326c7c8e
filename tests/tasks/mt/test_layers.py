"""The pipelined encoder-decoder equals its layers applied per micro-batch."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.tasks.mt import layers as mt_layers

from tests import transparency
from tests.pipeline import pipeline_models as models


def _Pipeline(k, m):
  """Embedding, encoder and decoder layers, softmax: seven layers at K=7
  (two encoder, three decoder layers), four (one and one) at K <= 4, where
  more would only be more graph to trace."""
  encoder, decoder = (2, 3) if k > 4 else (1, 1)
  p = mt_layers.GPipeTransformerSeq2Seq.Params().Set(
      name='mt', vocab_size=16, model_dim=8, num_heads=2, hidden_dim=16,
      num_encoder_layers=encoder, num_decoder_layers=decoder, residual_keep_prob=0.8,
      batch_size=models.BATCH, src_len=5, tgt_len=4, label_smoothing=0.1)
  p.pipeline.Set(num_partitions=k, num_micro_batches=m)
  return mt_layers.GPipeTransformerSeq2Seq.PipelineParams(p).Instantiate()


def _Inputs():
  """The pipeline's inputs (source and target ids and paddings)."""
  b = models.BATCH
  src = tf.random.stateless_uniform([b, 5], [1, 0], 0, 16, tf.int32)
  src_pad = tf.cast(tf.range(5)[None, :] >= tf.range(b)[:, None] % 5 + 1, tf.float32)
  tgt = tf.random.stateless_uniform([b, 4], [1, 1], 0, 16, tf.int32)
  tgt_pad = tf.cast(tf.range(4)[None, :] >= tf.range(b)[:, None] % 4 + 1, tf.float32)
  return src, src_pad, tgt, tgt_pad


_LABELS = tf.random.stateless_uniform([models.BATCH, 4], [1, 2], 0, models.VOCAB, tf.int32)


# K up to 7: seven layers there, one per cell.
# M=16 runs in make test on tests/pipeline's ffn and conv stacks (42 s here).
@pytest.mark.parametrize('k,m', models.KMGrid(ks=(1, 2, 4, 7), fast_ms=(1, 2, 4, 8)))
def test_seq2seq_pipeline_is_transparent(k, m):
  pipe = _Pipeline(k, m)
  assert pipe.num_cells == k
  # Source paddings only mask: no gradient reaches them (None, taken as 0).
  transparency.CheckTransparent(pipe, _Inputs(), m, step=3, loss_fn=models.TokenLoss(_LABELS))


def test_decoder_attends_to_the_source():
  pipe = _Pipeline(2, 1)
  src, src_pad, tgt, tgt_pad = _Inputs()
  logits = pipe(src, src_pad, tgt, tgt_pad)[0]
  changed = pipe(tf.roll(src, 1, axis=1), src_pad, tgt, tgt_pad)[0]
  assert not np.allclose(logits.numpy(), changed.numpy())
