"""K, M, R, the schedule, the loop emission and the device mapping are
performance knobs: the model's variables (names, initial values), its loss
and its gradients, dropout on, are the same under every layout."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core import step_seeds
from lingvo_pipe.core import variable_paths
from lingvo_pipe.pipeline.schedules.schedule import ScheduleKind
from lingvo_pipe.tasks.lm import model as lm_model

from tests.pipeline import pipeline_models as models

# The reference layout first: one cell, the whole batch in one micro-batch.
LAYOUTS = {
    'K1-M1': dict(num_partitions=1, num_micro_batches=1),
    'K2-M2': dict(num_partitions=2, num_micro_batches=2),
    'K4-M4': dict(num_partitions=4, num_micro_batches=4),
    'K4-M16': dict(num_partitions=4, num_micro_batches=16),
    'K2-M2-R2': dict(num_partitions=2, num_micro_batches=2, num_replicas=2),
    '1F1B-K2-M4': dict(num_partitions=2, num_micro_batches=4,
                       schedule=ScheduleKind.ONE_F_ONE_B),
    'interleaved-K2-v2-M4': dict(num_partitions=4, cells_per_device=2,
                                 num_micro_batches=4,
                                 schedule=ScheduleKind.INTERLEAVED),
    'tick-loop-K2-M4': dict(num_partitions=2, num_micro_batches=4,
                            loop_min_micro_batches=2),
    '1F1B-loop-K2-M4': dict(num_partitions=2, num_micro_batches=4,
                            schedule=ScheduleKind.ONE_F_ONE_B,
                            loop_min_micro_batches=2),
    'K2-other-devices': dict(num_partitions=2, num_micro_batches=2,
                             devices=['/device:CPU:3', '/device:CPU:1']),
    'splits': dict(splits=[1, 3], num_micro_batches=2),
}


def _Task(layout):
  p = lm_model.LanguageModelTask.Params().Set(name='lm', random_seed=3)
  # Embedding, two Transformer layers, softmax: one layer per cell at K=4.
  p.stack.Set(vocab_size=16, model_dim=8, num_heads=2, hidden_dim=16, num_layers=2,
              batch_size=models.BATCH, seq_len=4, residual_keep_prob=0.7)
  p.stack.pipeline.Set(**layout)
  return p.Instantiate()


def _Step(task):
  """Loss and gradients by variable path of one training step at step 5."""
  batch = models.TransformerBatch(seed=7)
  by_path = variable_paths.VariablesByPath(task)
  names = [n for n, v in by_path.items() if v.trainable]

  @tf.function(autograph=False)
  def Step():
    with tf.GradientTape() as tape:
      loss = task.FProp(step_seeds.WithStepSeed(task.theta, [5, 0]), batch).loss
    return loss, tape.gradient(loss, [by_path[n] for n in names])

  loss, grads = Step()
  return loss.numpy(), dict(zip(names, [tf.convert_to_tensor(g).numpy() for g in grads]))


@pytest.fixture(scope='module')
def reference():
  task = _Task(LAYOUTS['K1-M1'])
  values = {n: v.numpy() for n, v in variable_paths.VariablesByPath(task).items()}
  return values, _Step(task)


# K4-M16 (one example per micro-batch, the slowest) runs in make test-slow.
@pytest.mark.parametrize('name', [
    pytest.param(name, marks=pytest.mark.slow if name == 'K4-M16' else ())
    for name in list(LAYOUTS)[1:]])
def test_variables_loss_and_gradients_equal_one_cell(name, reference):
  values, (loss, grads) = reference
  task = _Task(LAYOUTS[name])
  by_path = variable_paths.VariablesByPath(task)
  assert list(by_path) == list(values), 'variable paths differ from K=1'
  for path, v in by_path.items():
    np.testing.assert_array_equal(v.numpy(), values[path], err_msg=path)
  got_loss, got_grads = _Step(task)
  np.testing.assert_allclose(got_loss, loss, rtol=1e-6)
  for path, g in got_grads.items():
    np.testing.assert_allclose(g, grads[path], rtol=1e-5, atol=1e-6, err_msg=path)


def test_variable_paths_name_the_layers_not_the_cells():
  task = _Task(LAYOUTS['K4-M4'])
  paths = list(variable_paths.VariablesByPath(task))
  assert 'stack/pipeline/layer_1/body/fflayer/fflayer/fc0/w' in paths or any(
      p.startswith('stack/pipeline/layer_1/') for p in paths), paths
  assert not [p for p in paths if 'cell_' in p], paths
  for k, run in enumerate(task.stack.pipeline.CellLayerIndices()):
    for i in run:
      layer = task.stack.pipeline.layers[i]
      for v in layer.variables:
        assert v.device.endswith(f'CPU:{k}'), (layer.path, v.device)


def test_dropout_is_on():
  """The layouts above would agree trivially without dropout: the loss at
  another step differs."""
  task = _Task(LAYOUTS['K2-M2'])
  batch = models.TransformerBatch(seed=7)
  losses = [task.FProp(step_seeds.WithStepSeed(task.theta, [s, 0]), batch).loss.numpy()
            for s in (5, 6)]
  assert losses[0] != losses[1]
