"""Which training input a checkpoint's input position belongs to.

A checkpoint holds the training iterator's state, and tf.data restores an
iterator by rebuilding the input pipeline saved in that state, not the one
the current params build: resumed with another batch size, sequence
length, seed or input file, training would read the old input (the saved
pipeline holds its data) or fail at its first batch (the batch size). So a
checkpoint also holds the text of the train input params it was saved
with, and a training run whose params differ is refused before anything
is written.
"""

from typing import List

import tensorflow as tf

from lingvo_pipe.core import hyperparams
from trainer.checkpointing import checkpoint_keys

NAME = 'train_input_params'
KEY = NAME + checkpoint_keys.VALUE_SUFFIX


class TrainInputChangedError(checkpoint_keys.CheckpointMismatchError):
  """The checkpoint's input position belongs to other train input params."""


def ParamsVariable(train: hyperparams.Params) -> tf.Variable:
  """The checkpointed text of the train input params `train`."""
  return tf.Variable(train.ToText(), trainable=False, name=NAME, dtype=tf.string)


def CheckSameInput(path: str, train: hyperparams.Params) -> None:
  """Raises unless the checkpoint at prefix `path` was saved with train
  input params `train` (or predates this check: it holds no text).

  Raises:
    TrainInputChangedError: naming each changed param, both values, and
      the ways out.
  """
  reader = tf.train.load_checkpoint(path)
  if not reader.has_tensor(KEY):
    return
  saved = reader.get_tensor(KEY).decode()
  changes = _Changes(saved, train.ToText())
  if not changes:
    return
  raise TrainInputChangedError(
      f'Checkpoint {checkpoint_keys.DisplayName(path)} was saved with other train input '
      f'params ({"; ".join(changes)}), and the input position it holds restores the '
      'input pipeline saved with it, which would read the old input or fail. The '
      'checkpoint is intact and was not changed. Train on with the params it was '
      'saved with, or start a new --logdir from it with trainer.init_from_checkpoint_rules.')


def _Changes(saved: str, current: str) -> List[str]:
  """'train.key: saved -> current' for each key whose value differs."""
  old, new = _Items(saved), _Items(current)
  return [f'train.{k}: {old.get(k, "(unset)")} -> {new.get(k, "(unset)")}'
          for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]


def _Items(text: str) -> dict:
  return dict(line.split(' : ', 1) for line in text.splitlines() if ' : ' in line)
