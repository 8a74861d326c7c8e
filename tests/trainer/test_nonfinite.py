"""Non-finite losses are skipped or stop the run, and never applied."""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe import base_experiment
from lingvo_pipe import model_registry
from trainer import experiment_params
from trainer import loop

from tests.trainer import summaries


def _Trainer(tmp_path, policy):
  params = experiment_params.ExperimentParams(
      model_registry.GetExperiment('lm.StdlibBytesTiny'))
  params.trainer.Set(on_nonfinite=policy, steps_per_loop=2, max_steps=4)
  return loop.Trainer(params, str(tmp_path), log=lambda _: None)


def _PoisonOneWeight(trainer):
  """Makes one softmax weight NaN: every step's loss is then NaN."""
  v = [w for w in trainer.task.trainable_variables if 'softmax' in w.name][0]
  poisoned = v.numpy()
  poisoned.flat[0] = np.nan
  v.assign(poisoned)
  return [w.numpy() for w in trainer.task.trainable_variables]


def test_stop_raises_and_applies_nothing(tmp_path):
  trainer = _Trainer(tmp_path, base_experiment.NonFinitePolicy.STOP)
  before = _PoisonOneWeight(trainer)
  with pytest.raises(loop.NonFiniteLossError, match='Non-finite loss or gradients at step 0'):
    trainer.Train(4)
  assert int(trainer.global_step.numpy()) == 0
  for b, w in zip(before, trainer.task.trainable_variables):
    np.testing.assert_array_equal(b, w.numpy())


def test_skip_step_goes_on_without_applying(tmp_path):
  trainer = _Trainer(tmp_path, base_experiment.NonFinitePolicy.SKIP_STEP)
  before = _PoisonOneWeight(trainer)
  # The steps are skipped; the save after them refuses the NaN weight (see
  # test_non_finite_weights_are_never_checkpointed).
  with pytest.raises(loop.NonFiniteLossError, match='not saved'):
    trainer.Train(4)
  assert int(trainer.global_step.numpy()) == 2
  for b, w in zip(before, trainer.task.trainable_variables):
    np.testing.assert_array_equal(b, w.numpy())


def _NanLossAtStep(trainer, bad_step):
  """Test-only injection: the task's loss is NaN at one global step."""
  fprop = trainer.task.FProp

  def Poisoned(theta, batch):
    metrics = fprop(theta, batch)
    nan = tf.where(tf.equal(trainer.global_step, bad_step), np.nan, 0.0)
    metrics.loss = metrics.loss + nan
    return metrics

  trainer.task.FProp = Poisoned


def _CheckpointValues(logdir):
  """{checkpoint: {key: value}} of every float tensor of every checkpoint."""
  out = {}
  for index in glob.glob(os.path.join(logdir, 'checkpoints', '*.index')):
    reader = tf.train.load_checkpoint(index[:-len('.index')])
    out[index] = {k: reader.get_tensor(k) for k, d in reader.get_variable_to_dtype_map().items()
                  if d.is_floating}
  return out


def test_one_nan_batch_is_skipped_counted_and_reported(tmp_path):
  trainer = _Trainer(tmp_path, base_experiment.NonFinitePolicy.SKIP_STEP)
  _NanLossAtStep(trainer, 3)
  trainer.Train(6)
  assert int(trainer.global_step.numpy()) == 6
  skipped = sorted(summaries.Scalars(str(tmp_path), 'train')['nonfinite_steps_skipped'])
  assert skipped == [(2, 0.0), (4, 1.0), (6, 0.0)]
  values = _CheckpointValues(str(tmp_path))
  assert len(values) == 3
  for tensors in values.values():
    assert all(np.isfinite(v).all() for v in tensors.values())


def test_stop_names_the_step_of_the_nan_batch(tmp_path):
  trainer = _Trainer(tmp_path, base_experiment.NonFinitePolicy.STOP)
  _NanLossAtStep(trainer, 3)
  with pytest.raises(loop.NonFiniteLossError, match='Non-finite loss or gradients at step 3'):
    trainer.Train(6)
  assert [os.path.basename(p) for p in sorted(_CheckpointValues(str(tmp_path)))] == [
      'ckpt-2.index']


def test_non_finite_weights_are_never_checkpointed(tmp_path):
  # Every step is skipped, but the NaN weight itself must not be saved.
  trainer = _Trainer(tmp_path, base_experiment.NonFinitePolicy.SKIP_STEP)
  _PoisonOneWeight(trainer)
  with pytest.raises(loop.NonFiniteLossError,
                     match=r'Non-finite values in .*softmax.* at step 2; not saved'):
    trainer.Train(4)
  assert _CheckpointValues(str(tmp_path)) == {}
