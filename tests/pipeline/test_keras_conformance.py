"""The conformance matrix for a Keras model: every schedule x emission x
remat x replicas equals the Keras model itself.

The chain of tests/core/layers/keras_examples.py (Dense, LayerNormalization,
a MultiHeadAttention block), made a pipeline by KerasLayers with the Keras
model's weights, trains one step; its outputs, loss and the gradient of
every variable and of the input equal `model(x)`'s under a GradientTape
(rtol 1e-5). R=2 replicas of M micro-batches are the R*M micro-batches of
one pipeline. The K x M grid (K in {1, 2, 4}, M in {1, 4}) is in
tests/core/layers/test_keras_layer.py.

`make test` runs each schedule once, the (emission, remat, replicas)
combinations in turn over the schedules; `make test-slow` the rest.
"""

import itertools

import pytest
import tensorflow as tf

from lingvo_pipe.core.layers import keras_models
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.replicas import replica_variables

from tests import transparency
from tests.core.layers.keras_examples import ChainModel, DIM, TIME
from tests.pipeline import pipeline_models as models
from tests.pipeline.conformance_cases import BATCH, EMISSIONS, REMATS, SCHEDULES


def _Cases():
  combos = list(itertools.product(EMISSIONS, REMATS, (1, 2)))
  cases = []
  for i, name in enumerate(SCHEDULES):
    for emission, remat, replicas in combos:
      fast = combos[i % len(combos)] == (emission, remat, replicas)
      cases.append(pytest.param(name, emission, remat, replicas,
                                id=f'{name}-{emission}-{remat.name}-R{replicas}',
                                marks=() if fast else pytest.mark.slow))
  return cases


def _KerasPipeline(model, name, emission, remat, replicas):
  """The pipeline of `model`'s layers with its weights, replica copies too."""
  params, cells, m, _ = SCHEDULES[name]
  pipe = gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=keras_models.KerasLayers(model, [None, TIME, DIM]),
      num_partitions=cells, num_micro_batches=m, num_replicas=replicas, remat=remat,
      loop_min_micro_batches=EMISSIONS[emission], input_shapes=[[BATCH, TIME, DIM]],
      **params).Instantiate()
  keras_models.CopyWeightsFromKeras(pipe, model)
  replica_variables.SetCopiesToOriginals(pipe)
  return pipe


@pytest.mark.parametrize('name,emission,remat,replicas', _Cases())
def test_keras_model(name, emission, remat, replicas):
  model = ChainModel()
  pipe = _KerasPipeline(model, name, emission, remat, replicas)
  num_micro = SCHEDULES[name][2] * replicas
  x = tf.random.stateless_normal([BATCH, TIME, DIM], [len(name), num_micro])
  step = (models.TrainStepWithLoss(pipe, 7, num_micro) if SCHEDULES[name][3]
          else models.TrainStep(pipe, 7))
  y, loss, grads = step(x)

  keras_weight = {id(var): w for var, w in keras_models.WeightPairs(pipe, model)}
  variables = list(pipe.trainable_variables)
  with tf.GradientTape() as tape:
    tape.watch(x)
    expected_y = model(x, training=True)
    expected_loss = models.Loss(expected_y)
  expected_grads = tape.gradient(
      expected_loss, [keras_weight[id(v)] for v in variables] + [x])

  transparency.AssertClose(y, expected_y, 'outputs')
  transparency.AssertClose(loss, expected_loss, 'loss')
  names = [v.name for v in variables] + ['input']
  assert len(grads) == len(expected_grads) == len(names)
  for what, g, e in zip(names, grads, expected_grads):
    assert g is not None, what
    transparency.AssertClose(g, e, f'gradient of {what}')
