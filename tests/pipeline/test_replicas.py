"""R pipeline replicas equal one pipeline on the whole batch (local devices)."""

import pytest
import tensorflow as tf

from lingvo_pipe.pipeline import executor

from tests import transparency
from tests.pipeline import pipeline_models as models


# make test runs R=2; R=4 (8 devices) under the slow mark.
@pytest.mark.parametrize('r,k,m', [(2, 2, 2), (2, 2, 1),
                                   pytest.param(4, 2, 1, marks=pytest.mark.slow)])
def test_convnet_replicas_equal_the_unpartitioned_network(r, k, m):
  """Batch norm and dropout included: replica r's micro-batch m is
  micro-batch r*M + m of the reference (its statistics and its seed)."""
  layers, shape = models.ConvNetLayers(keep_prob=0.8)
  pipe = models.Pipeline(layers, shape, k, m, num_replicas=r)
  assert [[d.index for d in row] for row in pipe.replica_devices] == [
      list(range(i * k, (i + 1) * k)) for i in range(r)]
  x = tf.random.stateless_normal(shape, [r, m])
  ref = transparency.CheckTransparent(pipe, (x,), r * m)
  transparency.CheckMovingAverages(pipe, ref.bn_inputs)


# make test covers replicas with the convnet above (batch norm, dropout)
# and R=1 transformer stacks on workers (tests/trainer/test_remote_cells.py).
@pytest.mark.slow
def test_transformer_stack_replicas():
  pipe = models.TransformerStackPipeline(2, 2, num_replicas=2)
  transparency.CheckTransparent(pipe, models.TransformerInputs(seed=3), 4)


def test_two_replicas_train_like_one_pipeline():
  """R=2, K=2, M=2 against R=1, K=2, M=4 on the same global batches: the
  losses and the weights after three SGD steps (rtol 1e-5)."""
  layers, shape = models.FfnLayers(keep_prob=0.7)
  results = []
  for r, m in ((1, 4), (2, 2)):
    tf.random.set_seed(5)
    pipe = models.Pipeline(layers, shape, 2, m, num_replicas=r)
    variables = list(pipe.trainable_variables)
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    train_step = models.TrainStep(pipe, 0)  # traced once: seeds of step 0
    losses = []
    for step in range(3):
      _, loss, grads = train_step(tf.random.stateless_normal(shape, [step, 9]))
      optimizer.apply_gradients(zip(grads[:len(variables)], variables))
      losses.append(float(loss))
    results.append((losses, {v.name: v.numpy() for v in variables}))
  (losses1, weights1), (losses2, weights2) = results
  transparency.AssertClose(losses2, losses1, 'losses')
  assert sorted(weights1) == sorted(weights2)
  for name in weights1:
    transparency.AssertClose(weights2[name], weights1[name], name)


def test_replica_gradients_are_added_on_the_variables_device():
  """The traced step adds each weight's R gradients with one AddN on
  replica 0's device of its cell; replica 1's cell calls run on replica 1's
  devices."""
  layers, shape = models.FfnLayers()
  pipe = models.Pipeline(layers, shape, 2, 2, num_replicas=2)
  graph = models.TrainStep(pipe, 0).get_concrete_function(
      tf.TensorSpec(shape, tf.float32)).graph
  sums = [op for op in graph.get_operations()
          if op.type == 'AddN' and op.name.startswith(executor.REPLICA_SUM_SCOPE)]
  assert len(sums) == len(pipe.trainable_variables)
  owner = {v.name: tf.DeviceSpec.from_string(v.device).device_index
           for v in pipe.trainable_variables}
  assert set(owner.values()) == {0, 1}
  assert {tf.DeviceSpec.from_string(op.device).device_index for op in sums} == {0, 1}
  calls = [op for op in graph.get_operations()
           if op.type in ('PartitionedCall', 'StatefulPartitionedCall')]
  on = {tf.DeviceSpec.from_string(op.device).device_index for op in calls}
  assert on == {0, 1, 2, 3}


@pytest.mark.parametrize('kwargs,message', [
    (dict(num_replicas=5), '5 replicas x 2 cells at 1 per device need 10 devices but only 8'),
    (dict(num_replicas=0), 'num_replicas (0) must be >= 1'),
    (dict(num_replicas=2, devices=['CPU:0', 'CPU:1', 'CPU:2']), 'need 4 devices but only 3'),
])
def test_too_few_devices_fail_at_build(kwargs, message):
  layers, shape = models.FfnLayers()
  with pytest.raises(ValueError) as e:
    models.Pipeline(layers, shape, 2, 2, **kwargs)
  assert message in str(e.value)


def test_consecutive_cells_per_device_packs_replicas():
  layers, shape = models.FfnLayers()
  pipe = models.Pipeline(layers, shape, 2, 2, num_replicas=2, consecutive_cells_per_device=2,
                         devices=['CPU:4', 'CPU:5'])
  assert [[d.index for d in row] for row in pipe.replica_devices] == [[4, 4], [5, 5]]
  transparency.CheckTransparent(pipe, (tf.random.stateless_normal(shape, [1, 2]),), 4)
