"""Benchmarks one training step of a standard workload; prints one JSON object.

One configuration per process (TensorFlow's allocator peak and thread pools
are per process). Loss = mean of squared outputs (float32), plain SGD on
float32 weights; --fprop_dtype=bfloat16 computes in bfloat16, --jit_compile=xla
compiles the cells with XLA (docs/precision.md).

  python -m benchmarks.pipeline_bench --workload=ffn --k=4 --m=4
  python -m benchmarks.pipeline_bench --workload=ffn --baseline
"""

import dataclasses
import json
import os
import statistics
import sys
import time

os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import tensorflow as tf

from benchmarks import schedule_flags

FLAGS = flags.FLAGS
flags.DEFINE_enum('workload', 'ffn', ['ffn', 'transformer', 'transformer-act'],
                  'A workload of docs/workloads.md.')
flags.DEFINE_integer('k', 1, 'Cells (devices).')
flags.DEFINE_integer('m', 1, 'Micro-batches.')
flags.DEFINE_enum('remat', 'per_cell', ['none', 'per_cell', 'per_layer'],
                  'Rematerialization policy.')
flags.DEFINE_bool('remat_last_micro_batch', False, 'With --remat=per_cell, '
                  "recompute each cell's last micro-batch too (PipeliningLayer's "
                  'remat_last_micro_batch).')
schedule_flags.Define()
flags.DEFINE_bool('baseline', False, 'The same layers unpipelined on one device.')
flags.DEFINE_integer('steps', 10, 'Measured steps.')
flags.DEFINE_integer('warmup', 2, 'Steps run before measuring (after the first).')
flags.DEFINE_integer('intra_op_threads', 0, 'Intra-op threads (0: TF default).')
flags.DEFINE_integer('inter_op_threads', 0, 'Inter-op threads (0: TF default).')
flags.DEFINE_integer('num_layers', 0, 'Override the workload\'s L (0: keep).')
flags.DEFINE_integer('batch', 0, 'Override the workload\'s batch size (0: keep).')
flags.DEFINE_integer('seq', 0, 'Override the workload\'s sequence length (0: keep).')
flags.DEFINE_float('learning_rate', 1e-3, 'SGD learning rate.')
flags.DEFINE_float('residual_keep_prob', 1.0, 'Keep probability of the '
                   "transformer workloads' residual dropout (1.0: none).")
flags.DEFINE_enum('fprop_dtype', 'float32', ['float32', 'bfloat16', 'float16'],
                  'Compute dtype of the layers (weights stay float32).')
flags.DEFINE_enum('jit_compile', 'none', ['none', 'xla', 'auto'],
                  "PipeliningLayer's jit_compile (a CellCompilation).")
flags.DEFINE_string('timeline_dir', '', 'If set, profile one more step and write '
                    'timeline.json (Chrome trace) and timeline.png there.')


def _ConfigureDevices(num_devices: int) -> None:
  cpu = tf.config.list_physical_devices('CPU')[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * max(num_devices, 1))
  if FLAGS.intra_op_threads:
    tf.config.threading.set_intra_op_parallelism_threads(FLAGS.intra_op_threads)
  if FLAGS.inter_op_threads:
    tf.config.threading.set_inter_op_parallelism_threads(FLAGS.inter_op_threads)


def _BuildModel(workload):
  from benchmarks import workloads  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.pipeline import gpipe
  from lingvo_pipe.core.layers import containers
  layers = workloads.Layers(workload)
  if FLAGS.residual_keep_prob < 1.0:
    if workload.name == 'ffn':
      raise app.UsageError('--residual_keep_prob needs a transformer workload.')
    layers = [lp.Copy().Set(residual_keep_prob=FLAGS.residual_keep_prob)
              for lp in layers]
  dtype = tf.as_dtype(FLAGS.fprop_dtype)
  if FLAGS.baseline:
    with tf.device('/device:CPU:0'):
      return containers.SequentialLayer.Params().Set(
          name='model', sub=layers, fprop_dtype=dtype).Instantiate()
  from lingvo_pipe.pipeline.schedules import schedule  # pylint: disable=g-import-not-at-top
  return gpipe.PipeliningLayer.Params().Set(
      name='model', layers=layers, num_partitions=FLAGS.k * schedule_flags.CellsPerDevice(),
      num_micro_batches=FLAGS.m, input_shapes=[workload.input_shape],
      remat=gpipe.RematPolicy(FLAGS.remat),
      remat_last_micro_batch=FLAGS.remat_last_micro_batch, fprop_dtype=dtype,
      jit_compile=gpipe.CellCompilation(FLAGS.jit_compile),
      schedule=schedule.ScheduleKind(FLAGS.schedule),
      cells_per_device=FLAGS.cells_per_device,
      loop_min_micro_batches=FLAGS.loop_min_micro_batches).Instantiate()


def GraphOps(concrete_fn) -> int:
  """Ops of the step's graph including every function body it calls."""
  graph_def = concrete_fn.graph.as_graph_def()
  return len(graph_def.node) + sum(len(f.node_def) for f in graph_def.library.function)


