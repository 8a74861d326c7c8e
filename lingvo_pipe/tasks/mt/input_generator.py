"""Byte-level parallel text for translation: line-aligned source and target
files, or a generated translation-like task (reverse the sentence).

Ids are bytes; 0 pads, 1 starts the decoder input, 2 ends the target.
Training examples are drawn uniformly with replacement by a counter (the
iterator's position checkpoints exactly); eval examples come in order.
"""

import glob
from typing import List, Tuple

import numpy as np
import tensorflow as tf

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.nested_map import NestedMap

PAD, BOS, EOS = 0, 1, 2


def SyntheticPairs(num: int, seed: int) -> List[Tuple[bytes, bytes]]:
  """Sentences of random lowercase words and their reversals."""
  rng = np.random.RandomState(seed)
  pairs = []
  for _ in range(num):
    words = [bytes(rng.randint(97, 123, rng.randint(2, 6)).astype(np.uint8))
             for _ in range(rng.randint(1, 5))]
    src = b' '.join(words)
    pairs.append((src, src[::-1]))
  return pairs


def _ReadLines(pattern: str) -> List[bytes]:
  files = sorted(glob.glob(pattern))
  if not files:
    raise FileNotFoundError(f'No file matches {pattern!r}.')
  lines: List[bytes] = []
  for path in files:
    with open(path, 'rb') as f:
      lines.extend(line.rstrip(b'\r\n') for line in f)
  return lines


def Encode(texts: List[bytes], length: int, add_eos: bool) -> np.ndarray:
  """Byte ids [len(texts), length], cut to fit (with EOS last if add_eos), PAD after."""
  ids = np.full([len(texts), length], PAD, np.int32)
  for i, text in enumerate(texts):
    row = list(text[:length - 1] if add_eos else text[:length]) + ([EOS] if add_eos else [])
    ids[i, :len(row)] = row
  return ids


class ParallelTextInput:
  """Builds the dataset of one split from its params."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', 'parallel_text_input', 'Name.')
    p.Define('source_file_pattern', '', 'Glob of source files (one sentence a '
             'line); empty: the generated reversal task.')
    p.Define('target_file_pattern', '', 'Glob of target files, line-aligned '
             'with the sources.')
    p.Define('split', 'train', "'train' (random examples) or 'eval' (in order).")
    p.Define('num_synthetic', 20000, 'Generated pairs (train and eval '
             'generate different ones).')
    p.Define('batch_size', 32, 'Examples per batch.')
    p.Define('src_len', 32, 'Source bytes (longer lines are cut).')
    p.Define('tgt_len', 32, 'Target bytes including the end marker.')
    p.Define('seed', 1234, 'Sampling (and generation) seed.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    p = params
    if p.split not in ('train', 'eval'):
      raise ValueError(f"Input split must be 'train' or 'eval', got {p.split!r}.")
    self.params = p.Copy().Freeze()
    src, tgt = self._Texts()
    if len(src) != len(tgt):
      raise ValueError(f'Source and target files have {len(src)} and '
                       f'{len(tgt)} lines; they must be line-aligned.')
    if len(src) < p.batch_size:
      raise ValueError(f'{len(src)} sentence pairs are fewer than one batch '
                       f'({p.batch_size}).')
    self.src = Encode(src, p.src_len, add_eos=False)
    self.labels = Encode(tgt, p.tgt_len, add_eos=True)

  def _Texts(self) -> Tuple[List[bytes], List[bytes]]:
    p = self.params
    if p.source_file_pattern or p.target_file_pattern:
      return _ReadLines(p.source_file_pattern), _ReadLines(p.target_file_pattern)
    seed = p.seed if p.split == 'train' else p.seed + 1
    pairs = SyntheticPairs(p.num_synthetic if p.split == 'train' else
                           max(p.num_synthetic // 10, p.batch_size), seed)
    return [s for s, _ in pairs], [t for _, t in pairs]

  def Dataset(self) -> tf.data.Dataset:
    """Batches of NestedMap(src_ids, src_paddings, tgt_ids, tgt_paddings,
    labels); tgt_ids are the labels shifted right behind BOS."""
    p = self.params
    src, labels = tf.constant(self.src), tf.constant(self.labels)
    num = len(self.src)
    if p.split == 'train':
      index = tf.data.Dataset.counter().map(
          lambda i: tf.random.stateless_uniform([], [p.seed, i], maxval=num,
                                                dtype=tf.int64))
    else:
      index = tf.data.Dataset.range(num)

    def Example(i):
      label = labels[i]
      tgt = tf.concat([[BOS], label[:-1]], axis=0)
      return NestedMap(
          src_ids=src[i], src_paddings=tf.cast(tf.equal(src[i], PAD), tf.float32),
          tgt_ids=tgt, tgt_paddings=tf.cast(tf.equal(label, PAD), tf.float32),
          labels=label)

    return index.map(Example).batch(p.batch_size, drop_remainder=True)
