"""Every registered experiment: params text round-trip, plan, one training
step and an eval batch, checkpoint round-trip; and its params leave
TensorFlow's devices to the trainer."""

import pytest
import tensorflow as tf

from lingvo_pipe import model_registry
from tests import fresh_process
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


def test_making_the_params_leaves_the_devices_to_the_trainer():
  """The trainer makes an experiment's params, then the logical devices
  its pipelines need: making the params of every experiment (a Keras
  model's too) must not start TensorFlow's runtime, which would fix the
  devices at one. In a fresh process: the test process has its devices."""
  code = ('import tensorflow as tf\n'
          'from lingvo_pipe import model_registry\n'
          'from trainer import experiment_params\n'
          'model_registry.ImportAllExperiments()\n'
          'for key in model_registry.Keys():\n'
          '  experiment_params.ExperimentParams(model_registry.GetExperiment(key))\n'
          'tf.config.set_logical_device_configuration(\n'
          '    tf.config.list_physical_devices("CPU")[0],\n'
          '    [tf.config.LogicalDeviceConfiguration()] * 4)\n'
          'print(len(model_registry.Keys()), len(tf.config.list_logical_devices("CPU")))\n')
  result = fresh_process.RunPython('-c', code)
  assert result.stdout.split() == [str(len(KEYS)), '4'], result.stdout
