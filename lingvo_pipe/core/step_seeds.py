"""Step seeds: the entry of a random layer's theta that its masks depend on."""

from typing import Any

import tensorflow as tf

from lingvo_pipe.core.nested_map import NestedMap

# The key of a random layer's step seed in its theta.
KEY = 'step_seed'


def WithStepSeed(theta: NestedMap, step_seed: Any) -> NestedMap:
  """Returns theta with every random layer's step seed set to `step_seed`.

  `step_seed` is an int64 vector of two elements: [global_step, index in
  the global batch of the first example the inputs hold]. A dropout mask
  is a pure function of the global step, the layer path and each
  example's index (DropoutLayer), so a pipeline gives micro-batch m the
  index of its first example and splitting the batch changes no mask.
  """
  step_seed = tf.cast(tf.convert_to_tensor(step_seed), tf.int64)
  return _Replace(theta, step_seed)


def _Replace(value: Any, step_seed: tf.Tensor) -> Any:
  if isinstance(value, dict):
    out = NestedMap()
    for key, sub in value.items():
      out[key] = step_seed if key == KEY else _Replace(sub, step_seed)
    return out
  if isinstance(value, (list, tuple)):
    return type(value)(_Replace(v, step_seed) for v in value)
  return value
