"""What `--mode=inspect_params` and `--mode=inspect_model` print.

The pipelines are read from the task's params when they hold the layers
(PipelinedModel stacks fill them in from their params), else from the built
task (NeedsBuild: a task that makes its layers in its constructor, Lingvo's
habit). The planner's table weighs only the schedules the pipeline's owner
can train: the class that calls the PipeliningLayer declares them in
PIPELINE_SCHEDULES; without it only GPIPE, the one schedule FProp trains
(the others need FPropWithLoss).
"""

from typing import Any, Iterator, List, Optional, Sequence, Tuple

from lingvo_pipe import base_experiment
from lingvo_pipe.core import base_layer
from lingvo_pipe.core import base_params
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.planning import choices
from lingvo_pipe.planning import planner
from lingvo_pipe.planning import tuner
from lingvo_pipe.pipeline.layout import cells as cells_lib
from lingvo_pipe.pipeline.layout import cluster
from lingvo_pipe.pipeline.layout import device_mapping
from lingvo_pipe.pipeline.layout import micro_batch
from lingvo_pipe.pipeline.layout import micro_batch_count
from lingvo_pipe.pipeline.layout import plan as plan_lib
from lingvo_pipe.pipeline.lowering import program
from lingvo_pipe.pipeline.schedules import schedule

DEFAULT_BUDGET_BYTES = 1 << 30  # memory of each device for the planner table

# Slot variables per weight of each optimizer the trainer builds
# (trainer/optimizers.py: tf.compat.v1.train's Adam: m and v; momentum:
# the velocity; RMSProp: rms and momentum; SGD none).
_OPTIMIZER_SLOTS = {
    base_experiment.OptimizerKind.SGD: 0,
    base_experiment.OptimizerKind.MOMENTUM: 1,
    base_experiment.OptimizerKind.ADAM: 2,
    base_experiment.OptimizerKind.RMSPROP: 2,
}

# The class attribute naming the ScheduleKinds a pipeline's owner trains.
SCHEDULES_ATTRIBUTE = 'PIPELINE_SCHEDULES'

# (path, pipeline params, the class of the layer that owns the pipeline)
Pipeline = Tuple[str, hyperparams.Params, Optional[type]]


def OptimizerSlots(kind: base_experiment.OptimizerKind) -> int:
  """Slot variables per weight of the optimizer `kind`."""
  if kind not in _OPTIMIZER_SLOTS:
    raise ValueError(f'Unknown optimizer {kind!r}; use an OptimizerKind.')
  return _OPTIMIZER_SLOTS[kind]


def RunnableSchedules(owner: Optional[type]) -> Sequence[schedule.ScheduleKind]:
  """The ScheduleKinds the owner class of a pipeline can train."""
  return tuple(getattr(owner, SCHEDULES_ATTRIBUTE, (schedule.ScheduleKind.GPIPE,)))


def PipelinesInParams(params: Any, path: str = '',
                      owner: Optional[type] = None) -> Iterator[Pipeline]:
  """(path, params, owner class) of every PipeliningLayer in nested params."""
  if isinstance(params, hyperparams.Params):
    cls = params.cls if 'cls' in params else None
    if cls is gpipe.PipeliningLayer:
      yield path or '.', params, owner
    elif cls is not None and hasattr(cls, 'PipelineParams'):  # a stack that fills in its pipeline
      pipeline = cls.PipelineParams(params)
      base_params.InheritBaseParams(pipeline, params)  # e.g. the compute dtype
      yield f'{path}.pipeline', base_params.WithInheritedBaseParams(pipeline), cls
      return
    for key, value in params.IterParams():
      yield from PipelinesInParams(value, f'{path}.{key}' if path else key,
                                   cls if cls is not None else owner)


def NeedsBuild(task_params: hyperparams.Params) -> bool:
  """Whether a pipeline in the params has no layers yet: the task fills
  them in when it is built, so only the built task shows its cells."""
  return any(not p.layers and not p.cell_tpl for _, p, _ in PipelinesInParams(task_params))


def BuiltPipelines(task: Any) -> List[Pipeline]:
  """(path, params, owner class) of every PipeliningLayer of a built task,
  the path made of the owning layers' attribute names."""
  found: List[Pipeline] = []

  def Walk(layer: Any, path: str) -> None:
    for name, child in sorted(vars(layer).items()):
      if isinstance(child, gpipe.PipeliningLayer):
        found.append((f'{path}.{name}' if path else name, child.params, type(layer)))
      elif isinstance(child, base_layer.BaseLayer):
        Walk(child, f'{path}.{name}' if path else name)

  Walk(task, '')
  return found


