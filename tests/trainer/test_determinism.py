"""Determinism: the same seed gives bitwise-equal loss curves (also with
the steps grouped into loops differently), and the pipelined and
unpipelined versions of one experiment give the same loss curve to rtol
1e-5 over 20 Adam steps."""


import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe import base_experiment
from lingvo_pipe import model_registry
from trainer import experiment_params
from trainer import loop

from tests.trainer import summaries

STEPS = 20


def _LossCurve(logdir, overrides, copy_weights_from=None):
  """Trains lm.StdlibBytesTiny (Adam, dropout off) STEPS steps; returns
  (the loss at every step, the trainer)."""
  params = experiment_params.ExperimentParams(model_registry.GetExperiment('lm.StdlibBytesTiny'))
  experiment_params.ApplyOverrides(params, 'task.stack.residual_keep_prob=1.0; '
                                   'trainer.save_interval_steps=1000; ' + overrides)
  assert params.trainer.optimizer == base_experiment.OptimizerKind.ADAM
  trainer = loop.Trainer(params, str(logdir), log=lambda _: None)
  if copy_weights_from is not None:
    source = copy_weights_from.task.trainable_variables
    target = trainer.task.trainable_variables
    assert [v.shape for v in source] == [v.shape for v in target]
    for s, t in zip(source, target):
      t.assign(s)
  initial = [v.numpy() for v in trainer.task.trainable_variables]
  trainer.Train(STEPS)
  losses = dict(summaries.Scalars(logdir, 'train')['loss'])
  trainer.initial = initial
  return np.array([losses[s] for s in sorted(losses)]), trainer


@pytest.mark.slow  # make test: test_kill_and_resume_short checks that a run
# equals an independent run with the same seed bitwise, in its final state.
def test_same_seed_gives_bitwise_equal_loss_curves(tmp_path):
  a, _ = _LossCurve(tmp_path / 'a', 'trainer.steps_per_loop=1')
  b, _ = _LossCurve(tmp_path / 'b', 'trainer.steps_per_loop=1')
  assert len(a) == STEPS
  assert a.tobytes() == b.tobytes()
  other_seed, _ = _LossCurve(tmp_path / 'c', 'trainer.steps_per_loop=1; train.seed=7')
  assert other_seed.tobytes() != a.tobytes()  # the test can fail


def test_pipelined_equals_unpipelined_for_20_adam_steps(tmp_path):
  pipelined, p_trainer = _LossCurve(tmp_path / 'pipelined', 'trainer.steps_per_loop=1')
  assert p_trainer.params.task.stack.pipeline.num_partitions == 2
  assert p_trainer.params.task.stack.pipeline.num_micro_batches == 2
  # One cell, the whole batch at once: no pipeline. Same initial weights.
  flat, _ = _LossCurve(tmp_path / 'flat', 'trainer.steps_per_loop=1; '
                       'task.stack.pipeline.num_partitions=1; '
                       'task.stack.pipeline.num_micro_batches=1',
                       copy_weights_from=_Initial(p_trainer))
  assert len(pipelined) == len(flat) == STEPS
  np.testing.assert_allclose(flat, pipelined, rtol=1e-5)
  print(f'largest relative difference over {STEPS} steps: '
        f'{float(np.max(np.abs(flat - pipelined) / np.abs(pipelined))):.2e}')


class _Initial:
  """The initial weights of a trainer, as `task.trainable_variables`."""

  def __init__(self, trainer):
    self.task = self
    self.trainable_variables = [tf.constant(v) for v in trainer.initial]
