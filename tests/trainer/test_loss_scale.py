"""Dynamic loss scaling: an overflow skips the step and lowers the scale,
good steps raise it again, and a resumed run keeps it."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe import base_experiment
from lingvo_pipe import model_registry
from trainer import experiment_params
from trainer import loop
from trainer import loss_scale

FACTOR = 2.0**10
GROWTH = 2
OVERFLOW = 2.0**40  # the scaled float16 gradients of the tiny LM overflow


def test_update_lowers_on_overflow_and_grows_after_interval():
  s = loss_scale.DynamicLossScale(initial_scale=8.0, factor=2.0, growth_interval=3)
  history = []
  for finite in (False, True, True, True, True, False, False, False, False):
    s.Update(tf.constant(finite))
    history.append(float(s.scale.numpy()))
  # 8 -> 4 (overflow); three good steps -> 8; one good, then overflows to
  # the floor of 1.
  assert history == [4.0, 4.0, 4.0, 8.0, 8.0, 4.0, 2.0, 1.0, 1.0]
  assert int(s.good_steps.numpy()) == 0


def test_bad_settings_are_rejected():
  with pytest.raises(ValueError, match='loss_scale_factor > 1'):
    loss_scale.DynamicLossScale(factor=1.0)


def _Float16Trainer(logdir):
  params = experiment_params.ExperimentParams(
      model_registry.GetExperiment('lm.StdlibBytesTiny'))
  params.task.fprop_dtype = tf.float16
  params.trainer.Set(loss_scaling=base_experiment.LossScaling.DYNAMIC,
                     loss_scale_initial=OVERFLOW, loss_scale_factor=FACTOR,
                     loss_scale_growth_interval=GROWTH, steps_per_loop=1,
                     on_nonfinite=base_experiment.NonFinitePolicy.STOP,
                     max_steps=100)
  return loop.Trainer(params, logdir, log=lambda _: None)


def _Weights(trainer):
  return [v.numpy() for v in trainer.task.trainable_variables]


def test_overflow_skips_then_scale_recovers_and_resumes(tmp_path):
  trainer = _Float16Trainer(str(tmp_path))
  scales, applied = [], []
  for step in range(1, 7):
    before = _Weights(trainer)
    trainer.Train(step)  # one step; STOP would raise on a non-finite loss
    after = _Weights(trainer)
    scales.append(float(trainer.loss_scale.scale.numpy()))
    applied.append(any(not np.array_equal(b, a) for b, a in zip(before, after)))
  assert int(trainer.global_step.numpy()) == 6
  # The injected overflow: nothing applied, the scale lowered.
  assert not applied[0] and scales[0] == OVERFLOW / FACTOR
  # The scale comes down until the steps apply, then grows after GROWTH good
  # steps in a row.
  first = applied.index(True)
  assert all(not a for a in applied[:first])
  assert scales[first - 1] == OVERFLOW / FACTOR**first
  good = first
  while good < len(applied) and applied[good]:
    good += 1
  assert good - first >= GROWTH, applied
  assert scales[first + GROWTH - 1] == scales[first - 1] * FACTOR
  # Resume: a new trainer restores the scale and its count.
  saved = (trainer.loss_scale.scale.numpy(), trainer.loss_scale.good_steps.numpy())
  resumed = _Float16Trainer(str(tmp_path))
  assert float(resumed.loss_scale.scale.numpy()) == OVERFLOW
  resumed.Restore()
  assert (resumed.loss_scale.scale.numpy(), resumed.loss_scale.good_steps.numpy()) == saved
