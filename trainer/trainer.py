"""The trainer binary: runs a registered experiment.

  python -m trainer.trainer --model=lm.StdlibBytesGPipe --logdir=/tmp/lm \
      --mode=train_and_eval

Modes: train, eval, train_and_eval, inspect_params, inspect_model, profile
(a pipeline timeline of one training step: logdir/timeline.json for
Perfetto or chrome://tracing, logdir/timeline.png, the bubble line), decode
(trainer/decoder.py), export (a SavedModel, trainer/export.py) and worker
(a task of --cluster_spec serving a client's cells). User
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
                                             'profile', 'decode', 'export',
                                             'worker'],
                  'What to do. worker: serve as task --task of --cluster_spec '
                  '(docs/several_machines.md).')
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
flags.DEFINE_string('cluster_spec', '', 'The cells\' worker tasks, '
                    '"worker=host:port,host:port" (default: TF_CONFIG\'s '
                    'cluster, if set; empty: cells on local devices).')
flags.DEFINE_integer('task', -1, 'With --mode=worker: this worker\'s task '
                     'index (default: TF_CONFIG\'s task index).')
flags.DEFINE_integer('worker_threads', 0, 'With --mode=worker: intra-op '
                     'threads of the worker (0: TensorFlow\'s default).')
flags.DEFINE_float('worker_timeout_s', 20.0, 'With a cluster: end the run '
                   'with an error naming the worker when one does not answer '
                   'for this long (checked all along the run, whatever the '
                   'step time), and wait this long for the workers to come up.')
flags.DEFINE_bool('tf_cpp_logs', False, "Show TensorFlow's C++ log lines "
                  '(INFO and up). Without it only FATAL ones show, or those '
                  'at and above TF_CPP_MIN_LOG_LEVEL when that is set.')
flags.DEFINE_integer('planner_budget_mb', 1024, 'inspect_model: memory of '
                     'each device for the planner\'s table, in MiB.')
flags.DEFINE_integer('sample_bytes', 200, 'After train_and_eval of a language '
                     'model, print a sample of this many bytes (0: none).')
flags.DEFINE_string('decode_prompt', '', 'In --mode=decode, decode this text '
                    '(one example per line: a sentence to translate, a prompt '
                    'to continue) instead of the dev split.')
flags.DEFINE_bool('export_keep_devices', False, 'In --mode=export, keep each '
                  "pipeline cell's device placement in the SavedModel (default: "
                  'cleared, so it runs on whatever devices the loader has).')


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
  present (must run before TensorFlow initializes its devices); with a
  cluster, connects to its workers instead."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.pipeline import cluster
  config = _Cluster()
  if config is not None:
    needed = cluster.DevicesNeeded(params.task)
    if needed > len(config.Tasks()):
      raise _UserError(
          f'The model needs {needed} devices (cells x replicas / '
          f'consecutive_cells_per_device) but --cluster_spec has {len(config.Tasks())} '
          'worker task(s); start more workers, or lower num_replicas or the '
          'number of cells, or raise consecutive_cells_per_device.')
    _ConnectCluster()
    return
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
  from trainer import decoder  # pylint: disable=g-import-not-at-top
  if FLAGS.sample_bytes > 0:
    decoder.PrintSample(trainer_obj, FLAGS.sample_bytes)


def _DecodeOrExport(params) -> None:
  """--mode=decode and --mode=export on the newest checkpoint in --logdir."""
  from trainer import decoder  # pylint: disable=g-import-not-at-top
  from trainer import export
  try:
    decoder.CheckCanDecode(params, FLAGS.model)
  except decoder.NoDecoderError as e:
    raise _UserError(str(e)) from None
  logdir = FLAGS.logdir or os.path.join('/tmp/lingvo_pipe', FLAGS.model)
  if not export.LatestCheckpoint(logdir):
    raise _UserError(f'No checkpoint in {logdir!r} to {FLAGS.mode}; train first '
                     '(--mode=train) or point --logdir at a trained run.')
  _ConfigureDevices(params)
  from trainer import loop  # pylint: disable=g-import-not-at-top
  from trainer import checkpoints
  try:
    trainer_obj = loop.Trainer(params, logdir)
    trainer_obj.Restore(read_only=True)  # changes nothing in the checkpoints
    if FLAGS.mode == 'decode':
      decoder.Decoder(trainer_obj).Run(FLAGS.decode_prompt)
    else:
      print(f'Exported {export.Export(trainer_obj, FLAGS.export_keep_devices)}')
  except (FileNotFoundError, ValueError, checkpoints.CheckpointError) as e:
    raise _UserError(str(e)) from None


def _Cluster():
  """The ClusterConfig of --cluster_spec or TF_CONFIG; None without."""
  from trainer import cluster_run  # pylint: disable=g-import-not-at-top
  try:
    return cluster_run.ClusterFromFlags(FLAGS.cluster_spec, os.environ)
  except ValueError as e:
    raise _UserError(str(e)) from None


def _ConnectCluster() -> None:
  from trainer import cluster_client  # pylint: disable=g-import-not-at-top
  try:
    cluster_client.Connect(_Cluster(), FLAGS.worker_timeout_s)
  except cluster_client.WorkerUnreachableError as e:
    raise _UserError(str(e)) from None


def _Supervised(trainer_obj):
  """A context for running steps: with a cluster, the watchdog that ends
  the run when a worker stops answering, and one line for a step that
  fails because a worker is gone (cluster_run.Supervised)."""
  import contextlib  # pylint: disable=g-import-not-at-top
  config = _Cluster()
  if config is None:
    return contextlib.nullcontext()
  from trainer import cluster_run  # pylint: disable=g-import-not-at-top
  return cluster_run.Supervised(trainer_obj, config, FLAGS.worker_timeout_s)


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


def _TrainUntilDoneOrStopped(trainer_obj, max_steps: int, after_loop=None) -> None:
  """Trains (under the cluster watchdog, if any); SIGTERM or SIGINT end the
  run after the step under way with a checkpoint at that step, exit status
  128 + the signal number."""
  from trainer import loop  # pylint: disable=g-import-not-at-top
  from trainer import signals
  with signals.GracefulStop(trainer_obj.stop_requested) as stop:
    try:
      with _Supervised(trainer_obj):
        done = trainer_obj.Train(max_steps, after_loop)
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
  if FLAGS.mode == 'worker':
    from trainer import cluster_run  # pylint: disable=g-import-not-at-top
    try:
      cluster_run.RunWorker(FLAGS.cluster_spec, FLAGS.task, os.environ,
                              FLAGS.worker_threads)
    except ValueError as e:
      raise _UserError(str(e)) from None
    return
  params = _ResolveParams()
  if FLAGS.mode == 'inspect_params':
    print(params.ToText(), end='')
    return
  if FLAGS.mode == 'inspect_model':
    from trainer import inspection  # pylint: disable=g-import-not-at-top
    if FLAGS.planner_budget_mb <= 0:
      raise _UserError(f'--planner_budget_mb={FLAGS.planner_budget_mb} must be '
                       '> 0: the memory of each device in MiB, e.g. 16384.')
    config = _Cluster()
    print(inspection.ModelPlan(params.task, FLAGS.planner_budget_mb << 20,
                               inspection.OptimizerSlots(params.trainer.optimizer),
                               cluster_tasks=len(config.Tasks()) if config else 0))
    return
  if FLAGS.mode in ('decode', 'export'):
    _DecodeOrExport(params)
    return
  if FLAGS.mode == 'train_and_eval' and params.trainer.decode_interval_steps > 0:
    from trainer import decoder  # pylint: disable=g-import-not-at-top
    try:
      decoder.CheckCanDecode(params, FLAGS.model)
    except decoder.NoDecoderError as e:
      raise _UserError(f'trainer.decode_interval_steps is set but {e}') from None
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
    # Only training changes the checkpoint directory (docs/checkpoints.md).
    trainer_obj.Restore(read_only=FLAGS.mode not in ('train', 'train_and_eval'))
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
    after_loop = None
    if FLAGS.mode == 'train_and_eval' and params.trainer.decode_interval_steps > 0:
      from trainer import decoder  # pylint: disable=g-import-not-at-top
      after_loop = decoder.EveryNSteps(trainer_obj, params.trainer.decode_interval_steps)
    _TrainUntilDoneOrStopped(trainer_obj, FLAGS.max_steps or params.trainer.max_steps,
                             after_loop)
  if FLAGS.mode in ('eval', 'train_and_eval'):
    if FLAGS.mode == 'eval' and not trainer_obj.manager.latest_checkpoint:
      raise _UserError(f'No checkpoint in {logdir!r} to evaluate; train first.')
    with _Supervised(trainer_obj):
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
