"""Step seeds: the entry of a random layer's theta that its masks depend on."""

from typing import Any, List

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


def Seeds(theta: NestedMap) -> List[Any]:
  """The step seeds of `theta`'s random layers (empty if none uses one)."""
  return [v for k, v in theta.FlattenItems() if k.split('.')[-1] == KEY]


class Counter:
  """Step seeds for steps that run without a trainer (whose global step
  seeds them): each Next is [n, 0] for the n-th call. A constant seed (the
  theta's own, zeros) would let Grappler fold every dropout mask into a
  constant of the step's graph, drawn once and held between steps: on
  the tuner's uneven stack (docs/benchmarks/tuning.md) at K=1 M=8 1F1B
  the step measured 13% faster and its peak 77 MB, against the 55 MB
  of a varying seed."""

  def __init__(self) -> None:
    self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name='step_seed_counter')

  def Next(self, theta: NestedMap) -> NestedMap:
    """`theta` with the next step seed (unchanged if no layer of it uses one)."""
    if not Seeds(theta):
      return theta
    return WithStepSeed(theta, tf.stack([self._step.assign_add(1), 0]))


def _Replace(value: Any, step_seed: tf.Tensor) -> Any:
  if isinstance(value, dict):
    out = NestedMap()
    for key, sub in value.items():
      out[key] = step_seed if key == KEY else _Replace(sub, step_seed)
    return out
  if isinstance(value, (list, tuple)):
    return type(value)(_Replace(v, step_seed) for v in value)
  return value
