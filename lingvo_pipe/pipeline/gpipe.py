"""PipeliningLayer: GPipe (arXiv 1811.06965) over K cells and M micro-batches.

The layer holds the params, the layers and the resolved plan (plan.py:
cells, devices of every replica, the schedule's actions, remat); one
executor (executor.py) runs the plan's actions. FProp trains with the loss
outside the pipeline as one `tf.custom_gradient`: its forward runs every
forward of the schedule (fill), its gradient function the rest (drain), so
it runs schedules whose devices finish their forwards first (fill-drain).
FPropWithLoss takes a per-micro-batch loss function and runs forwards,
losses and backwards of any schedule (1F1B, interleaved, zero bubble, or
a text) in one go. With M >= p.loop_min_micro_batches the same actions run
as one while loop over clocks (loop_executor). Batch-norm statistics are summed over micro-batches and
applied once per step.
"""

from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core import precision
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline import cell_compilation
from lingvo_pipe.pipeline import cell_runner
from lingvo_pipe.pipeline import cells
from lingvo_pipe.pipeline.cells import CellParams
from lingvo_pipe.pipeline import cluster
from lingvo_pipe.pipeline import executor
from lingvo_pipe.pipeline import loop_executor
from lingvo_pipe.pipeline import micro_batch
from lingvo_pipe.pipeline import partition
from lingvo_pipe.pipeline import plan as plan_lib
from lingvo_pipe.pipeline import schedule
from lingvo_pipe.pipeline.cell_compilation import CellCompilation
from lingvo_pipe.pipeline.remat import RematPolicy


