"""The declared micro-batch contract of PipeliningLayer: broadcast inputs and
summed outputs by index or path, never guessed from shapes; each breach is
a ValueError naming the input or output and the fix."""

import re

import pytest
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import eval_mode
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.core import weights
from lingvo_pipe.pipeline import gpipe

from tests import transparency

B, D = 8, 8  # D == B: a broadcast [D, D] table has the batch size at batch_dim


class _Scale(base_layer.BaseLayer):
  """x -> tanh(x * w), other inputs carried along. (x, table): x @ table
  first. NestedMap(x, a_mask, aux): masks x and adds mean(x^2) to aux, a
  per-micro-batch loss term."""

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable('w', weights.WeightParams([D], init=weights.WeightInit.Uniform(1.0)))

  def FProp(self, theta, x, *rest):
    if isinstance(x, NestedMap):
      y = tf.tanh(x.x * theta.w) * x.a_mask
      return NestedMap(x=y, a_mask=x.a_mask, aux=x.aux + tf.reduce_mean(tf.square(y)))
    if rest:
      x = tf.matmul(x, rest[0])
    return (tf.tanh(x * theta.w),) + rest

  @classmethod
  def FPropMeta(cls, params, *shapes):
    return layer_meta.LayerMeta(layer_meta.Shapes(*shapes), flops=1)


class _Head(base_layer.BaseLayer):
  """NestedMap(x, a_mask, aux) -> (x, aux); (x, *carried) -> (x, carried[0]) or x.
  `keep_second` keeps the carried input as an output."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('keep_second', False, 'Output the second input too.')
    return p

  def FProp(self, theta, x, *rest):
    if isinstance(x, NestedMap):
      return x.x, x.aux
    return (x, rest[0]) if self.params.keep_second else x

  @classmethod
  def FPropMeta(cls, params, *shapes):
    if isinstance(shapes[0], NestedMap):
      return layer_meta.LayerMeta((shapes[0].x, shapes[0].aux))
    return layer_meta.LayerMeta(tuple(tf.TensorShape(s) for s in
                                      shapes[:2 if params.keep_second else 1]))


def _Pipe(num_micro, keep_second=False, **kwargs):
  layers = [_Scale.Params().Set(name=f's{i}') for i in range(3)]
  layers.append(_Head.Params().Set(name='head', keep_second=keep_second))
  params = gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, splits=[2], num_micro_batches=num_micro)
  return params.Set(**kwargs).Instantiate()


def _Normal(shape, seed):
  return tf.random.stateless_normal(shape, [seed, 0])


def _Reference(pipe, inputs, split, num_micro, loss_fn):
  """The layers applied to each micro-batch on its own (the inputs at
  `split` sliced along the batch, the others whole), plain autodiff of
  the sum of the micro-batches' losses: a whole input's gradient is the
  sum of its micro-batches'. Returns (per-micro-batch outputs, loss,
  gradients of the variables and the flat inputs)."""
  variables = list(pipe.trainable_variables)
  flat = tf.nest.flatten(inputs)
  layers = [layer for cell in pipe.cells for layer in cell.sub]
  with tf.GradientTape() as tape:
    tape.watch(flat)
    pieces = [tf.split(x, num_micro) if s else [x] * num_micro for x, s in zip(flat, split)]
    outs, total = [], 0.0
    for m in range(num_micro):
      h = tuple(tf.nest.pack_sequence_as(inputs, [p[m] for p in pieces]))
      for layer in layers:
        h = layer.FProp(layer.theta, *h)
        h = h if isinstance(h, tuple) else (h,)
      outs.append(h)
      total += loss_fn(h, m)
  return outs, total, tape.gradient(total, variables + flat)


def _Pipelined(pipe, inputs, loss_fn):
  """(outputs, loss, gradients of the variables and the flat inputs)."""
  flat = tf.nest.flatten(inputs)
  with tf.GradientTape() as tape:
    tape.watch(flat)
    out = pipe(*inputs)
    loss = loss_fn(out if isinstance(out, tuple) else (out,), None)
  return out, loss, tape.gradient(loss, list(pipe.trainable_variables) + flat)


@pytest.mark.parametrize('num_micro,shapes', [
    (1, None), (4, None),
    # input_shapes of a NestedMap input: a NestedMap of shapes, enough for
    # the automatic partition into num_partitions cells.
    (4, NestedMap(x=[B, D], a_mask=[D], aux=[])),
])
def test_nested_input_whose_broadcast_keys_sort_before_the_batch_key(num_micro, shapes):
  """tf.nest orders 'a_mask' and 'aux' before the batch entry 'x'; they
  reach every micro-batch whole and get the sum of the micro-batches'
  gradients. The aux output is declared summed: it equals the sum of the
  micro-batches' aux, in training and in eval."""
  partition = (dict(splits=[2]) if shapes is None else
               dict(splits=[], num_partitions=2, input_shapes=[shapes]))
  pipe = _Pipe(num_micro, broadcast_inputs=['0.a_mask', '0.aux'], summed_outputs=[1],
               **partition)
  assert pipe.num_cells == 2
  inputs = (NestedMap(x=_Normal([B, D], 1), a_mask=_Normal([D], 2), aux=tf.constant(0.5)),)
  targets = _Normal([B, D], 3)

  def Loss(out, m):
    y, aux = out
    target = targets if m is None else tf.split(targets, num_micro)[m]
    return tf.reduce_sum(y * target) + aux

  split = [False, False, True]  # a_mask, aux, x: tf.nest's (sorted) order
  outs, ref_loss, ref_grads = _Reference(pipe, inputs, split, num_micro, Loss)
  (y, aux), loss, grads = _Pipelined(pipe, inputs, Loss)
  transparency.AssertClose(y, tf.concat([o[0] for o in outs], 0))
  transparency.AssertClose(aux, tf.add_n([o[1] for o in outs]))
  transparency.AssertClose(loss, ref_loss)
  transparency.AssertClose(grads, ref_grads)
  with eval_mode.EvalMode():
    eval_y, eval_aux = pipe(*inputs)
  transparency.AssertClose(eval_y, y)
  transparency.AssertClose(eval_aux, aux)


