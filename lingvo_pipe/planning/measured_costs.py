"""What each layer of a pipeline costs on this machine, measured.

FLOPs mislead where layers are not matmul-bound (elementwise, memory
bound, small or badly shaped products), so the partition can balance
measured seconds instead: `Measure` times every layer of a
PipeliningLayer's `layers` alone, on one device, at the micro-batch size,
feeding each the previous one's real outputs; `Balanced` gives the params
that balance them (cost=CostKind.GIVEN, layer_costs).

Per layer three traced functions run `repeats` times after a warm-up, and
the median of each is kept: its forward (F), the forward and the
gradient of its floating inputs (F + I), and the forward and the gradients
of its inputs and its weights (F + I + W). I and W are the differences,
at least 0 (a difference of two noisy medians can go below it). Each
layer is built from its params with fresh variables: what it costs does
not depend on their values.
"""

import dataclasses
import statistics
import time
from typing import Any, Callable, List, Sequence

import tensorflow as tf

from lingvo_pipe.core import base_params
from lingvo_pipe.core import hyperparams
from lingvo_pipe.pipeline.layout import micro_batch
from lingvo_pipe.pipeline.layout import micro_batch_count
from lingvo_pipe.pipeline.layout import partition


@dataclasses.dataclass(frozen=True)
class LayerCost:
  """Measured seconds of one layer on one micro-batch."""
  forward_s: float
  input_grad_s: float
  weight_grad_s: float

  @property
  def step_s(self) -> float:
    """Its share of a training step: forward, input and weight gradients."""
    return self.forward_s + self.input_grad_s + self.weight_grad_s


def Measure(pipeline: hyperparams.Params, inputs: Sequence[Any], repeats: int = 5,
            device: str = '/device:CPU:0') -> List[LayerCost]:
  """Each of `pipeline`'s layers (PipeliningLayer params with `layers`)
  timed on the first micro-batch of `inputs` (the pipeline's inputs, a
  whole batch), on `device`.

  Raises:
    ValueError: if the pipeline has no `layers` (a cell_tpl pipeline is
      partitioned by hand), repeats < 1, or the inputs do not split into
      its micro-batches.
  """
  if not pipeline.layers:
    raise ValueError(f'PipeliningLayer {pipeline.name!r}: Measure times the entries of '
                     'p.layers; this pipeline has none (cell_tpl is a manual partition).')
  if repeats < 1:
    raise ValueError(f'repeats ({repeats}) must be >= 1.')
  contract = micro_batch.Contract.FromParams(pipeline)
  batch = contract.InputLayout(tuple(inputs)).batch_size
  num_micro = micro_batch_count.NumMicroBatches(pipeline, batch)
  x = contract.SplitInputs(tuple(inputs), num_micro)[0]
  costs = []
  with tf.device(device):
    for p in base_params.WithInheritedBaseParams(pipeline).layers:
      layer = p.Instantiate()
      costs.append(_LayerCost(layer, x, repeats))
      x = _AsTuple(layer.FProp(layer.theta, *x))
  return costs


def Balanced(pipeline: hyperparams.Params, costs: Sequence[LayerCost]) -> hyperparams.Params:
  """A copy of `pipeline` whose automatic partition balances the measured
  step seconds of its layers."""
  return pipeline.Copy().Set(cost=partition.CostKind.GIVEN,
                             layer_costs=[c.step_s for c in costs])


def _AsTuple(out: Any) -> tuple:
  return out if isinstance(out, tuple) else (out,)


def _LayerCost(layer: Any, x: tuple, repeats: int) -> LayerCost:
  weights = list(layer.trainable_variables)
  floats = [t for t in tf.nest.flatten(x) if t.dtype.is_floating]

  def Forward():
    return tf.nest.flatten(layer.FProp(layer.theta, *x))

  def Gradients(sources: List[Any]) -> Callable[[], Any]:
    def Run():
      with tf.GradientTape() as tape:
        tape.watch(floats)
        out = [t for t in Forward() if t.dtype.is_floating]
        loss = tf.add_n([tf.reduce_sum(tf.cast(t, tf.float32)) for t in out])
      return [g for g in tape.gradient(loss, sources) if g is not None]
    return Run

  forward = _MedianSeconds(Forward, repeats)
  with_inputs = _MedianSeconds(Gradients(floats), repeats) if floats else forward
  with_weights = _MedianSeconds(Gradients(floats + weights), repeats)
  return LayerCost(forward, max(with_inputs - forward, 0.0),
                   max(with_weights - with_inputs, 0.0))


def _MedianSeconds(fn: Callable[[], Any], repeats: int) -> float:
  """The median wall time of the traced `fn` over `repeats` runs after one."""
  traced = tf.function(fn, autograph=False)
  tf.nest.map_structure(lambda t: t.numpy(), traced())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    tf.nest.map_structure(lambda t: t.numpy(), traced())
    times.append(time.perf_counter() - start)
  return statistics.median(times)