class PipeliningLayer(base_layer.BaseLayer):
  """Splits a sequence of layers into K cells on K devices and pipelines
  M micro-batches through them. Equal to the unpartitioned network in
  outputs, loss and gradients for every K and M.

  The micro-batch contract is declared, never guessed from shapes
  (micro_batch module docstring). Inputs (tensors or nested structures) are
  split into micro-batches along batch_dim and must all carry the same batch
  size there, except those named in p.broadcast_inputs, which reach every
  micro-batch whole and get the sum of the micro-batches' gradients. A
  cell's outputs are the next cell's inputs. The last cell's outputs are
  concatenated along batch_dim and must carry the micro-batch size there,
  except those named in p.summed_outputs, which are summed over
  micro-batches: cells add auxiliary loss terms or metrics to a scalar they
  carry along, and summed_outputs names it.
  """

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('cell_tpl', [], 'Manual partition: params of each cell (usually '
             'SequentialLayer params). Exclusive with layers.')
    p.Define('layers', [], 'Automatic partition: params of all layers, in '
             'order, split into num_partitions cells or at splits.')
    p.Define('num_partitions', 0, 'K for the automatic partition.')
    p.Define('splits', [], 'Manual split points for layers, e.g. [3, 7, 12].')
    p.Define('cost', partition.CostKind.FLOPS,
             'What the automatic partition balances (a CostKind).')
    p.Define('input_shapes', None, 'List of the shapes of the pipeline '
             'inputs, batch included, e.g. [[64, 512]]: needed for the '
             'automatic partition and to check cell boundaries at build.')
    p.Define('num_micro_batches', 1, 'M, micro-batches per mini-batch.')
    p.Define('micro_batch_size', 0, 'Alternative to num_micro_batches: '
             'examples per micro-batch (0: use num_micro_batches).')
    p.Define('batch_dim', 0, '0: batch-major inputs, 1: time-major.')
    p.Define('broadcast_inputs', [], 'Inputs that every micro-batch gets '
             'whole (e.g. a table or mask shared by all examples), by index '
             "of FProp's positional inputs or by path inside one: '1.mask' "
             'is key mask of NestedMap input 1 (micro_batch module '
             'docstring). Their gradient is the sum over micro-batches. All '
             'other inputs are split along batch_dim and must have the same '
             'size there.')
    p.Define('summed_outputs', [], "Outputs of the last cell (indices or "
             "paths into its output tuple, as for broadcast_inputs) summed "
             'over micro-batches: auxiliary loss terms, metrics. All other '
             'outputs are concatenated along batch_dim and must have the '
             'micro-batch size there.')
    p.Define('devices', None, 'Device names of the cells, replica after '
             'replica (with one cell per device, cell k of replica r on '
             'devices[(r*K + k) // max(consecutive_cells_per_device, 1)]); '
             'None: device 0 of each worker task '
             'when connected to a cluster, else the local devices '
             '(device_mapping.DefaultDevices).')
    p.Define('num_replicas', 1, 'R: copies of the K-cell pipeline, each fed '
             '1/R of the batch (R*M micro-batches in all), with any schedule; '
             "their gradients are summed on each variable's device (replica "
             "0's cells) and applied once (docs/design.md, \"Pipeline "
             'replicas"). Evaluation runs replica 0 alone on the whole batch.')
    p.Define('consecutive_cells_per_device', 0, 'Consecutive cells (of the '
             'R*K) per device of `devices`, e.g. 2 to put 4 cells on 2 worker '
             'tasks; 0: one cell per device. (cells_per_device interleaves '
             'cells instead.)')
    p.Define('remat', RematPolicy.PER_CELL, 'A RematPolicy.')
    p.Define('remat_last_micro_batch', False, 'With RematPolicy.PER_CELL, '
             "recompute each cell's last micro-batch too. False keeps its "
             "activations (torchgpipe's except_last): its backward is the "
             "cell's first, and recomputing would restore them all for it "
             "anyway, so no device's peak grows. PER_LAYER always recomputes.")
    p.Define('schedule', schedule.ScheduleKind.GPIPE, 'A ScheduleKind: '
             'GPIPE, ONE_F_ONE_B, INTERLEAVED, ZB_H1, ZB_H2 or ZB_V. GPIPE '
             'trains through FProp and an outer tape, or FPropWithLoss; the '
             'others start backwards before the last forward and need the '
             'loss inside the pipeline: train them through FPropWithLoss.')
    p.Define('schedule_text', '', 'A schedule of your own, replacing '
             "p.schedule: PyTorch pipelining's notation, one line per device "
             "(or lines separated by ';'), e.g. '0F0,0F1,0B0,0B1;1F0,1B0,"
             "1F1,1B1' (pipeline/schedule_text.py); it names each action's "
             'cell and micro-batch, so it fixes the cells and M.')
    p.Define('loop_min_micro_batches', 0, 'Train with M >= this as one '
             'tf.while_loop over clocks (loop_executor): a step graph of a '
             'few calls per cell whatever M, for every schedule and replicas; '
             "every micro-batch recomputed but the last cell's that remat "
             'keeps. 0: never, always the unrolled emission (executor).')
    p.Define('cells_per_device', 1, 'v: cells per device, for '
             'ScheduleKind.INTERLEAVED (cell j on device j mod K, K = '
             'cells / v); set num_partitions (or cell_tpl) to K*v cells. '
             'ZB_V always puts 2 on each device (cells d and 2K-1-d).')
    p.Define('jit_compile', CellCompilation.NONE, 'A CellCompilation: XLA '
             "compiles each cell's forward and backward on its device "
             '(pipeline/cell_compilation.py says what stays outside).')
    return p

  # The cells are views of the layers (cells.CellView), the runners hold
  # traced functions and the plan is data: none is part of the model's
  # variables.
  _TF_MODULE_IGNORED_PROPERTIES = frozenset(
      ('_cells', '_cell_layer_indices', '_runners', '_replica_runners',
       'plan')).union(
          base_layer.BaseLayer._TF_MODULE_IGNORED_PROPERTIES)

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    layer_params, layer_runs = cells.LogicalLayers(p)
    self.__dict__['_cell_layer_indices'] = layer_runs
    cell_params = cells.CellParamsOf(p, layer_params, layer_runs)
    self._contract = micro_batch.Contract.FromParams(p)
    self._CheckMicroBatching(cell_params)
    devices = [cluster.Device.Parse(d) for d in p.devices] if p.devices else None
    resolved = plan_lib.FromParams(p, len(cell_params), devices)
    if not p.micro_batch_size:
      resolved.Actions(p.num_micro_batches)  # M against the schedule, at build
    self.__dict__['plan'] = resolved
    self.num_devices = resolved.num_devices
    self.num_cells = resolved.num_cells
    # [replica][cell]; the variables live on replica 0's devices.
    self.replica_devices = [list(row) for row in resolved.replica_devices]
    self.devices = self.replica_devices[0]
    # The layers are the pipeline's own, named and initialized by their
    # place in the unpartitioned network; each on its cell's device.
    layer_devices = [''] * len(layer_params)
    for k, run in enumerate(self._cell_layer_indices):
      for i in run:
        layer_devices[i] = self.devices[k].name
    self.CreateChildren('layers', layer_params, devices=layer_devices)
    with self.name_scope:
      views = [cells.CellView(cp, [self.layers[i] for i in run])
               for cp, run in zip(cell_params, self._cell_layer_indices)]
    self.__dict__['_cells'] = views
    jit = cell_compilation.Compiles(p.jit_compile, self.fprop_dtype)
    self.__dict__['_replica_runners'] = [
        [cell_runner.CellRunner(cell, d.name, jit) for cell, d in zip(views, row)]
        for row in self.replica_devices]
    self.__dict__['_runners'] = self._replica_runners[0]

  @property
  def cells(self) -> List[base_layer.BaseLayer]:
    """The cells, views of runs of self.layers (cells.CellView)."""
    return list(self._cells)

  def CellLayerIndices(self) -> List[List[int]]:
    """For each cell, the indices of its layers in self.layers."""
    return [list(run) for run in self._cell_layer_indices]

  def CellThetas(self, theta: NestedMap) -> List[NestedMap]:
    """Each cell's theta, from the pipeline's theta (its layers')."""
    return [cells.CellTheta(theta.layers, run) for run in self._cell_layer_indices]

  def _CheckMicroBatching(self, cell_params: List[hyperparams.Params]) -> None:
    """Checks M, and with input_shapes the cell boundaries and the
    micro-batch contract, before any cell is built."""
    p = self.params
    micro_batch.NumMicroBatches(p, None)
    if p.input_shapes is None:
      return
    shapes = layer_meta.Shapes(*p.input_shapes)
    micro_batch.NumMicroBatches(p, self._contract.InputLayout(shapes).batch_size)
    out_shapes = _CheckCellBoundaries(cell_params, shapes)
    self._contract.SummedOutputs(containers.AsTuple(out_shapes))

  # --- forward -------------------------------------------------------------

  def FProp(self, theta: NestedMap, *inputs: Any) -> Any:
    num_micro = self._NumMicro(inputs)
    thetas = self._ReadThetas(theta)
    if base_layer.IsEvalMode():
      run, slices = self._Executor(self._ComputeThetas(thetas), inputs, num_micro,
                                   training=False)
      return containers.UnwrapSingle(self._Outputs(run.Forwards(), slices))
    if not self.plan.ForwardsFirst(num_micro):
      raise ValueError(
          f'PipeliningLayer {self.params.name!r}: schedule '
          f'{_Name(self.params)} starts backwards before the last '
          'forward, so it trains with the loss inside the pipeline: call '
          'FPropWithLoss(theta, loss_fn, *inputs) instead of FProp, or use '
          'ScheduleKind.GPIPE.')
    return containers.UnwrapSingle(self._Train(thetas, inputs, num_micro))

  def FPropWithLoss(self, theta: NestedMap, loss_fn: executor.MicroLossFn,
                    *inputs: Any) -> Tuple[tf.Tensor, Any]:
    """The loss and the outputs, with the loss inside the pipeline.

    Args:
      theta: the layer's theta.
      loss_fn: the last cell's outputs of one micro-batch (as FProp returns
        outputs) -> that micro-batch's scalar loss, run on the last cell's
        device as soon as its forward ends. The step's loss is the sum over
        micro-batches: a mean over the batch divides by the whole batch's
        count in each micro-batch. It may read tensors computed before the
        pipeline, but its gradient reaches only the pipeline's outputs.
      *inputs: as for FProp.

    Returns:
      (loss, outputs). In training the loss's gradient (of the inputs and
      theta) runs the backward in p.schedule's order, within the forward
      (executor), and the outputs are not differentiable; the outer
      GradientTape and optimizer code is that of FProp's.
    """
    num_micro = self._NumMicro(inputs)
    thetas = self._ReadThetas(theta)
    if base_layer.IsEvalMode():
      run, slices = self._Executor(self._ComputeThetas(thetas), inputs, num_micro,
                                   training=False, loss_fn=loss_fn)
      last_outputs = run.Forwards()
      return run.Loss(), containers.UnwrapSingle(self._Outputs(last_outputs, slices))
    loss, outputs = self._TrainWithLoss(thetas, inputs, num_micro, loss_fn)
    return loss, containers.UnwrapSingle(outputs)

  def _NumMicro(self, inputs: tuple) -> int:
    """M of a step (checked against the schedule)."""
    num_micro = micro_batch.NumMicroBatches(
        self.params, self._contract.InputLayout(inputs).batch_size)
    self.plan.Actions(num_micro)
    return num_micro

  def _ReadThetas(self, theta: NestedMap) -> List[NestedMap]:
    """Each cell's variables read on its device."""
    thetas = []
    for k, t in enumerate(self.CellThetas(theta)):
      with tf.device(self.devices[k].name):
        thetas.append(tf.nest.map_structure(tf.convert_to_tensor, t))
    return thetas

  def _ComputeThetas(self, thetas: List[NestedMap]) -> List[NestedMap]:
    """Each cell's theta cast to the dtypes its layers compute with
    (core/precision), once per step on the cell's device; the identity in
    float32."""
    cast = []
    for k, theta in enumerate(thetas):
      with tf.device(self.devices[k].name):
        cast.append(precision.CastTheta(self.cells[k], theta))
    return cast

  def _Executor(self, thetas: List[NestedMap], inputs: tuple, num_micro: int,
                training: bool, loss_fn: Optional[executor.MicroLossFn] = None
                ) -> Tuple[Any, List[tuple]]:
    """The step's executor and the replicas' slices of the inputs (the
    batch cut into R slices, each into M micro-batches on its replica's
    first device). The one place that chooses the emission: a loop over
    clocks (loop_executor) for training with M >= p.loop_min_micro_batches,
    else unrolled (executor)."""
    resolved = self.plan if training else self.plan.ReplicaZero()
    num_replicas = resolved.num_replicas
    slices = self._contract.SplitInputs(inputs, num_replicas) if num_replicas > 1 else [inputs]
    micro = []
    for r, row in enumerate(resolved.replica_devices):
      with tf.device(row[0].name):
        micro.append(self._contract.SplitInputs(slices[r], num_micro))
    micro_size = self._contract.InputLayout(micro[0][0]).batch_size
    if training and resolved.Loops(num_micro):
      return loop_executor.LoopExecutor(resolved, self._replica_runners, thetas, micro,
                                        micro_size, loss_fn), slices
    return executor.Executor(resolved, self._replica_runners, thetas, micro,
                             micro_size, training, loss_fn), slices

  def _Outputs(self, last_outputs: List[List[tuple]], slices: List[tuple]) -> tuple:
    """The last cell's outputs of the whole batch."""
    last = self.num_cells - 1
    per_replica = []
    for r, row in enumerate(self.replica_devices[:len(slices)]):
      micro_size = self._contract.InputLayout(slices[r]).batch_size // len(last_outputs[r])
      with tf.device(row[last].name):
        per_replica.append(self._contract.MergeOutputs(last_outputs[r], micro_size))
    if len(per_replica) == 1:
      return tuple(per_replica[0])
    replica_size = self._contract.InputLayout(slices[0]).batch_size
    return tuple(self._contract.MergeOutputs(per_replica, replica_size))

  def _InputGrads(self, input_grads: List[List[List[Any]]],
                  slices: List[tuple]) -> List[Any]:
    """The gradients of the flat pipeline inputs of the whole batch."""
    per_replica = []
    for r, row in enumerate(self.replica_devices):
      with tf.device(row[0].name):
        per_replica.append(self._contract.MergeInputGrads(slices[r], input_grads[r]))
    if len(per_replica) == 1:
      return per_replica[0]
    return self._contract.MergeInputGrads(slices[0], per_replica)

  # --- training --------------------------------------------------------------

  def _Train(self, thetas: List[NestedMap], inputs: tuple, num_micro: int) -> tuple:
    """The training forward (every F), with the rest of the schedule as
    its custom gradient. The forward applies the cells' statistics, so its
    outputs are all it returns; tf.custom_gradient takes and returns nests."""

    @tf.custom_gradient
    def Pipeline(step_inputs, cell_thetas):
      run, slices = self._Executor(self._ComputeThetas(cell_thetas), step_inputs,
                                   num_micro, training=True)
      last_outputs = run.Forwards()
      outputs = self._Outputs(last_outputs, slices)
      self._ApplyCellUpdates(run.Updates())
      flat_out = tf.nest.flatten(outputs)

      def Grad(*dys, variables=None):
        del variables  # the pipeline reads no variables; theta is passed in
        dys = [tf.zeros_like(y) if dy is None else dy for y, dy in zip(flat_out, dys)]
        result = run.Backwards(self._OutputGrads(last_outputs, dys))
        return (self._InputGrads(result.input_grads, slices) +
                [g for cell in result.theta_grads for g in cell])

      return outputs, Grad

    return Pipeline(inputs, thetas)

  def _OutputGrads(self, last_outputs: List[List[tuple]], dys: List[Any]
                   ) -> List[List[List[Any]]]:
    """[replica][micro-batch] the gradients of the last cell's flat outputs,
    from those of the whole batch's."""
    last = self.num_cells - 1
    num_replicas, num_micro = len(last_outputs), len(last_outputs[0])
    per_replica = (self._contract.SplitOutputGrads(last_outputs[0][0], dys, num_replicas)
                   if num_replicas > 1 else [dys])
    split = []
    for r, row in enumerate(self.replica_devices):
      with tf.device(row[last].name):
        split.append(self._contract.SplitOutputGrads(
            last_outputs[r][0], per_replica[r], num_micro))
    return split

  def _TrainWithLoss(self, thetas: List[NestedMap], inputs: tuple,
                     num_micro: int, loss_fn: executor.MicroLossFn
                     ) -> Tuple[tf.Tensor, tuple]:
    """The training step of p.schedule with the loss inside: forwards,
    losses and backwards all run in the forward of one tf.custom_gradient,
    whose gradient scales the stored gradients by the loss's upstream
    gradient."""
    devices = [d.name for d in self.devices]

    @tf.custom_gradient
    def Pipeline(step_inputs, cell_thetas):
      run, slices = self._Executor(self._ComputeThetas(cell_thetas), step_inputs,
                                   num_micro, training=True, loss_fn=loss_fn)
      result = run.Run()
      outputs = self._Outputs(result.last_outputs, slices)
      d_inputs = self._InputGrads(result.input_grads, slices)
      self._ApplyCellUpdates(result.updates)

      def Grad(d_loss, *unused_d_outputs, variables=None):
        grads = _Scale(d_inputs, d_loss, devices[0])
        for k, cell_grads in enumerate(result.theta_grads):
          grads += _Scale(cell_grads, d_loss, devices[k])
        return (grads, [None] * len(variables)) if variables else grads

      return (result.loss, outputs), Grad

    loss, outputs = Pipeline(inputs, thetas)
    return loss, tf.nest.map_structure(tf.stop_gradient, outputs)

  def _ApplyCellUpdates(self, summed: List[NestedMap]) -> None:
    for k, cell in enumerate(self.cells):
      if cell.HasUpdates():
        with tf.device(self.devices[k].name):
          cell.ApplyUpdates(summed[k])

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, *input_shapes: Any) -> layer_meta.LayerMeta:
    return containers.ChainMeta(CellParams(params), input_shapes)


def _Scale(grads: Sequence[Any], scale: tf.Tensor, device: str) -> List[Any]:
  """`grads` times the scalar `scale` on `device` (None stays None): the
  stored gradients of a loss, for an upstream gradient `scale` of it."""
  with tf.device(device):
    return [None if g is None else g * tf.cast(scale, g.dtype) for g in grads]


def _Name(p: hyperparams.Params) -> str:
  return 'schedule_text' if p.schedule_text else p.schedule.name


def _CheckCellBoundaries(cells: Sequence[hyperparams.Params], shapes: tuple) -> Any:
  """Chains FPropMeta through the cells so a shape clash fails at build;
  returns the last cell's output shapes."""
  for k, cp in enumerate(cells):
    try:
      shapes = cp.cls.FPropMeta(cp, *shapes).out_shapes
    except (ValueError, TypeError) as e:
      raise ValueError(f'Cell {k} does not accept the output of cell {k - 1} '
                       f'(shapes {[str(s) for s in shapes]}): {e}') from e
  return shapes
