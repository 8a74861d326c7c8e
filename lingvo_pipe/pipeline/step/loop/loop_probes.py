"""Throwaway traces that tell a loop step what it carries between iterations.

A tf.while_loop needs the structure and shape of everything it carries
before its body is traced: each cell's outputs and statistics, the loss,
and the factor pairs of the weight gradients each cell's backward defers
(which weights defer is known only once a backward is traced). Both are
read off concrete functions that are traced and never run; the backward
probe traces the very functions the loop then calls (cell_runner caches
them), so it costs no second trace. A factor layout also says how a
backward's factor pairs flatten into the loop's arrays and back.
"""

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline.cell import cell_gradients
from lingvo_pipe.pipeline.cell import cell_runner
from lingvo_pipe.pipeline.lowering import remat
from lingvo_pipe.pipeline.step import step_runner
from lingvo_pipe.pipeline.step.loop import loop_arrays

# Per cell: (weight index, specs of its flat factor pairs) of each weight
# whose gradient its backward defers.
FactorLayout = List[Tuple[int, List[tf.TensorSpec]]]


def TakeFactors(gradients: cell_gradients.CellGradients, split: bool) -> Dict[int, Any]:
  """The factor pairs of the backward just run: a split one's (for its
  W), else those kept for the step's end."""
  return gradients.TakeSplitFactors() if split else gradients.TakeFactors()


def Structures(runners: Sequence[cell_runner.CellRunner], thetas: Sequence[NestedMap],
               inputs: tuple, loss_fn: Optional[step_runner.MicroLossFn]
               ) -> Tuple[List[Any], List[Any], Optional[tf.TensorSpec]]:
  """Each cell's output and statistics structures (as TensorSpecs) and the
  loss's spec (None without loss_fn), from a trace of the chain."""
  def Chain():
    x, outs, updates = inputs, [], []
    for runner, theta in zip(runners, thetas):
      x, upd, _ = runner.Forward(theta, x)
      outs.append(x)
      updates.append(upd)
    loss = [step_runner.LossAndOutputGrads(loss_fn, x, 0, tf.constant(0))[0]] if loss_fn else []
    return outs, updates, loss

  traced = tf.function(Chain, autograph=False).get_concrete_function()
  outs, updates, loss = tf.nest.map_structure(
      lambda t: tf.TensorSpec(t.shape, t.dtype), traced.structured_outputs)
  return outs, updates, loss[0] if loss else None


def FactorLayouts(runners: Sequence[Sequence[cell_runner.CellRunner]],
                  micro_theta: Callable[[int, int, tf.Tensor], NestedMap],
                  in_structs: Sequence[Any], out_structs: Sequence[Any],
                  decisions: Sequence[remat.Decision], split: Sequence[bool],
                  num_micro: int) -> List[FactorLayout]:
  """Per cell its FactorLayout, from a trace of one backward per lane
  ([replica][cell] runners; every lane defers alike)."""
  indices: List[List[int]] = []

  def Probe():
    layouts = []
    for r, row in enumerate(runners):
      for c, runner in enumerate(row):
        x = tf.nest.pack_sequence_as(in_structs[c], loop_arrays.Zeros(
            loop_arrays.Specs(in_structs[c])))
        dy = tf.nest.pack_sequence_as(out_structs[c], loop_arrays.Zeros(
            loop_arrays.Specs(out_structs[c])))
        runner.Backward(micro_theta(r, c, tf.constant(0)), x, dy, decisions[c], num_micro)
        factors = TakeFactors(runner.gradients, split[c])
        if r == 0:
          indices.append(sorted(factors))
          layouts.append([[f for pair in factors[i] for f in pair] for i in sorted(factors)])
    return layouts

  traced = tf.function(Probe, autograph=False).get_concrete_function()
  return [[(i, loop_arrays.Specs(flat)) for i, flat in zip(cell_indices, cell)]
          for cell_indices, cell in zip(indices, traced.structured_outputs)]


def FactorSpecs(layout: FactorLayout, packed: bool) -> List[tf.TensorSpec]:
  """The specs of a cell's factors as the loop carries them. A B's: an
  array each, gathered after the loop straight into its weight's product
  (packed, they would need a gather and a split there, two more copies of
  them all alive at the step's peak). An I's `packed`: one vector per
  dtype, which its W reads back (an array per factor costs every
  iteration: ZB-V K=2 M=16 0.40 against 0.39 s a step, first step 4.0
  against 3.3 s)."""
  flat = [spec for _, specs in layout for spec in specs]
  if not packed:
    return flat
  sizes: Dict[tf.DType, int] = {}
  for spec in flat:
    sizes[spec.dtype] = sizes.get(spec.dtype, 0) + spec.shape.num_elements()
  return [tf.TensorSpec([n], dtype) for dtype, n in sorted(sizes.items(),
                                                          key=lambda kv: kv[0].name)]


def FlatBackward(x: tuple, dx: List[Any], gradients: cell_gradients.CellGradients,
                 split: bool, layout: FactorLayout) -> List[tf.Tensor]:
  """The backward just run: its flat input gradients (zeros for None), then
  its factors (TakeFactors) as FactorSpecs(layout, split) says."""
  factors = TakeFactors(gradients, split)
  flat = [f for i in sorted(factors) for pair in factors[i] for f in pair]
  if split:
    flat = [tf.concat([tf.reshape(f, [-1]) for f in flat if f.dtype == spec.dtype], 0)
            for spec in FactorSpecs(layout, packed=True)]
  return [tf.zeros_like(v) if g is None else g for v, g in zip(tf.nest.flatten(x), dx)] + flat


def Pairs(flat: Sequence[tf.Tensor], layout: FactorLayout, packed: bool
          ) -> Dict[int, List[Tuple[tf.Tensor, tf.Tensor]]]:
  """Each deferring weight's factor pairs from `flat` (FactorSpecs'):
  one micro-batch's packed vectors, or a B's arrays gathered
  ([micro-batches, rows, ...]), whose rows then come concatenated
  micro-batch after micro-batch."""
  specs = FactorSpecs(layout, packed=False)
  if packed:
    pieces: Dict[tf.DType, Any] = {}
    for vector, packed_spec in zip(flat, FactorSpecs(layout, packed=True)):
      sizes = [s.shape.num_elements() for s in specs if s.dtype == packed_spec.dtype]
      pieces[packed_spec.dtype] = iter(tf.split(vector, sizes))
    rows = iter([tf.reshape(next(pieces[s.dtype]), s.shape) for s in specs])
  else:
    rows = iter([tf.reshape(v, [-1] + s.shape[1:].as_list()) for v, s in zip(flat, specs)])
  pairs = {}
  for i, layout_specs in layout:
    values = [next(rows) for _ in layout_specs]
    pairs[i] = list(zip(values[0::2], values[1::2]))
  return pairs
