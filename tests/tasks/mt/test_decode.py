"""The translation task's decoder on the pipelined model: scores are the
model's own log-probabilities, and the partition does not change the output."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core import eval_mode
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.tasks.mt import input_generator as mt_input
from lingvo_pipe.tasks.mt import model as mt_model

BATCH, LEN = 8, 8


def _Task(k, m, beam_size, seed=5, micro_batch_size=0, loop_min_micro_batches=0):
  p = mt_model.TranslationTask.Params().Set(name='mt', beam_size=beam_size,
                                            length_alpha=0.0, random_seed=seed)
  p.model.Set(vocab_size=256, model_dim=16, num_heads=2, hidden_dim=32,
              num_encoder_layers=1, num_decoder_layers=2, batch_size=BATCH,
              src_len=LEN, tgt_len=LEN)
  p.model.pipeline.Set(num_partitions=k, num_micro_batches=m,
                       micro_batch_size=micro_batch_size,
                       loop_min_micro_batches=loop_min_micro_batches)
  return p.Instantiate()


def _Batch():
  inp = mt_input.ParallelTextInput.Params().Set(
      batch_size=BATCH, src_len=LEN, tgt_len=LEN, split='eval', num_synthetic=80)
  return next(iter(inp.Instantiate().Dataset()))


def _Decode(task, batch):
  fn = tf.function(lambda b: task.Decode(task.theta, b), autograph=False)
  return fn(NestedMap(src_ids=batch.src_ids, src_paddings=batch.src_paddings))


def _TeacherForcedLogProb(task, batch, ids):
  """Sum of log p(ids[t] | ids[:t]) by one forward over the whole target."""
  bos = tf.fill([BATCH, 1], mt_input.BOS)
  tgt = tf.concat([bos, ids[:, :-1]], axis=1)
  with eval_mode.EvalMode():
    out = task.model.FProp(task.theta.model, batch.src_ids, batch.src_paddings, tgt,
                           tf.cast(tf.equal(ids, mt_input.PAD), tf.float32), ids)
  logp = tf.gather(tf.nn.log_softmax(out.logits), ids, batch_dims=2)
  return tf.reduce_sum(logp * out.weights, axis=1)


@pytest.mark.parametrize('beam_size', [1, 3])
def test_scores_are_the_log_probability_of_the_output(beam_size):
  task, batch = _Task(2, 2, beam_size), _Batch()
  out = _Decode(task, batch)
  assert out.ids.shape == [BATCH, LEN]
  # An untrained model rarely emits EOS: cut every row at its length.
  ids = tf.where(tf.range(LEN)[None] < out.lengths[:, None], out.ids, mt_input.PAD)
  np.testing.assert_array_equal(ids.numpy(), out.ids.numpy())
  np.testing.assert_allclose(out.scores.numpy(),
                             _TeacherForcedLogProb(task, batch, out.ids).numpy(), rtol=1e-5)


def _CopyWeights(src_task, dst_task):
  """Gives dst_task src_task's weights, layer by layer (the partition
  changes where a layer lives, not its variables)."""
  def Layers(task):
    return {layer.params.name: layer for cell in task.model.pipeline.cells
            for layer in cell.sub}
  src, dst = Layers(src_task), Layers(dst_task)
  assert src.keys() == dst.keys()
  for name, layer in src.items():
    for a, b in zip(layer.variables, dst[name].variables, strict=True):
      b.assign(a)


def test_the_partition_does_not_change_the_translation():
  batch = _Batch()
  unpartitioned, piped = _Task(1, 1, 2), _Task(4, 2, 2)
  _CopyWeights(unpartitioned, piped)
  one = _Decode(unpartitioned, batch)
  piped = _Decode(piped, batch)
  np.testing.assert_array_equal(piped.ids.numpy(), one.ids.numpy())
  np.testing.assert_allclose(piped.scores.numpy(), one.scores.numpy(), rtol=1e-5)


def test_a_pipeline_of_loops_translates_as_the_unrolled_one():
  """Decoding's forwards run as one loop per device inside beam search's
  own loop, where the pipeline loops (as in evaluation)."""
  batch = _Batch()
  unrolled = _Decode(_Task(2, 2, 3), batch)
  looped = _Decode(_Task(2, 2, 3, loop_min_micro_batches=2), batch)
  np.testing.assert_array_equal(looped.ids.numpy(), unrolled.ids.numpy())
  np.testing.assert_allclose(looped.scores.numpy(), unrolled.scores.numpy(), rtol=1e-5)


def test_beam_search_scores_at_least_greedy_on_the_model():
  batch = _Batch()
  greedy = _Decode(_Task(2, 2, 1), batch).scores.numpy()
  beam = _Decode(_Task(2, 2, 4), batch).scores.numpy()
  assert np.all(beam >= greedy - 1e-4), (beam, greedy)


def test_a_batch_the_micro_batches_do_not_divide_is_an_error():
  task = _Task(2, 4, 1)
  batch = _Batch()
  with pytest.raises(ValueError, match='multiple of 4'):
    task.Decode(task.theta, NestedMap(src_ids=batch.src_ids[:6],
                                      src_paddings=batch.src_paddings[:6]))


def test_a_batch_the_micro_batch_size_does_not_divide_is_an_error():
  task = _Task(2, 1, 1, micro_batch_size=4)
  batch = _Batch()
  with pytest.raises(ValueError, match=r"pipeline's micro_batch_size \(4\); use a batch "
                     'size that is a multiple of 4'):
    task.Decode(task.theta, NestedMap(src_ids=batch.src_ids[:6],
                                      src_paddings=batch.src_paddings[:6]))


def test_a_prompt_line_longer_than_the_source_is_refused_not_cut():
  task = _Task(2, 1, 1)
  with pytest.raises(ValueError, match=rf'Line 2 of the prompt is {LEN + 1} bytes; the '
                     rf'model reads at most {LEN} \(model.src_len\)'):
    task.PromptBatch('ab\n' + 'x' * (LEN + 1))


@pytest.mark.parametrize('pipeline', [dict(num_micro_batches=2), dict(micro_batch_size=4)])
def test_prompts_are_padded_to_a_batch_the_pipeline_takes(pipeline):
  """Three prompts: four rows, M=2 of two rows, or M=1 of micro_batch_size 4."""
  task = _Task(2, pipeline.get('num_micro_batches', 1), 1,
               micro_batch_size=pipeline.get('micro_batch_size', 0))
  batch = task.PromptBatch('ab\ncd\nef')
  assert batch.src_ids.shape[0] == 4
  out = _Decode(task, batch)
  assert out.ids.shape == [4, LEN]
