"""How much two devices slow each other's weight-streaming products.

ffn's micro-batch products at M=16 ([4, 512] x [512, 2048]) read a 4 MiB
weight for 16 KFLOP of output rows: memory traffic, not arithmetic, bounds
them. This runs a chain of such products over the weights of one K=2 cell
(`--weights` distinct matrices) on one logical device, then two chains on
two devices at once, one thread per device as in the speedup table's
one_per_device rows, and prints one JSON object: microseconds per product
alone and side by side, and their ratio (1.0: the devices do not contend).
"""

import json
import os
import statistics
import time

from absl import app
from absl import flags
import tensorflow as tf

FLAGS = flags.FLAGS
flags.DEFINE_integer('rows', 4, 'Rows per product (ffn at M=16: 4).')
flags.DEFINE_integer('weights', 16, 'Distinct [512, 2048] weights per device.')
flags.DEFINE_integer('passes', 20, 'Passes over the weights per timed call.')
flags.DEFINE_integer('repeats', 15, 'Timed calls per setting (median).')


def _Chains(num_devices: int):
  """A tf.function running one product chain per device."""
  weights = []
  for d in range(num_devices):
    with tf.device(f'/device:CPU:{d}'):
      weights.append([tf.Variable(tf.random.stateless_normal([512, 2048], [d, i]))
                      for i in range(FLAGS.weights)])

  @tf.function(autograph=False)
  def Run(x):
    outs = []
    for d, chain in enumerate(weights):
      with tf.device(f'/device:CPU:{d}'):
        y = x
        for _ in range(FLAGS.passes):
          for w in chain:
            # A scalar of each product feeds the next: the chain is serial.
            y = y + 1e-9 * tf.reduce_sum(tf.matmul(y, w))
        outs.append(y)
    return outs

  return Run


def _MicrosPerProduct(run, x) -> float:
  run(x)
  times = []
  for _ in range(FLAGS.repeats):
    start = time.perf_counter()
    for y in run(x):
      y.numpy()
    times.append(time.perf_counter() - start)
  return statistics.median(times) / (FLAGS.passes * FLAGS.weights) * 1e6


def main(argv):
  del argv
  cpu = tf.config.list_physical_devices('CPU')[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(2)
  x = tf.random.stateless_normal([FLAGS.rows, 512], [7, 7])
  alone = _MicrosPerProduct(_Chains(1), x)
  side_by_side = _MicrosPerProduct(_Chains(2), x)
  print(json.dumps(dict(
      rows=FLAGS.rows, weights_per_device=FLAGS.weights, cpus=os.cpu_count(),
      us_per_product_alone=alone, us_per_product_side_by_side=side_by_side,
      slowdown=side_by_side / alone, tf_version=tf.__version__)), flush=True)


if __name__ == '__main__':
  app.run(main)
