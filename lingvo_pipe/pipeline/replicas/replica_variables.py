"""Each pipeline replica's own copy of its cells' trainable variables.

With R replicas, replica 0 trains the model's variables (the ones the
checkpoint holds, by their logical paths) and replica r > 0 a copy of
each trainable variable on its own device for the same cell. Every
replica receives the same all-reduced gradient (all_reduce.py) and the
optimizer applies it to every copy with the copy's own slots, on the
copy's device, so the copies stay bitwise alike with no variable read
across replicas. The copies are no part of the model: not in its
variables, paths or checkpoints: before training, after a restore or a
warm start, the trainer sets them and their slots to replica 0's
(trainer/optimizers.SynchronizeCopies).
"""

from typing import Any, Dict, List, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core.nested_map import NestedMap


class ReplicaVariables:
  """The copies of one PipeliningLayer's trainable variables.

  Args:
    layers: the pipeline's layers.
    cell_layers: per cell, the indices of its layers.
    replica_devices: [replica][cell] the cell's device (replica 0's holds
      the originals).
  """

  def __init__(self, layers: Sequence[base_layer.BaseLayer],
               cell_layers: Sequence[Sequence[int]],
               replica_devices: Sequence[Sequence[Any]]) -> None:
    self._copies: Dict[int, List[tf.Variable]] = {}
    self._replica_devices = replica_devices
    self.pairs: List[Tuple[tf.Variable, List[tf.Variable]]] = []
    if len(replica_devices) < 2:
      return
    for k, run in enumerate(cell_layers):
      for var in [v for i in run for v in layers[i].trainable_variables]:
        copies = []
        for row in replica_devices[1:]:
          with tf.init_scope(), tf.device(row[k].name):
            copies.append(tf.Variable(var.read_value(), trainable=True,
                                      name=var.name.split(':')[0] + '/replica_copy'))
        self._copies[id(var)] = copies
        self.pairs.append((var, copies))

  def Thetas(self, cells: Sequence[base_layer.BaseLayer],
             thetas: Sequence[NestedMap]) -> List[List[NestedMap]]:
    """[replica - 1][cell] the cell's theta for each replica r >= 1, on
    its device: the trainable variables read from the replica's copies,
    the other entries (statistics, step seeds) copied from `thetas`
    (replica 0's)."""
    out: List[List[NestedMap]] = []
    for r, row in enumerate(self._replica_devices[1:], 1):
      out.append([])
      for cell, theta, device in zip(cells, thetas, row):

        def Entry(owner: base_layer.BaseLayer, name: str, value, r=r):
          copies = self._copies.get(id(getattr(owner, name)))
          return tf.identity(value) if copies is None else copies[r - 1].read_value()

        with tf.device(device.name):
          out[-1].append(cell.MapTheta(theta, Entry))
    return out


def CopiesIn(model: base_layer.BaseLayer) -> List[Tuple[tf.Variable, List[tf.Variable]]]:
  """(original, its replica copies) of every trainable variable that a
  pipeline with replicas in `model` (or `model` itself) copies."""
  held = [layer.__dict__.get('replica_variables') for layer in model.Walk()]
  return [pair for copies in held if isinstance(copies, ReplicaVariables)
          for pair in copies.pairs]


def SetCopiesToOriginals(model: base_layer.BaseLayer) -> None:
  """Assigns every replica copy in `model` its original's value: after the
  originals were set by other means than the optimizer (weights copied in,
  set_weights). The trainer's optimizers.SynchronizeCopies also sets slots."""
  for original, copies in CopiesIn(model):
    for copy in copies:
      copy.assign(original)


def TrainedVariables(model: base_layer.BaseLayer) -> List[tf.Variable]:
  """What an optimizer trains: `model`'s trainable variables, then every
  replica copy. Take the gradients of all of them and apply them all; the
  copies' gradients are their originals' (the sum over replicas)."""
  return list(model.trainable_variables) + [
      c for _, copies in CopiesIn(model) for c in copies]
