"""Reads the trainer's TensorBoard event files back, for tests."""

import glob
import os
from typing import Dict, List, Tuple

import tensorflow as tf


def Scalars(logdir: str, split: str) -> Dict[str, List[Tuple[int, float]]]:
  """{tag: [(step, value)]} from the event files of logdir/split, in order."""
  out: Dict[str, List[Tuple[int, float]]] = {}
  for path in sorted(glob.glob(os.path.join(str(logdir), split, 'events.*'))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for v in event.summary.value:
        out.setdefault(v.tag, []).append((event.step, float(tf.make_ndarray(v.tensor))))
  return out
