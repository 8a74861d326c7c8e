"""The FIFO queues between the devices' loops of a loop step (loop_executor).

Per replica and boundary j between cells j and j+1: 'acts' carries cell
j's outputs to cell j+1's device, 'grads' their gradients back to cell
j's. Each queue is a resource of the step's graph on the device that
takes from it (the op, not tf.queue.FIFOQueue: that is an eager queue on
CPU:0 that lives as long as its Python object), drained of what a
failed step left before either side uses it. Producer and consumer hold
handles of their own: a function's automatic control dependencies order
the ops of one handle, and would start the consumer's loop only after
the producer's had ended.
"""

import itertools
from typing import Dict, List, Sequence, Tuple

import tensorflow as tf

Pair = Tuple[tf.queue.QueueBase, tf.queue.QueueBase]  # (producer's, consumer's)

_IDS = itertools.count()


def Build(out_specs: Sequence[Sequence[tf.TensorSpec]], devices: Sequence[str],
          capacity: int) -> Dict[str, List[Pair]]:
  """One replica's queues: per boundary j, 'acts' and 'grads' of cell j's
  out_specs, the cells on `devices`."""
  queues: Dict[str, List[Pair]] = dict(acts=[], grads=[])
  for j, specs in enumerate(out_specs[:-1]):
    dtypes, shapes = [s.dtype for s in specs], [s.shape for s in specs]
    for key, cell in (('acts', j + 1), ('grads', j)):
      name = f'lingvo_pipe_loop_{next(_IDS)}'

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
