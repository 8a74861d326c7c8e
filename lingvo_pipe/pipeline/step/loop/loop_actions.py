"""The body of each kind of action in a device's loop (loop_executor): F, X (B or I), W and KEPT.

Each runs one cell's action on micro-batch m (a tensor: the loop's
iteration picks it) inside its branch of the loop's tf.switch_case: it
takes what it reads from the step's inputs, the queue from the previous
or next cell, or the device's arrays (loop_state), and puts what it makes
into its pieces of the iteration or into a queue, returning the queue
writes the next iteration must wait for.
"""

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import tensorflow as tf

from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline.cell import cell_runner
from lingvo_pipe.pipeline.lowering import loop_tables
from lingvo_pipe.pipeline.lowering import remat
from lingvo_pipe.pipeline.step import step_runner
from lingvo_pipe.pipeline.step.loop import loop_arrays
from lingvo_pipe.pipeline.step.loop import loop_probes
from lingvo_pipe.pipeline.step.loop import loop_queues
from lingvo_pipe.pipeline.step.loop import loop_state

Pieces = Dict[str, List[tf.Tensor]]  # one cell's pieces of an iteration, per key


@dataclasses.dataclass(frozen=True)
class LoopActions:
  """What the actions of one loop step read (loop_executor builds it).

  Attributes:
    runners: [replica][cell] the CellRunners.
    queues: [replica] loop_queues.Build's queues.
    stacked_inputs: [replica] the pipeline's flat inputs, micro-batches stacked.
    input_struct, out_structs: the pipeline inputs' structure; each cell's outputs'.
    tables, specs, layouts: the loop tables, loop_state.Specs, and per cell
      its loop_probes.FactorLayout.
    decisions: per cell its backwards' remat.Decision (Program.loop_backwards).
    kept_decision: the last cell's kept forwards' decision, or None.
    loss_fn: the per-micro-batch loss, or None; training: whether a training step.
    num_micro, num_cells: M and the number of cells.
  """
  runners: List[List[cell_runner.CellRunner]]
  queues: List[Dict[str, List[loop_queues.Pair]]]
  stacked_inputs: List[List[tf.Tensor]]
  input_struct: Any
  out_structs: List[Any]
  tables: loop_tables.LoopTables
  specs: loop_state.Specs
  layouts: List[loop_probes.FactorLayout]
  decisions: Tuple[remat.Decision, ...]
  kept_decision: Optional[remat.Decision]
  loss_fn: Optional[step_runner.MicroLossFn]
  training: bool
  num_micro: int
  num_cells: int

  def Forward(self, r: int, c: int, m: tf.Tensor, theta: NestedMap,
               pieces: Pieces) -> List[Any]:
    """F: cell c's outputs on to the next cell (or, the last, kept with
    its loss and output gradients); its inputs kept for its backward."""
    x = self._Inputs(r, c, m, pieces)
    out, upd, _ = self.runners[r][c].Forward(theta, x)
    pieces['sums'] = tf.nest.flatten(upd)
    return self._Outputs(r, c, m, out, pieces)

  def _Outputs(self, r: int, c: int, m: tf.Tensor, out: tuple,
               pieces: Pieces) -> List[Any]:
    """Cell c's outputs of micro-batch m to the next cell's queue, or the
    last cell's into its pieces with (loss inside) its loss and output
    gradients."""
    if c < self.num_cells - 1:
      return [self.queues[r]['acts'][c][0].enqueue(tf.nest.flatten(out))]
    pieces['outs'] = tf.nest.flatten(out)
    if self.loss_fn and self.training:
      micro_loss, dy = step_runner.LossAndOutputGrads(self.loss_fn, out, r, m)
      pieces['loss'], pieces['dys'] = [micro_loss], dy
    return []

  def _Inputs(self, r: int, c: int, m: tf.Tensor, pieces: Pieces
              ) -> tuple:
    """A forward's inputs: the pipeline's for cell 0, else from the queue
    (into its piece of the ring)."""
    if c == 0:
      return self._StepInputs(r, m)
    flat = loop_queues.Dequeue(self.queues[r]['acts'][c - 1][1])
    pieces['ins'] = flat
    return tf.nest.pack_sequence_as(self._InStruct(c), flat)

  def _StepInputs(self, r: int, m: tf.Tensor) -> tuple:
    """Micro-batch m of replica r's pipeline inputs (cell 0's)."""
    return tf.nest.pack_sequence_as(self.input_struct,
                                    [tf.gather(x, m) for x in self.stacked_inputs[r]])

  def _InStruct(self, c: int) -> Any:
    return self.input_struct if c == 0 else self.out_structs[c - 1]

  def Backward(self, r: int, c: int, m: tf.Tensor, theta: NestedMap, place: int,
                state: Dict[str, Any], pieces: Pieces) -> List[Any]:
    """X: from the ring of cell c's inputs and its output gradients (the
    loss's from their ring, or the next cell's from the queue), its input
    gradients on (queue, or d_inputs for cell 0) and its factors kept."""
    runner, last = self.runners[r][c], self.num_cells - 1
    if c == 0:
      x = self._StepInputs(r, m)
    else:
      slot = m % loop_state.InputDepth(self.tables, c)
      x = tf.nest.pack_sequence_as(self._InStruct(c), loop_arrays.Read(
          state['ins'][place], slot, self.specs.ins[c]))
    if c == last:
      depth = loop_state.LossGradientDepth(self.specs, self.tables)
      flat_dy = loop_arrays.Read(state['dys'], m % depth, self.specs.outs[c])
    else:
      flat_dy = loop_queues.Dequeue(self.queues[r]['grads'][c][1])
    dy = tf.nest.pack_sequence_as(self.out_structs[c], flat_dy)
    backward = runner.Backward(theta, x, dy, self.decisions[c], self.num_micro)
    return self._InputGrads(r, c, x, backward, pieces)

  def _InputGrads(self, r: int, c: int, x: tuple, backward: cell_runner.Backwarded,
                  pieces: Pieces) -> List[Any]:
    flat = loop_probes.FlatBackward(x, backward.input_grads, self.runners[r][c].gradients,
                                    self.tables.split[c], self.layouts[c])
    num_in = len(self.specs.ins[c])
    pieces['factors'] = flat[num_in:]
    if c == 0:
      pieces['d_inputs'] = flat[:num_in]
      return [backward.done]
    return [backward.done, self.queues[r]['grads'][c - 1][0].enqueue(flat[:num_in])]

  def Weights(self, c: int, m: tf.Tensor, runner: cell_runner.CellRunner,
               factors: List[tf.TensorArray], pieces: Pieces) -> List[Any]:
    """W: the products of micro-batch m's factors (from their ring) added
    to cell c's weight sums."""
    slot = m % self.tables.factor_rings[c]
    products = runner.gradients.Products(
        loop_probes.Pairs(loop_arrays.Read(factors, slot, self.specs.factors[c]),
                          self.layouts[c], packed=True))
    pieces['weight_sums'] = [s + products[i]
                             for s, (i, _) in zip(pieces['weight_sums'], self.layouts[c])]
    return []

  def Kept(self, r: int, m: tf.Tensor, theta: NestedMap,
            pieces: Pieces) -> List[Any]:
    """The last cell's forward of micro-batch m recorded, its loss, and its
    backward from the record."""
    c = self.num_cells - 1
    runner = self.runners[r][c]
    x = self._Inputs(r, c, m, pieces)
    out, upd, recording = runner.Forward(theta, x,
                                         self.kept_decision, self.num_micro)
    if self.loss_fn is None or recording is None:  # KEPT's premises
      raise RuntimeError('A kept last-cell forward needs the loss inside and a recorded '
                         'forward: a bug in the loop tables.')
    pieces['sums'] = tf.nest.flatten(upd)
    self._Outputs(r, c, m, out, pieces)
    backward = runner.BackwardFromTape(recording, x, out,
                                       tf.nest.pack_sequence_as(out, pieces['dys']))
    return self._InputGrads(r, c, x, backward, pieces)
