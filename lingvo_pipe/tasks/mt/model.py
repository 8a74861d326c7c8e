"""A translation task: a GPipe Transformer encoder-decoder, its metrics and
its decoder (greedy or beam search, corpus BLEU)."""

from typing import Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import eval_mode
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline.layout import micro_batch_count
from lingvo_pipe.tasks import decoding
from lingvo_pipe.tasks.lm import model as lm_model
from lingvo_pipe.tasks.mt import beam_search
from lingvo_pipe.tasks.mt import bleu
from lingvo_pipe.tasks.mt import input_generator as mt_input
from lingvo_pipe.tasks.mt import layers as mt_layers


class TranslationTask(base_layer.BaseLayer, decoding.DecodingTask):
  """FProp(theta, batch) -> metrics (see lm_model.TokenMetrics) of the
  target given the source; batches come from ParallelTextInput.

  Decode translates batch.src_ids by beam search (greedy with beam_size 1),
  each step running the pipelined encoder-decoder's eval forward on the
  target so far: no remat, no gradient, every cell on its device.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('model', mt_layers.GPipeTransformerSeq2Seq.Params(),
             'The pipelined encoder-decoder.')
    p.Define('beam_size', 4, 'Decoder beam size; 1: greedy search.')
    p.Define('length_alpha', 0.6, 'Length normalization of the beam\'s final '
             'choice: score / ((5 + length) / 6) ** alpha; 0: raw score.')
    p.Define('max_decode_len', 0, 'Most target bytes decoded, EOS included '
             '(0: model.tgt_len).')
    p.Define('bleu_smoothing', bleu.Smoothing.NONE, 'A bleu.Smoothing.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    if p.beam_size < 1 or p.max_decode_len < 0:
      raise ValueError(f'TranslationTask {p.name!r}: beam_size ({p.beam_size}) '
                       f'must be >= 1 and max_decode_len ({p.max_decode_len}) '
                       '>= 0 (0: model.tgt_len).')
    self.CreateChild('model', p.model)

  def FProp(self, theta: NestedMap, batch: NestedMap) -> NestedMap:
    out = self.model.FProp(theta.model, batch.src_ids, batch.src_paddings,
                           batch.tgt_ids, batch.tgt_paddings, batch.labels)
    return lm_model.TokenMetrics(out, batch.labels)

  # --- decoding ---------------------------------------------------------------

  @property
  def max_decode_len(self) -> int:
    return self.params.max_decode_len or self.params.model.tgt_len

  def _LogProbsFn(self, theta: NestedMap, src_ids: tf.Tensor,
                  src_paddings: tf.Tensor) -> beam_search.LogProbsFn:
    """The scorer of beam_search: the pipeline's eval forward on the
    target so far (BOS, then the ids before t); causal self-attention makes
    position t's logits independent of the PAD after it."""

    def LogProbs(ids: tf.Tensor, t: tf.Tensor) -> tf.Tensor:
      bos = tf.fill([tf.shape(ids)[0], 1], mt_input.BOS)
      tgt_ids = tf.concat([bos, ids[:, :-1]], axis=1)
      out = self.model.FProp(theta.model, src_ids, src_paddings, tgt_ids,
                             tf.zeros(tf.shape(ids), tf.float32), ids)
      return tf.nn.log_softmax(tf.gather(out.logits, t, axis=1))
    return LogProbs

  def Decode(self, theta: NestedMap, batch: NestedMap) -> NestedMap:
    """Translates batch.src_ids [B, S] (batch.src_paddings marks padding).

    Returns:
      NestedMap(ids [B, max_decode_len] ending in EOS then PAD, scores [B]
      (log-probability), lengths [B] (EOS included)).

    Raises:
      ValueError: if B * beam_size rows do not split into the pipeline's
        micro-batches.
    """
    p = self.params
    k = p.beam_size
    src_ids, src_paddings = batch.src_ids, batch.src_paddings
    batch_size = src_ids.shape[0]
    multiple = micro_batch_count.BatchMultiple(p.model.pipeline)
    if batch_size is not None and (batch_size * k) % multiple:
      what = ('micro_batch_size' if p.model.pipeline.micro_batch_size
              else 'num_micro_batches')
      raise ValueError(f'Decoding {batch_size} examples with beam_size {k} '
                       f'gives {batch_size * k} rows, not a multiple of the '
                       f'pipeline\'s {what} ({multiple}); use a batch size '
                       f'that is a multiple of {multiple}.')
    if batch_size is None:
      batch_size = tf.shape(src_ids)[0]
    with eval_mode.EvalMode():
      if k == 1:
        fn = self._LogProbsFn(theta, src_ids, src_paddings)
        out = beam_search.GreedySearch(fn, batch_size, self.max_decode_len,
                                       mt_input.EOS, mt_input.PAD)
      else:
        fn = self._LogProbsFn(theta, tf.repeat(src_ids, k, axis=0),
                              tf.repeat(src_paddings, k, axis=0))
        out = beam_search.BeamSearch(fn, batch_size, self.max_decode_len, k,
                                     mt_input.EOS, mt_input.PAD, p.length_alpha)
    return NestedMap(ids=out.ids, scores=out.scores, lengths=out.lengths)

  def PromptBatch(self, text: str) -> NestedMap:
    """One example per line of `text`, repeated up to a batch the pipeline
    takes (micro_batch_count.BatchMultiple; is_real marks the given ones).

    Raises:
      ValueError: for a line longer than the model reads (model.src_len
        bytes), which would be translated cut.
    """
    lines = [line.encode('utf-8') for line in text.split('\n')]
    limit = self.params.model.src_len
    for i, line in enumerate(lines):
      if len(line) > limit:
        raise ValueError(f'Line {i + 1} of the prompt is {len(line)} bytes; the model '
                         f'reads at most {limit} (model.src_len): shorten it or split it '
                         'over lines.')
    multiple = micro_batch_count.BatchMultiple(self.params.model.pipeline)
    size = -(-len(lines) // multiple) * multiple
    src = mt_input.Encode(lines + [lines[-1]] * (size - len(lines)),
                          self.params.model.src_len, add_eos=False)
    return NestedMap(src_ids=tf.constant(src),
                     src_paddings=tf.constant((src == mt_input.PAD).astype(np.float32)),
                     is_real=tf.constant(np.arange(size) < len(lines)))

  def PostProcessDecode(self, batch: NestedMap,
                        decoded: NestedMap) -> List[decoding.DecodedExample]:
    stop = (mt_input.EOS, mt_input.PAD)
    examples = []
    for i, ids in enumerate(decoded.ids):
      if 'is_real' in batch and not batch.is_real[i]:
        continue
      reference = decoding.Text(batch.labels[i], stop) if 'labels' in batch else None
      examples.append(decoding.DecodedExample(
          source=decoding.Text(batch.src_ids[i], stop),
          output=decoding.Text(ids, stop), reference=reference))
    return examples

  def DecodeMetrics(self, examples: Sequence[decoding.DecodedExample]) -> Dict[str, float]:
    """Corpus BLEU of the examples that have a reference."""
    scored = [e for e in examples if e.reference is not None]
    if not scored:
      return {}
    return {'bleu': bleu.CorpusBleu([e.output for e in scored],
                                    [e.reference or '' for e in scored],
                                    self.params.bleu_smoothing)}

  def ServingSignature(self) -> Tuple[Dict[str, tf.TensorSpec], str]:
    return ({'src_ids': tf.TensorSpec([None, self.params.model.src_len], tf.int32,
                                      name='src_ids')},
            'ids [batch, max_decode_len] (bytes, then EOS=2, then PAD=0), '
            'scores [batch] (log-probability), lengths [batch]')

  def ServingFunction(self, theta: NestedMap, **inputs: tf.Tensor) -> Dict[str, tf.Tensor]:
    """Translates src_ids [batch, src_len] (bytes, PAD=0 after them) for a
    batch of up to model.batch_size sentences: the pipeline's micro-batches
    need a static batch, so the batch is padded to it and cut back."""
    src_ids = inputs['src_ids']
    size = self.params.model.batch_size
    n = tf.shape(src_ids)[0]
    check = tf.debugging.assert_less_equal(
        n, size, message=f'The exported translator takes at most {size} '
        'sentences per call (model.batch_size); split the batch.')
    with tf.control_dependencies([check]):
      padded = tf.pad(src_ids, [[0, size - n], [0, 0]])
    padded = tf.ensure_shape(padded, [size, self.params.model.src_len])
    out = self.Decode(theta, NestedMap(
        src_ids=padded, src_paddings=tf.cast(tf.equal(padded, mt_input.PAD), tf.float32)))
    return {key: value[:n] for key, value in out.items()}
