"""PipeliningLayer: GPipe (arXiv 1811.06965) over K cells and M micro-batches.

Training runs one `tf.custom_gradient` over the whole pipeline. Its forward
streams the micro-batches through the cells in schedule order (fill) and
keeps only each cell's inputs; its gradient function streams them back in
reverse (drain), recomputing each cell on its own device, and sums each
cell's weight gradients over the micro-batches on that device (the cell's
CellGradients). What each micro-batch keeps or recomputes is remat.Decide's:
under per-cell remat each cell's last micro-batch keeps its activations
instead of being recomputed, unless asked (torchgpipe's 'except_last').
Batch-norm statistics are summed over micro-batches and applied once per
step.

FPropWithLoss takes a per-micro-batch loss function and runs the loss
inside the pipeline, in the order of p.schedule (scheduled_step, or with
p.loop_min_micro_batches one while loop over its clocks, scheduled_loop):
the way to train with 1F1B or the interleaved schedule, whose backwards
start before the last forward.
"""

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

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
from lingvo_pipe.pipeline import device_mapping
from lingvo_pipe.pipeline import micro_batch
from lingvo_pipe.pipeline import partition
from lingvo_pipe.pipeline import remat
from lingvo_pipe.pipeline import replicas
from lingvo_pipe.pipeline import schedule
from lingvo_pipe.pipeline.cell_compilation import CellCompilation
from lingvo_pipe.pipeline import scheduled_loop
from lingvo_pipe.pipeline import scheduled_step
from lingvo_pipe.pipeline import tick_loop
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
             '1/R of the batch (R*M micro-batches in all); their gradients '
             "are summed on each variable's device (replica 0's cells) and "
             'applied once (docs/design.md, "Pipeline replicas"). '
             'Evaluation runs replica 0 alone on the whole batch.')
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
    p.Define('schedule', schedule.ScheduleKind.GPIPE, 'A ScheduleKind. '
             'GPIPE trains through FProp and an outer tape, or FPropWithLoss; '
             'ONE_F_ONE_B and INTERLEAVED need the loss inside the pipeline: '
             'train them through FPropWithLoss.')
    p.Define('loop_min_micro_batches', 0, 'Train with M >= this as a '
             'tf.while_loop over clock ticks: a step graph of at most 2 '
             'calls per cell whatever M. FProp (GPIPE) runs tick_loop, every '
             'micro-batch recomputed; FPropWithLoss (any schedule) runs '
             "scheduled_loop, which keeps only the last cell's micro-batches "
             'that remat keeps. 0: never, always the unrolled emission.')
    p.Define('cells_per_device', 1, 'v: cells per device, for '
             'ScheduleKind.INTERLEAVED (cell j on device j mod K, K = '
             'cells / v); set num_partitions (or cell_tpl) to K*v cells.')
    p.Define('jit_compile', CellCompilation.NONE, 'A CellCompilation: XLA '
             "compiles each cell's forward and backward on its device "
             '(pipeline/cell_compilation.py says what stays outside).')
    return p

  # The cells are views of the layers (cells.CellView) and the runners
  # hold traced functions: neither is part of the model's variables.
  _TF_MODULE_IGNORED_PROPERTIES = frozenset(
      ('_cells', '_cell_layer_indices', '_runners', '_replica_runners')).union(
          base_layer.BaseLayer._TF_MODULE_IGNORED_PROPERTIES)

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    layer_params, layer_runs = cells.LogicalLayers(p)
    self.__dict__['_cell_layer_indices'] = layer_runs
    cell_params = cells.CellParamsOf(p, layer_params, layer_runs)
    self._contract = micro_batch.Contract.FromParams(p)
    self._CheckMicroBatching(cell_params)
    self.num_devices = _NumDevices(p, len(cell_params))
    devices = [cluster.Device.Parse(d) for d in p.devices] if p.devices else None
    # [replica][cell]: cell k on its replica's device k mod K (interleaved
    # stages put cells_per_device cells on each); the variables live on
    # replica 0's devices.
    stage_devices = device_mapping.PlaceReplicas(
        self.num_devices, p.num_replicas, devices, p.consecutive_cells_per_device)
    self.replica_devices = [[row[k % self.num_devices] for k in range(len(cell_params))]
                            for row in stage_devices]
    self.devices = self.replica_devices[0]
    self.num_cells = len(cell_params)
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
    num_micro = micro_batch.NumMicroBatches(
        self.params, self._contract.InputLayout(inputs).batch_size)
    thetas = [self._ReadTheta(t, k) for k, t in enumerate(self.CellThetas(theta))]
    if base_layer.IsEvalMode():
      outputs = self._ForwardOnly(thetas, inputs, num_micro)
    else:
      if self.params.schedule != schedule.ScheduleKind.GPIPE:
        raise ValueError(
            f'PipeliningLayer {self.params.name!r}: schedule '
            f'{self.params.schedule.name} starts backwards before the last '
            'forward, so it trains with the loss inside the pipeline: call '
            'FPropWithLoss(theta, loss_fn, *inputs) instead of FProp, or use '
            'ScheduleKind.GPIPE.')
      outputs = self._Train(thetas, inputs, num_micro)
    return containers.UnwrapSingle(tuple(outputs))

  def FPropWithLoss(self, theta: NestedMap, loss_fn: scheduled_step.MicroLossFn,
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
      (scheduled_step), and the outputs are not differentiable; the outer
      GradientTape and optimizer code is that of FProp's.
    """
    num_micro = micro_batch.NumMicroBatches(
        self.params, self._contract.InputLayout(inputs).batch_size)
    thetas = [self._ReadTheta(t, k) for k, t in enumerate(self.CellThetas(theta))]
    if base_layer.IsEvalMode():
      micro = self._contract.SplitInputs(inputs, num_micro)
      tasks, _ = self._RunForward(self._ComputeThetas(thetas), micro)
      last = self.num_cells - 1
      with tf.device(self.devices[last].name):
        loss = tf.add_n([loss_fn(containers.UnwrapSingle(tasks[(last, m)].outputs))
                         for m in range(num_micro)])
      return loss, containers.UnwrapSingle(tuple(self._MergeOutputs(tasks, num_micro)))
    loss, outputs = self._TrainWithLoss(thetas, inputs, num_micro, loss_fn)
    return loss, containers.UnwrapSingle(tuple(outputs))

  def _ReadTheta(self, theta: NestedMap, k: int) -> NestedMap:
    """Reads cell k's variables on its device."""
    with tf.device(self.devices[k].name):
      return tf.nest.map_structure(tf.convert_to_tensor, theta)

  def _ComputeThetas(self, thetas: List[NestedMap]) -> List[NestedMap]:
    """Each cell's theta cast to the dtypes its layers compute with
    (core/precision), once per step on the cell's device; the identity in
    float32."""
    cast = []
    for k, theta in enumerate(thetas):
      with tf.device(self.devices[k].name):
        cast.append(precision.CastTheta(self.cells[k], theta))
    return cast

  def _MicroTheta(self, theta: NestedMap, first_example: Any) -> NestedMap:
    """Cell theta for the micro-batch whose first example has index
    `first_example` in the global batch: step seeds [s0, first_example]
    (base_layer.WithStepSeed).

    The seed passes through PlaceholderWithDefault, which Grappler never
    folds: from a constant step seed (none set, or Python numbers) each
    call of a cell would get a constant of its own, and Grappler
    specializes a called function for each distinct constant input, K*M
    copies of the cells' functions, which doubles the first step
    (docs/benchmarks/profiles.md, 'Figures behind the code').
    """
    seed = tick_loop.MicroSeed(theta, first_example)
    if seed is None:
      return theta
    return base_layer.WithStepSeed(
        theta, tf.raw_ops.PlaceholderWithDefault(input=seed, shape=[2]))

  def _RunForward(self, thetas: List[NestedMap], micro_inputs: List[tuple],
                  training: bool = False, replica: int = 0
                  ) -> Tuple[Dict[Tuple[int, int], '_Task'], List[NestedMap]]:
    """Forward of every (cell, micro-batch) of `replica` in schedule order.

    Returns what each (k, m) saw and produced, in training the recording of
    the forwards that the backward does not recompute, and per cell the
    statistics summed over micro-batches on its device. Micro-batch m of
    replica r has the step seed of micro-batch r*M + m.
    """
    p = self.params
    devices = self.replica_devices[replica]
    runners = self._replica_runners[replica]
    num_micro = len(micro_inputs)
    micro_size = self._contract.InputLayout(micro_inputs[0]).batch_size
    tasks: Dict[Tuple[int, int], _Task] = {}
    updates: List[List[NestedMap]] = [[] for _ in range(self.num_cells)]
    previous: Dict[int, List[Any]] = {}
    for task in schedule.Schedule(schedule.ScheduleKind.GPIPE, self.num_cells,
                                  num_micro, schedule.Phase.FORWARD):
      k, m = task.cell, task.micro_batch
      x = micro_inputs[m] if k == 0 else tasks[(k - 1, m)].outputs
      with tf.device(devices[k].name):
        theta = self._MicroTheta(thetas[k], (replica * num_micro + m) * micro_size)
      decision = (remat.Decide(p.remat, p.remat_last_micro_batch, m, num_micro)
                  if training else None)
      with _After(previous.get(k)):
        out, upd, recording = runners[k].Forward(theta, x, decision, num_micro)
      tasks[(k, m)] = _Task(x, theta, out, decision, recording)
      updates[k].append(upd)
      previous[k] = tf.nest.flatten(out)
    summed = []
    for k in range(self.num_cells):
      with tf.device(devices[k].name):
        summed.append(tf.nest.map_structure(lambda *xs: tf.add_n(list(xs)),
                                            *updates[k]))
    return tasks, summed

  def _ForwardOnly(self, thetas: List[NestedMap], inputs: tuple,
                   num_micro: int) -> tuple:
    micro = self._contract.SplitInputs(inputs, num_micro)
    tasks, _ = self._RunForward(self._ComputeThetas(thetas), micro)
    return self._MergeOutputs(tasks, num_micro)

  def _MergeOutputs(self, tasks: Dict[Tuple[int, int], '_Task'],
                    num_micro: int, replica: int = 0) -> tuple:
    last = self.num_cells - 1
    micro_size = self._contract.InputLayout(tasks[(0, 0)].inputs).batch_size
    with tf.device(self.replica_devices[replica][last].name):
      return self._contract.MergeOutputs(
          [tasks[(last, m)].outputs for m in range(num_micro)], micro_size)

  # --- training --------------------------------------------------------------

  def _Train(self, thetas: List[NestedMap], inputs: tuple,
             num_micro: int) -> tuple:
    """The training forward, with the backward as its custom gradient. The
    forward applies the cells' statistics, so its outputs are all it
    returns; tf.custom_gradient takes and returns nests."""
    if self.params.num_replicas > 1:
      return replicas.TrainReplicas(self, thetas, inputs, num_micro)
    if tick_loop.Applicable(num_micro, self.params.loop_min_micro_batches):
      return self._TrainTickLoop(thetas, inputs, num_micro)

    @tf.custom_gradient
    def Pipeline(step_inputs, cell_thetas):
      with tf.device(self.devices[0].name):
        micro = self._contract.SplitInputs(step_inputs, num_micro)
      tasks, summed = self._RunForward(self._ComputeThetas(cell_thetas), micro,
                                       training=True)
      outputs = self._MergeOutputs(tasks, num_micro)
      self._ApplyCellUpdates(summed)
      flat_out = tf.nest.flatten(outputs)

      def Grad(*dys, variables=None):
        del variables  # the pipeline reads no variables; theta is passed in
        dys = [tf.zeros_like(y) if dy is None else dy
               for y, dy in zip(flat_out, dys)]
        d_inputs, d_thetas = self._RunBackward(tasks, dys, num_micro)
        return d_inputs + d_thetas

      return outputs, Grad

    return Pipeline(inputs, thetas)

  def _TrainTickLoop(self, thetas: List[NestedMap], inputs: tuple,
                     num_micro: int) -> tuple:
    """_Train as two tf.while_loops over clock ticks (tick_loop)."""
    first, last = self.devices[0].name, self.devices[-1].name

    @tf.custom_gradient
    def Pipeline(step_inputs, cell_thetas):
      with tf.device(first):
        micro = self._contract.SplitInputs(step_inputs, num_micro)
      micro_size = self._contract.InputLayout(micro[0]).batch_size
      loop = tick_loop.TickLoop(self._runners, self._ComputeThetas(cell_thetas), micro,
                                micro_size,
                                self.params.remat)
      last_outputs, stash, summed = loop.Forward()
      per_micro = loop.LastOutputs(last_outputs)
      with tf.device(last):
        outputs = self._contract.MergeOutputs(per_micro, micro_size)
      self._ApplyCellUpdates(summed)
      flat_out = tf.nest.flatten(outputs)

      def Grad(*dys, variables=None):
        del variables  # the pipeline reads no variables; theta is passed in
        dys = [tf.zeros_like(y) if dy is None else dy for y, dy in zip(flat_out, dys)]
        with tf.device(last):
          micro_dys = self._contract.SplitOutputGrads(per_micro[0], dys, num_micro)
        input_grads = loop.Backward(stash, micro_dys)
        with tf.device(first):
          d_inputs = self._contract.MergeInputGrads(micro[0], input_grads)
        return d_inputs + [g for k, runner in enumerate(self._runners)
                           for g in runner.gradients.StepGradients(cell_thetas[k])]

      return outputs, Grad

    return Pipeline(inputs, thetas)

  def _TrainWithLoss(self, thetas: List[NestedMap], inputs: tuple,
                     num_micro: int, loss_fn: scheduled_step.MicroLossFn
                     ) -> Tuple[tf.Tensor, tuple]:
    """The training step of p.schedule with the loss inside: forwards,
    losses and backwards all run in the forward of one tf.custom_gradient,
    whose gradient scales the stored gradients by the loss's upstream
    gradient. Emitted task by task (scheduled_step), or with M >=
    p.loop_min_micro_batches as one loop over the clocks (scheduled_loop)."""
    p = self.params
    tasks = schedule.Tasks(p.schedule, self.num_devices, num_micro,
                           p.cells_per_device)
    decisions = scheduled_step.Decisions(tasks, p.remat,
                                         p.remat_last_micro_batch, num_micro)
    devices = [d.name for d in self.devices]

    @tf.custom_gradient
    def Pipeline(step_inputs, cell_thetas):
      with tf.device(devices[0]):
        micro = self._contract.SplitInputs(step_inputs, num_micro)

      compute_thetas = self._ComputeThetas(cell_thetas)
      micro_size = self._contract.InputLayout(micro[0]).batch_size

      def MicroTheta(k: int, m: int) -> NestedMap:
        with tf.device(devices[k]):
          return self._MicroTheta(compute_thetas[k], m * micro_size)

      if tick_loop.Applicable(num_micro, p.loop_min_micro_batches):
        result = scheduled_loop.ScheduledLoop(
            self._runners, devices[:self.num_devices], tasks, compute_thetas, micro,
            micro_size, p.remat, p.remat_last_micro_batch, loss_fn).Run()
      else:
        result = scheduled_step.RunStep(self._runners, devices[:self.num_devices],
                                        tasks, micro, MicroTheta, decisions, loss_fn)
      with tf.device(devices[-1]):
        outputs = self._contract.MergeOutputs(result.last_outputs, micro_size)
      with tf.device(devices[0]):
        d_inputs = self._contract.MergeInputGrads(micro[0], result.input_grads)
      self._ApplyCellUpdates(result.updates)

      def Grad(d_loss, *unused_d_outputs, variables=None):
        grads = scheduled_step.ScaleGradients(d_inputs, d_loss, devices[0])
        for k, cell_grads in enumerate(result.theta_grads):
          grads += scheduled_step.ScaleGradients(cell_grads, d_loss, devices[k])
        return (grads, [None] * len(variables)) if variables else grads

      return (result.loss, outputs), Grad

    loss, outputs = Pipeline(inputs, thetas)
    return loss, tf.nest.map_structure(tf.stop_gradient, outputs)

  def _RunBackward(self, tasks: Dict[Tuple[int, int], '_Task'],
                   output_grads: List[Any], num_micro: int, replica: int = 0
                   ) -> Tuple[List[Any], List[Any]]:
    """Backward of every (cell, micro-batch) of `replica` in schedule
    order, recomputing each cell on its device (or reading the recording of
    its forward).

    Returns the gradients of the flat pipeline inputs and, cell after cell,
    of the flat thetas summed over micro-batches on each cell's device (by
    the cells' CellGradients).
    """
    p = self.params
    last = self.num_cells - 1
    devices = self.replica_devices[replica]
    runners = self._replica_runners[replica]
    with tf.device(devices[last].name):
      micro_dys = self._contract.SplitOutputGrads(
          tasks[(last, 0)].outputs, output_grads, num_micro)
    grads_out = {(last, m): micro_dys[m] for m in range(num_micro)}
    for runner in runners:
      runner.gradients.StartStep(num_micro)
    input_grads: List[Any] = [None] * num_micro
    previous: Dict[int, List[Any]] = {}
    for task in schedule.Schedule(p.schedule, self.num_cells, num_micro,
                                  schedule.Phase.BACKWARD):
      k, m = task.cell, task.micro_batch
      done = tasks[(k, m)]
      dy = tf.nest.pack_sequence_as(done.outputs, grads_out[(k, m)])
      with _After(previous.get(k)):
        if done.recording is not None:
          dx = runners[k].BackwardFromTape(done.recording, done.inputs,
                                           done.outputs, dy)
        else:
          dx = runners[k].Backward(done.theta, done.inputs, dy,
                                   done.decision, num_micro)
      previous[k] = [g for g in dx if g is not None]
      if k > 0:
        grads_out[(k - 1, m)] = [
            tf.zeros_like(x) if g is None else g
            for x, g in zip(tf.nest.flatten(done.inputs), dx)]
      else:
        input_grads[m] = dx
    with tf.device(devices[0].name):
      d_inputs = self._contract.MergeInputGrads(tasks[(0, 0)].inputs, input_grads)
    return d_inputs, [g for k, runner in enumerate(runners)
                      for g in runner.gradients.StepGradients(tasks[(k, 0)].theta)]

  def _ApplyCellUpdates(self, summed: List[NestedMap]) -> None:
    for k, cell in enumerate(self.cells):
      if cell.HasUpdates():
        with tf.device(self.devices[k].name):
          cell.ApplyUpdates(summed[k])

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, *input_shapes: Any) -> layer_meta.LayerMeta:
    return containers.ChainMeta(CellParams(params), input_shapes)


