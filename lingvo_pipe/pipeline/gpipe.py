"""PipeliningLayer: GPipe (arXiv 1811.06965) over K cells and M micro-batches.

The layer holds the params, the layers and the plan resolved once
(plan.py); one executor runs the plan's actions, unrolled (executor.py)
or as one loop per device (loop_executor.py) from plan.LoopFromM's M.
FProp trains with the loss outside the pipeline (fill-drain),
FPropWithLoss with the loss inside (any schedule); both are one custom
gradient (train_step.py). Batch-norm statistics are summed over
micro-batches and applied once per step.
"""

from typing import Any, Callable, List, Optional, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import eval_mode
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.core import precision
from lingvo_pipe.pipeline.cell import cell_runner
from lingvo_pipe.pipeline.layout import cell_compilation
from lingvo_pipe.pipeline.layout import cells
from lingvo_pipe.pipeline.layout import cluster
from lingvo_pipe.pipeline.layout import micro_batch
from lingvo_pipe.pipeline.layout import micro_batch_count
from lingvo_pipe.pipeline.layout import partition
from lingvo_pipe.pipeline.layout import plan as plan_lib
from lingvo_pipe.pipeline.layout.cell_compilation import CellCompilation
from lingvo_pipe.pipeline.lowering import program
from lingvo_pipe.pipeline.lowering.remat import RematPolicy
from lingvo_pipe.pipeline.replicas import all_reduce
from lingvo_pipe.pipeline.replicas import replica_batches
from lingvo_pipe.pipeline.replicas import replica_variables
from lingvo_pipe.pipeline.schedules import schedule
from lingvo_pipe.pipeline.step import executor
from lingvo_pipe.pipeline.step import step_runner
from lingvo_pipe.pipeline.step import train_step
from lingvo_pipe.pipeline.step.loop import loop_executor
from lingvo_pipe.pipeline.step.loop import loop_queues


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
    p.Define('num_partitions', 0, 'Cells of the automatic partition: K devices x v cells each.')
    p.Define('splits', [], 'Manual split points for layers, e.g. [3, 7, 12].')
    p.Define('cost', partition.CostKind.FLOPS,
             'What the automatic partition balances (a CostKind).')
    p.Define('layer_costs', [], 'With cost=CostKind.GIVEN: one positive cost per entry of '
             'layers (e.g. seconds, planning.measured_costs.Measure), balanced instead of '
             'their FLOPs.')
    p.Define('input_shapes', None, 'List of the shapes of the pipeline inputs, batch '
             'included, e.g. [[64, 512]] (a NestedMap input: a NestedMap of shapes): '
             'needed for the automatic partition and to check cell boundaries at build.')
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
             '1/R of the batch (R*M micro-batches in all), with any schedule, '
             'each training its own copy of the variables with the gradient '
             'all-reduced over replicas (docs/several_machines.md). '
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
    p.Define('schedule', schedule.ScheduleKind.GPIPE, 'A ScheduleKind: '
             'GPIPE, ONE_F_ONE_B, INTERLEAVED, ZB_H1, ZB_H2 or ZB_V. GPIPE '
             'trains through FProp and an outer tape, or FPropWithLoss; the '
             'others start backwards before the last forward and need the '
             'loss inside the pipeline: train them through FPropWithLoss.')
    p.Define('schedule_text', '', 'A schedule of your own, replacing '
             "p.schedule: PyTorch pipelining's notation, one line per device "
             "(or lines separated by ';'), e.g. '0F0,0F1,0B0,0B1;1F0,1B0,"
             "1F1,1B1' (pipeline/schedules/schedule_text.py); it names each action's "
             'cell and micro-batch, so it fixes the cells and M.')
    p.Define('loop_min_micro_batches', None, 'Train and evaluate in a graph (tf.function) '
             'with M >= this as one tf.while_loop per device (loop_executor): a step graph '
             "of a few calls per cell whatever M; every micro-batch recomputed but the last "
             "cell's that remat keeps, under NONE too (pipeline/lowering/program.py). 0: "
             'never (unrolled, executor, as eagerly always); None: from where it was '
             'measured no slower (plan.LoopFromM, docs/schedules.md).')
    p.Define('cells_per_device', 1, 'v: cells per device, 2 or more for '
             'ScheduleKind.INTERLEAVED (cell j on device j mod K, K = '
             'cells / v); set num_partitions (or cell_tpl) to K*v cells. '
             'ZB_V always puts 2 on each device (cells d and 2K-1-d).')
    p.Define('jit_compile', CellCompilation.NONE, 'A CellCompilation: XLA '
             "compiles each cell's forward and backward on its device "
             '(pipeline/layout/cell_compilation.py says what stays outside).')
    return p

  # Views of the layers (cells.CellView), traced functions, data, the
  # replicas' copies (replica_variables), the all-reduces' keys and the loop
  # steps' queue names: none is the model's variables.
  _TF_MODULE_IGNORED_PROPERTIES = frozenset(
      ('_cells', '_cell_layer_indices', '_replica_runners', 'plan',
       'replica_variables', '_collectives', '_queue_names')).union(
          base_layer.BaseLayer._TF_MODULE_IGNORED_PROPERTIES)

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    layer_params, layer_runs = cells.LogicalLayers(p)
    self.__dict__['_cell_layer_indices'] = layer_runs
    cell_params = cells.CellParamsOf(p, layer_params, layer_runs)
    self._contract = micro_batch.Contract.FromParams(p)
    cells.CheckBoundaries(p, self._contract, cell_params)
    devices = [cluster.Device.Parse(d) for d in p.devices] if p.devices else None
    resolved = plan_lib.FromParams(p, len(cell_params), devices)
    if not p.micro_batch_size:
      resolved.Check(p.num_micro_batches)  # M against the schedule, at build
    self.__dict__['plan'] = resolved
    self.num_devices, self.num_cells = resolved.num_devices, resolved.num_cells
    # [replica][cell]; the model's variables live on replica 0's devices.
    self.replica_devices = [list(row) for row in resolved.replica_devices]
    self.devices = self.replica_devices[0]
    # The layers are the pipeline's own, named and initialized by their
    # place in the unpartitioned network; each on its cell's device.
    device_of = {i: self.devices[k].name for k, run in enumerate(layer_runs) for i in run}
    self.CreateChildren('layers', layer_params,
                        devices=[device_of[i] for i in range(len(layer_params))])
    cells.CheckExampleAxes(p, self.layers)
    self.__dict__['replica_variables'] = replica_variables.ReplicaVariables(
        self.layers, self._cell_layer_indices, self.replica_devices)
    with self.name_scope:
      views = [cells.CellView(cp, [self.layers[i] for i in run])
               for cp, run in zip(cell_params, self._cell_layer_indices)]
    self.__dict__['_cells'] = views
    jit = cell_compilation.Compiles(p.jit_compile, self.fprop_dtype)
    self.__dict__['_replica_runners'] = [
        [cell_runner.CellRunner(cell, d.name, jit) for cell, d in zip(views, row)]
        for row in self.replica_devices]
    self.__dict__['_collectives'] = all_reduce.Collectives(
        [d.name for row in self.replica_devices for d in row] if p.num_replicas > 1 else [])
    self.__dict__['_queue_names'] = loop_queues.QueueNames()

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

  # --- forward -------------------------------------------------------------

  def FProp(self, theta: NestedMap, *inputs: Any) -> Any:
    num_micro = self._NumMicro(inputs)
    thetas = self._ReadThetas(theta)
    if eval_mode.IsEvalMode():
      run, batches = self._Executor(self._ComputeThetas(thetas), inputs, num_micro,
                                   training=False)
      return containers.UnwrapSingle(batches.Outputs(run.Forwards()))
    if not self.plan.Program(num_micro, program.Step.LOSS_OUTSIDE).ForwardsFirst():
      raise ValueError(
          f'PipeliningLayer {self.params.name!r}: {_Name(self.params)} starts backwards '
          'before the last forward, so it trains with the loss inside the pipeline: call '
          'FPropWithLoss(theta, loss_fn, *inputs) instead of FProp, or use ScheduleKind.GPIPE.')
    return containers.UnwrapSingle(train_step.LossOutside(
        self._Start(num_micro), self._ApplyCellUpdates, inputs, thetas))

  def FPropWithLoss(self, theta: NestedMap, loss_fn: Callable[..., tf.Tensor],
                    *inputs: Any, loss_inputs: Any = None) -> Tuple[tf.Tensor, Any]:
    """The loss and the outputs, with the loss inside the pipeline.

    Args:
      theta: the layer's theta.
      loss_fn: one micro-batch's loss, a scalar, run on the last cell's
        device as soon as its forward ends: loss_fn(outputs) with the last
        cell's outputs of the micro-batch (as FProp returns outputs), or
        with loss_inputs loss_fn(outputs, micro-batch's loss_inputs). The
        step's loss is the sum over micro-batches: a mean over the batch
        divides by the whole batch's count in each micro-batch. It may read
        tensors computed before the pipeline, but its gradient reaches only
        the pipeline's outputs.
      *inputs: as for FProp.
      loss_inputs: per-example tensors only the loss reads (labels,
        weights, masks; a tensor or a nested structure), each with the
        pipeline's batch at batch_dim. Cut into micro-batches (and
        replicas) as the inputs are, they reach loss_fn beside the outputs
        instead of travelling through every cell. They get no gradient.

    Returns:
      (loss, outputs). In training the loss's gradient (of the inputs and
      theta) runs the backward in p.schedule's order, within the forward
      (executor), and the outputs are not differentiable; the outer
      GradientTape and optimizer code is that of FProp's.
    """
    num_micro = self._NumMicro(inputs, loss_inputs)
    thetas = self._ReadThetas(theta)
    if eval_mode.IsEvalMode():
      run, batches = self._Executor(self._ComputeThetas(thetas), inputs, num_micro,
                                   False, loss_fn, loss_inputs)
      last_outputs = run.Forwards()
      return run.Loss(), containers.UnwrapSingle(batches.Outputs(last_outputs))
    loss, outputs = train_step.LossInside(
        self._Start(num_micro, loss_fn, loss_inputs), self._ApplyCellUpdates,
        inputs, thetas, [[d.name for d in row] for row in self.replica_devices])
    return loss, containers.UnwrapSingle(outputs)

  def _NumMicro(self, inputs: tuple, loss_inputs: Any = None) -> int:
    """M of a step (checked against the schedule); evaluation's of replica
    0 alone. The loss inputs checked against the inputs' batch."""
    replicas = 1 if eval_mode.IsEvalMode() else self.params.num_replicas
    batch_size = self._contract.InputLayout(inputs).batch_size
    if loss_inputs is not None:
      self._contract.CheckLossInputs(loss_inputs, batch_size)
    num_micro = micro_batch_count.NumMicroBatches(self.params, batch_size, replicas)
    self.plan.Check(num_micro)
    return num_micro

  def _ReadThetas(self, theta: NestedMap) -> List[List[NestedMap]]:
    """[replica][cell] the cell's theta read on its device: replica 0's
    from `theta`, in training each other replica's from its own copies
    (replica_variables)."""
    thetas = []
    for k, t in enumerate(self.CellThetas(theta)):
      with tf.device(self.devices[k].name):
        thetas.append(tf.nest.map_structure(tf.convert_to_tensor, t))
    return [thetas] + ([] if eval_mode.IsEvalMode() else
                       self.replica_variables.Thetas(self.cells, thetas))

  def _ComputeThetas(self, thetas: List[List[NestedMap]]) -> List[List[NestedMap]]:
    """[replica][cell] the theta cast to the dtypes the cell's layers
    compute with (core/precision), once per step on its device; the
    identity in float32."""
    def Cast(k: int, theta: NestedMap, device: cluster.Device) -> NestedMap:
      with tf.device(device.name):
        return precision.CastTheta(self.cells[k], theta)
    return [[Cast(k, *pair) for k, pair in enumerate(zip(row, devices))]
            for row, devices in zip(thetas, self.replica_devices)]

  def _Start(self, num_micro: int, loss_fn: Optional[Callable[..., tf.Tensor]] = None,
             loss_inputs: Any = None) -> train_step.Start:
    """A training step's start: (cell thetas, inputs) -> its executor and
    batches, the thetas cast once to the compute dtypes."""
    return lambda thetas, inputs: self._Executor(
        self._ComputeThetas(thetas), inputs, num_micro, True, loss_fn, loss_inputs)

  def _Executor(self, thetas: List[List[NestedMap]], inputs: tuple, num_micro: int,
                training: bool, loss_fn: Optional[Callable[..., tf.Tensor]] = None,
                loss_inputs: Any = None
                ) -> Tuple[step_runner.StepRunner, replica_batches.ReplicaBatches]:
    """The step's executor and its batch cut into replicas x micro-batches
    (evaluation: replica 0, the whole batch), running the step's Program.
    The one place that chooses the emission: in a graph from
    plan.LoopFromM's M a loop per device (loop_executor), else unrolled
    (executor). Eagerly always unrolled: one device's loop would wait
    forever on a queue the next one's fills."""
    resolved = self.plan if training else self.plan.ReplicaZero()
    batches = replica_batches.ReplicaBatches(self._contract, resolved.replica_devices,
                                             inputs, num_micro, loss_inputs)
    emission = (program.Emission.UNROLLED if tf.executing_eagerly()
                else resolved.Emission(num_micro))
    step = (program.Step.EVALUATION if not training else
            program.Step.LOSS_OUTSIDE if loss_fn is None else program.Step.LOSS_INSIDE)
    micro_loss = None if loss_fn is None else _MicroLoss(loss_fn, loss_inputs, batches)
    args = (resolved, resolved.Program(num_micro, step, emission), self._replica_runners,
            thetas, batches.micro_inputs, batches.micro_size, micro_loss, self._collectives)
    if emission == program.Emission.LOOP:
      return loop_executor.LoopExecutor(*args, self._queue_names), batches
    return executor.Executor(*args), batches

  def _ApplyCellUpdates(self, summed: List[NestedMap]) -> None:
    for k, cell in enumerate(self.cells):
      if cell.HasUpdates():
        with tf.device(self.devices[k].name):
          cell.ApplyUpdates(summed[k])

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, *input_shapes: Any) -> layer_meta.LayerMeta:
    return containers.ChainMeta(cells.CellParams(params), input_shapes)


def _MicroLoss(loss_fn: Callable[..., tf.Tensor], loss_inputs: Any,
               batches: replica_batches.ReplicaBatches) -> step_runner.MicroLossFn:
  """The executors' per-micro-batch loss from FPropWithLoss's loss_fn: with
  loss inputs, the micro-batch's own beside its outputs."""
  if loss_inputs is None:
    return lambda out, r, m: loss_fn(out)
  return lambda out, r, m: loss_fn(out, batches.LossInputs(r, m))


def _Name(p: hyperparams.Params) -> str:
  return 'the schedule of schedule_text' if p.schedule_text else f'schedule {p.schedule.name}'
