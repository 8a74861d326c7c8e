"""CIFAR-10 in its binary format, or generated images for smoke runs.

A binary file holds records of 1 label byte and 3072 pixel bytes (1024 red,
1024 green, 1024 blue, row-major 32x32). Images become NHWC floats scaled
to [-1, 1]. Training examples are drawn uniformly with replacement by a
counter (the iterator's position checkpoints exactly); eval is in order.
"""

import glob

import numpy as np
import tensorflow as tf

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.nested_map import NestedMap

RECORD_BYTES = 1 + 32 * 32 * 3


def ReadCifarBinary(pattern: str):
  """(images uint8 [N, 32, 32, 3], labels int32 [N]) from matching files.

  Raises:
    FileNotFoundError: if nothing matches.
    ValueError: if a file is not a whole number of records.
  """
  files = sorted(glob.glob(pattern))
  if not files:
    raise FileNotFoundError(f'No CIFAR-10 binary file matches {pattern!r} '
                            '(e.g. .../cifar-10-batches-bin/data_batch_*.bin).')
  chunks = []
  for path in files:
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size % RECORD_BYTES:
      raise ValueError(f'{path} has {raw.size} bytes, not a multiple of the '
                       f'{RECORD_BYTES}-byte CIFAR-10 record.')
    chunks.append(raw.reshape(-1, RECORD_BYTES))
  records = np.concatenate(chunks)
  images = records[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
  return images, records[:, 0].astype(np.int32)


def SyntheticImages(num: int, size: int, num_classes: int, seed: int):
  """Noisy images whose class sets the brightness of one color channel and
  the stripe direction, so that a small model can learn them."""
  rng = np.random.RandomState(seed)
  labels = rng.randint(0, num_classes, num).astype(np.int32)
  images = rng.randint(0, 96, (num, size, size, 3))
  stripes = (np.arange(size) // 2 % 2) * 80
  for i, label in enumerate(labels):
    images[i, :, :, label % 3] += 60 + 15 * (label // 3)
    images[i] += (stripes[:, None, None] if label % 2 else stripes[None, :, None])
  return np.clip(images, 0, 255).astype(np.uint8), labels


class CifarInput:
  """Builds the dataset of one split from its params."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = hyperparams.InstantiableParams(cls)
    p.Define('name', 'cifar_input', 'Name.')
    p.Define('file_pattern', '', 'Glob of CIFAR-10 binary files; empty: '
             'generated images.')
    p.Define('split', 'train', "'train' (random examples) or 'eval' (in order).")
    p.Define('num_synthetic', 2048, 'Generated images when file_pattern is empty.')
    p.Define('image_size', 32, 'Side of generated images (files are 32).')
    p.Define('num_classes', 10, 'Classes of generated images.')
    p.Define('batch_size', 32, 'Examples per batch.')
    p.Define('seed', 1234, 'Sampling (and generation) seed.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    p = params
    if p.split not in ('train', 'eval'):
      raise ValueError(f"Input split must be 'train' or 'eval', got {p.split!r}.")
    self.params = p.Copy().Freeze()
    if p.file_pattern:
      self.images, self.labels = ReadCifarBinary(p.file_pattern)
    else:
      seed = p.seed if p.split == 'train' else p.seed + 1
      self.images, self.labels = SyntheticImages(p.num_synthetic, p.image_size,
                                                 p.num_classes, seed)
    if len(self.labels) < p.batch_size:
      raise ValueError(f'{len(self.labels)} images are fewer than one batch '
                       f'({p.batch_size}).')

  def Dataset(self) -> tf.data.Dataset:
    """Batches of NestedMap(images [batch, h, w, 3] float32, labels)."""
    p = self.params
    images, labels = tf.constant(self.images), tf.constant(self.labels)
    num = len(self.labels)
    if p.split == 'train':
      index = tf.data.Dataset.counter().map(
          lambda i: tf.random.stateless_uniform([], [p.seed, i], maxval=num,
                                                dtype=tf.int64))
    else:
      index = tf.data.Dataset.range(num)

    def Example(i):
      return NestedMap(images=tf.cast(images[i], tf.float32) / 127.5 - 1.0,
                       labels=labels[i])

    return index.map(Example).batch(p.batch_size, drop_remainder=True)
