"""Unpipelined step of residual 512-2048-512 blocks in plain TF, per dtype, XLA and rows; prints JSON."""

import json
import statistics
import time

from absl import app
from absl import flags
import tensorflow as tf

FLAGS = flags.FLAGS


def main(argv):
  del argv
  tf.config.threading.set_intra_op_parallelism_threads(FLAGS.intra_op_threads)
  dtype = tf.as_dtype(FLAGS.dtype)
  init = tf.random.stateless_normal
  ws = [tf.Variable(init([512, 2048], [i, 0]) * 0.02) for i in range(FLAGS.layers)]
  vs = [tf.Variable(init([2048, 512], [i, 1]) * 0.02) for i in range(FLAGS.layers)]
  xs = [init([FLAGS.rows, 512], [9, c]) for c in range(FLAGS.calls)]

  @tf.function(jit_compile=FLAGS.xla, autograph=False)
  def Step(xs):
    with tf.GradientTape() as tape:
      w = [tf.cast(v, dtype) for v in ws]  # once per step, as the pipeline does
      v2 = [tf.cast(v, dtype) for v in vs]
      loss = 0.
      for x in xs:
        h = tf.cast(x, dtype)
        for a, b in zip(w, v2):
          h = h + tf.matmul(tf.nn.relu(tf.matmul(h, a)), b)
        loss += tf.reduce_mean(tf.square(tf.cast(h, tf.float32)))
    grads = tape.gradient(loss, ws + vs)
    for var, g in zip(ws + vs, grads):
      var.assign_sub(1e-3 * g)
    return loss

  for _ in range(3):
    Step(xs).numpy()
  times = []
  for _ in range(FLAGS.steps):
    t0 = time.perf_counter()
    Step(xs).numpy()
    times.append(time.perf_counter() - t0)
  print(json.dumps(dict(layers=FLAGS.layers, rows=FLAGS.rows, calls=FLAGS.calls,
                        dtype=FLAGS.dtype, xla=FLAGS.xla,
                        intra_op_threads=FLAGS.intra_op_threads,
                        step_s_median=statistics.median(times), step_s_min=min(times))))


def _DefineFlags():
  """Only when run, so importing this beside other benchmarks does not clash."""
  flags.DEFINE_integer('layers', 4, 'Residual blocks (ffn K=4 gives each cell 4).')
  flags.DEFINE_integer('rows', 16, 'Rows per call (ffn K=4 M=4: 16 per micro-batch).')
  flags.DEFINE_integer('calls', 1, 'Forward+backward calls per step, each on its own rows.')
  flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16'], 'Compute dtype.')
  flags.DEFINE_bool('xla', False, 'jit_compile the step.')
  flags.DEFINE_integer('steps', 20, 'Measured steps (after 3 unmeasured).')
  flags.DEFINE_integer('intra_op_threads', 0, 'Intra-op threads (0: TF default).')


if __name__ == '__main__':
  _DefineFlags()
  app.run(main)
