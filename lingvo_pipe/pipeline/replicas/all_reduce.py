"""The replicas' gradients summed with TensorFlow's collective all-reduce.

Cell c of every replica holds its own copy of the cell's variables
(replica_variables.py), so each replica needs the sum of all replicas'
gradients on its own device. Per cell, the gradients of each dtype are
packed into one vector and summed by one CollectiveReduceV2 per replica
device (the ring all-reduce behind tf.distribute's multi-worker strategy;
TensorFlow picks the implementation): no central sum, no transport of our
own. A cell's reduction depends only on that cell's gradients, so it
starts as soon as they exist and overlaps the backwards of the cells
still working.

The keys belong to the pipeline that reduces (`Collectives`, one per
PipeliningLayer, dropped with it): TensorFlow's runtime knows a group by
its key in the whole process, so each owner takes a range of group keys of
its own (as tf.distribute's CollectiveKeys takes a group_key_start), one
group per set of devices (a cell's replica devices); instance keys are
counted per owner, one per (cell, dtype) of each traced step, so
reductions that may run at once never share one. Each device's collectives
run in the order they were built (the owner's ordering token per device),
the same order on every member, which keeps them from waiting on each
other. The tokens are variables, made with the owner: made during the
first trace of a step, they would make tf.function trace the whole step
a second time.
"""

import itertools
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.pipeline.cell.scope_names import ALL_REDUCE_SCOPE

# Chunks of a ring all-reduce in flight per device. TensorFlow's default
# (-1: its own choice) took 0.33 s for 134 MB between two loopback workers,
# 8 took 0.15-0.22 s (plain transfers of the same bytes: 0.09-0.10 s);
# docs/several_machines.md has the measurements.
_SUBDIVISIONS = 8

# Group keys per owner; a pipeline has one group per cell.
_GROUP_KEYS_PER_OWNER = 1 << 12
_owners = itertools.count()  # the one process-wide count: of key ranges handed out


class Collectives:
  """The group keys, instance keys and ordering tokens of one owner's
  all-reduces on `devices` (module docstring)."""

  def __init__(self, devices: Sequence[str]) -> None:
    self._lock = threading.Lock()
    self._first_group_key = 1 + next(_owners) * _GROUP_KEYS_PER_OWNER
    self._group_keys: Dict[Tuple[str, ...], int] = {}
    self._instance_keys = itertools.count(1)
    self._ordering_tokens: Dict[str, tf.Variable] = {}
    with tf.init_scope():
      for device in devices:
        if device not in self._ordering_tokens:
          with tf.device(device):
            self._ordering_tokens[device] = tf.Variable(
                0.0, trainable=False, name='collective_ordering_token')

  def GroupKey(self, devices: Tuple[str, ...]) -> int:
    with self._lock:
      if devices not in self._group_keys:
        if len(self._group_keys) == _GROUP_KEYS_PER_OWNER:
          raise RuntimeError(f'An owner of all-reduces uses at most '
                             f'{_GROUP_KEYS_PER_OWNER} sets of devices.')
        self._group_keys[devices] = self._first_group_key + len(self._group_keys)
      return self._group_keys[devices]

  def InstanceKey(self) -> int:
    with self._lock:
      return next(self._instance_keys)

  def OrderingToken(self, device: str) -> Any:
    """The resource that orders this owner's collectives on `device`."""
    if device not in self._ordering_tokens:
      raise ValueError(f'All-reduces on {device!r}: their owner was made for '
                       f'{sorted(self._ordering_tokens)} only.')
    return self._ordering_tokens[device].handle


def Sum(per_replica: Sequence[Sequence[Optional[tf.Tensor]]],
        devices: Sequence[str], keys: Collectives) -> List[List[Optional[tf.Tensor]]]:
  """The sum over replicas of flat gradients, on every replica's device.

  Args:
    per_replica: [replica] the same cell's flat gradients (None where a
      theta entry has none, alike in every replica).
    devices: [replica] the cell's device in that replica.
    keys: the reducing pipeline's Collectives.

  Returns:
    [replica] the summed gradients on that replica's device, bitwise
    alike (None stays None).
  """
  if len(per_replica) == 1:
    return [list(per_replica[0])]
  reduce = _Reduce(len(per_replica), tuple(devices), keys)
  if tf.executing_eagerly():
    # Every member of a collective must be launched together: one op at a
    # time would wait forever for the others. In a graph, no function of
    # its own: a call op without a device would route every gradient
    # through the caller's default device (the client, on a cluster).
    reduce = tf.function(reduce, autograph=False)
  return reduce([list(g) for g in per_replica])


def _Reduce(group_size: int, devices: Tuple[str, ...], keys: Collectives):
  """The collectives summing [replica] flat gradients over replicas."""
  group_key = keys.GroupKey(devices)

  def Reduce(per_replica: List[List[Optional[tf.Tensor]]]):
    outputs: List[List[Optional[tf.Tensor]]] = [
        [None] * len(g) for g in per_replica]
    by_dtype: Dict[tf.DType, List[int]] = {}
    for i, g in enumerate(per_replica[0]):
      if g is not None:
        by_dtype.setdefault(g.dtype, []).append(i)
    for _, indices in sorted(by_dtype.items(), key=lambda kv: kv[0].name):
      instance_key = keys.InstanceKey()
      for r, device in enumerate(devices):
        with tf.device(device), tf.name_scope(ALL_REDUCE_SCOPE):
          parts = [per_replica[r][i] for i in indices]
          packed = tf.concat([tf.reshape(g, [-1]) for g in parts], 0)
          summed = tf.raw_ops.CollectiveReduceV2(
              input=packed, group_size=group_size, group_key=group_key,
              instance_key=instance_key,
              ordering_token=[keys.OrderingToken(device)],
              merge_op='Add', final_op='Id',
              max_subdivs_per_device=_SUBDIVISIONS)
          sizes = [tf.size(g) for g in parts]
          for i, piece, g in zip(indices, tf.split(summed, sizes), parts):
            outputs[r][i] = tf.reshape(piece, tf.shape(g))
    return outputs

  return Reduce
