"""The trainer binary: runs a registered experiment.

  python -m trainer.trainer --model=lm.StdlibBytesGPipe --logdir=/tmp/lm \
      --mode=train_and_eval

Modes: train, eval, train_and_eval, inspect_params, inspect_model, profile
(a pipeline timeline of one training step: logdir/timeline.json for
Perfetto or chrome://tracing, logdir/timeline.png, the bubble line). User
errors (unknown model, bad override, unwritable logdir, missing data) end
the program with one line on stderr and exit code 2, without a traceback.
SIGTERM and SIGINT end training after the step under way with a checkpoint
at that step (exit code 128 + the signal); see docs/reliability.md.
"""

import os
import sys
import tempfile

# TensorFlow's C++ log lines stay off the terminal unless the user sets
# TF_CPP_MIN_LOG_LEVEL or passes --tf_cpp_logs (see _QuietCppLogs).
_USER_TF_CPP_MIN_LOG_LEVEL = os.environ.get('TF_CPP_MIN_LOG_LEVEL', '')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

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
flags.DEFINE_bool('tf_cpp_logs', False, "Show TensorFlow's C++ log lines "
                  '(INFO and up). Without it only FATAL ones show, or those '
                  'at and above TF_CPP_MIN_LOG_LEVEL when that is set.')
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
  from trainer import param_checks  # pylint: disable=g-import-not-at-top
  try:
    param_checks.CheckRunParams(params, FLAGS.max_steps)
  except param_checks.ParamRangeError as e:
    raise _UserError(str(e)) from None
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


def _PrepareLogdir() -> str:
  """Creates the logdir and checks that it takes files; writes nothing else."""
  logdir = FLAGS.logdir or os.path.join('/tmp/lingvo_pipe', FLAGS.model)
  try:
    os.makedirs(logdir, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=logdir, prefix='.write_test'):
      pass
  except OSError as e:
    raise _UserError(f'Cannot write to --logdir {logdir!r}: {e.strerror}; choose '
                     'a writable directory.') from None
  return logdir


def _WriteParamsText(params, logdir: str) -> None:
  """Writes logdir/params.txt whole or not at all (a temporary file renamed)."""
  path = os.path.join(logdir, 'params.txt')
  try:
    with tempfile.NamedTemporaryFile('w', dir=logdir, prefix='.params.txt.',
                                     delete=False) as f:
      f.write(params.ToText())
    os.replace(f.name, path)
  except OSError as e:
    raise _UserError(f'Cannot write {path!r}: {e.strerror}; choose a writable '
                     '--logdir.') from None


def _CheckEvalInput(params) -> None:
  """Reads the dev input now, so a bad eval file fails before training."""
  try:
    params.dev.Instantiate()
  except (OSError, ValueError) as e:
    raise _UserError(f'dev input: {_Reason(e)}') from None


def _Reason(e: Exception) -> str:
  """One line for an input or setup error (OSError: the file and reason)."""
  if isinstance(e, OSError) and e.strerror:
    return f'cannot read {e.filename!r}: {e.strerror}; check the file and its permissions.'
  return str(e)


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


def _QuietCppLogs() -> None:
  """Filters TensorFlow's C++ log lines below the level the user chose
  (--tf_cpp_logs: all; else TF_CPP_MIN_LOG_LEVEL if set; else FATAL only)."""
  from trainer import quiet_logs  # pylint: disable=g-import-not-at-top
  level = 3
  if FLAGS.tf_cpp_logs:
    level = 0
  elif _USER_TF_CPP_MIN_LOG_LEVEL.strip().isdigit():
    level = min(int(_USER_TF_CPP_MIN_LOG_LEVEL), 3)
  os.environ['TF_CPP_MIN_LOG_LEVEL'] = str(level)
  quiet_logs.FilterCppLogs(level)


def _TrainUntilDoneOrStopped(trainer_obj, max_steps: int) -> None:
  """Trains; SIGTERM or SIGINT end the run after the step under way with a
  checkpoint at that step, exit status 128 + the signal number."""
  from trainer import loop  # pylint: disable=g-import-not-at-top
  from trainer import signals
  with signals.GracefulStop(trainer_obj.stop_requested) as stop:
    try:
      done = trainer_obj.Train(max_steps)
    except loop.NonFiniteLossError as e:
      raise _UserError(str(e)) from None
  if not done:
    signum = stop.signum or signals.signal.SIGTERM
    step = int(trainer_obj.global_step.numpy())
    print(f'Stopped by {signals.signal.Signals(signum).name} at step {step}; saved '
          f'{trainer_obj.manager.latest_checkpoint}. Run the same command to resume.',
          flush=True)
    sys.exit(128 + signum)


def Main(argv) -> None:
  del argv
  _QuietCppLogs()
  logging.set_verbosity(logging.WARNING)
  params = _ResolveParams()
  if FLAGS.mode == 'inspect_params':
    print(params.ToText(), end='')
    return
  if FLAGS.mode == 'inspect_model':
    from trainer import inspection  # pylint: disable=g-import-not-at-top
    print(inspection.ModelPlan(params.task))
    return
  logdir = _PrepareLogdir()
  _ConfigureDevices(params)
  from trainer import checkpoints  # pylint: disable=g-import-not-at-top
  from trainer import loop
  if FLAGS.mode in ('eval', 'train_and_eval'):
    _CheckEvalInput(params)
  try:
    trainer_obj = loop.Trainer(params, logdir)
  except (OSError, ValueError) as e:
    raise _UserError(_Reason(e)) from None
  try:
    trainer_obj.Restore()
  except checkpoints.CheckpointError as e:
    raise _UserError(str(e)) from None
  _WriteParamsText(params, logdir)
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
    _TrainUntilDoneOrStopped(trainer_obj, FLAGS.max_steps or params.trainer.max_steps)
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
