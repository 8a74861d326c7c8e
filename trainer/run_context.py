"""What every trainer mode shares, built once: the options, the params, the
logdir, the cluster and the devices.

trainer.py turns its flags into Options and calls Build; each mode module
(train_mode, inspect_mode, profile_mode, decode_mode, worker_mode) then
reads the RunContext and never the flags. User errors are UserError: one
line on stderr, exit status 2, before any work starts.
"""

import contextlib
import dataclasses
import importlib
import os
import sys
import tempfile
from typing import Any, ContextManager, Optional, Sequence

import tensorflow as tf

from lingvo_pipe import model_registry
from lingvo_pipe.core import hyperparams
from lingvo_pipe.pipeline.layout import device_mapping
from trainer.cluster.cluster_spec import ClusterConfig
from trainer.checkpointing import checkpoints
from trainer.cluster import cluster_client
from trainer.cluster import cluster_run
from trainer import experiment_params
from trainer import loop
from trainer.cluster import network_exposure
from trainer import param_checks
from trainer import run_summary

DEFAULT_LOGDIR_ROOT = '/tmp/lingvo_pipe'


class UserError(Exception):
  """Reported as one line, without a traceback."""


@dataclasses.dataclass(frozen=True)
class Options:
  """The trainer's flags, as plain values (see trainer.py for their docs)."""
  mode: str = 'train_and_eval'
  model: str = 'lm.StdlibBytesGPipe'
  imports: Sequence[str] = ()
  logdir: str = ''
  model_params_override: str = ''
  model_params_file_override: str = ''
  max_steps: int = 0
  seed: int = -1
  num_logical_devices: int = 0
  cluster_spec: str = ''
  task: int = -1
  worker_threads: int = 0
  trust_cluster_network: bool = False
  worker_timeout_s: float = 20.0
  planner_budget_mb: int = 1024
  memory_budget_mb: int = 0
  sample_bytes: int = 200
  decode_prompt: str = ''
  export_keep_devices: bool = False


class RunContext:
  """One run's options, params, logdir and cluster; devices on demand.

  Attributes:
    options: the Options.
    params: task, train, dev, test and trainer params with the overrides
      applied and range-checked (empty Params for --mode=worker).
    logdir: --logdir, or /tmp/lingvo_pipe/<model>; not created yet.
    cluster: the ClusterConfig of --cluster_spec or TF_CONFIG, or None.
  """

  def __init__(self, options: Options, params: hyperparams.Params,
               cluster_config: Optional[ClusterConfig]) -> None:
    self.options = options
    self.params = params
    self.logdir = options.logdir or os.path.join(DEFAULT_LOGDIR_ROOT, options.model)
    self.cluster = cluster_config
    self._devices_configured = False
    self._created_logdir: Optional[str] = None  # the topmost directory PrepareLogdir made

  @property
  def max_steps(self) -> int:
    """--max_steps, else the experiment's trainer.max_steps."""
    return self.options.max_steps or self.params.trainer.max_steps

  def PrepareLogdir(self) -> str:
    """Creates the logdir and checks that it takes files; writes nothing else."""
    try:
      self._created_logdir = _FirstMissing(self.logdir)
      os.makedirs(self.logdir, exist_ok=True)
      with tempfile.NamedTemporaryFile(dir=self.logdir, prefix='.write_test'):
        pass
    except OSError as e:
      raise UserError(f'Cannot write to --logdir {self.logdir!r}: {e.strerror}; '
                      'choose a writable directory.') from None
    return self.logdir

  def RemoveUnusedLogdir(self) -> None:
    """Removes the directories PrepareLogdir created, if the run, refused,
    left them empty: a refused run leaves no trace."""
    if self._created_logdir is None:
      return
    path = os.path.abspath(self.logdir)
    while True:
      try:
        os.rmdir(path)
      except OSError:  # not empty (or gone): keep what is there
        return
      if path == self._created_logdir:
        return
      path = os.path.dirname(path)

  def _DevicesNeeded(self) -> int:
    try:
      return device_mapping.DevicesNeeded(self.params.task)
    except ValueError as e:  # e.g. a schedule_text that does not parse
      raise UserError(str(e)) from None

  def ConfigureDevices(self) -> None:
    """Creates logical CPU devices for the pipelines when no accelerator is
    present (before TensorFlow initializes its devices); with a cluster,
    connects to its workers instead. Runs once."""
    if self._devices_configured:
      return
    self._devices_configured = True
    if self.cluster is not None:
      needed = self._DevicesNeeded()
      if needed > len(self.cluster.Tasks()):
        raise UserError(
            f'The model needs {needed} devices (cells x replicas / '
            'consecutive_cells_per_device) but --cluster_spec has '
            f'{len(self.cluster.Tasks())} worker task(s); start more workers, or '
            'lower num_replicas or the number of cells, or raise '
            'consecutive_cells_per_device.')
      trusted = self.options.trust_cluster_network
      try:
        network_exposure.CheckTrusted(self.cluster.Tasks(), 'This client', trusted)
        port = cluster_client.Connect(self.cluster, self.options.worker_timeout_s)
      except (network_exposure.UntrustedNetworkError,
              cluster_client.WorkerUnreachableError) as e:
        raise UserError(str(e)) from None
      print(f'connected to {len(self.cluster.Tasks())} worker task(s); this client\'s '
            f'{network_exposure.OpenPortNote(port, trusted)}', flush=True)
      return
    self.ConfigureLocalDevices()

  def ConfigureLocalDevices(self) -> None:
    """Without an accelerator, as many logical CPU devices as the pipelines
    need (or --num_logical_devices); never connects to a cluster."""
    self._devices_configured = True
    if tf.config.list_physical_devices('GPU') or tf.config.list_physical_devices('TPU'):
      return
    wanted = self.options.num_logical_devices or max(
        self._DevicesNeeded(), self.params.trainer.num_logical_devices, 1)
    cpu = tf.config.list_physical_devices('CPU')[0]
    try:
      tf.config.set_logical_device_configuration(
          cpu, [tf.config.LogicalDeviceConfiguration()] * wanted)
    except RuntimeError:  # devices made before the run (trainer called from Python)
      have = len(tf.config.list_logical_devices('CPU'))
      if have < wanted:
        raise UserError(
            f'TensorFlow in this process already made {have} logical CPU '
            f'device(s) and the model needs {wanted}; make {wanted} with '
            'tf.config.set_logical_device_configuration before anything uses '
            'TensorFlow, or run the trainer in a process of its own.') from None

  def NewTrainer(self, logdir: Optional[str] = None) -> loop.Trainer:
    """The loop.Trainer of this run (devices configured first), in logdir
    (default: the run's); prints the opening line before anything traces."""
    self.ConfigureDevices()
    try:
      trainer_obj = loop.Trainer(self.params, logdir or self.logdir)
    except (OSError, ValueError) as e:
      raise UserError(Reason(e)) from None
    print(run_summary.OpeningLine(self.options.model, self.options.mode,
                                  trainer_obj.task, self.logdir), flush=True)
    return trainer_obj

  def Restore(self, trainer_obj: loop.Trainer) -> Optional[str]:
    """trainer_obj.Restore(), its CheckpointError as a UserError. Only
    training changes the checkpoint directory (docs/checkpoints.md): every
    other mode restores read-only."""
    try:
      return trainer_obj.Restore(
          read_only=self.options.mode not in ('train', 'train_and_eval'))
    except checkpoints.CheckpointError as e:
      raise UserError(str(e)) from None

  def Supervised(self, trainer_obj: loop.Trainer) -> ContextManager[Any]:
    """A context for running steps: with a cluster, the watchdog that ends
    the run when a worker stops answering (cluster_run.Supervised)."""
    if self.cluster is None:
      return contextlib.nullcontext()
    return cluster_run.Supervised(trainer_obj, self.cluster,
                                  self.options.worker_timeout_s)