def test_broadcast_input_with_the_batch_size_at_batch_dim_is_not_split():
  """A [D, D] table with D == B: guessing by shape would split it; declared
  broadcast, each micro-batch multiplies by all of it, and its gradient is
  the sum of the micro-batches'."""
  num_micro = 4
  pipe = _Pipe(num_micro, broadcast_inputs=[1], input_shapes=[[B, D], [D, D]])
  inputs = (_Normal([B, D], 4), _Normal([D, D], 5) / D)
  assert inputs[1].shape[0] == B

  def Loss(out, m):
    return tf.reduce_sum(tf.square(out[0]))

  outs, ref_loss, ref_grads = _Reference(pipe, inputs, [True, False], num_micro, Loss)
  y, loss, grads = _Pipelined(pipe, inputs, Loss)
  transparency.AssertClose(y, tf.concat([o[0] for o in outs], 0))
  transparency.AssertClose(loss, ref_loss)
  transparency.AssertClose(grads, ref_grads)


def test_summed_output_is_the_sum_over_micro_batches():
  """A broadcast input carried to the output and declared summed comes out
  M times; its gradient reaches every micro-batch whole."""
  num_micro = 4
  pipe = _Pipe(num_micro, keep_second=True, broadcast_inputs=[1], summed_outputs=[1],
               input_shapes=[[B, D], [D, D]])
  inputs = (_Normal([B, D], 6), _Normal([D, D], 7) / D)

  def Loss(out, m):
    return tf.reduce_sum(tf.square(out[0])) + tf.reduce_sum(out[1] * inputs[1])

  _, ref_loss, ref_grads = _Reference(pipe, inputs, [True, False], num_micro, Loss)
  (_, table), loss, grads = _Pipelined(pipe, inputs, Loss)
  transparency.AssertClose(table, num_micro * inputs[1])
  transparency.AssertClose(loss, ref_loss)
  transparency.AssertClose(grads, ref_grads)


# --- errors ------------------------------------------------------------------


def test_undeclared_input_with_another_batch_size_at_build():
  with pytest.raises(ValueError, match=(
      r"input '0' \(shape \(8, 8\)\) has 8 and input '1' \(shape \(4, 8\)\) has 4\. "
      r".*declare it in broadcast_inputs \(e\.g\. broadcast_inputs=\['1'\]\)")):
    _Pipe(2, input_shapes=[[B, D], [4, D]])


def test_undeclared_input_with_another_batch_size_at_call():
  pipe = _Pipe(2)
  with pytest.raises(ValueError, match=(
      r"input '0' \(shape \(8, 8\)\) has 8 and input '1' \(shape \(4, 8\)\) has 4")):
    pipe(_Normal([B, D], 1), _Normal([4, D], 2))


def test_undeclared_input_without_a_batch_dim():
  pipe = _Pipe(2)
  with pytest.raises(ValueError, match=(
      r"input '0\.aux' \(shape \(\)\) has no static size at batch_dim=0.*"
      r"broadcast_inputs=\['0\.aux'\]")):
    pipe(NestedMap(x=_Normal([B, D], 1), a_mask=tf.ones([D]), aux=tf.constant(0.)))


def test_every_input_broadcast():
  with pytest.raises(ValueError, match=r"Every pipeline input is in broadcast_inputs \['0'\]"):
    _Pipe(2, broadcast_inputs=[0], input_shapes=[[B, D]])


def test_broadcast_index_out_of_range_at_build():
  with pytest.raises(ValueError, match=(
      r"broadcast_inputs index 2 \(in '2'\) is out of range: there are 2 pipeline inputs")):
    _Pipe(2, broadcast_inputs=[1, 2], input_shapes=[[B, D], [D, D]])


def test_broadcast_index_out_of_range_at_call():
  pipe = _Pipe(2, broadcast_inputs=['1.mask'])
  with pytest.raises(ValueError, match=r"index 1 \(in '1\.mask'\) is out of range: there are "
                     r'1 pipeline inputs'):
    pipe(_Normal([B, D], 1))


