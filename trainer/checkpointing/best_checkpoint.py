"""The best checkpoint by an eval metric, kept apart from the trainer's
retention (trainer.best_checkpoint_metric), as Keras's ModelCheckpoint
with save_best_only does.

logdir/best is a logdir of its own: best/checkpoints holds a copy of the
checkpoint whose evaluation had the best value so far, with its state
file, and best/best.txt says which step, metric and value. So
`--mode=eval`, `decode` and `export` with `--logdir=<logdir>/best` read
it. The trainer's in-training evaluation and an evaler beside it may both
keep it: a file lock serialises them.
"""

import contextlib
import fcntl
import glob
import os
import shutil
from typing import Callable, Iterator, Mapping, Optional, Tuple

import tensorflow as tf

BEST_DIR = 'best'
RECORD = 'best.txt'


class UnknownMetricError(ValueError):
  """The metric is not one the task's evaluation reports; one line."""


class BestCheckpoint:
  """Keeps logdir/best at the checkpoint with the best `metric`."""

  def __init__(self, logdir: str, metric: str, higher_is_better: bool,
               log: Callable[[str], None] = print) -> None:
    self.directory = os.path.join(logdir, BEST_DIR)
    self.metric = metric
    self.higher_is_better = higher_is_better
    self.log = log

  def Consider(self, checkpoint_path: str, step: int, metrics: Mapping[str, float]) -> bool:
    """Makes the checkpoint at prefix `checkpoint_path` (evaluated at
    `step` to `metrics`) the best if its metric beats the kept one; returns
    whether it did.

    Raises:
      UnknownMetricError: if `metrics` lacks the metric, naming those it has.
    """
    if self.metric not in metrics:
      raise UnknownMetricError(
          f'trainer.best_checkpoint_metric={self.metric!r} is not a metric of this '
          f'task\'s evaluation; it reports {", ".join(sorted(metrics))}.')
    value = float(metrics[self.metric])
    with self._Locked():
      kept = self.Kept()
      if kept is not None and not self._Beats(value, kept[1]):
        return False
      self._Copy(checkpoint_path)
      with open(os.path.join(self.directory, RECORD + '.tmp'), 'w') as f:
        f.write(f'step {step}\n{self.metric} {value!r}\n')
      os.replace(os.path.join(self.directory, RECORD + '.tmp'),
                 os.path.join(self.directory, RECORD))
    self.log(f'Best {self.metric} so far ({value:.4f} at step {step}): kept in '
             f'{self.directory}.')
    return True

  def Kept(self) -> Optional[Tuple[int, float]]:
    """(step, value) of the kept checkpoint, or None."""
    try:
      with open(os.path.join(self.directory, RECORD)) as f:
        step_line, value_line = f.read().splitlines()[:2]
    except (OSError, ValueError):
      return None
    return int(step_line.split()[1]), float(value_line.split()[1])

  def _Beats(self, value: float, kept: float) -> bool:
    return value > kept if self.higher_is_better else value < kept

  def _Copy(self, checkpoint_path: str) -> None:
    """Copies the checkpoint's files into best/checkpoints, records it in
    the state file there, then removes the previous best's files."""
    target = os.path.join(self.directory, 'checkpoints')
    os.makedirs(target, exist_ok=True)
    previous = tf.train.get_checkpoint_state(target)
    name = os.path.basename(checkpoint_path)
    for source in glob.glob(glob.escape(checkpoint_path) + '.*'):
      shutil.copyfile(source, os.path.join(target, os.path.basename(source)))
    tf.compat.v1.train.update_checkpoint_state(target, name)  # relative: the logdir may move
    if previous is not None and os.path.basename(previous.model_checkpoint_path) != name:
      for old in glob.glob(glob.escape(previous.model_checkpoint_path) + '.*'):
        os.remove(old)

  @contextlib.contextmanager
  def _Locked(self) -> Iterator[None]:
    os.makedirs(self.directory, exist_ok=True)
    with open(os.path.join(self.directory, '.lock'), 'w') as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      try:
        yield
      finally:
        fcntl.flock(lock, fcntl.LOCK_UN)


def FromParams(logdir: str, trainer_params, log: Callable[[str], None] = print
               ) -> Optional[BestCheckpoint]:
  """The BestCheckpoint trainer.best_checkpoint_metric asks for, or None."""
  if not trainer_params.best_checkpoint_metric:
    return None
  return BestCheckpoint(logdir, trainer_params.best_checkpoint_metric,
                        trainer_params.best_checkpoint_higher_is_better, log)
