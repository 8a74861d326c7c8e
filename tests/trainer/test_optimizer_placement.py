"""A cell's optimizer state lives on the cell's device (docs/design.md): the
tf.compat.v1.train optimizers create each slot next to its variable."""

import pytest
import tensorflow as tf

from lingvo_pipe import base_experiment
from lingvo_pipe import model_registry
from trainer import experiment_params
from trainer import loop


@pytest.mark.parametrize('kind', [base_experiment.OptimizerKind.ADAM,
                                  base_experiment.OptimizerKind.RMSPROP,
                                  base_experiment.OptimizerKind.MOMENTUM])
def test_slots_are_on_their_variables_devices(kind, tmp_path):
  params = experiment_params.ExperimentParams(
      model_registry.GetExperiment('lm.StdlibBytesTiny'))
  params.trainer.Set(optimizer=kind, steps_per_loop=1)
  trainer = loop.Trainer(params, str(tmp_path), log=lambda _: None)
  trainer.Train(1)
  cells = trainer.task.stack.pipeline.cells
  assert len(cells) == 2
  for k, cell in enumerate(cells):
    for v in cell.trainable_variables:
      assert tf.DeviceSpec.from_string(v.device).device_index == k, v.name
      slots = [trainer.optimizer.get_slot(v, n) for n in trainer.optimizer.get_slot_names()]
      assert slots and all(s is not None for s in slots), v.name
      for s in slots:
        assert s.device == v.device, (v.name, s.device, v.device)
