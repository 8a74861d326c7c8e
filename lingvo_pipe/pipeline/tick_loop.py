"""Fill-drain as a tf.while_loop over clock ticks: a step graph that does not grow with M.

The unrolled emission (gpipe) calls each cell's traced forward and backward
once per micro-batch: 2*K*M call ops, and TensorFlow's time to the first
step grows with them. Here the forward is one loop of M+K-1 ticks whose
body calls each of the K cells once, under a tf.cond that skips a cell with
no micro-batch at that tick (schedule.ForwardClockCycles: cell k runs
micro-batch t-k at tick t), and the backward is another such loop
(schedule.BackwardClockCycles: cell k runs micro-batch M-1-(t-(K-1-k))).
So the step holds 2K cell calls whatever M is.

Between ticks a cell's output travels in a loop variable (the register the
next cell reads at the next tick) and is also written into a TensorArray
indexed by tick, the stash from which the backward loop reads the cell's
inputs to recompute it; tick-indexed writes happen every tick (zeros for an
idle cell), so no write needs a condition. Every micro-batch is recomputed
(as RematPolicy.PER_CELL with remat_last_micro_batch, or PER_LAYER's
per-layer recomputation) and weight gradients are added into the cells'
accumulators (CellGradients.StartLoopStep, ZeroAccumulators); under
PER_CELL the projections' deferred factor pairs (deferred_grads) leave the
loop in tick-indexed TensorArrays too, and each weight takes one product
after it. Batch-norm statistics are summed in loop variables. Dropout
masks take the step seed [s0, m * micro-batch size] of micro-batch m, as
in the unrolled emission.
"""

from typing import Any, Callable, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline import cell_runner
from lingvo_pipe.pipeline import loop_arrays
from lingvo_pipe.pipeline import remat
from lingvo_pipe.pipeline.cell_gradients import IsDifferentiable


def MicroSeed(theta: NestedMap, first_example: Any) -> Optional[tf.Tensor]:
  """The step seed [s0, first_example] of a micro-batch whose first example
  has index `first_example` in the global batch (base_layer.WithStepSeed);
  None if no layer of theta uses a step seed."""
  seeds = [v for k, v in theta.FlattenItems()
           if k.split('.')[-1] == base_layer.STEP_SEED_KEY]
  if not seeds:
    return None
  return tf.stack([seeds[0][0], tf.cast(first_example, tf.int64)])


def MicroTheta(theta: NestedMap, first_example: tf.Tensor) -> NestedMap:
  """Cell theta for the micro-batch whose first example is `first_example`
  (a tensor) of the global batch."""
  seed = MicroSeed(theta, first_example)
  return theta if seed is None else base_layer.WithStepSeed(theta, seed)


def _Active(m: tf.Tensor, num_micro: int) -> tf.Tensor:
  return tf.logical_and(m >= 0, m < num_micro)


def _Clamp(m: tf.Tensor, num_micro: int) -> tf.Tensor:
  return tf.clip_by_value(m, 0, num_micro - 1)


