"""custom_gradients: TensorFlow's custom gradients whose gradient
functions are freed with their graph, and give the same gradients."""

import gc
import weakref

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core import custom_gradients
from lingvo_pipe.pipeline import gpipe

from tests.pipeline import pipeline_models as models


def _Square(decorator):
  """x^2 with the gradient 2x written by hand, under `decorator`."""

  @decorator
  def Square(x):
    return x * x, lambda dy: 2.0 * x * dy

  return Square


def _GraphOfAStep(decorator):
  """A weak reference to the graph of a traced step using the decorated
  function, the function itself dropped."""
  square = _Square(decorator)

  @tf.function(autograph=False)
  def Step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = square(x)
    return tape.gradient(y, x)

  np.testing.assert_allclose(Step(tf.constant(3.0)).numpy(), 6.0)
  return weakref.ref(Step.get_concrete_function(tf.TensorSpec([], tf.float32)).graph)


def test_a_traced_graph_is_freed_with_its_function():
  """tf.custom_gradient alone keeps every graph it was traced in (its
  gradient function stays in TensorFlow's registry); CustomGradient's
  graph is freed once nothing uses it."""
  kept = _GraphOfAStep(tf.custom_gradient)
  freed = _GraphOfAStep(custom_gradients.CustomGradient)
  gc.collect()
  assert kept() is not None
  assert freed() is None


@pytest.mark.parametrize('decorator', [custom_gradients.CustomGradient,
                                       lambda f: custom_gradients.RecomputeGrad(
                                           lambda x: f(x)[0])],
                         ids=['custom_gradient', 'recompute_grad'])
def test_gradients_inside_and_outside_the_traced_function(decorator):
  """The tape inside the function, and outside it (TensorFlow builds the
  function's backward later, from the registry): the hand-written
  gradient, or the recomputed one."""
  square = _Square(decorator)
  forward = tf.function(square, autograph=False)
  x = tf.constant([1.0, -2.0])
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = tf.reduce_sum(forward(x))
  np.testing.assert_allclose(tape.gradient(y, x).numpy(), [2.0, -4.0])
  with tf.GradientTape() as tape:  # eagerly: nothing registered
    tape.watch(x)
    y = tf.reduce_sum(square(x))
  np.testing.assert_allclose(tape.gradient(y, x).numpy(), [2.0, -4.0])


def test_a_saved_model_keeps_the_custom_gradient(tmp_path):
  """SavedModel traces the registered gradient functions of the graphs it
  saves; the registry's weak reference still reaches them."""
  module = tf.Module()
  module.square = tf.function(_Square(custom_gradients.CustomGradient), autograph=False,
                              input_signature=[tf.TensorSpec([None], tf.float32)])
  tf.saved_model.save(module, str(tmp_path))
  loaded = tf.saved_model.load(str(tmp_path))
  x = tf.constant([3.0])
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = loaded.square(x)
  np.testing.assert_allclose(tape.gradient(y, x).numpy(), [6.0])


@pytest.mark.parametrize('remat,loop', [('NONE', 0), ('PER_LAYER', 2)])
def test_a_pipelines_traced_step_is_freed_with_the_pipeline(remat, loop):
  """Every custom gradient of a training step (the pipeline's, the cells'
  recomputation, the projections') lets the step's graph go: a process
  that builds pipeline after pipeline (the tuner's trials) stays flat."""

  def StepGraph():
    layers, shape = models.FfnLayers()
    pipe = models.Pipeline(layers, shape, 2, 4, remat=gpipe.RematPolicy[remat],
                           loop_min_micro_batches=loop)
    step = models.TrainStepWithLoss(pipe, 7, 4)
    step(tf.ones(shape))
    return weakref.ref(step.get_concrete_function(tf.TensorSpec(shape, tf.float32)).graph)

  graph = StepGraph()
  gc.collect()
  assert graph() is None
