"""The FIFO queues between the devices' loops of a loop step (loop_executor).

Per replica and boundary j between cells j and j+1: 'acts' carries cell
j's outputs to cell j+1's device, 'grads' their gradients back to cell
j's. Each queue is a resource of the step's graph on the device that
takes from it (the op, not tf.queue.FIFOQueue: that is an eager queue on
CPU:0 that lives as long as its Python object), drained of what a
failed step left before either side uses it. Producer and consumer hold
handles of their own: a function's automatic control dependencies order
the ops of one handle, and would start the consumer's loop only after
the producer's had ended; so the queue is shared by name.

A named queue lives as long as the process (its ops look it up by name
at every run, so it cannot be destroyed while a trace may run again).
Names therefore belong to their pipeline (QueueNames): the same on every
retrace of a step of one signature, which reuses the queues its last
trace made, and distinct for each loop step built in one graph (two calls
of the pipeline in one function run at once) and for each pipeline.
"""

import hashlib
from typing import Dict, List, Sequence, Tuple
import uuid
import weakref

import tensorflow as tf

Pair = Tuple[tf.queue.QueueBase, tf.queue.QueueBase]  # (producer's, consumer's)


class QueueNames:
  """The names of one pipeline's loop-step queues (module docstring)."""

  def __init__(self) -> None:
    self._owner = f'lingvo_pipe_loop_{uuid.uuid4().hex[:12]}'
    self._steps: 'weakref.WeakKeyDictionary[tf.Graph, int]' = weakref.WeakKeyDictionary()

  def Step(self) -> str:
    """The prefix of a loop step built now: its index among the loop steps
    of this pipeline built in the current graph."""
    graph = tf.compat.v1.get_default_graph()
    index = self._steps.get(graph, 0)
    self._steps[graph] = index + 1
    return f'{self._owner}_{index}'


def Build(out_specs: Sequence[Sequence[tf.TensorSpec]], devices: Sequence[str],
          capacity: int, prefix: str) -> Dict[str, List[Pair]]:
  """One replica's queues: per boundary j, 'acts' and 'grads' of cell j's
  out_specs, the cells on `devices`; named `prefix` (QueueNames.Step and
  the replica), the boundary, the direction and the signature."""
  queues: Dict[str, List[Pair]] = dict(acts=[], grads=[])
  for j, specs in enumerate(out_specs[:-1]):
    dtypes, shapes = [s.dtype for s in specs], [s.shape for s in specs]
    signature = hashlib.sha1(repr((dtypes, shapes, capacity)).encode()).hexdigest()[:12]
    for key, cell in (('acts', j + 1), ('grads', j)):
      name = f'{prefix}_{j}_{key}_{signature}'

      def Handle():
        return tf.queue.QueueBase(dtypes, shapes, None, tf.raw_ops.FIFOQueueV2(
            component_types=dtypes, shapes=shapes, capacity=capacity, shared_name=name))

      with tf.device(devices[cell]):
        producer = Handle()
        drained = producer.dequeue_many(producer.size())
        with tf.control_dependencies(tf.nest.flatten(drained)):
          queues[key].append((producer, Handle()))
  return queues


def Dequeue(queue: tf.queue.QueueBase) -> List[tf.Tensor]:
  """The next element of `queue`, its components as a list."""
  element = queue.dequeue()
  return list(element) if isinstance(element, (list, tuple)) else [element]