def _Emission(resolved: plan_lib.Plan, num_micro: Optional[int]) -> str:
  """How the pipeline's training step is emitted at M=num_micro (None:
  unknown), and from which M it loops (loop_min_micro_batches)."""
  start = resolved.loop_min_micro_batches
  if not start:
    return 'unrolled at every M (loop_min_micro_batches)'
  loops = num_micro is not None and resolved.Emission(num_micro) == program.Emission.LOOP
  now = ('' if num_micro is None else
         f'{"a loop per device" if loops else "unrolled"} at M={num_micro}; ')
  return f'{now}a loop per device from M={start} (loop_min_micro_batches)'


def _Human(n: float) -> str:
  for unit in ('', 'K', 'M', 'G', 'T'):
    if abs(n) < 1000:
      return f'{n:.1f}{unit}' if unit else f'{int(n)}'
    n /= 1000
  return f'{n:.1f}P'


def _Around(n: int) -> List[int]:
  return sorted({max(n // 2, 1), n, 2 * n})


def _NumMicroBatches(p: hyperparams.Params) -> Optional[int]:
  """The pipeline's training M for its input_shapes; None if
  micro_batch_size is set and input_shapes is not."""
  batch = None
  if p.input_shapes is not None:
    batch = micro_batch.Contract.FromParams(p).InputLayout(
        layer_meta.Shapes(*p.input_shapes)).batch_size
  return micro_batch_count.NumMicroBatches(p, batch, p.num_replicas)


def _PlannerTable(p: hyperparams.Params, num_devices: int, num_micro: Optional[int],
                  budget_bytes: int, optimizer_slots: int,
                  runnable: Sequence[schedule.ScheduleKind]) -> List[str]:
  """The planner's candidates around the configured K (num_devices) and M,
  every remat, the schedules in runnable."""
  if not p.layers or p.input_shapes is None or num_micro is None:
    return ['  planner: needs the automatic partition (layers and input_shapes).']
  schedules = [(kind, v) for kind, v in tuner.ALL_SCHEDULES if kind in runnable]
  rows = planner.Plan(p.layers, _ReplicaInputShapes(p), budget_bytes,
                      cells=_Around(num_devices), micro_batches=_Around(num_micro),
                      optimizer_slots=optimizer_slots, batch_dim=p.batch_dim,
                      cost=p.cost, layer_costs=p.layer_costs,
                      remat_last_micro_batch=p.remat_last_micro_batch,
                      broadcast_inputs=p.broadcast_inputs, schedules=schedules,
                      loop_from=lambda kind, remat: plan_lib.LoopFromM(
                          p.Copy().Set(schedule=kind, remat=remat)))
  best = choices.Recommend(rows)
  verdict = (f'{choices.Override(best)} (the pipeline\'s params)' if best else
             f'none fits {budget_bytes / 2**20:.0f} MiB; raise --planner_budget_mb or '
             'give the model more devices')
  per_replica = (f'; for each of the {p.num_replicas} replicas: 1/'
                 f'{p.num_replicas} of the batch, with its own copy of the '
                 'weights and optimizer slots' if p.num_replicas > 1 else '')
  names = ', '.join(k.name for k, _ in schedules)
  return [f'  planner: budget {budget_bytes / 2**20:.0f} MiB per device, '
          f'{optimizer_slots} optimizer slot(s); per row the device with the '
          f'largest peak{per_replica}; time x: step time over the fastest row\'s; '
          f'schedules weighed (the planner\'s that the model trains): {names}; '
          f'recommended (*): {verdict}',
          choices.FormatTable(rows)]


def _ReplicaInputShapes(p: hyperparams.Params) -> List[Any]:
  """p.input_shapes with the batch of one replica (1/R of it) in every
  input that is split into micro-batches: what each replica's devices see."""
  if p.num_replicas <= 1:
    return list(p.input_shapes)
  shapes = layer_meta.Shapes(*p.input_shapes)
  layout = micro_batch.Contract.FromParams(p).InputLayout(shapes)
  if layout.batch_size % p.num_replicas:
    raise ValueError(f'The batch of {layout.batch_size} does not split into '
                     f'num_replicas={p.num_replicas} equal parts; use a '
                     'batch size that R divides.')
  out = []
  for shape, broadcast in zip(p.input_shapes, layout.broadcast):
    shape = list(shape)
    if not broadcast:
      shape[p.batch_dim] //= p.num_replicas
    out.append(shape)
  return out


def _Plan(p: hyperparams.Params, num_cells: int, cluster_tasks: int) -> plan_lib.Plan:
  """The plan of pipeline params `p`, its devices as a run would place
  them: p.devices, else the worker tasks' or logical CPU devices."""
  if p.devices:
    devices = [cluster.Device.Parse(d) for d in p.devices]
  elif cluster_tasks:
    devices = cluster.WorkerDevices(cluster_tasks)
  else:
    devices = [cluster.Device(cluster.DeviceType.CPU, j) for j in range(
        device_mapping.NumDevicesNeeded(num_cells, p.num_replicas,
                                        p.consecutive_cells_per_device))]
  return plan_lib.FromParams(p, num_cells, devices, check_devices=False)


def ModelPlan(task_params: hyperparams.Params,
              budget_bytes: int = DEFAULT_BUDGET_BYTES,
              optimizer_slots: int = 0, cluster_tasks: int = 0,
              task: Any = None) -> str:
  """Per pipeline: per cell (and replica) its layers, parameters, FLOPs,
  activation bytes and device, from the layers' metadata (nothing is
  built); then the planner's table of candidate K, M and remat for
  `budget_bytes` per device (planner.Plan, with `optimizer_slots` slots per
  parameter). With `cluster_tasks` worker tasks, pipelines without devices
  of their own go to the tasks' devices as they would in a run on that
  cluster (device_mapping.DefaultDevices). With the built `task`, its
  pipelines are read from it instead (see NeedsBuild)."""
  lines: List[str] = []
  task_params = base_params.WithInheritedBaseParams(task_params)
  pipelines = BuiltPipelines(task) if task is not None else list(PipelinesInParams(task_params))
  for path, p, owner in pipelines:
    cells = cells_lib.CellParams(p)
    resolved = _Plan(p, len(cells), cluster_tasks)
    num_devices, places = resolved.num_devices, resolved.replica_devices
    num_micro = _NumMicroBatches(p)
    bubble = ('unknown (micro_batch_size needs input_shapes)' if num_micro is None
              else f'{resolved.UnitBubble(num_micro):.1%}')
    replicas = (f', R={p.num_replicas} replicas of 1/{p.num_replicas} of the '
                'batch each (own copies of the variables, gradients all-reduced)'
                if p.num_replicas > 1 else '')
    lines.append(f'pipeline {path}: K={len(cells)} cells, M={num_micro or "?"} '
                 f'micro-batches{replicas}, remat {p.remat.name}, schedule '
                 f'{resolved.schedule_name}, bubble {bubble}')
    lines.append(f'  {"cell":<5} {"device":<42} {"param bytes":>12} '
                 f'{"GFLOPs":>8} {"act bytes":>10}  layers')
    shapes = layer_meta.Shapes(*(p.input_shapes or []))
    for k, cell in enumerate(cells):
      names = [lp.name for lp in cell.sub] if 'sub' in cell else [cell.name]
      if shapes:
        meta = cell.cls.FPropMeta(cell, *shapes)
        shapes = meta.out_shapes
        cost = (f'{_Human(meta.param_bytes):>12} {meta.flops / 1e9:>8.3f} '
                f'{_Human(meta.act_bytes):>10}')
      else:
        cost = f'{"?":>12} {"?":>8} {"?":>10}'
      lines.append(f'  {k:<5} {places[0][k].name:<42} {cost}  {", ".join(names)}')
    for r, row in enumerate(places[1:], start=1):
      lines.append(f'  replica {r}: ' + ', '.join(
          f'cell {k} on {d.name}' for k, d in enumerate(row)))
    lines.append(f'  training step: {_Emission(resolved, num_micro)}')
    lines.extend(_PlannerTable(p, num_devices, num_micro, budget_bytes, optimizer_slots,
                               RunnableSchedules(owner)))
  if not lines:
    lines.append('The model has no PipeliningLayer: it runs on one device.')
  return '\n'.join(lines)
