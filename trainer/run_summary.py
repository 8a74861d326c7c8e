"""The opening line of a run: what runs, how it is pipelined, and where."""

from typing import List

import tensorflow as tf

from lingvo_pipe.pipeline import gpipe


def _ShortDevice(name: str) -> str:
  """'CPU:1' for a local device, 'worker/task:1/CPU:0' on a cluster."""
  spec = tf.DeviceSpec.from_string(name)
  device = f'{spec.device_type}:{spec.device_index}'
  if spec.job and spec.job != 'localhost':
    return f'{spec.job}/task:{spec.task}/{device}'
  return device


def PipelineLines(task: tf.Module) -> List[str]:
  """'K=2 cells, M=4 micro-batches, schedule GPIPE, devices CPU:0 CPU:1' per
  PipeliningLayer of the built task (replicas' devices apart: '| CPU:2
  CPU:3'), read off the layers themselves (so tasks that build their
  pipelines in their constructors are covered)."""
  found = []
  for module in task.submodules:
    if not isinstance(module, gpipe.PipeliningLayer):
      continue
    p, plan = module.params, module.plan
    micro = (f'{p.micro_batch_size} examples per micro-batch' if p.micro_batch_size
             else f'M={p.num_micro_batches} micro-batches')
    devices = ' | '.join(' '.join(_ShortDevice(d.name) for d in row)
                         for row in plan.replica_devices)
    replicas = f', R={plan.num_replicas} replicas' if plan.num_replicas > 1 else ''
    found.append(f'{p.name}: K={plan.num_cells} cells, {micro}{replicas}, schedule '
                 f'{plan.schedule_name}, devices {devices}')
  return found


def OpeningLine(model: str, mode: str, task: tf.Module, logdir: str) -> str:
  """One line naming the experiment, mode, pipelines and logdir."""
  pipelines = PipelineLines(task) or ['no pipeline (one device)']
  return f'{model} ({mode}): {"; ".join(pipelines)}; logdir {logdir}'