def test_unknown_key():
  pipe = _Pipe(2, broadcast_inputs=['0.mask', '0.aux'], summed_outputs=[1])
  with pytest.raises(ValueError, match=(
      r"broadcast_inputs names '0\.mask', which is not among the pipeline inputs; their "
      r"paths are \['0\.a_mask', '0\.aux', '0\.x'\]")):
    pipe(NestedMap(x=_Normal([B, D], 1), a_mask=tf.ones([D]), aux=tf.constant(0.)))


@pytest.mark.parametrize('entry', ['a.b', -1, '1.', 1.0])
def test_malformed_entry_at_build(entry):
  with pytest.raises(ValueError, match=re.escape(f'broadcast_inputs entry {entry!r} is malformed')):
    _Pipe(2, broadcast_inputs=[entry])


@pytest.mark.parametrize('is_eval', [False, True])
def test_undeclared_output_that_is_not_batch_sized(is_eval):
  pipe = _Pipe(4, broadcast_inputs=['0.a_mask', '0.aux'])
  inputs = NestedMap(x=_Normal([B, D], 1), a_mask=tf.ones([D]), aux=tf.constant(0.))
  match = (r"Output '1' of the last cell \(shape \(\) per micro-batch\) lacks the micro-batch "
           r"size 2 at batch_dim=0.*declare it: summed_outputs=\['1'\]")
  with pytest.raises(ValueError, match=match):
    if is_eval:
      with eval_mode.EvalMode():
        pipe(inputs)
    else:
      pipe(inputs)


def test_summed_output_index_out_of_range_at_build():
  with pytest.raises(ValueError, match=(
      r"summed_outputs index 1 \(in '1'\) is out of range: there are 1 outputs of the last cell")):
    _Pipe(2, summed_outputs=[1], input_shapes=[[B, D]])


def test_summed_output_that_carries_the_batch_at_build():
  """A per-example output declared summed would add different examples'
  values together, its shape changing with M."""
  with pytest.raises(ValueError, match=(
      r"'pipe': summed output '1' has shape \(4, 8\) in a micro-batch of 4 and \(8, 8\) "
      r"in the batch of 8: it carries the batch.*Leave it out of summed_outputs")):
    _Pipe(2, keep_second=True, summed_outputs=[1], input_shapes=[[B, D], [B, D]])


def test_unknown_summed_output_at_call():
  pipe = _Pipe(2, broadcast_inputs=['0.a_mask', '0.aux'], summed_outputs=['1.loss'])
  with pytest.raises(ValueError, match=(
      r"summed_outputs names '1\.loss', which is not among the outputs of the last cell; "
      r"their paths are \['0', '1'\]")):
    pipe(NestedMap(x=_Normal([B, D], 1), a_mask=tf.ones([D]), aux=tf.constant(0.)))


@pytest.mark.parametrize('batch_dim', [2, -1])
def test_bad_batch_dim(batch_dim):
  with pytest.raises(ValueError, match=rf'batch_dim must be 0 \(batch-major\) or 1 '
                     rf'\(time-major\), got {batch_dim}'):
    _Pipe(2, batch_dim=batch_dim)


def _NeverCalled(*args):
  raise AssertionError('the loss ran although its inputs were refused')


@pytest.mark.parametrize('loss_inputs,match', [
    (NestedMap(labels=tf.zeros([4], tf.int32)),
     r"loss_inputs\.labels \(shape \(4,\)\) has 4 examples at batch_dim=0 where the "
     r"pipeline inputs have 8: give it one entry per example"),
    (tf.constant(1.0),
     r"loss_inputs \(shape \(\)\) has no static size at batch_dim=0: loss inputs are "
     r"per-example tensors .* let loss_fn read it directly"),
], ids=['another_batch_size', 'no_batch_dim'])
def test_bad_loss_inputs_are_refused_before_the_loss_runs(loss_inputs, match):
  pipe = _Pipe(2)
  with pytest.raises(ValueError, match=match):
    pipe.FPropWithLoss(pipe.theta, _NeverCalled, _Normal([B, D], 1), loss_inputs=loss_inputs)


def test_time_major_loss_inputs_are_cut_along_the_batch():
  """batch_dim=1: [time, batch] weights reach each micro-batch's loss as
  its [time, micro-batch] slice; the loss and gradients equal the whole
  batch's weighted sum (the layers act on each example alone)."""
  pipe = _Pipe(4, batch_dim=1)
  x, weights = _Normal([3, B, D], 1), _Normal([3, B], 2)
  variables = list(pipe.trainable_variables)
  with tf.GradientTape(persistent=True) as tape:
    loss, _ = pipe.FPropWithLoss(
        pipe.theta, lambda y, w: tf.reduce_sum(y[..., 0] * w), x, loss_inputs=weights)
    expected = tf.reduce_sum(pipe.FProp(pipe.theta, x)[..., 0] * weights)
  transparency.AssertClose(loss, expected, 'loss')
  transparency.AssertClose(tape.gradient(loss, variables), tape.gradient(expected, variables),
                           'gradients')
