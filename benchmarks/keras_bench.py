"""A pipelined Keras Transformer stack against the same stack of the
project's own layers, in one run; prints one JSON object.

The stack is docs/workloads.md's `transformer` (by default): L pre-LN
Transformer layers (self-attention, then feed-forward), once as Keras
layers (MultiHeadAttention, LayerNormalization, Dense) pipelined by
KerasLayers, once as the project's TransformerEncoderLayer, both at the
same --k, --m and --schedule. Their training steps (planning/trial.Run:
the loss inside the pipeline, every gradient, gradient descent) are timed
alternately, --rounds rounds; beside them the unpipelined Keras model's
own `train_on_batch` (Keras's defaults) on the same batch.

  python -m benchmarks.keras_bench [--workload=transformer --k=2 --m=4 --schedule=one_f_one_b]
"""

import json
import statistics
from typing import Any, Dict, List

from absl import app
from absl import flags

from benchmarks import runner

FLAGS = flags.FLAGS


def _DefineFlags() -> None:
  flags.DEFINE_string('workload', 'transformer', 'A Transformer workload of docs/workloads.md.')
  flags.DEFINE_integer('k', 2, 'Devices (cells).')
  flags.DEFINE_integer('m', 4, 'Micro-batches.')
  flags.DEFINE_enum('schedule', 'one_f_one_b', ['gpipe', 'one_f_one_b', 'zb_h1', 'zb_h2'],
                    'The schedule (a ScheduleKind value of one cell per device).')
  flags.DEFINE_integer('rounds', 3, 'Rounds, alternating the two pipelines.')


def KerasTransformerStack(num_layers: int, dim: int, hidden: int, heads: int, seq: int) -> Any:
  """The workload's stack from Keras layers: a Sequential of pre-LN
  Transformer layers, each a Keras layer of named sublayers."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  keras = tf.keras

  class PreLnTransformer(keras.layers.Layer):
    """x + attention(ln(x)), then + ffn(ln(.)), as TransformerEncoderLayer."""

    def __init__(self, **kwargs):
      super().__init__(**kwargs)
      self.attention_ln = keras.layers.LayerNormalization(epsilon=1e-6, name='attention_ln')
      self.attention = keras.layers.MultiHeadAttention(heads, dim // heads, name='attention')
      self.ffn_ln = keras.layers.LayerNormalization(epsilon=1e-6, name='ffn_ln')
      self.ffn_in = keras.layers.Dense(hidden, activation='relu', name='ffn_in')
      self.ffn_out = keras.layers.Dense(dim, name='ffn_out')

    def call(self, x):
      h = self.attention_ln(x)
      x = x + self.attention(h, h)
      return x + self.ffn_out(self.ffn_in(self.ffn_ln(x)))

  return keras.Sequential([keras.Input((seq, dim))] +
                          [PreLnTransformer(name=f'layer_{i}') for i in range(num_layers)])


def Compare(workload: Any, k: int, m: int, schedule: str, rounds: int) -> Dict[str, Any]:
  """Step times of the two pipelines (alternating) and of train_on_batch."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from benchmarks import workloads  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core.layers import keras_models  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.pipeline import gpipe  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.pipeline.schedules.built_in import ScheduleKind  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.planning import trial  # pylint: disable=g-import-not-at-top
  w = workload
  model = KerasTransformerStack(w.num_layers, w.dim, w.hidden, w.heads, w.seq)
  common = dict(num_partitions=k, num_micro_batches=m, input_shapes=[w.input_shape],
                schedule=ScheduleKind(schedule))
  pipelines = {
      'keras': gpipe.PipeliningLayer.Params().Set(
          name='keras', layers=keras_models.KerasLayers(model, [None, w.seq, w.dim]), **common),
      'project': gpipe.PipeliningLayer.Params().Set(
          name='project', layers=workloads.Layers(w), **common),
  }
  weights = dict(keras=model.count_params(), project=sum(
      int(tf.size(v)) for v in pipelines['project'].Instantiate().trainable_variables))
  x = tf.random.stateless_normal(w.input_shape, [1, 2])
  times: Dict[str, List[float]] = {key: [] for key in pipelines}
  for _ in range(rounds):
    for key, (seconds, _) in zip(pipelines, trial.Run(list(pipelines.values()), [x])):
      times[key].append(seconds)
  model.compile(optimizer=tf.keras.optimizers.SGD(1e-6),
                loss=lambda _, y: tf.reduce_mean(tf.square(y)))
  zeros = tf.zeros_like(x)
  model.train_on_batch(x, zeros)  # builds and traces
  train_on_batch = trial.StepSeconds(
      lambda n: [model.train_on_batch(x, zeros) for _ in range(n)], rounds=rounds)
  median = {key: statistics.median(t) for key, t in times.items()}
  return dict(workload=w.name, k=k, m=m, schedule=schedule, weights=weights,
              keras_pipeline_step_s=times['keras'], project_pipeline_step_s=times['project'],
              keras_over_project=median['keras'] / median['project'],
              keras_over_project_by_round=[a / b for a, b in zip(times['keras'],
                                                                   times['project'])],
              keras_train_on_batch_step_s=train_on_batch,
              keras_train_on_batch_jit_compile=bool(model.jit_compile),
              speedup_over_train_on_batch=train_on_batch / median['keras'])


def main(argv):
  del argv
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from benchmarks import workloads  # pylint: disable=g-import-not-at-top
  cpu = tf.config.list_physical_devices('CPU')[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * FLAGS.k)
  row = Compare(workloads.WORKLOADS[FLAGS.workload], FLAGS.k, FLAGS.m, FLAGS.schedule,
                FLAGS.rounds)
  print(json.dumps(dict(machine=runner.MachineInfo(), rows=[row])))


if __name__ == '__main__':
  _DefineFlags()
  app.run(main)
