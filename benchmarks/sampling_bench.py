"""LM sampling speed with a key/value cache against rerunning the window.

Builds an experiment's language model (default the demo's,
lm.StdlibBytesGPipe: 4 cells on 4 logical CPU devices, 8 micro-batches,
window 128) at its initial weights (speed does not depend on them), then
samples `--steps` bytes after a `--prompt`-byte prompt with
lm/sampler.py's CachedSampler and FullWindowSampler, alternating,
`--repeats` times each after one untimed warm-up run of each, and prints
one JSON object: bytes per second of each (median and all runs), their
ratio, and whether both drew the same bytes.

  python -m benchmarks.sampling_bench --steps=256 --repeats=5
"""

import json
import os
import statistics
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import numpy as np
import tensorflow as tf

FLAGS = flags.FLAGS
flags.DEFINE_string('model', 'lm.StdlibBytesGPipe', 'A language-model experiment.')
flags.DEFINE_integer('batch', 8, 'Continuations sampled at once.')
flags.DEFINE_integer('prompt', 64, 'Prompt bytes.')
flags.DEFINE_integer('steps', 256, 'Bytes generated per run.')
flags.DEFINE_integer('repeats', 5, 'Timed runs of each sampler, alternating.')


def main(argv) -> None:
  del argv
  from lingvo_pipe import model_registry  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.pipeline.layout import device_mapping
  from lingvo_pipe.tasks.lm import sampler
  task_params = model_registry.GetExperiment(FLAGS.model).Task()
  cpu = tf.config.list_physical_devices('CPU')[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * device_mapping.DevicesNeeded(task_params))
  task = task_params.Instantiate()
  prompt = np.random.RandomState(0).randint(32, 127, [FLAGS.batch, FLAGS.prompt]).astype(np.int32)
  samplers = {'cached': sampler.CachedSampler(task.stack, FLAGS.batch),
              'full_window': sampler.FullWindowSampler(task.stack, FLAGS.batch)}
  outputs = {name: s.Sample(prompt, FLAGS.steps, seed=1) for name, s in samplers.items()}
  runs = {name: [] for name in samplers}
  for _ in range(FLAGS.repeats):
    for name, s in samplers.items():
      start = time.perf_counter()
      s.Sample(prompt, FLAGS.steps, seed=1)
      runs[name].append(FLAGS.batch * FLAGS.steps / (time.perf_counter() - start))
  median = {name: statistics.median(r) for name, r in runs.items()}
  stack = task.params.stack
  print(json.dumps({
      'model': FLAGS.model, 'num_cells': len(task.stack.pipeline.cells),
      'num_micro_batches': stack.pipeline.num_micro_batches, 'window': stack.seq_len,
      'batch': FLAGS.batch, 'prompt_bytes': FLAGS.prompt, 'generated_bytes': FLAGS.steps,
      'repeats': FLAGS.repeats,
      'bytes_per_s_median': median,
      'bytes_per_s_runs': runs,
      'cached_over_full_window': median['cached'] / median['full_window'],
      'same_bytes': bool(np.array_equal(outputs['cached'], outputs['full_window'])),
  }, indent=1))


if __name__ == '__main__':
  app.run(main)
