"""A step's batch as replicas x micro-batches, and its outputs and gradients back as one batch.

The batch is cut into R slices where it lies, each slice into M
micro-batches on its replica's first device (micro_batch.Contract: split
inputs are cut, broadcast ones reach every micro-batch whole), so
micro-batch m of replica r is micro-batch r*M + m of the whole batch. The
last cell's outputs are merged on each replica's last device, then over
replicas; the gradients of the inputs the other way round. The loss
inputs (FPropWithLoss's labels, weights, masks) are cut alike, each
replica's on its last device, where its micro-batches' losses run.
"""

from typing import Any, List, Sequence

import tensorflow as tf

from lingvo_pipe.pipeline.layout import cluster
from lingvo_pipe.pipeline.layout import micro_batch


class ReplicaBatches:
  """The cuts of one step's batch.

  Args:
    contract: the pipeline's micro_batch.Contract.
    replica_devices: [replica][cell] the devices of the replicas that run.
    inputs: the pipeline's inputs of the whole batch.
    num_micro: M, micro-batches per replica.
    loss_inputs: per-example tensors of the whole batch for the loss
      (checked by contract.CheckLossInputs), or None. They get no gradient.
  """

  def __init__(self, contract: micro_batch.Contract,
               replica_devices: Sequence[Sequence[cluster.Device]], inputs: tuple,
               num_micro: int, loss_inputs: Any = None) -> None:
    self._contract = contract
    self._devices = replica_devices
    self._num_micro = num_micro
    num_replicas = len(replica_devices)
    self._slices = contract.SplitInputs(inputs, num_replicas) if num_replicas > 1 else [inputs]
    self.micro_inputs: List[List[tuple]] = []
    for r, row in enumerate(replica_devices):
      with tf.device(row[0].name):
        self.micro_inputs.append(contract.SplitInputs(self._slices[r], num_micro))
    self.micro_size = contract.InputLayout(self.micro_inputs[0][0]).batch_size
    self._loss_inputs = loss_inputs
    self._loss_by_micro: List[List[tf.Tensor]] = []
    if loss_inputs is not None:
      flat = [tf.stop_gradient(x) for x in tf.nest.flatten(loss_inputs)]
      dim = contract.batch_dim
      slices = zip(*[tf.split(x, num_replicas, axis=dim) for x in flat])
      for row, per_replica in zip(replica_devices, slices):
        with tf.device(row[-1].name):
          self._loss_by_micro.append([_ByMicro(x, num_micro, dim) for x in per_replica])

  def LossInputs(self, r: int, m: Any) -> Any:
    """Micro-batch m's loss inputs of replica r (m an int, or in a loop a
    scalar tensor), as loss_inputs is structured."""
    dim = self._contract.batch_dim
    return tf.nest.pack_sequence_as(
        self._loss_inputs, [tf.gather(x, m, axis=dim) for x in self._loss_by_micro[r]])

  def Outputs(self, last_outputs: Sequence[Sequence[tuple]]) -> tuple:
    """The last cell's outputs of the whole batch, from [replica][micro-batch]."""
    per_replica = []
    for r, row in enumerate(self._devices):
      with tf.device(row[-1].name):
        per_replica.append(self._contract.MergeOutputs(last_outputs[r], self.micro_size))
    if len(per_replica) == 1:
      return tuple(per_replica[0])
    replica_size = self.micro_size * self._num_micro
    return tuple(self._contract.MergeOutputs(per_replica, replica_size))

  def OutputGrads(self, last_outputs: Sequence[Sequence[tuple]],
                  dys: Sequence[Any]) -> List[List[List[Any]]]:
    """[replica][micro-batch] the gradients of the last cell's flat outputs,
    from `dys`, those of the whole batch's."""
    num_replicas = len(self._devices)
    per_replica = (self._contract.SplitOutputGrads(last_outputs[0][0], dys, num_replicas)
                   if num_replicas > 1 else [list(dys)])
    split = []
    for r, row in enumerate(self._devices):
      with tf.device(row[-1].name):
        split.append(self._contract.SplitOutputGrads(
            last_outputs[r][0], per_replica[r], self._num_micro))
    return split

  def InputGrads(self, input_grads: Sequence[Sequence[List[Any]]]) -> List[Any]:
    """The gradients of the flat pipeline inputs of the whole batch, from
    [replica][micro-batch]."""
    per_replica = []
    for r, row in enumerate(self._devices):
      with tf.device(row[0].name):
        per_replica.append(self._contract.MergeInputGrads(self._slices[r], input_grads[r]))
    if len(per_replica) == 1:
      return per_replica[0]
    return self._contract.MergeInputGrads(self._slices[0], per_replica)


def _ByMicro(x: tf.Tensor, num_micro: int, dim: int) -> tf.Tensor:
  """x with its axis `dim` split in two, [num_micro, micro-batch size]:
  micro-batch m is tf.gather(..., m, axis=dim)."""
  shape = tf.shape(x)
  return tf.reshape(x, tf.concat([shape[:dim], [num_micro, -1], shape[dim + 1:]], 0))