@dataclasses.dataclass
class _Task:
  """What one (cell, micro-batch) forward saw and produced."""
  inputs: tuple
  theta: NestedMap
  outputs: tuple
  decision: Optional[remat.Decision]  # None: not training
  recording: Optional[cell_runner.Recording]


def _After(previous: Optional[List[Any]]):
  """A context whose ops wait for `previous` (the device's last task), so a
  device runs its tasks in schedule order. Control edges on the cell's call
  op itself: identities of its inputs would cost M*K*(inputs + theta) graph
  nodes and their tracing time (docs/benchmarks/profiles.md)."""
  return tf.control_dependencies(previous or [])


def _NumDevices(p: hyperparams.Params, num_cells: int) -> int:
  """K, the devices of p's num_cells cells (p.cells_per_device each);
  raises ValueError for a schedule that cannot run them."""
  v = p.cells_per_device
  if not isinstance(p.schedule, schedule.ScheduleKind):
    raise TypeError(f'PipeliningLayer {p.name!r}: schedule must be a '
                    f'ScheduleKind, got {p.schedule!r}.')
  if v < 1 or num_cells % v:
    raise ValueError(f'PipeliningLayer {p.name!r}: {num_cells} cells do not '
                     f'make cells_per_device={v} cells on each device; set '
                     f'num_partitions to a multiple of {v} (K*v cells).')
  num_devices = num_cells // v
  if p.num_replicas > 1 and (p.schedule != schedule.ScheduleKind.GPIPE or
                             p.loop_min_micro_batches):
    raise ValueError(f'PipeliningLayer {p.name!r}: num_replicas='
                     f'{p.num_replicas} runs the unrolled GPIPE schedule only; '
                     f'set num_replicas=1 for schedule={p.schedule.name} or '
                     'loop_min_micro_batches, or use ScheduleKind.GPIPE with '
                     'loop_min_micro_batches=0.')
  num_micro = p.num_micro_batches if not p.micro_batch_size else None
  schedule.CheckShape(p.schedule, num_devices, num_micro or num_devices, v)
  return num_devices


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
