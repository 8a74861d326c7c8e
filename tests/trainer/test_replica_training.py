"""The trainer with pipeline replicas: R replicas train as one pipeline on
the same global batch (clipping and the non-finite check see the reduced
gradient), the checkpoint holds one copy of the model, and a run resumes
under another R with every replica's copy and slots restored."""

import shutil

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe import model_registry
from trainer.checkpointing import checkpoint_keys
from trainer import experiment_params
from trainer import loop

from tests.trainer import summaries

STEPS = 4
# A clip norm below the gradients' norm: every step is clipped.
CLIP = 0.05
_PIPE = 'task.stack.pipeline.'


def _Trainer(logdir, replicas: int, micro: int) -> loop.Trainer:
  params = experiment_params.ExperimentParams(
      model_registry.GetExperiment('lm.StdlibBytesTiny'))
  experiment_params.ApplyOverrides(
      params, f'task.stack.residual_keep_prob=0.8; trainer.steps_per_loop=2; '
      f'trainer.clip_gradient_norm_to_value={CLIP}; {_PIPE}num_partitions=2; '
      f'{_PIPE}num_replicas={replicas}; {_PIPE}num_micro_batches={micro}')
  return loop.Trainer(params, str(logdir), log=lambda _: None)


def _Scalars(logdir, tag):
  return np.array([v for _, v in summaries.Scalars(logdir, 'train')[tag]])


@pytest.fixture(scope='module')
def one_pipeline(tmp_path_factory):
  """R=1, M=4: (the logdir of 2 * STEPS steps in one run, a copy of it at
  STEPS: its checkpoint and curves then, which tests resume from)."""
  logdir = tmp_path_factory.mktemp('r1')
  at_steps = tmp_path_factory.mktemp('r1_at_steps')
  trainer = _Trainer(logdir, 1, 4)
  trainer.Train(STEPS)
  shutil.copytree(logdir, at_steps, dirs_exist_ok=True)
  trainer.Train(2 * STEPS)
  return logdir, at_steps


def test_two_replicas_train_as_one_pipeline_with_clipping(one_pipeline, tmp_path):
  r1_logdir, _ = one_pipeline
  trainer = _Trainer(tmp_path, 2, 2)
  trainer.Train(STEPS)
  expected = _Scalars(r1_logdir, 'loss')[:STEPS // 2]
  np.testing.assert_allclose(_Scalars(tmp_path, 'loss'), expected, rtol=1e-5)
  norms = _Scalars(tmp_path, 'grad_norm')
  assert (norms > CLIP).all(), norms  # clipped: one norm, of the reduced gradient
  np.testing.assert_allclose(norms, _Scalars(r1_logdir, 'grad_norm')[:STEPS // 2],
                             rtol=1e-5)
  assert trainer.replica_copies
  for original, (copy,) in trainer.replica_copies:
    np.testing.assert_array_equal(copy.numpy(), original.numpy(), err_msg=original.name)
  # One copy of the model in the checkpoint: the keys of R=1's.
  def Saved(path):  # the model's variables and the optimizer's slots
    return {k: v for k, v in checkpoint_keys.CheckpointSpecs(path).items()
            if not k.startswith('train_iterator')}

  assert Saved(trainer.manager.latest_checkpoint) == Saved(
      tf.train.latest_checkpoint(str(r1_logdir / 'checkpoints')))


# make test resumes at R=4 (its copies' slots from R=1's); R=2 is slow.
@pytest.mark.parametrize('replicas,micro', [pytest.param(2, 2, marks=pytest.mark.slow), (4, 1)])
def test_resumes_under_another_number_of_replicas(one_pipeline, tmp_path, replicas, micro):
  """From R=1's checkpoint at STEPS, R replicas continue as R=1 went on
  (unrestarted; a resumed run equals it, test_kill_and_resume): every copy
  and its Adam slots start from the restored ones. The first STEPS are a
  copy of R=1's logdir then, not trained again."""
  r1_logdir, at_steps = one_pipeline
  shutil.copytree(at_steps, tmp_path, dirs_exist_ok=True)
  resumed = _Trainer(tmp_path, replicas, micro)
  assert resumed.Restore()
  resumed.Train(2 * STEPS)
  np.testing.assert_allclose(_Scalars(tmp_path, 'loss'), _Scalars(r1_logdir, 'loss'),
                             rtol=1e-5)
  for original, copies in resumed.replica_copies:
    for copy in copies:
      np.testing.assert_array_equal(copy.numpy(), original.numpy(), err_msg=original.name)
