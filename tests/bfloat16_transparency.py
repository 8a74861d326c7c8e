"""bfloat16 transparency: a bfloat16 pipeline against its layers unpipelined in bfloat16.

The bfloat16 counterpart of tests/transparency.py's CheckTransparent, with
tolerances of a few bfloat16 steps.
"""

from typing import Any, Callable, List

import numpy as np
import tensorflow as tf

from lingvo_pipe.core import step_seeds

from tests import transparency
from tests.pipeline import pipeline_models as models

# bfloat16 keeps 8 significant bits (a relative step of 2^-8 = 0.0039). The
# pipeline runs the reference's casts and products, in the same order per
# micro-batch; what differs is how the float32 sums of the micro-batches'
# weight gradients and the once-per-step products of deferred factors
# (pipeline/cell/deferred_grads.py: one bfloat16 product over all micro-batches
# instead of M) are rounded. So each tensor is compared to a few bfloat16
# steps of its own scale: |a - e| <= RTOL * |e| + ATOL * max|e|, where a
# gradient's scale is at least FLOOR of the largest gradient's.
RTOL, ATOL, FLOOR = 2e-2, 2e-2, 1e-2
# Gradients that are zero in exact arithmetic, so rounding noise on both
# sides: attention's key bias adds the same q.b to every logit of a query
# row, which the softmax ignores. Both must stay below NOISE of the largest
# gradient.
_ZERO_GRADIENTS = ('key_b',)
NOISE = 5e-2
DTYPE = tf.bfloat16


def AssertCloseBf16(actual: Any, expected: Any, what: str,
                     min_scale: float = 0.0) -> None:
  a = tf.cast(tf.convert_to_tensor(actual), tf.float32).numpy()
  e = tf.cast(tf.convert_to_tensor(expected), tf.float32).numpy()
  scale = max(float(np.max(np.abs(e))) if e.size else 0.0, min_scale)
  np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL * scale + 1e-7,
                             err_msg=what)


def Float32Loss(outputs: Any) -> tf.Tensor:
  """models.Loss on float32 outputs: the loss is float32 (core/precision)."""
  return models.Loss(tf.cast(outputs, tf.float32))


def TrainStepWithFloat32Loss(pipe, step: int, num_micro: int):
  """models.TrainStepWithLoss with each micro-batch's term of Float32Loss
  (a mean of squares over the whole batch) computed in float32."""
  variables = list(pipe.trainable_variables)

  @tf.function(autograph=False)
  def Step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      theta = step_seeds.WithStepSeed(pipe.theta, [step, 0])
      micro_loss = lambda out: tf.reduce_sum(tf.square(tf.cast(out, tf.float32))) / float(
          x.shape.num_elements())
      loss, outputs = pipe.FPropWithLoss(theta, micro_loss, x)
    return outputs, loss, tape.gradient(loss, variables + [x])

  return Step


def CheckBf16Transparent(pipe, inputs: List[tf.Tensor], m: int, loss_inside: bool = False,
                         loss_fn: Callable[[Any], tf.Tensor] = Float32Loss) -> None:
  """`loss_fn` of the outputs; with loss_inside, Float32Loss's terms inside."""
  ref = transparency.Reference(pipe).TrainStep(inputs, m, 3, loss_fn)
  if loss_inside:
    y, loss, grads = TrainStepWithFloat32Loss(pipe, 3, m)(*inputs)
  else:
    y, loss, grads = models.TrainStep(pipe, 3, loss_fn)(*inputs)
  for out in tf.nest.flatten(y):
    if out.dtype.is_floating and out.shape.rank:
      assert out.dtype in (DTYPE, tf.float32), out.dtype
  tf.nest.map_structure(lambda a, e: AssertCloseBf16(a, e, 'outputs'), y, ref.y)
  AssertCloseBf16(loss, ref.loss, 'loss')
  sources = list(pipe.trainable_variables) + models.FloatInputs(inputs)
  assert len(grads) == len(ref.grads) == len(sources)
  floor = FLOOR * max(float(tf.reduce_max(tf.abs(tf.convert_to_tensor(g))))
                      for g in ref.grads if g is not None)
  for source, g, rg in zip(sources, grads, ref.grads):
    name = getattr(source, 'name', 'float input')
    if g is not None:
      assert g.dtype == source.dtype, (name, g.dtype)
    if name.split('/')[-1].split(':')[0] in _ZERO_GRADIENTS:
      for noise in (g, rg):
        assert float(tf.reduce_max(tf.abs(noise))) <= NOISE * floor / FLOOR, name
      continue
    AssertCloseBf16(tf.zeros_like(source) if g is None else g,
                     tf.zeros_like(source) if rg is None else rg,
                     f'gradient of {name}', floor)
