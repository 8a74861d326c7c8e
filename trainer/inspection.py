"""What `--mode=inspect_params` and `--mode=inspect_model` print."""

from typing import Any, Iterator, List

import tensorflow as tf

from lingvo_pipe.core import cluster
from lingvo_pipe.core import gpipe
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import schedule


def _Pipelines(params: Any, path: str = '') -> Iterator[tuple]:
  """(path, params) of every PipeliningLayer in nested params."""
  if isinstance(params, hyperparams.Params):
    cls = params.cls if 'cls' in params else None
    if cls is gpipe.PipeliningLayer:
      yield path or '.', params
    elif hasattr(cls, 'PipelineParams'):  # a stack that fills in its pipeline
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


def ModelPlan(task_params: hyperparams.Params) -> str:
  """Per pipeline: per cell its layers, parameters, FLOPs, activation bytes
  and device, from the layers' metadata (nothing is built)."""
  lines: List[str] = []
  for path, p in _Pipelines(task_params):
    cells = gpipe.CellParams(p)
    devices = cluster.PlaceCells(
        len(cells), [cluster.Device.Parse(d) for d in p.devices] if p.devices else
        [cluster.Device(cluster.DeviceType.CPU, k) for k in range(len(cells))],
        check_exists=False)
    lines.append(f'pipeline {path}: K={len(cells)} cells, M={p.num_micro_batches} '
                 f'micro-batches, remat {p.remat.name}, bubble '
                 f'{schedule.BubbleFraction(len(cells), max(p.num_micro_batches, 1)):.1%}')
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
  if not lines:
    lines.append('The model has no PipeliningLayer: it runs on one device.')
  return '\n'.join(lines)
