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


def test_clipping_runs_next_to_each_gradient():
  """The global norm's parts (L2Loss) and the clipped gradients are computed
  on each gradient's device (no gradient travels for the norm); the values
  are tf.clip_by_global_norm's, the norm of the first `counted` alone."""
  from trainer import optimizers  # pylint: disable=g-import-not-at-top
  values = [tf.constant([3.0, 4.0]), tf.constant([[12.0]])]

  @tf.function(autograph=False)
  def Clip(counted):
    grads = []
    for device, value in zip(('CPU:1', 'CPU:2'), values):
      with tf.device(device):
        grads.append(tf.identity(value))
    return optimizers.ClipByGlobalNorm(grads, 2.0, counted)

  clipped, norm = Clip(-1)
  expected, expected_norm = tf.clip_by_global_norm(values, 2.0)
  assert float(norm) == pytest.approx(float(expected_norm)) == pytest.approx(13.0)
  for got, want in zip(clipped, expected):
    assert got.numpy() == pytest.approx(want.numpy())
  assert float(Clip(1)[1]) == pytest.approx(5.0)
  graph = Clip.get_concrete_function(-1).graph
  for op in graph.get_operations():
    # A gradient's part of the norm, and its scaling (the scalar scale
    # itself is computed once, anywhere).
    if op.type == 'L2Loss' or (op.type == 'Mul' and op.outputs[0].shape.rank):
      assert op.device.endswith(('CPU:1', 'CPU:2')), (op.name, op.device)
