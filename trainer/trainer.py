"""The trainer binary: runs a registered experiment.

  python -m trainer.trainer --model=lm.StdlibBytesGPipe --logdir=/tmp/lm \
      --mode=train_and_eval

Modes: train, eval, train_and_eval, inspect_params, inspect_model, profile
(a pipeline timeline of one training step: logdir/timeline.json for
Perfetto or chrome://tracing, logdir/timeline.png, the bubble line). User
errors (unknown model, bad override, unwritable logdir, missing data) end
the program with one line on stderr and exit code 2, without a traceback.
"""

import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging

FLAGS = flags.FLAGS
flags.DEFINE_string('model', 'lm.StdlibBytesGPipe', 'Registered experiment key '
                    '(any unique dotted suffix works).')
flags.DEFINE_string('logdir', '', 'Checkpoints, summaries and params.txt go '
                    'here; default /tmp/lingvo_pipe/<model>.')
flags.DEFINE_enum('mode', 'train_and_eval', ['train', 'eval', 'train_and_eval',
                                             'inspect_params', 'inspect_model',
                                             'profile'],
                  'What to do.')
flags.DEFINE_string('model_params_override', '', 'Overrides such as '
                    "\"trainer.max_steps=100; task.stack.model_dim=64\".")
flags.DEFINE_string('model_params_file_override', '', 'A file of "key : value" '
                    'lines (the params.txt format) applied before '
                    '--model_params_override.')
flags.DEFINE_integer('max_steps', 0, 'Stop at this global step (0: the '
                     "experiment's trainer.max_steps). The learning-rate "
                     'schedule still follows trainer.max_steps, so a run '
                     'stopped early and resumed equals one run.')
flags.DEFINE_integer('seed', -1, 'Random seed (-1: the experiment\'s).')
flags.DEFINE_integer('num_logical_devices', 0, 'Logical CPU devices to create '
                     'when there is no accelerator (0: as many as the model\'s '
                     'pipelines need, at least 1).')
flags.DEFINE_integer('planner_budget_mb', 1024, 'inspect_model: memory of '
                     'each device for the planner\'s table, in MiB.')
flags.DEFINE_integer('sample_bytes', 200, 'After train_and_eval of a language '
                     'model, print a sample of this many bytes (0: none).')


class _UserError(Exception):
  """Reported as one line, without a traceback."""


def _ResolveParams():
  from lingvo_pipe import model_registry  # pylint: disable=g-import-not-at-top
  from trainer import experiment_params
  try:
    experiment = model_registry.GetExperiment(FLAGS.model)
  except (LookupError, ValueError) as e:
    raise _UserError(str(e)) from None
  params = experiment_params.ExperimentParams(experiment)
  try:
    if FLAGS.model_params_file_override:
      try:
        with open(FLAGS.model_params_file_override) as f:
          text = f.read()
      except OSError as e:
        raise _UserError(f'Cannot read --model_params_file_override: {e}') from None
      params.FromText(text)
    experiment_params.ApplyOverrides(params, FLAGS.model_params_override)
  except (AttributeError, TypeError, ValueError) as e:
    raise _UserError(str(e)) from None
  if FLAGS.seed >= 0:
    params.trainer.seed = FLAGS.seed
  return params


def _ConfigureDevices(params) -> None:
  """Creates logical CPU devices for the pipelines when no accelerator is
  present (must run before TensorFlow initializes its devices)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.pipeline import cluster
  if tf.config.list_physical_devices('GPU') or tf.config.list_physical_devices('TPU'):
    return
  wanted = FLAGS.num_logical_devices or max(cluster.DevicesNeeded(params.task),
                                            params.trainer.num_logical_devices, 1)
  cpu = tf.config.list_physical_devices('CPU')[0]
  tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * wanted)


def _PrepareLogdir(params) -> str:
  logdir = FLAGS.logdir or os.path.join('/tmp/lingvo_pipe', FLAGS.model)
  try:
    os.makedirs(logdir, exist_ok=True)
    with open(os.path.join(logdir, 'params.txt'), 'w') as f:
      f.write(params.ToText())
  except OSError as e:
    raise _UserError(f'Cannot write to --logdir {logdir!r}: {e.strerror}; choose '
                     'a writable directory.') from None
  return logdir


def _Sample(trainer_obj) -> None:
  """Prints a sample continuation of a held-out text window."""
  from lingvo_pipe.core import base_layer  # pylint: disable=g-import-not-at-top
  task = trainer_obj.task
  if FLAGS.sample_bytes <= 0 or not hasattr(task, 'Sample'):
    return
  batch = next(iter(trainer_obj.params.dev.Instantiate().Dataset()))
  with base_layer.EvalMode():
    sample = task.Sample(task.theta, batch.ids, FLAGS.sample_bytes, seed=trainer_obj.tp.seed)
  prompt = bytes(batch.ids[0].numpy().astype('uint8')).decode('utf-8', 'replace')
  text = bytes(sample[0].numpy().astype('uint8')).decode('utf-8', 'replace')
  print(f'--- prompt (last 80 bytes) ---\n{prompt[-80:]}\n--- sample ---\n{text}\n---')


def Main(argv) -> None:
  del argv
  logging.set_verbosity(logging.WARNING)
  params = _ResolveParams()
  if FLAGS.mode == 'inspect_params':
    print(params.ToText(), end='')
    return
  if FLAGS.mode == 'inspect_model':
    from trainer import inspection  # pylint: disable=g-import-not-at-top
    if FLAGS.planner_budget_mb <= 0:
      raise _UserError(f'--planner_budget_mb={FLAGS.planner_budget_mb} must be '
                       '> 0: the memory of each device in MiB, e.g. 16384.')
    print(inspection.ModelPlan(params.task, FLAGS.planner_budget_mb << 20,
                               inspection.OptimizerSlots(params.trainer.optimizer)))
    return
  logdir = _PrepareLogdir(params)
  _ConfigureDevices(params)
  from trainer import loop  # pylint: disable=g-import-not-at-top
  try:
    trainer_obj = loop.Trainer(params, logdir)
  except (FileNotFoundError, ValueError) as e:
    raise _UserError(str(e)) from None
  trainer_obj.Restore()
  if FLAGS.mode == 'profile':
    from trainer import profiling  # pylint: disable=g-import-not-at-top
    try:
      print(profiling.ProfileOneStep(trainer_obj))
    except ValueError as e:
      raise _UserError(str(e)) from None
    print(f'Timeline: {os.path.join(logdir, "timeline.json")} (Perfetto, '
          f'chrome://tracing) and {os.path.join(logdir, "timeline.png")}')
    return
  if FLAGS.mode in ('train', 'train_and_eval'):
    try:
      trainer_obj.Train(FLAGS.max_steps or params.trainer.max_steps)
    except loop.NonFiniteLossError as e:
      raise _UserError(str(e)) from None
  if FLAGS.mode in ('eval', 'train_and_eval'):
    if FLAGS.mode == 'eval' and not trainer_obj.manager.latest_checkpoint:
      raise _UserError(f'No checkpoint in {logdir!r} to evaluate; train first.')
    trainer_obj.Eval('dev')
  if FLAGS.mode == 'train_and_eval':
    _Sample(trainer_obj)


def _MainWithUserErrors(argv) -> None:
  try:
    Main(argv)
  except _UserError as e:
    print(f'error: {e}', file=sys.stderr)
    sys.exit(2)


def Run() -> None:
  """Console-script entry point."""
  app.run(_MainWithUserErrors)


if __name__ == '__main__':
  Run()
