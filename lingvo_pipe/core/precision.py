"""The mixed-precision policy: which dtype each computation of a layer uses.

A layer's `fprop_dtype` (a BaseLayer param; None: its `dtype`) is the dtype
of its activations and of the products it computes. Variables keep
`dtype` (float32): the optimizer updates float32 master weights, its slots
are float32 and checkpoints hold float32. A layer reads its weights cast to
its compute dtype; the cast's gradient brings the weight gradient back to
float32 before it reaches the optimizer.

Computations that stay float32 whatever `fprop_dtype` is, because bfloat16
(8 bits of mantissa, a relative step of 2^-8) or float16 would change the
result beyond rounding:

- the softmax cross entropy and the loss (SoftmaxLayer): log-softmax
  subtracts a log-sum-exp of many terms from each logit, and a mean over
  thousands of tokens would lose every term below 2^-8 of the running sum;
- the attention softmax (MultiHeadedAttention): the same log-sum-exp, per
  query row;
- layer-norm and batch-norm statistics (mean, variance, the normalization
  itself) and their scale and bias: the variance is a difference of
  nearly equal sums, and the moving averages of batch norm add updates of
  (1 - decay) = 1e-3 of their value, which bfloat16 would round away.

Those layers compute in float32 and return their outputs in the compute
dtype; under a reduced compute dtype the layer norm and the attention
softmax keep only their reduced inputs for the backward, which recomputes
their float32 part (core/float32_islands). A pipeline casts each cell's weights once per step, on the cell's
device, with `CastTheta`; the layers' own casts are then no-ops.
"""

import contextlib
import contextvars
from typing import Any, Iterator, List, Optional

import tensorflow as tf

# Compute dtypes a layer may have; others (float64) work as well but are
# not mixed precision.
REDUCED_DTYPES = (tf.bfloat16, tf.float16)

_LOSS_SCALE: contextvars.ContextVar[Optional[tf.Tensor]] = contextvars.ContextVar(
    'lingvo_pipe_loss_scale', default=None)


@contextlib.contextmanager
def LossScaling(scale: tf.Tensor) -> Iterator[None]:
  """Inside, the training objective is the loss times `scale` (a float32
  scalar; dynamic loss scaling of float16). Whoever takes a loss's gradient
  inside a layer, before the outer tape (a pipeline with the loss inside),
  scales it by LossScale() so that the float16 backward sees scaled
  gradients, as it would under the outer tape."""
  token = _LOSS_SCALE.set(scale)
  try:
    yield
  finally:
    _LOSS_SCALE.reset(token)


def LossScale() -> Optional[tf.Tensor]:
  """The scale of the innermost LossScaling, or None."""
  return _LOSS_SCALE.get()


def ComputeDtype(params: Any) -> tf.DType:
  """The dtype of a layer's activations and products: params.fprop_dtype,
  else params.dtype."""
  return tf.as_dtype(params.fprop_dtype or params.dtype)


def IsReduced(dtype: Optional[tf.DType]) -> bool:
  """Whether `dtype` is a reduced-precision float (bfloat16, float16)."""
  return dtype is not None and tf.as_dtype(dtype) in REDUCED_DTYPES


def CastFloat(x: Any, dtype: tf.DType) -> Any:
  """`x` cast to `dtype` if it is a floating-point tensor (or variable) of
  another dtype; anything else (integers, None) unchanged. No op is created
  when the dtype already matches."""
  if x is None or not hasattr(x, 'dtype'):
    return x
  if not tf.as_dtype(x.dtype).is_floating or x.dtype == dtype:
    return x
  return tf.cast(x, dtype)


def CastFloats(nest: Any, dtype: tf.DType) -> Any:
  """CastFloat of every tensor of a nest."""
  return tf.nest.map_structure(lambda x: CastFloat(x, dtype), nest)


def Float32(x: tf.Tensor) -> tf.Tensor:
  """`x` as float32 for a computation that needs it (see the module
  docstring); unchanged if it already is float32 or float64."""
  if x.dtype in (tf.float32, tf.float64):
    return x
  return tf.cast(x, tf.float32)


def CastTheta(layer: Any, theta: Any) -> Any:
  """`theta` of `layer` with each floating variable cast to the dtype its
  owning layer computes with (BaseLayer.ThetaDtype); step seeds and other
  integers unchanged. Ops go where the caller places them: a pipeline calls
  it once per cell and step under the cell's device."""
  return layer.MapTheta(theta, _CastVariable)


def _CastVariable(owner: Any, name: str, value: Any) -> Any:
  return CastFloat(value, owner.ThetaDtype(name))


def CastGradients(grads: List[Any], like: List[Any]) -> List[Any]:
  """Each gradient of the flat list `grads` cast to the dtype of its
  counterpart in the flat list `like` (None stays None): bfloat16
  gradients of cast weights back to the variables' float32."""
  if len(grads) != len(like):
    raise ValueError(f'CastGradients: {len(grads)} gradients for '
                     f'{len(like)} tensors; pass one gradient per tensor.')
  return [None if g is None else _CastGradient(g, x.dtype)
          for g, x in zip(grads, like)]


def _CastGradient(g: Any, dtype: tf.DType) -> Any:
  if isinstance(g, tf.IndexedSlices):
    if g.values.dtype == dtype:
      return g
    return tf.IndexedSlices(tf.cast(g.values, dtype), g.indices, g.dense_shape)
  return CastFloat(g, dtype)
