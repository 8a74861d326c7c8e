"""kept_bytes: what a forward keeps for its backward, read off the traced
gradient, against what each op's gradient needs by hand."""

import pytest
import tensorflow as tf

from lingvo_pipe.core.layers.activations import Activation
from lingvo_pipe.core.layers import linear
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.planning import kept_bytes
from lingvo_pipe.planning import measured_costs

F32 = 4


def _Read(forward, x, weights=()):
  """kept_bytes.Read of forward(x) and its gradients to x and `weights`,
  traced with x an argument."""
  marks = kept_bytes.Marks()

  def Run(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      marks.Forward()
      out = forward(x)
      marks.Outputs([out])
      loss = tf.reduce_sum(out)
    marks.Gradient()
    gradients = tape.gradient(loss, [x] + list(weights))
    marks.Gradients(gradients)
    return gradients

  return kept_bytes.Read(tf.function(Run).get_concrete_function(x).graph, marks)


def test_views_count_once_and_shape_reads_keep_nothing():
  """exp's gradient reads its output h; the product v * v reads v, a
  reshape of h (the same buffer) twice; the reshape's gradient reads only
  h's shape; x is not read (exp's gradient needs its output)."""
  x = tf.ones([4, 8])

  def Forward(t):
    v = tf.reshape(tf.exp(t), [-1])
    return v * v

  assert _Read(Forward, x) == kept_bytes.Kept(
      inner_bytes=32 * F32, output_bytes=32 * F32, reads_outputs=False, reads_inputs=False)


def test_a_gradient_no_result_needs_reads_nothing():
  """sin(x) * mask, the mask a cast of a comparison (no gradient): the
  product's gradient to the mask reads sin(x) and leads nowhere, so only
  the mask is kept (sin's gradient reads x, the input)."""
  x = tf.ones([4, 8])

  def Forward(t):
    return tf.sin(t) * tf.cast(t > 0.5, tf.float32)

  assert _Read(Forward, x) == kept_bytes.Kept(
      inner_bytes=32 * F32, output_bytes=32 * F32, reads_outputs=False, reads_inputs=True)


def test_marks_without_the_gradients_are_refused():
  marks = kept_bytes.Marks()
  with pytest.raises(ValueError, match=r'call marks.Gradients\(g\)'):
    kept_bytes.Read(tf.Graph(), marks)


def test_projections_keep_their_input_and_tanh_its_output():
  """The matmul's weight gradient reads the input (x.T @ dy), its input
  gradient does not; tanh's gradient reads its output (1 - y^2); weights
  and their reads are not activations. Chained, the tanh layer's output is held once, though both
  its own gradient and the next layer's read it; the last layer's output
  nobody reads."""
  layers = [linear.ProjectionLayer.Params().Set(name='tanh', input_dim=32, output_dim=64,
                                                activation=Activation.TANH),
            linear.ProjectionLayer.Params().Set(name='linear', input_dim=64, output_dim=16)]
  x = tf.ones([8, 32])
  tanh = layers[0].Instantiate()
  weights = tanh.trainable_variables
  assert _Read(lambda t: tanh.FProp(tanh.theta, t), x, weights) == kept_bytes.Kept(
      inner_bytes=0, output_bytes=8 * 64 * F32, reads_outputs=True, reads_inputs=True)
  assert _Read(lambda t: tanh.FProp(tanh.theta, t), x) == kept_bytes.Kept(
      inner_bytes=0, output_bytes=8 * 64 * F32, reads_outputs=True, reads_inputs=False)
  pipeline = gpipe.PipeliningLayer.Params().Set(name='pipe', layers=layers,
                                                input_shapes=[[8, 32]], num_micro_batches=2)
  costs = measured_costs.Measure(pipeline, [x], repeats=1)
  assert [c.kept_bytes for c in costs] == [4 * 64 * F32, 0]  # at the micro-batch, 4 rows


def test_chain_holds_an_output_its_own_or_the_next_gradient_reads():
  reads_in = kept_bytes.Kept(10, 5, reads_outputs=False, reads_inputs=True)
  reads_out = kept_bytes.Kept(10, 5, reads_outputs=True, reads_inputs=False)
  neither = kept_bytes.Kept(10, 5, reads_outputs=False, reads_inputs=False)
  assert kept_bytes.Chain([neither, reads_in, reads_out, neither, neither]) == [
      15, 10, 15, 10, 10]
