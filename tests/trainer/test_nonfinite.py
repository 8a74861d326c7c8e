"""Non-finite losses are skipped or stop the run, and never applied.

Building a trainer's step is most of a test's time, so the tests of one
policy share trainers where their runs allow: one STOP trainer runs the
poisoned weight, then (the weight mended) the NaN batch; one SKIP_STEP
run of a poisoned weight serves the two tests that check it."""

import glob
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe import base_experiment
from lingvo_pipe import model_registry
from trainer import experiment_params
from trainer import loop

from tests.trainer import summaries


def _Trainer(logdir, policy):
  """(a trainer, bad_step): its loss is NaN at global step bad_step (a
  variable, so that one trace serves any step; -1, the start: never)."""
  params = experiment_params.ExperimentParams(
      model_registry.GetExperiment('lm.StdlibBytesTiny'))
  params.trainer.Set(on_nonfinite=policy, steps_per_loop=2, max_steps=4)
  trainer = loop.Trainer(params, str(logdir), log=lambda _: None)
  bad_step = tf.Variable(-1, dtype=tf.int64, trainable=False)
  _NanLossAtStep(trainer, bad_step)
  return trainer, bad_step


def _PoisonOneWeight(trainer):
  """Makes one softmax weight NaN: every step's loss is then NaN. Returns
  the weights after, and a function that mends the weight."""
  v = [w for w in trainer.task.trainable_variables if 'softmax' in w.name][0]
  healthy = v.numpy()
  poisoned = healthy.copy()
  poisoned.flat[0] = np.nan
  v.assign(poisoned)
  return [w.numpy() for w in trainer.task.trainable_variables], lambda: v.assign(healthy)


def _NanLossAtStep(trainer, bad_step):
  """Test-only injection: the task's loss is NaN at one global step."""
  fprop = trainer.task.FProp

  def Poisoned(theta, batch):
    metrics = fprop(theta, batch)
    nan = tf.where(tf.equal(trainer.global_step, bad_step), np.nan, 0.0)
    metrics.loss = metrics.loss + nan
    return metrics

  trainer.task.FProp = Poisoned


def _Raised(train):
  """The NonFiniteLossError that train() raises."""
  with pytest.raises(loop.NonFiniteLossError) as raised:
    train()
  return raised.value


def _CheckpointValues(logdir):
  """{checkpoint: {key: value}} of every float tensor of every checkpoint."""
  out = {}
  for index in glob.glob(os.path.join(logdir, 'checkpoints', '*.index')):
    reader = tf.train.load_checkpoint(index[:-len('.index')])
    out[index] = {k: reader.get_tensor(k) for k, d in reader.get_variable_to_dtype_map().items()
                  if d.is_floating}
  return out


@pytest.fixture(name='stopped', scope='module')
def _Stopped(tmp_path_factory):
  """One STOP trainer, two runs: a poisoned weight from step 0 (nothing
  saved), then, the weight mended, a NaN batch at step 3."""
  logdir = tmp_path_factory.mktemp('stopped')
  trainer, bad_step = _Trainer(logdir, base_experiment.NonFinitePolicy.STOP)
  before, mend = _PoisonOneWeight(trainer)
  poisoned = dict(error=_Raised(lambda: trainer.Train(4)), before=before,
                  step=int(trainer.global_step.numpy()),
                  after=[w.numpy() for w in trainer.task.trainable_variables])
  mend()
  bad_step.assign(3)
  nan_batch = dict(error=_Raised(lambda: trainer.Train(6)),
                   checkpoints=sorted(_CheckpointValues(str(logdir))))
  return poisoned, nan_batch


@pytest.fixture(name='skipped_poisoned', scope='module')
def _SkippedPoisoned(tmp_path_factory):
  """A SKIP_STEP run of 4 steps with a NaN weight."""
  logdir = tmp_path_factory.mktemp('skipped_poisoned')
  trainer, _ = _Trainer(logdir, base_experiment.NonFinitePolicy.SKIP_STEP)
  before, _ = _PoisonOneWeight(trainer)
  return dict(error=_Raised(lambda: trainer.Train(4)), before=before,
              step=int(trainer.global_step.numpy()),
              after=[w.numpy() for w in trainer.task.trainable_variables],
              checkpoints=_CheckpointValues(str(logdir)))


def test_stop_raises_and_applies_nothing(stopped):
  poisoned, _ = stopped
  assert re.search('Non-finite loss or gradients at step 0', str(poisoned['error']))
  assert poisoned['step'] == 0
  for b, w in zip(poisoned['before'], poisoned['after']):
    np.testing.assert_array_equal(b, w)


def test_skip_step_goes_on_without_applying(skipped_poisoned):
  # The steps are skipped; the save after them refuses the NaN weight (see
  # test_non_finite_weights_are_never_checkpointed).
  assert re.search('not saved', str(skipped_poisoned['error']))
  assert skipped_poisoned['step'] == 2
  for b, w in zip(skipped_poisoned['before'], skipped_poisoned['after']):
    np.testing.assert_array_equal(b, w)


def test_one_nan_batch_is_skipped_counted_and_reported(tmp_path):
  trainer, bad_step = _Trainer(tmp_path, base_experiment.NonFinitePolicy.SKIP_STEP)
  bad_step.assign(3)
  trainer.Train(6)
  assert int(trainer.global_step.numpy()) == 6
  skipped = sorted(summaries.Scalars(str(tmp_path), 'train')['nonfinite_steps_skipped'])
  assert skipped == [(2, 0.0), (4, 1.0), (6, 0.0)]
  values = _CheckpointValues(str(tmp_path))
  assert len(values) == 3
  for tensors in values.values():
    assert all(np.isfinite(v).all() for v in tensors.values())


def test_stop_names_the_step_of_the_nan_batch(stopped):
  _, nan_batch = stopped
  assert re.search('Non-finite loss or gradients at step 3', str(nan_batch['error']))
  assert [os.path.basename(p) for p in nan_batch['checkpoints']] == ['ckpt-2.index']


def test_non_finite_weights_are_never_checkpointed(skipped_poisoned):
  # Every step is skipped, but the NaN weight itself must not be saved.
  assert re.search(r'Non-finite values in .*softmax.* at step 2; not saved',
                   str(skipped_poisoned['error']))
  assert skipped_poisoned['checkpoints'] == {}