class TickLoop:
  """The fill-drain training step of K cells over M micro-batches as two
  while loops (module docstring).

  Args:
    runners: the cells' CellRunners, by cell.
    thetas: each cell's theta (read on its device).
    micro_inputs: the pipeline's inputs of each micro-batch.
    micro_size: examples per micro-batch (dropout masks index examples).
    policy: the pipeline's RematPolicy (PER_LAYER recomputes per layer;
      every other policy recomputes each cell whole).
  """

  def __init__(self, runners: Sequence[cell_runner.CellRunner],
               thetas: Sequence[NestedMap], micro_inputs: Sequence[tuple],
               micro_size: int,
               policy: remat.RematPolicy) -> None:
    self._runners = list(runners)
    self._thetas = list(thetas)
    self._num_micro = len(micro_inputs)
    self._micro_size = micro_size
    self._num_cells = len(runners)
    self._ticks = self._num_micro + self._num_cells - 1
    self._input_struct = micro_inputs[0]
    self._decision = remat.Decision(record=False, inline=False,
                                    per_layer=policy == remat.RematPolicy.PER_LAYER,
                                    defer=policy == remat.RematPolicy.PER_CELL)
    with tf.device(runners[0].device):
      flat = [tf.nest.flatten(x) for x in micro_inputs]
      self._stacked_inputs = [tf.stack(list(column)) for column in zip(*flat)]
    # Each cell's output structure, from a throwaway trace of the chain.
    self._out_structs, self._update_structs = self._Structures(micro_inputs[0])

  def _MicroTheta(self, k: int, m: tf.Tensor) -> NestedMap:
    """Cell k's theta for micro-batch m (tick_loop.MicroTheta)."""
    return MicroTheta(self._thetas[k], m * self._micro_size)

  def _Structures(self, inputs: tuple) -> Tuple[List[Any], List[Any]]:
    def Chain():
      x, outs, updates = inputs, [], []
      for k, runner in enumerate(self._runners):
        x, upd, _ = runner.Forward(self._thetas[k], x)
        outs.append(x)
        updates.append(upd)
      return outs, updates

    traced = tf.function(Chain, autograph=False).get_concrete_function()
    specs = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype),
                                  traced.structured_outputs)
    return specs[0], specs[1]

  def _CellInputs(self, k: int, m: tf.Tensor, stash: List[List[tf.TensorArray]]
                  ) -> tuple:
    """Cell k's inputs of micro-batch m (clamped into range): the pipeline's
    for cell 0, else cell k-1's output stashed at tick m + k - 1."""
    m = _Clamp(m, self._num_micro)
    if k == 0:
      flat = [tf.gather(x, m) for x in self._stacked_inputs]
      return tf.nest.pack_sequence_as(self._input_struct, flat)
    flat = [a.read(m + k - 1) for a in stash[k - 1]]
    return tf.nest.pack_sequence_as(self._out_structs[k - 1], flat)

  def Forward(self) -> Tuple[tf.TensorArray, List[List[tf.TensorArray]], List[Any]]:
    """The forward loop. Returns the stash (per cell but the last, its
    outputs by tick), the last cell's outputs by tick, and per cell its
    statistics summed over micro-batches."""
    out_flat = [tf.nest.flatten(s) for s in self._out_structs]
    upd_flat = [tf.nest.flatten(s) for s in self._update_structs]
    arrays = [loop_arrays.Arrays(specs, self._ticks) for specs in out_flat]
    registers = [loop_arrays.Zeros(specs) for specs in out_flat]
    sums = [loop_arrays.Zeros(specs) for specs in upd_flat]

    def Body(t, registers, arrays, sums):
      new_registers, new_arrays, new_sums = [], [], []
      for k, runner in enumerate(self._runners):
        with tf.device(runner.device):  # the tick's ops of cell k, on its device
          m = t - k
          if k == 0:
            x = self._CellInputs(0, m, arrays)
          else:
            x = tf.nest.pack_sequence_as(self._out_structs[k - 1], registers[k - 1])

          def Run(k=k, runner=runner, x=x, m=m):
            out, upd, _ = runner.Forward(self._MicroTheta(k, m), x)
            return tf.nest.flatten(out) + tf.nest.flatten(upd)

          def Idle(k=k):
            return loop_arrays.Zeros(out_flat[k]) + loop_arrays.Zeros(upd_flat[k])

          result = tf.cond(_Active(m, self._num_micro), Run, Idle)
          outs, upds = result[:len(out_flat[k])], result[len(out_flat[k]):]
          new_registers.append(outs)
          new_arrays.append([a.write(t, y) for a, y in zip(arrays[k], outs)])
          new_sums.append([s + u for s, u in zip(sums[k], upds)])
      return t + 1, new_registers, new_arrays, new_sums

    _, _, arrays, sums = tf.while_loop(
        lambda t, *_: t < self._ticks, Body, (tf.constant(0), registers, arrays, sums))
    summed = [tf.nest.pack_sequence_as(self._update_structs[k], sums[k])
              for k in range(self._num_cells)]
    return arrays[-1], arrays[:-1], summed

  def LastOutputs(self, last: List[tf.TensorArray]) -> List[tuple]:
    """Per micro-batch the last cell's outputs (micro-batch m at tick m+K-1)."""
    k = self._num_cells - 1
    ticks = [m + k for m in range(self._num_micro)]
    columns = [tf.unstack(a.gather(ticks), self._num_micro) for a in last]
    return [tuple(tf.nest.pack_sequence_as(self._out_structs[k], list(flat)))
            for flat in zip(*columns)]

  def _FactorLayouts(self, stash: List[List[tf.TensorArray]],
                     output_grads: List[List[Any]]) -> List[List[Tuple[int, List[tf.TensorSpec]]]]:
    """Per cell, the weight gradients its backward defers: (weight index,
    specs of its flat factor pairs), from a throwaway trace of one backward
    per cell (the functions the loop then calls, traced once)."""

    indices: List[List[int]] = []  # per cell, its deferring weights

    def Probe():
      layouts = []
      for k, runner in enumerate(self._runners):
        m = tf.constant(0)
        x = self._CellInputs(k, m, stash)
        dy = tf.nest.pack_sequence_as(
            self._out_structs[k], [tf.zeros(s.shape, s.dtype)
                                   for s in tf.nest.flatten(self._out_structs[k])])
        runner.Backward(self._MicroTheta(k, m), x, dy, self._decision,
                        self._num_micro)
        factors = runner.gradients.TakeFactors()
        indices.append(sorted(factors))
        layouts.append([[t for pair in factors[i] for t in pair] for i in sorted(factors)])
      return layouts

    del output_grads
    traced = tf.function(Probe, autograph=False).get_concrete_function()
    return [[(i, loop_arrays.Specs(flat)) for i, flat in zip(cell_indices, cell)]
            for cell_indices, cell in zip(indices, traced.structured_outputs)]

  def Backward(self, stash: List[List[tf.TensorArray]],
               output_grads: List[List[Any]]) -> List[List[Any]]:
    """The backward loop, from the gradients of each micro-batch's flat last
    outputs; adds the weight gradients into the cells' accumulators (call
    CellGradients.StartLoopStep first) and hands the factors of deferred
    weight gradients of every micro-batch to the cells' CellGradients.
    Returns per micro-batch the gradients of the flat pipeline inputs (None
    where not floating)."""
    num_micro, last = self._num_micro, self._num_cells - 1
    for runner in self._runners:
      runner.gradients.StartLoopStep(num_micro)
    layouts = self._FactorLayouts(stash, output_grads)
    for k, runner in enumerate(self._runners):
      runner.gradients.ZeroAccumulators(self._thetas[k])
    factor_specs = [[s for _, specs in cell for s in specs] for cell in layouts]
    factor_arrays = [loop_arrays.Arrays(specs, self._ticks) for specs in factor_specs]
    with tf.device(self._runners[last].device):
      stacked_dys = [tf.stack(list(column)) for column in zip(*output_grads)]
    in_flat = [tf.nest.flatten(self._input_struct)] + [
        tf.nest.flatten(s) for s in self._out_structs[:-1]]
    in_specs = [loop_arrays.Specs(x) for x in in_flat]
    grad_arrays = loop_arrays.Arrays(in_specs[0], self._ticks)
    registers = [loop_arrays.Zeros(specs) for specs in in_specs[1:]]  # d(inputs of cell k>0)

    def Body(t, registers, grad_arrays, factor_arrays):
      new_registers: List[Any] = [None] * (self._num_cells - 1)
      new_factor_arrays: List[Any] = [None] * self._num_cells
      for k in reversed(range(self._num_cells)):
        runner = self._runners[k]
        with tf.device(runner.device):  # the tick's ops of cell k, on its device
          m = num_micro - 1 - (t - (last - k))
          x = self._CellInputs(k, m, stash)
          if k == last:
            dy_flat = [tf.gather(d, _Clamp(m, num_micro)) for d in stacked_dys]
          else:
            dy_flat = registers[k]
          dy = tf.nest.pack_sequence_as(self._out_structs[k], dy_flat)

          def Run(k=k, runner=runner, x=x, dy=dy, m=m):
            dx = runner.Backward(self._MicroTheta(k, m), x, dy,
                                 self._decision, num_micro)
            factors = runner.gradients.TakeFactors()
            return [tf.zeros_like(v) if g is None else g
                    for v, g in zip(tf.nest.flatten(x), dx)] + [
                        t for i in sorted(factors) for pair in factors[i] for t in pair]

          def Idle(x=x, k=k):
            return ([tf.zeros_like(v) for v in tf.nest.flatten(x)] +
                    loop_arrays.Zeros(factor_specs[k]))

          result = tf.cond(_Active(m, num_micro), Run, Idle)
          num_dx = len(tf.nest.flatten(x))
          dx, factors = result[:num_dx], result[num_dx:]
          new_factor_arrays[k] = [a.write(t, f) for a, f in zip(factor_arrays[k], factors)]
          if k > 0:
            new_registers[k - 1] = dx
          else:
            grad_arrays = [a.write(t, g) for a, g in zip(grad_arrays, dx)]
      return t + 1, new_registers, grad_arrays, new_factor_arrays

    _, _, grad_arrays, factor_arrays = tf.while_loop(
        lambda t, *_: t < self._ticks, Body,
        (tf.constant(0), registers, grad_arrays, factor_arrays))
    for k, runner in enumerate(self._runners):
      # Cell k runs micro-batch m at tick (K-1-k) + M-1-m: every m's pairs.
      ticks = [last - k + num_micro - 1 - m for m in range(num_micro)]
      flat = iter(factor_arrays[k])
      factors = {}
      with tf.device(runner.device):
        for i, specs in layouts[k]:
          arrays = [loop_arrays.GatherRows(next(flat), ticks) for _ in specs]
          factors[i] = [(arrays[j], arrays[j + 1]) for j in range(0, len(arrays), 2)]
      runner.gradients.PutFactors(factors)
    # Cell 0 runs micro-batch m at tick K-1 + M-1-m.
    ticks = [last + num_micro - 1 - m for m in range(num_micro)]
    with tf.device(self._runners[0].device):
      columns = [tf.unstack(g.gather(ticks), num_micro) if IsDifferentiable(x)
                 else [None] * num_micro for g, x in zip(grad_arrays, in_flat[0])]
    return [list(grads) for grads in zip(*columns)]


def Applicable(num_micro: int, min_micro_batches: int) -> bool:
  """Whether the pipeline runs the loop: M >= min_micro_batches > 0 and
  M > 1 (with one micro-batch the unrolled step is as small)."""
  return 0 < min_micro_batches <= num_micro and num_micro > 1


LoopFactory = Callable[..., TickLoop]
