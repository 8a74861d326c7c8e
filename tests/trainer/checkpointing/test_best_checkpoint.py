"""logdir/best keeps the checkpoint with the best eval metric: a copy with
its own state file, replaced only by a better one, across processes and
restarts; a metric the evaluation does not report is one line."""

import os

import pytest
import tensorflow as tf

from trainer.checkpointing import best_checkpoint


def _Checkpoints(logdir, steps):
  """Checkpoints ckpt-<step> of one variable holding the step."""
  v = tf.Variable(0.0)
  manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), str(logdir / 'checkpoints'),
                                       max_to_keep=None)
  paths = {}
  for step in steps:
    v.assign(float(step))
    paths[step] = manager.save(checkpoint_number=step)
  return paths


def _KeptValue(logdir):
  path = tf.train.latest_checkpoint(str(logdir / 'best' / 'checkpoints'))
  return path, float(tf.train.load_checkpoint(path).get_tensor('v/.ATTRIBUTES/VARIABLE_VALUE'))


@pytest.mark.parametrize('higher_is_better,losses,kept', [
    (False, {1: 3.0, 2: 2.0, 3: 2.5}, 2),
    (True, {1: 3.0, 2: 2.0, 3: 2.5}, 1),
])
def test_the_best_is_kept_and_only_a_better_one_replaces_it(tmp_path, higher_is_better, losses,
                                                            kept):
  paths = _Checkpoints(tmp_path, losses)
  lines = []
  for step, loss in losses.items():
    # A new object each time: the kept value is read back from best.txt.
    best = best_checkpoint.BestCheckpoint(str(tmp_path), 'loss', higher_is_better, lines.append)
    best.Consider(paths[step], step, {'loss': loss, 'num_tokens': 8.0})
  assert best.Kept() == (kept, losses[kept])
  path, value = _KeptValue(tmp_path)
  assert path == str(tmp_path / 'best' / 'checkpoints' / f'ckpt-{kept}') and value == kept
  files = sorted(os.listdir(tmp_path / 'best' / 'checkpoints'))
  assert files == ['checkpoint', f'ckpt-{kept}.data-00000-of-00001', f'ckpt-{kept}.index']
  state = (tmp_path / 'best' / 'checkpoints' / 'checkpoint').read_text()
  assert f'model_checkpoint_path: "ckpt-{kept}"' in state  # relative: the logdir may move
  assert lines[-1].startswith(f'Best loss so far ({losses[kept]:.4f} at step {kept})')


def test_a_metric_the_evaluation_lacks_is_one_line(tmp_path):
  paths = _Checkpoints(tmp_path, [1])
  best = best_checkpoint.BestCheckpoint(str(tmp_path), 'accuracy', True)
  with pytest.raises(best_checkpoint.UnknownMetricError,
                     match=r"^trainer.best_checkpoint_metric='accuracy' is not a metric of this "
                           r"task's evaluation; it reports log_pplx, loss\.$"):
    best.Consider(paths[1], 1, {'loss': 1.0, 'log_pplx': 2.0})
  assert not (tmp_path / 'best' / 'checkpoints').exists()
