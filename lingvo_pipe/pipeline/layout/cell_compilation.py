"""Whether a pipeline's cells are compiled with XLA, and what stays outside.

With CellCompilation.XLA each cell's traced forward and the gradient part
of its traced backward are `tf.function(jit_compile=True)`, called on the
cell's device as before: the schedule, the transfers between cells, the
control edges that order a device's calls and the gradient accumulators
are unchanged. What XLA does not compile, and how it is handled:

- Gradient accumulators (cell_gradients): shapeless resource variables
  assigned in place. The compiled function returns the micro-batch's
  gradients, and an uncompiled wrapper, still one call per micro-batch on
  the cell's device, assigns or adds them.
- Deferred weight gradients (deferred_grads): the factors are recorded by
  Python while the gradient is traced and must be tensors of the step's
  graph; inside a compiled function they are not. Compiled cells do not
  defer: each backward computes its weight gradients itself.
- The kept micro-batch under per-cell remat (remat.Decision.inline): an
  inlined forward is not a function, so it could not be compiled; compiled
  cells call their compiled forward for it too and differentiate the call.
- Step seeds of dropout: stateless RNG ops (Philox) have XLA kernels, and
  the seed is an input of the compiled function (PlaceholderWithDefault
  stays outside it), so one compilation serves every micro-batch and step.
- Ops without an XLA kernel inside a cell fail when the step is first
  traced, with TensorFlow's error naming the op: set CellCompilation.NONE
  for such a model.

On a TPU the same functions would be compiled by the TPU's XLA backend;
docs/precision.md says what a TPU run needs beyond this.
"""

import enum

from typing import FrozenSet

import tensorflow as tf


class CellCompilation(enum.Enum):
  """How a PipeliningLayer runs its cells' traced functions."""
  NONE = 'none'  # TensorFlow's graph executor (Grappler), no XLA
  XLA = 'xla'    # jit_compile=True on each cell's device
  AUTO = 'auto'  # the measured faster one for the compute dtype (Compiles)


# Compute dtypes for which AUTO compiles, from benchmarks/precision_bench.py
# (docs/benchmarks/precision.md): none on the development CPU, where
# compiled cells took 2.2x the step of uncompiled ones in float32 and
# bfloat16 alike.
_XLA_FASTER: FrozenSet[tf.DType] = frozenset()


def Compiles(kind: CellCompilation, compute_dtype: tf.DType) -> bool:
  """Whether cells of `compute_dtype` are compiled under `kind`.

  Raises:
    TypeError: if kind is not a CellCompilation.
  """
  if not isinstance(kind, CellCompilation):
    raise TypeError(f'jit_compile must be a CellCompilation (NONE, XLA or '
                    f'AUTO), got {kind!r}.')
  if kind == CellCompilation.AUTO:
    return tf.as_dtype(compute_dtype) in _XLA_FASTER
  return kind == CellCompilation.XLA
