"""Every registered experiment: params text round-trip, plan, one training
step and an eval batch, checkpoint round-trip."""

import pytest
import tensorflow as tf

from lingvo_pipe import model_registry
from trainer import experiment_params
from trainer import inspection
from trainer import loop

model_registry.ImportAllExperiments()
KEYS = model_registry.Keys()
# The full-size bfloat16 variants run in make test-slow; make test runs
# lm.StdlibBytesTinyBf16, the same code path on a tiny model.
_SLOW = {'lm.StdlibBytesGPipeBf16', 'mt.ReverseBytesGPipeBf16'}


def test_experiments_are_registered():
  assert 'lm.StdlibBytesGPipe' in KEYS


@pytest.mark.parametrize('key', [
    pytest.param(k, marks=pytest.mark.slow) if k in _SLOW else k for k in KEYS])
def test_experiment_conforms(key, tmp_path):
  params = experiment_params.ExperimentParams(model_registry.GetExperiment(key))
  text = params.ToText()
  fresh = experiment_params.ExperimentParams(model_registry.GetExperiment(key))
  assert fresh.FromText(text) == params
  assert 'K=' in inspection.ModelPlan(params.task)
  experiment_params.ApplyOverrides(params, 'trainer.steps_per_loop=1; trainer.eval_steps=1')
  trainer = loop.Trainer(params, str(tmp_path), log=lambda _: None)
  trainer.Train(1)
  assert int(trainer.global_step.numpy()) == 1
  metrics = trainer.Eval('dev')
  assert set(metrics) >= {'loss'}
  before = [v.numpy() for v in trainer.task.trainable_variables]
  for v in trainer.task.trainable_variables:
    v.assign(tf.zeros_like(v))
  trainer.Restore()
  for b, v in zip(before, trainer.task.trainable_variables):
    tf.debugging.assert_equal(b, v.numpy())