def _FirstMissing(path: str) -> Optional[str]:
  """The topmost directory of `path` that does not exist (None: it exists)."""
  path = os.path.abspath(path)
  if os.path.exists(path):
    return None
  while not os.path.exists(os.path.dirname(path)):
    path = os.path.dirname(path)
  return path


def Reason(e: Exception) -> str:
  """One line for an input or setup error (OSError: the file and reason)."""
  if isinstance(e, OSError) and e.strerror:
    return (f'cannot read {e.filename!r}: {e.strerror}; check the file and its '
            'permissions.')
  return str(e)


def Build(options: Options, with_experiment: bool = True) -> RunContext:
  """The RunContext of options: the user's modules imported, the experiment
  resolved, its overrides applied and checked, the cluster parsed.

  Raises:
    UserError: for anything the user can fix, as one line.
  """
  try:
    config = cluster_run.ClusterFromFlags(options.cluster_spec, os.environ)
  except ValueError as e:
    raise UserError(str(e)) from None
  params = ResolveParams(options) if with_experiment else hyperparams.Params()
  return RunContext(options, params, config)


def ImportUserModules(modules: Sequence[str]) -> None:
  """Imports each --import module, from the working directory or PYTHONPATH.

  Raises:
    UserError: for a module that is not found.
  """
  AddWorkingDirectoryToPath()
  for name in modules:
    try:
      importlib.import_module(name)
    except ModuleNotFoundError as e:
      if e.name is None or not (name == e.name or name.startswith(e.name + '.')):
        raise
      raise UserError(f'--import={name}: no module {e.name!r} in the working '
                      f'directory ({os.getcwd()}) or on PYTHONPATH.') from None


def AddWorkingDirectoryToPath() -> None:
  """Lets the user's modules in the working directory import, as `python -m`
  does; appended, so a user file never shadows an installed package (a
  trainer.py of the user's does not replace this trainer)."""
  cwd = os.getcwd()
  if cwd not in sys.path and '' not in sys.path:
    sys.path.append(cwd)


def ResolveParams(options: Options) -> hyperparams.Params:
  """The experiment's params with the file and flag overrides and --seed
  applied, range-checked.

  Raises:
    UserError: unknown model, unreadable override file, bad override, or a
      value out of range.
  """
  ImportUserModules(options.imports)
  try:
    experiment = model_registry.GetExperiment(options.model)
  except (LookupError, ValueError) as e:
    raise UserError(str(e)) from None
  params = experiment_params.ExperimentParams(experiment)
  try:
    if options.model_params_file_override:
      try:
        with open(options.model_params_file_override) as f:
          text = f.read()
      except OSError as e:
        raise UserError(f'Cannot read --model_params_file_override: {e}') from None
      experiment_params.ApplyParamsFile(params, text, options.model_params_file_override)
    experiment_params.ApplyOverrides(params, options.model_params_override)
  except (AttributeError, TypeError, ValueError) as e:
    raise UserError(str(e)) from None
  if options.seed >= 0:
    params.trainer.seed = options.seed
  try:
    param_checks.CheckRunParams(params, options.max_steps,
                                experiment_params.ExperimentParams(experiment))
  except param_checks.ParamRangeError as e:
    raise UserError(str(e)) from None
  return params
