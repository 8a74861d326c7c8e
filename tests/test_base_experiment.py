"""Tests of BaseExperiment's defaults and the trainer settings."""

import pytest

from lingvo_pipe import base_experiment
from lingvo_pipe.core import hyperparams


def test_trainer_params_defaults():
  assert dict(base_experiment.TrainerParams().IterParams()) == {
      'max_steps': 1000,
      'steps_per_loop': 100,
      'save_interval_steps': 0,
      'max_checkpoints_to_keep': 5,
      'keep_checkpoint_every_n_hours': 0.0,
      'eval_steps': 10,
      'decode_steps': 10,
      'decode_interval_steps': 0,
      'eval_interval_steps': 0,
      'best_checkpoint_metric': '',
      'best_checkpoint_higher_is_better': False,
      'learning_rate': 1e-3,
      'optimizer': base_experiment.OptimizerKind.ADAM,
      'momentum': 0.9,
      'lr_schedule': base_experiment.LrSchedule.CONSTANT,
      'warmup_steps': 0,
      'clip_gradient_norm_to_value': 0.0,
      'on_nonfinite': base_experiment.NonFinitePolicy.STOP,
      'seed': 1234,
      'num_logical_devices': 0,
      'loss_scaling': base_experiment.LossScaling.NONE,
      'loss_scale_initial': 2.0**15,
      'loss_scale_factor': 2.0,
      'loss_scale_growth_interval': 2000,
      'reset_optimizer_state': False,
      'init_from_checkpoint_rules': {},
  }


def test_trainer_params_round_trip_through_text():
  default = base_experiment.TrainerParams()
  assert base_experiment.TrainerParams().FromText(default.ToText()) == default
  changed = base_experiment.TrainerParams().Set(
      max_steps=7, steps_per_loop=3, save_interval_steps=6,
      max_checkpoints_to_keep=2, keep_checkpoint_every_n_hours=0.5,
      eval_steps=4, decode_steps=2, decode_interval_steps=50, eval_interval_steps=20,
      best_checkpoint_metric='loss', best_checkpoint_higher_is_better=True, learning_rate=0.25,
      optimizer=base_experiment.OptimizerKind.RMSPROP, momentum=0.5,
      lr_schedule=base_experiment.LrSchedule.WARMUP_RSQRT, warmup_steps=9,
      clip_gradient_norm_to_value=1.5,
      on_nonfinite=base_experiment.NonFinitePolicy.SKIP_STEP, seed=11,
      num_logical_devices=4, loss_scaling=base_experiment.LossScaling.DYNAMIC,
      loss_scale_initial=8.0, loss_scale_factor=4.0,
      loss_scale_growth_interval=10, reset_optimizer_state=True,
      init_from_checkpoint_rules={'/tmp/runs/a/checkpoints': (
          [('stack/(.*)', 'stack/%s')], [])})
  # Every value differs from its default, so each must come from the text.
  assert all(value != default.Get(key) for key, value in changed.IterParams())
  restored = base_experiment.TrainerParams().FromText(changed.ToText())
  assert restored == changed


def _Input(split):
  p = hyperparams.Params()
  p.Define('split', split, 'Which data.')
  return p


def test_dev_defaults_to_train_and_test_to_dev():

  class TrainOnly(base_experiment.BaseExperiment):

    def Train(self):
      return _Input('train')

  class WithDev(TrainOnly):

    def Dev(self):
      return _Input('dev')

  assert TrainOnly().Dev().split == 'train'
  assert TrainOnly().Test().split == 'train'
  assert WithDev().Test().split == 'dev'
  experiment = TrainOnly()
  assert experiment.Dev() is not experiment.Dev()  # fresh params each call
  assert experiment.Trainer() == base_experiment.TrainerParams()
  assert experiment.Trainer() is not experiment.Trainer()


def test_task_and_train_must_be_defined():

  class Empty(base_experiment.BaseExperiment):
    pass

  with pytest.raises(NotImplementedError, match=r'Empty must define Task\(\)'):
    Empty().Task()
  with pytest.raises(NotImplementedError, match=r'Empty must define Train\(\)'):
    Empty().Dev()
