"""Non-finite losses are skipped or stop the run, and never applied."""

import numpy as np
import pytest

from lingvo_pipe import base_experiment
from lingvo_pipe import model_registry
from trainer import experiment_params
from trainer import loop


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
  trainer.Train(4)
  assert int(trainer.global_step.numpy()) == 4
  for b, w in zip(before, trainer.task.trainable_variables):
    np.testing.assert_array_equal(b, w.numpy())
