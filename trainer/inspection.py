"""What `--mode=inspect_params` and `--mode=inspect_model` print."""

from typing import Any, Iterator, List, Optional

import tensorflow as tf

from lingvo_pipe import base_experiment
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.pipeline import cluster
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline import micro_batch
from lingvo_pipe.pipeline import planner
from lingvo_pipe.pipeline import schedule

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

# The schedules the planner weighs: (ScheduleKind, cells per device).
PLANNED_SCHEDULES = ((schedule.ScheduleKind.GPIPE, 1),
                     (schedule.ScheduleKind.ONE_F_ONE_B, 1),
                     (schedule.ScheduleKind.INTERLEAVED, 2))


def OptimizerSlots(kind: base_experiment.OptimizerKind) -> int:
  """Slot variables per weight of the optimizer `kind`."""
  if kind not in _OPTIMIZER_SLOTS:
    raise ValueError(f'Unknown optimizer {kind!r}; use an OptimizerKind.')
  return _OPTIMIZER_SLOTS[kind]


def _Pipelines(params: Any, path: str = '') -> Iterator[tuple]:
  """(path, params) of every PipeliningLayer in nested params."""
  if isinstance(params, hyperparams.Params):
    cls = params.cls if 'cls' in params else None
    if cls is gpipe.PipeliningLayer:
      yield path or '.', params
    elif cls is not None and hasattr(cls, 'PipelineParams'):  # a stack that fills in its pipeline
      yield f'{path}.pipeline', cls.PipelineParams(params)
      return
    for key, value in params.IterParams():
      yield from _Pipelines(value, f'{path}.{key}' if path else key)


def _Human(n: float) -> str:
  for unit in ('', 'K', 'M', 'G', 'T'):
    if abs(n) < 1000:
      return f'{n:.1f}{unit}' if unit else f'{int(n)}'
    n /= 1000
  return f'{n:.1f}P'


def _Around(n: int) -> List[int]:
  return sorted({max(n // 2, 1), n, 2 * n})


def _NumMicroBatches(p: hyperparams.Params) -> Optional[int]:
  """The pipeline's M for its input_shapes; None if micro_batch_size is set
  and input_shapes is not."""
  batch = None
  if p.input_shapes is not None:
    batch = micro_batch.Contract.FromParams(p).InputLayout(
        layer_meta.Shapes(*p.input_shapes)).batch_size
  return micro_batch.NumMicroBatches(p, batch)


def _Bubble(p: hyperparams.Params, num_devices: int, num_micro: int) -> float:
  """The idle share of p's schedule (its unit-time table)."""
  return schedule.MeasuredBubble(schedule.Tasks(p.schedule, num_devices, num_micro,
                                                p.cells_per_device))


def _PlannerTable(p: hyperparams.Params, num_micro: Optional[int],
                  budget_bytes: int, optimizer_slots: int) -> List[str]:
  """The planner's candidates around the configured K and M, every remat."""
  if not p.layers or p.input_shapes is None or num_micro is None:
    return ['  planner: needs the automatic partition (layers and input_shapes).']
  num_devices = len(gpipe.CellParams(p)) // max(p.cells_per_device, 1)
  rows = planner.Plan(p.layers, p.input_shapes, budget_bytes,
                      cells=_Around(num_devices), micro_batches=_Around(num_micro),
                      optimizer_slots=optimizer_slots, batch_dim=p.batch_dim,
                      cost=p.cost, remat_last_micro_batch=p.remat_last_micro_batch,
                      broadcast_inputs=p.broadcast_inputs, schedules=PLANNED_SCHEDULES)
  best = planner.Recommend(rows)
  verdict = (f'K={best.num_devices} M={best.num_micro_batches} remat '
             f'{best.remat.name} schedule {planner.ScheduleName(best)}'
             if best else 'none fits')
  return [f'  planner: budget {budget_bytes / 2**20:.0f} MiB per device, '
          f'{optimizer_slots} optimizer slot(s); per row the device with the '
          f'largest peak; recommended (*): {verdict}',
          planner.FormatTable(rows)]


def ModelPlan(task_params: hyperparams.Params,
              budget_bytes: int = DEFAULT_BUDGET_BYTES,
              optimizer_slots: int = 0) -> str:
  """Per pipeline: per cell its layers, parameters, FLOPs, activation bytes
  and device, from the layers' metadata (nothing is built); then the
  planner's table of candidate K, M and remat for `budget_bytes` per device
  (planner.Plan, with `optimizer_slots` slots per parameter)."""
  lines: List[str] = []
  for path, p in _Pipelines(task_params):
    cells = gpipe.CellParams(p)
    placed = cluster.PlaceCells(
        len(cells) // max(p.cells_per_device, 1),
        [cluster.Device.Parse(d) for d in p.devices] if p.devices else
        [cluster.Device(cluster.DeviceType.CPU, k) for k in range(len(cells))],
        check_exists=False)
    devices = [placed[k % len(placed)] for k in range(len(cells))]
    num_micro = _NumMicroBatches(p)
    num_devices = len(cells) // max(p.cells_per_device, 1)
    bubble = ('unknown (micro_batch_size needs input_shapes)' if num_micro is None
              else f'{_Bubble(p, num_devices, num_micro):.1%}')
    lines.append(f'pipeline {path}: K={len(cells)} cells, M={num_micro or "?"} '
                 f'micro-batches, remat {p.remat.name}, schedule '
                 f'{p.schedule.name}, bubble {bubble}')
    lines.append(f'  {"cell":<5} {"device":<34} {"param bytes":>12} '
                 f'{"GFLOPs":>8} {"act bytes":>10}  layers')
    shapes = tuple(tf.TensorShape(s) for s in p.input_shapes or [])
    for k, (cell, device) in enumerate(zip(cells, devices)):
      names = [lp.name for lp in cell.sub] if 'sub' in cell else [cell.name]
      if shapes:
        meta = cell.cls.FPropMeta(cell, *shapes)
        shapes = meta.out_shapes
        cost = (f'{_Human(meta.param_bytes):>12} {meta.flops / 1e9:>8.3f} '
                f'{_Human(meta.act_bytes):>10}')
      else:
        cost = f'{"?":>12} {"?":>8} {"?":>10}'
      lines.append(f'  {k:<5} {device.name:<34} {cost}  {", ".join(names)}')
    lines.extend(_PlannerTable(p, num_micro, budget_bytes, optimizer_slots))
  if not lines:
    lines.append('The model has no PipeliningLayer: it runs on one device.')
  return '\n'.join(lines)
