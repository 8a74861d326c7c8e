"""The FLOP partition against the measured-time partition, in one run; prints one JSON object.

Per workload, planning.measured_costs.Measure times each layer alone at
the micro-batch size, and two pipelines of the same layers at --k, --m
(fill-drain, PER_CELL remat) are built: one partitioned by FLOPs, one by
the measured seconds (cost=CostKind.GIVEN). Their training steps (forward,
loss, every gradient) run alternately, --rounds rounds of --steps steps
after a warm-up each; the JSON gives per workload both splits, both
median step times and measured over flops. Where both partitions give
the same cells (same_cells), the two pipelines run one step, and their
ratio is what two instances of it differ by on this machine.

Workloads: 'uneven', built here, where FLOPs mislead: --uneven_layers
layers, the first half elementwise (five LayerNorm + dropout pairs each:
few FLOPs, many passes over memory), the second half tanh projections
--dim x --dim, on --uneven_batch rows; and docs/workloads.md's ffn and
transformer.

  python -m benchmarks.partition_bench --workloads=uneven,ffn,transformer
"""

import json
import statistics
import time
from typing import Any, Dict, List, Tuple

from absl import app
from absl import flags

from benchmarks import runner

FLAGS = flags.FLAGS


def _DefineFlags() -> None:
  flags.DEFINE_list('workloads', ['uneven', 'ffn', 'transformer'],
                    "'uneven' or workloads of docs/workloads.md.")
  flags.DEFINE_integer('k', 2, 'Devices (cells).')
  flags.DEFINE_integer('m', 4, 'Micro-batches.')
  flags.DEFINE_integer('steps', 10, 'Timed steps per round and pipeline.')
  flags.DEFINE_integer('rounds', 3, 'Rounds, alternating the two pipelines.')
  flags.DEFINE_integer('repeats', 5, "Timed runs per layer and function (Measure's).")


def DefineWorkloadFlags() -> None:
  """The flags of the uneven stack (Workload('uneven'))."""
  flags.DEFINE_integer('uneven_layers', 8, "The uneven stack's layers (even).")
  flags.DEFINE_integer('dim', 1024, "The uneven stack's width.")
  flags.DEFINE_integer('uneven_batch', 256, "The uneven stack's batch.")


def UnevenLayers(num_layers: int, dim: int) -> List[Any]:
  """Half elementwise layers, then half projections (module docstring)."""
  from lingvo_pipe.core.layers import activations  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core.layers import containers  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core.layers import dropout  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core.layers import linear  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core.layers import normalization  # pylint: disable=g-import-not-at-top
  half = num_layers // 2
  layers = []
  for i in range(half):
    sub = []
    for j in range(5):
      sub += [normalization.LayerNorm.Params().Set(name=f'ln{j}', input_dim=dim),
              dropout.DropoutLayer.Params().Set(name=f'drop{j}', keep_prob=0.9)]
    layers.append(containers.SequentialLayer.Params().Set(name=f'elementwise_{i}', sub=sub))
  for i in range(num_layers - half):
    layers.append(linear.ProjectionLayer.Params().Set(
        name=f'projection_{i}', input_dim=dim, output_dim=dim,
        activation=activations.Activation.TANH))
  return layers


def Workload(name: str) -> Tuple[List[Any], List[int]]:
  """(layer params, input shape) of 'uneven' (the flags') or a docs/workloads.md workload."""
  from benchmarks import workloads  # pylint: disable=g-import-not-at-top
  if name == 'uneven':
    return UnevenLayers(FLAGS.uneven_layers, FLAGS.dim), [FLAGS.uneven_batch, FLAGS.dim]
  w = workloads.WORKLOADS[name]
  return workloads.Layers(w), w.input_shape


def _TrainStep(pipeline_params):
  """The pipeline's traced training step, and its cells' layer indices."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core import step_seeds  # pylint: disable=g-import-not-at-top
  pipe = pipeline_params.Instantiate()
  seeds = step_seeds.Counter()  # new dropout masks each step, as in training

  def Loss(out):
    return tf.reduce_mean(tf.cast(out[0] if isinstance(out, tuple) else out, tf.float32))

  @tf.function(autograph=False)
  def Step(x):
    with tf.GradientTape() as tape:
      loss, _ = pipe.FPropWithLoss(seeds.Next(pipe.theta), Loss, x)
    return [g for g in tape.gradient(loss, pipe.trainable_variables) if g is not None]

  return Step, pipe.CellLayerIndices()


def _Seconds(step, x, steps: int) -> List[float]:
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    for g in step(x):
      g.numpy()
    times.append(time.perf_counter() - start)
  return times


def Compare(name: str) -> Dict[str, Any]:
  """Both partitions of workload `name`, timed alternately."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.pipeline import gpipe  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.planning import measured_costs  # pylint: disable=g-import-not-at-top
  layers, shape = Workload(name)
  flops = gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, num_partitions=FLAGS.k, num_micro_batches=FLAGS.m,
      input_shapes=[shape], remat=gpipe.RematPolicy.PER_CELL)
  x = tf.random.stateless_normal(shape, [1, 2])
  costs = measured_costs.Measure(flops, [x], repeats=FLAGS.repeats)
  steps, cells, times = {}, {}, {'flops': [], 'measured': []}
  for key, params in (('flops', flops), ('measured', measured_costs.Balanced(flops, costs))):
    steps[key], cells[key] = _TrainStep(params)
    _Seconds(steps[key], x, 2)  # trace and warm up
  for _ in range(FLAGS.rounds):
    for key in ('flops', 'measured'):
      times[key] += _Seconds(steps[key], x, FLAGS.steps)
  median = {key: statistics.median(t) for key, t in times.items()}
  return dict(workload=name, k=FLAGS.k, m=FLAGS.m,
              layer_ms=[round(c.step_s * 1e3, 3) for c in costs],
              flops_cells=cells['flops'], measured_cells=cells['measured'],
              same_cells=cells['flops'] == cells['measured'],
              flops_step_s=median['flops'], measured_step_s=median['measured'],
              measured_over_flops=median['measured'] / median['flops'])


def main(argv):
  del argv
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  cpu = tf.config.list_physical_devices('CPU')[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * FLAGS.k)
  print(json.dumps(dict(machine=runner.MachineInfo(),
                        rows=[Compare(name) for name in FLAGS.workloads])))


if __name__ == '__main__':
  _DefineFlags()
  DefineWorkloadFlags()
  app.run(main)