def Run(workload_name: str) -> dict:
  from benchmarks import workloads  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import step_seeds  # pylint: disable=g-import-not-at-top
  workload = workloads.WORKLOADS[workload_name]
  overrides = dict(num_layers=FLAGS.num_layers, batch=FLAGS.batch, seq=FLAGS.seq)
  workload = dataclasses.replace(workload, **{k: v for k, v in overrides.items() if v})
  _ConfigureDevices(1 if FLAGS.baseline else FLAGS.k)
  start = time.perf_counter()
  model = _BuildModel(workload)
  variables = list(model.trainable_variables)
  x = tf.random.stateless_normal(workload.input_shape, [1, 2])

  loss_inside = FLAGS.schedule != 'gpipe' and not FLAGS.baseline
  count = float(tf.size(x).numpy())  # the output is the input's shape

  def MicroLoss(y):
    return tf.reduce_sum(tf.square(tf.cast(y, tf.float32))) / count

  seeds = step_seeds.Counter()  # new dropout masks each step, as in training

  @tf.function(autograph=False)
  def Step(x):
    theta = seeds.Next(model.theta)
    with tf.GradientTape() as tape:
      if loss_inside:
        loss = model.FPropWithLoss(theta, MicroLoss, x)[0]
      else:
        loss = tf.reduce_mean(tf.square(tf.cast(model.FProp(theta, x), tf.float32)))
    for v, g in zip(variables, tape.gradient(loss, variables)):
      with tf.device(v.device):
        v.assign_sub(FLAGS.learning_rate * tf.convert_to_tensor(g))
    return loss

  before_steps = tf.config.experimental.get_memory_info('CPU:0')['current']
  Step(x).numpy()
  first_step_s = time.perf_counter() - start
  for _ in range(FLAGS.warmup):
    Step(x).numpy()
  warmup_peak = tf.config.experimental.get_memory_info('CPU:0')['peak']
  tf.config.experimental.reset_memory_stats('CPU:0')
  times = []
  for _ in range(FLAGS.steps):
    t0 = time.perf_counter()
    Step(x).numpy()
    times.append(time.perf_counter() - t0)
  step_peak = tf.config.experimental.get_memory_info('CPU:0')['peak']
  held = tf.config.experimental.get_memory_info('CPU:0')['current'] - before_steps
  result = dict(
      workload=workload.name, num_layers=workload.num_layers,
      batch=workload.batch, seq=workload.seq,
      baseline=FLAGS.baseline, K=1 if FLAGS.baseline else FLAGS.k,
      M=1 if FLAGS.baseline else FLAGS.m,
      remat='none' if FLAGS.baseline else FLAGS.remat,
      remat_last_micro_batch=FLAGS.remat_last_micro_batch and not FLAGS.baseline,
      schedule='none' if FLAGS.baseline else FLAGS.schedule,
      cells_per_device=1 if FLAGS.baseline else schedule_flags.CellsPerDevice(),
      loop_min_micro_batches=0 if FLAGS.baseline else FLAGS.loop_min_micro_batches,
      step_s_median=statistics.median(times), step_s_min=min(times),
      first_step_s=first_step_s,
      bfc_peak_bytes=step_peak,
      bfc_process_peak_bytes=max(step_peak, warmup_peak),
      bfc_held_bytes=held,
      graph_ops=GraphOps(Step.get_concrete_function(x)),
      intra_op_threads=FLAGS.intra_op_threads, inter_op_threads=FLAGS.inter_op_threads,
      steps=FLAGS.steps, tf_version=tf.__version__,
      fprop_dtype=FLAGS.fprop_dtype, jit_compile=FLAGS.jit_compile)
  if FLAGS.timeline_dir and not FLAGS.baseline:
    from lingvo_pipe.profiling import bubble  # pylint: disable=g-import-not-at-top
    from lingvo_pipe.profiling import record  # pylint: disable=g-import-not-at-top
    from lingvo_pipe.pipeline.lowering import program  # pylint: disable=g-import-not-at-top
    actions = model.plan.Actions(FLAGS.m)
    # Fill-drain labels itself, unless it loops: a loop step's calls run in
    # iterations, which only the schedule's tasks tell from steps.
    loops = model.plan.Emission(FLAGS.m) == program.Emission.LOOP
    labelled = None if FLAGS.schedule == 'gpipe' and not loops else actions
    intervals = record.Record(lambda: Step(x), FLAGS.timeline_dir, schedule_actions=labelled)
    result.update(timeline=bubble.Summary(intervals, labelled),
                  measured_bubble=bubble.MeasuredBubble(intervals, actions),
                  simulated_bubble=bubble.PredictedBubble(intervals, actions),
                  replayed_bubble=bubble.PredictedBubble(intervals, actions, per_action=True))
  return result


def main(argv):
  del argv
  if os.environ.get('TF_CPU_ALLOCATOR_USE_BFC') != 'true':
    sys.exit('Set TF_CPU_ALLOCATOR_USE_BFC=true (needed for bfc_peak_bytes).')
  print(json.dumps(Run(FLAGS.workload)), flush=True)


if __name__ == '__main__':
  app.run(main)
