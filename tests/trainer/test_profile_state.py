"""--mode=profile works on a copy of the state (issue 28, point 6): the
global step, the checkpoints and the training curves in the logdir stay as
they were; only the timeline and its summaries are added. The trainer runs
in the test process: what is checked is the logdir, not the process."""

import os
import pathlib

from tests.trainer import summaries
from tests.trainer import your_experiment

KEY = your_experiment.KEY


def _Listing(directory: pathlib.Path):
  return {p.name: p.stat().st_mtime_ns for p in directory.iterdir()}


def _SummarySteps(directory: pathlib.Path, tag: str):
  """The steps at which tag was written under directory."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return [event.step for path in sorted(directory.glob('events.*'))
          for event in tf.compat.v1.train.summary_iterator(str(path))
          for value in event.summary.value if value.tag == tag]


def test_profile_leaves_step_and_checkpoints_alone(tmp_path):
  your_experiment.WriteModule(tmp_path)
  logdir = tmp_path / 'run'
  common = [f'--model={KEY}', '--logdir=run', '--model_params_override='
            'trainer.max_steps=50; trainer.max_checkpoints_to_keep=1']
  your_experiment.RunTrainerInProcess(tmp_path, *common, '--mode=train')
  checkpoints = _Listing(logdir / 'checkpoints')
  params = (logdir / 'params.txt').read_text()
  curves = summaries.Scalars(str(logdir), 'train')

  profiled = your_experiment.RunTrainerInProcess(tmp_path, *common, '--mode=profile')
  assert 'bubble: measured' in profiled.stdout
  assert ('The profiled steps were not saved; the checkpoints and the step in the logdir '
          'are as they were.') in profiled.stdout
  assert os.path.exists(logdir / 'timeline.png')
  assert _Listing(logdir / 'checkpoints') == checkpoints
  assert (logdir / 'params.txt').read_text() == params
  assert summaries.Scalars(str(logdir), 'train') == curves
  assert _SummarySteps(logdir / 'profile', 'pipeline/bubble_measured') == [50]

  again = your_experiment.RunTrainerInProcess(tmp_path, *common, '--mode=train')
  assert 'Nothing to train: the checkpoint is at step 50' in again.stdout
