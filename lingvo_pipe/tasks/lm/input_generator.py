"""Byte-level language-model input: windows of text files as tf.data batches.

Each example is a window of seq_len + 1 bytes: ids are its first seq_len
bytes, labels the last seq_len (the next byte). Training windows start at
uniformly random offsets (a pure function of the seed and the example
count); eval windows tile the text in order. The iterator is checkpointable, so a resumed run reads on where
it stopped.
"""

import glob
import os
import sysconfig
from typing import List

import numpy as np
import tensorflow as tf

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.nested_map import NestedMap


def StdlibPythonFiles() -> List[str]:
  """The .py files of the running interpreter's standard library, sorted."""
  stdlib = sysconfig.get_paths()['stdlib']
  files = glob.glob(os.path.join(stdlib, '*.py')) + glob.glob(
      os.path.join(stdlib, '*', '*.py'))
  return sorted(f for f in files if 'site-packages' not in f)


def HeldOut(path: str, eval_every: int) -> bool:
  """Whether a file is held out for eval: a stable 1-in-eval_every choice."""
  return sum(os.path.basename(path).encode('utf-8')) % eval_every == 0


class ByteLmInput:
  """Builds the dataset of one split from its params."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', 'byte_lm_input', 'Name.')
    p.Define('file_pattern', '', 'Glob of text files; empty: the Python '
             'standard library (split by HeldOut).')
    p.Define('split', 'train', "'train' (random windows, repeated) or 'eval' "
             '(tiled windows, in order).')
    p.Define('eval_every', 10, 'With the stdlib default, 1 file in this many '
             'is held out for eval.')
    p.Define('max_bytes', 4_000_000, 'Read at most this many bytes.')
    p.Define('batch_size', 32, 'Examples per batch.')
    p.Define('seq_len', 128, 'Bytes per example.')
    p.Define('seed', 1234, 'Shuffle seed.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    p = params
    if p.split not in ('train', 'eval'):
      raise ValueError(f"Input split must be 'train' or 'eval', got {p.split!r}.")
    self.params = p.Copy().Freeze()
    self.files = self._Files()
    self.data = self._ReadBytes()

  def _Files(self) -> List[str]:
    p = self.params
    if p.file_pattern:
      files = sorted(glob.glob(p.file_pattern))
      if not files:
        raise FileNotFoundError(f'No file matches input file_pattern '
                                f'{p.file_pattern!r}.')
      return files
    held_out = p.split == 'eval'
    return [f for f in StdlibPythonFiles() if HeldOut(f, p.eval_every) == held_out]

  def _ReadBytes(self) -> np.ndarray:
    p = self.params
    chunks, total = [], 0
    for path in self.files:
      with open(path, 'rb') as f:
        chunk = f.read(p.max_bytes - total)
      chunks.append(chunk)
      total += len(chunk)
      if total >= p.max_bytes:
        break
    data = np.frombuffer(b'\n'.join(chunks), dtype=np.uint8)
    if len(data) < (p.seq_len + 1) * p.batch_size:
      raise ValueError(f'Input has {len(data)} bytes, fewer than one batch '
                       f'needs ({p.batch_size} x {p.seq_len + 1}); give more '
                       'text or lower batch_size or seq_len.')
    return data

  def Dataset(self) -> tf.data.Dataset:
    """Batches of NestedMap(ids, labels, paddings), all [batch, seq_len]."""
    p = self.params
    window = p.seq_len + 1
    data = tf.constant(self.data)
    if p.split == 'train':
      # Window i starts at a uniform offset drawn from (seed, i): every part
      # of the corpus is equally likely at every step, and the iterator's
      # position is one counter, which checkpoints exactly.
      num_starts = len(self.data) - window
      starts = tf.data.Dataset.counter().map(
          lambda i: tf.random.stateless_uniform(
              [], [p.seed, i], maxval=num_starts, dtype=tf.int64))
    else:
      starts = tf.data.Dataset.range(0, len(self.data) - window, p.seq_len)

    def Example(start):
      chunk = tf.reshape(tf.cast(data[start:start + window], tf.int32), [window])
      return NestedMap(ids=chunk[:-1], labels=chunk[1:],
                       paddings=tf.zeros([p.seq_len], tf.float32))

    return starts.map(Example).batch(p.batch_size, drop_remainder=True)
