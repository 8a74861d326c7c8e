"""Trains a registered experiment a few steps, locally or on a cluster, and
writes what the tests compare: per-step losses, final weights, and where
the traced step puts each cell's calls and each variable's update.

  python -m tests.trainer.remote_train_program --out=DIR [--cluster_spec=...]
      [--override="task.stack.pipeline.num_replicas=2"]
"""

import argparse
import json
import os
import re
import sys
from typing import Any, Dict, List

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf

from lingvo_pipe import model_registry
from lingvo_pipe.pipeline.layout import cluster
from trainer.cluster import cluster_spec
from lingvo_pipe.pipeline.cell import scope_names
from trainer.cluster import cluster_client
from trainer import experiment_params
from trainer import loop

_CELL_FN = re.compile(r'cell_(\d+)_(forward|backward)')


def _Placements(graph_def: Any) -> Dict[str, List[List[str]]]:
  """'calls': [cell, kind, device] of every cell function call, with
  [cell, 'body', device] for every op in its body (an op without a device
  runs on its caller's); 'updates': [op, device, colocated variable];
  'kept': [op, device] of inlined kept forwards and backwards;
  'collectives': the device of every collective all-reduce."""
  library = {f.signature.name: f for f in graph_def.library.function}
  calls: List[List[str]] = []
  updates: List[List[str]] = []
  kept: List[List[str]] = []
  collectives: List[str] = []

  def Body(fn: str, device: str, cell: str) -> None:
    for node in library[fn].node_def:
      effective = node.device or device
      calls.append([cell, 'body', effective])
      if 'f' in node.attr and node.attr['f'].func.name in library:
        Body(node.attr['f'].func.name, effective, cell)

  def Visit(nodes: Any) -> None:
    for node in nodes:
      name = node.attr['f'].func.name if 'f' in node.attr else ''
      match = _CELL_FN.search(name)
      if match:
        kind = 'backward' if '__backward_' in name else match.group(2)
        calls.append([match.group(1), kind, node.device])
        Body(name, node.device, match.group(1))
      elif node.op == 'CollectiveReduceV2':
        collectives.append(node.device)
      elif node.op.startswith('ResourceApply'):
        updates.append([node.name, node.device, node.input[0]])
      elif (scope_names.KEPT_FORWARD_SCOPE in node.name or
            scope_names.KEPT_BACKWARD_SCOPE in node.name):
        kept.append([node.name, node.device])

  Visit(graph_def.node)
  for fn in library.values():
    if not _CELL_FN.search(fn.signature.name):
      Visit(fn.node_def)
  return {'calls': calls, 'updates': updates, 'kept': kept, 'collectives': collectives}


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument('--out', required=True)
  parser.add_argument('--cluster_spec', default='')
  parser.add_argument('--model', default='lm.StdlibBytesTiny')
  parser.add_argument('--override', default='')
  parser.add_argument('--steps', type=int, default=3)
  args = parser.parse_args()
  if args.cluster_spec:
    cluster_client.Connect(cluster_spec.Parse(args.cluster_spec), 60)
  else:
    cpu = tf.config.list_physical_devices('CPU')[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
  params = experiment_params.ExperimentParams(model_registry.GetExperiment(args.model))
  experiment_params.ApplyOverrides(params, args.override)
  trainer = loop.Trainer(params, os.path.join(args.out, 'logdir'), log=lambda _: None)
  graph_def = trainer._train_loop.get_concrete_function(  # pylint: disable=protected-access
      tf.constant(1)).graph.as_graph_def()
  losses = []
  for _ in range(args.steps):
    _, loss_sum, *_ = trainer._train_loop(tf.constant(1))  # pylint: disable=protected-access
    losses.append(float(loss_sum))
  pipeline = trainer.task.stack.pipeline
  variables = {v.name: v for v in trainer.task.trainable_variables}
  np.savez(os.path.join(args.out, 'weights.npz'),
           **{name: v.numpy() for name, v in variables.items()})
  slots = {name: [trainer.optimizer.get_slot(v, n).device
                  for n in trainer.optimizer.get_slot_names()]
           for name, v in variables.items()}
  report = {
      'losses': losses,
      'cell_devices': [[d.name for d in row] for row in pipeline.replica_devices],
      'variable_devices': {name: v.device for name, v in variables.items()},
      'copy_devices': {original.name: [c.device for c in copies]
                       for original, copies in trainer.replica_copies},
      'slot_devices': slots,
      'cell_of_variable': {v.name: k for k, cell in enumerate(pipeline.cells)
                           for v in cell.trainable_variables},
      'default_devices': [d.name for d in cluster.LocalDevices()],
      **_Placements(graph_def),
  }
  with open(os.path.join(args.out, 'report.json'), 'w') as f:
    json.dump(report, f)


if __name__ == '__main__':
  sys.exit(main())
