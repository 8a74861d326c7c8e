"""The learning-rate schedules' end, and the warning of a run past it."""

import pytest
import tensorflow as tf

from lingvo_pipe import base_experiment
from lingvo_pipe.base_experiment import LrSchedule
from trainer import optimizers


def _Trainer(schedule):
  return base_experiment.TrainerParams().Set(lr_schedule=schedule, max_steps=8,
                                             warmup_steps=2, learning_rate=0.1)


def test_cosine_reaches_zero_at_max_steps_and_a_longer_run_is_warned():
  tp = _Trainer(LrSchedule.COSINE)
  step = tf.Variable(8, dtype=tf.int64)
  assert float(optimizers.LearningRate(tp, step)()) == pytest.approx(0.0, abs=1e-9)
  assert optimizers.StepsPastScheduleWarning(tp, 8) == ''
  warning = optimizers.StepsPastScheduleWarning(tp, 40)
  assert warning.startswith('warning: --max_steps=40 is past trainer.max_steps=8, where '
                            'the COSINE learning rate reaches 0')
  assert warning.endswith('(--model_params_override=trainer.max_steps=40).')


@pytest.mark.parametrize('schedule', [LrSchedule.CONSTANT, LrSchedule.WARMUP_RSQRT])
def test_schedules_that_do_not_end_are_not_warned(schedule):
  tp = _Trainer(schedule)
  assert float(optimizers.LearningRate(tp, tf.Variable(40, dtype=tf.int64))()) > 0
  assert optimizers.StepsPastScheduleWarning(tp, 40) == ''
