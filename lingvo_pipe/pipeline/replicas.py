"""R replicas of one pipeline: data parallelism over copies of its K cells.

Replica r runs the same K cells on its own devices
(PipeliningLayer.replica_devices[r]) on its slice of the batch: the batch is
cut into R slices along batch_dim, and each replica cuts its slice into the
pipeline's M micro-batches, so that micro-batch m of replica r is
micro-batch r*M + m of one pipeline with R*M micro-batches (its step seed
too). The variables exist once, on replica 0's devices: each other replica
reads a copy of cell k's theta onto its own device of cell k, computes its
gradients there (summed over its micro-batches by its CellGradients), and
cell k's R gradients are added with tf.add_n on the variable's device,
where the optimizer applies one update. Batch-norm statistics are added
the same way and applied once. What crosses between devices per step is
therefore, besides the boundary activations and their gradients inside
each replica, each cell's weights once to every other replica and their
gradients once back.
"""

from typing import Any, List, Sequence

import tensorflow as tf

from lingvo_pipe.core.nested_map import NestedMap

# The name scope of the ops that add the replicas' gradients.
REPLICA_SUM_SCOPE = 'replica_sum'


def TrainReplicas(layer: Any, thetas: List[NestedMap], inputs: tuple,
                  num_micro: int) -> tuple:
  """The training forward of PipeliningLayer `layer` over its R replicas,
  with the backward of every replica as its custom gradient.

  Args:
    layer: the PipeliningLayer (its _RunForward, _RunBackward,
      _MergeOutputs and _ApplyCellUpdates take a replica index).
    thetas: each cell's theta, read on replica 0's devices.
    inputs: the pipeline inputs of the whole batch.
    num_micro: M, micro-batches per replica.

  Returns:
    The pipeline outputs of the whole batch, as with one replica.
  """
  num_replicas = layer.params.num_replicas
  contract = layer._contract  # pylint: disable=protected-access

  @tf.custom_gradient
  def Replicated(step_inputs, cell_thetas):
    # The batch is cut into replica slices where it is; each slice into
    # micro-batches on its replica's first device.
    slices = contract.SplitInputs(step_inputs, num_replicas)
    all_tasks, outputs, summed = [], [], []
    # Cast once on replica 0's devices (core/precision): the copies that
    # cross to the other replicas are then in the compute dtype.
    compute_thetas = layer._ComputeThetas(cell_thetas)  # pylint: disable=protected-access
    for r in range(num_replicas):
      devices = layer.replica_devices[r]
      replica_thetas = CopyThetas(compute_thetas, devices) if r else compute_thetas
      with tf.device(devices[0].name):
        micro = contract.SplitInputs(slices[r], num_micro)
      tasks, stats = layer._RunForward(replica_thetas, micro, training=True,  # pylint: disable=protected-access
                                       replica=r)
      all_tasks.append(tasks)
      outputs.append(layer._MergeOutputs(tasks, num_micro, replica=r))  # pylint: disable=protected-access
      summed.append(stats)
    replica_size = contract.InputLayout(slices[0]).batch_size
    merged = contract.MergeOutputs(outputs, replica_size)
    layer._ApplyCellUpdates(SumOverReplicas(  # pylint: disable=protected-access
        summed, [d.name for d in layer.devices]))
    flat_out = tf.nest.flatten(merged)

    def Grad(*dys, variables=None):
      del variables  # the pipeline reads no variables; theta is passed in
      dys = [tf.zeros_like(y) if dy is None else dy
             for y, dy in zip(flat_out, dys)]
      replica_dys = contract.SplitOutputGrads(outputs[0], dys, num_replicas)
      d_inputs, d_thetas = [], []
      for r in range(num_replicas):
        d_in, d_theta = layer._RunBackward(all_tasks[r], replica_dys[r],  # pylint: disable=protected-access
                                           num_micro, replica=r)
        d_inputs.append(d_in)
        d_thetas.append(d_theta)
      merged_inputs = contract.MergeInputGrads(slices[0], d_inputs)
      return merged_inputs + SumGradients(d_thetas, cell_thetas, layer.devices)

    return merged, Grad

  return Replicated(inputs, thetas)


def CopyThetas(thetas: List[NestedMap], devices: Sequence[Any]) -> List[NestedMap]:
  """Each cell's theta copied onto `devices[k]` (a replica's own copy)."""
  copies = []
  for theta, device in zip(thetas, devices):
    with tf.device(device.name):
      copies.append(tf.nest.map_structure(tf.identity, theta))
  return copies


def SumGradients(per_replica: Sequence[List[Any]], thetas: List[NestedMap],
                 devices: Sequence[Any]) -> List[Any]:
  """The flat theta gradients (cell after cell, as _RunBackward returns
  them) added over replicas, each on its cell's variable device (replica 0's
  device of that cell); None stays None."""
  sizes = [len(tf.nest.flatten(t)) for t in thetas]
  owners = [devices[k].name for k, n in enumerate(sizes) for _ in range(n)]
  total: List[Any] = []
  for i, owner in enumerate(owners):
    parts = [grads[i] for grads in per_replica if grads[i] is not None]
    if not parts:
      total.append(None)
      continue
    with tf.device(owner), tf.name_scope(REPLICA_SUM_SCOPE):
      total.append(tf.add_n(parts) if len(parts) > 1 else parts[0])
  return total


def SumOverReplicas(per_replica: Sequence[List[NestedMap]],
                    devices: Sequence[str]) -> List[NestedMap]:
  """Each cell's additive statistics added over replicas on `devices[k]`."""
  summed = []
  for k, device in enumerate(devices):
    with tf.device(device):
      summed.append(tf.nest.map_structure(
          lambda *xs: tf.add_n(list(xs)), *[stats[k] for stats in per_replica]))
  return summed
