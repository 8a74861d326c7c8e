"""Float32 islands: a float32 computation inside reduced-precision
activations that keeps only its inputs for the backward.

core/precision keeps the layer-norm statistics and the attention softmax in
float32 whatever the compute dtype. Run on bfloat16 activations, such a
computation casts its input up, and TensorFlow's gradients keep the float32
intermediates (the cast input, the centred input, the softmax's output)
until the backward: per element, twice or more the bytes of the bfloat16
activation itself, which measured as most of a bfloat16 step's peak.

`Island(fn, *inputs)` returns fn(*inputs) and keeps only `inputs` (in the
compute dtype) for the backward, which runs fn again under a tape and takes
its gradient: the same float32 operations in the same order, so values and
gradients are those of fn itself, for the price of computing fn twice. The
layers use it only when their compute dtype is reduced.
"""

from typing import Callable, List, Optional

import tensorflow as tf

from lingvo_pipe.core import custom_gradients


def Island(fn: Callable[..., tf.Tensor], *inputs: tf.Tensor) -> tf.Tensor:
  """fn(*inputs), with only `inputs` kept for the backward (see the module
  docstring). `fn` must read no variables; pass their values as inputs.
  Inputs that are not floating point get no gradient."""
  tensors = [tf.convert_to_tensor(x) for x in inputs]

  @custom_gradients.CustomGradient
  def Kept(*xs: tf.Tensor):
    def Grad(dy: tf.Tensor) -> List[Optional[tf.Tensor]]:
      # Inputs read after dy exists: the recomputation is not the same
      # nodes as the forward, so the graph optimizer cannot merge the two
      # and keep the forward's float32 intermediates after all.
      with tf.control_dependencies([dy]):
        again = [tf.identity(x) for x in xs]
      floating = [x for x in again if x.dtype.is_floating]
      with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(floating)
        y = fn(*again)
      grads = iter(tape.gradient(y, floating, output_gradients=dy,
                                 unconnected_gradients=tf.UnconnectedGradients.ZERO))
      return [next(grads) if x.dtype.is_floating else None for x in again]

    return fn(*xs), Grad

  return Kept(*tensors)
