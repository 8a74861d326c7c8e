"""The training loop: TPUEstimator-like loops of steps, checkpoints, summaries.

One tf.function runs `steps_per_loop` training steps back to back, reading
batches from a tf.data iterator inside the function. Around it the host
saves a checkpoint (model, optimizer slots, global step and the input
iterator's position), writes summaries and prints a progress line.
"""

import os
import time
from typing import Callable, Dict, List, Optional, Tuple

import tensorflow as tf

from lingvo_pipe import base_experiment
from lingvo_pipe.core import eval_mode
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.core import precision
from lingvo_pipe.core import step_seeds
from lingvo_pipe.core import variable_paths
from lingvo_pipe.pipeline import pipelined_model
from lingvo_pipe.pipeline.replicas import replica_variables
from trainer.checkpointing import checkpoint_keys
from trainer.checkpointing import checkpoints
from trainer import loop_report
from trainer import loss_scale as loss_scale_lib
from trainer import optimizers
from trainer import train_input_state
from trainer.checkpointing import warm_start


class NonFiniteLossError(RuntimeError):
  """The loss or the gradients became NaN or infinite (policy STOP)."""


class Trainer:
  """Trains and evaluates one experiment in `logdir`."""

  def __init__(self, params: hyperparams.Params, logdir: str,
               log: Callable[[str], None] = print) -> None:
    """`params` holds task, train, dev, test and trainer params (see
    experiment_params.ExperimentParams)."""
    self.params = params
    self.logdir = logdir
    self.log = log
    self.tp = params.trainer
    tf.random.set_seed(self.tp.seed)
    self.task = params.task.Instantiate()
    outside = pipelined_model.UpdatesOutsidePipelines(self.task)
    if outside:
      raise ValueError(
          f'{outside} keep statistics updated in training (batch norm\'s moving '
          'averages), which only a PipeliningLayer applies: outside one they never change, '
          'so training would leave them at their initial values and every mode would use '
          "those. Make them the pipeline's layers.")
    self.variables = list(self.task.trainable_variables)
    # Pipeline replicas' own copies of their variables (not the model's,
    # not checkpointed), trained with the same gradients.
    self.replica_copies = replica_variables.CopiesIn(self.task)
    self._trained = replica_variables.TrainedVariables(self.task)
    self._copies_synchronized = False
    self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name='global_step')
    # Set (e.g. by signals.GracefulStop) to end the loop before its next
    # step; not checkpointed.
    self.stop_requested = tf.Variable(False, trainable=False, name='stop_requested')
    self.learning_rate = optimizers.LearningRate(self.tp, self.global_step)
    self.optimizer = optimizers.Optimizer(self.tp, self.learning_rate)
    self.train_input = params.train.Instantiate()
    self.train_iterator = iter(self.train_input.Dataset())
    # The model's variables by their path in the logical model, so a
    # checkpoint loads under any layout (checkpoint_keys.py has the keys).
    self.model_variables = variable_paths.VariablesByPath(self.task)
    state = dict(model=variable_paths.Nested(self.model_variables),
                 global_step=self.global_step, train_iterator=self.train_iterator,
                 train_input_params=train_input_state.ParamsVariable(params.train))
    # float16: the loss scale and its count, checkpointed (loss_scale.py).
    self.loss_scale = loss_scale_lib.FromParams(self.tp)
    if self.loss_scale is not None:
      state['loss_scale'] = self.loss_scale
    self.checkpoint = tf.train.Checkpoint(optimizer=self.optimizer, **state)
    # What Restore reads with reset_optimizer_state: all but the optimizer.
    self._checkpoint_without_optimizer = tf.train.Checkpoint(**state)
    # Set by Restore(read_only=True): the run saves no checkpoint.
    self._read_only = False
    self.checkpoint_dir = os.path.join(logdir, 'checkpoints')
    self.manager = self._NewManager()
    self._train_loop = tf.function(self._TrainLoop, autograph=False)
    self._step_built = False  # the first loop's time includes building it
    self._eval_step = tf.function(self._EvalStep, autograph=False)
    self._writers: Dict[str, tf.summary.SummaryWriter] = {}

  # --- checkpoints ------------------------------------------------------------

  def _NewManager(self) -> tf.train.CheckpointManager:
    """A manager reading the state file as it is on disk now."""
    return tf.train.CheckpointManager(
        self.checkpoint, self.checkpoint_dir,
        max_to_keep=self.tp.max_checkpoints_to_keep,
        keep_checkpoint_every_n_hours=self.tp.keep_checkpoint_every_n_hours or None)

  def Restore(self, read_only: bool = False) -> Optional[str]:
    """Restores the newest readable checkpoint, if any, falling back past
    damaged ones (see checkpoints.py); returns its path. The checkpoint
    must hold exactly the model's variables and optimizer slots
    (checkpoint_keys.CheckMatches); trainer.reset_optimizer_state restores
    all but the optimizer. Without a checkpoint, in a training run,
    trainer.init_from_checkpoint_rules warm starts the model.

    Args:
      read_only: change nothing in the checkpoint directory, now or later
        (no save): eval, decode, export and profile.

    Raises:
      checkpoints.CheckpointError: if checkpoints exist but none is readable,
        or the newest readable one does not match the model
        (checkpoint_keys.CheckpointMismatchError), or warm start fails.
    """
    self._read_only = read_only
    if self.tp.init_from_checkpoint_rules:  # malformed rules fail even on a restart
      warm_start.CheckRules(self.tp.init_from_checkpoint_rules)
    slot_names = checkpoint_keys.SlotNamesOf(
        lambda: optimizers.Optimizer(self.tp, lambda: 0.0))
    reset_at: List[str] = []

    def Check(path: str) -> tf.train.Checkpoint:
      reset = self.tp.reset_optimizer_state and checkpoints.ResetsOptimizer(
          path, self.logdir)
      checkpoint_keys.CheckMatches(path, self.model_variables, slot_names, reset)
      if not read_only:  # only training reads on from the input position
        train_input_state.CheckSameInput(path, self.params.train)
      if not reset:
        return self.checkpoint
      reset_at.append(path)
      return self._checkpoint_without_optimizer

    path = checkpoints.RestoreNewestReadable(self.checkpoint, self.checkpoint_dir,
                                             self.log, check=Check, read_only=read_only)
    self._copies_synchronized = False  # the model's values changed
    self.manager = self._NewManager()
    if path:
      self.log(f'Restored {path} at step {int(self.global_step.numpy())}.')
    if path and reset_at:
      self.log('Optimizer state reset (trainer.reset_optimizer_state): the slots '
               f'({", ".join(slot_names) or "none"}) start afresh; checkpoints '
               'from now on keep theirs.')
      if not read_only:
        checkpoints.RecordOptimizerReset(path, self.logdir)
    elif not path and self.tp.init_from_checkpoint_rules and not read_only:
      warm_start.Apply(self.model_variables, self.tp.init_from_checkpoint_rules,
                       self.log)
    return path

  def _Writer(self, name: str) -> tf.summary.SummaryWriter:
    if name not in self._writers:
      self._writers[name] = tf.summary.create_file_writer(os.path.join(self.logdir, name))
    return self._writers[name]

  # --- training -----------------------------------------------------------------

  def _TrainStep(self, batch: NestedMap):
    """One step; returns (loss, gradient norm, finite, the task's metrics)."""
    step_seed = tf.stack([self.global_step.read_value(), tf.constant(0, tf.int64)])
    theta = step_seeds.WithStepSeed(self.task.theta, step_seed)
    scale = self.loss_scale
    with tf.GradientTape() as tape:
      if scale is None:
        metrics = self.task.FProp(theta, batch)
        objective = metrics.loss
      else:
        with precision.LossScaling(scale.scale):
          metrics = self.task.FProp(theta, batch)
        objective = scale.ScaleLoss(metrics.loss)
    grads = tape.gradient(objective, self._trained)
    grads = [tf.convert_to_tensor(g) for g in grads]
    if scale is not None:
      grads = scale.Unscale(grads)
    # One norm, of the model's gradients, clips every replica alike.
    grads, norm = optimizers.ClipByGlobalNorm(
        grads, self.tp.clip_gradient_norm_to_value, counted=len(self.variables))
    finite = optimizers.IsFinite(metrics.loss, norm)
    # An overflow of scaled gradients (finite loss) skips the step and lowers
    # the scale; it is not a non-finite loss for tp.on_nonfinite.
    overflow = tf.constant(False) if scale is None else tf.logical_and(
        optimizers.IsFinite(metrics.loss), tf.logical_not(finite))

    def Apply():
      with tf.control_dependencies([self.optimizer.apply_gradients(
          zip(grads, self._trained))]):
        return tf.constant(True)

    applied = tf.cond(finite, Apply, lambda: tf.constant(False))
    with tf.control_dependencies([applied]):
      advance = tf.logical_or(tf.logical_or(finite, overflow), tf.constant(
          self.tp.on_nonfinite == base_experiment.NonFinitePolicy.SKIP_STEP))
      step = self.global_step.assign_add(tf.cast(advance, tf.int64))
      updates = [step] if scale is None else [step, scale.Update(finite)]
    with tf.control_dependencies(updates):
      return (tf.identity(metrics.loss), tf.identity(norm),
              tf.logical_or(finite, overflow), metrics)

  def _TrainLoop(self, num_steps: tf.Tensor):
    """Runs up to num_steps steps; stops early on a non-finite loss if the
    policy is STOP. Returns (steps run, loss sum, last norm, skipped, stop,
    metric sums, metric names): the sums over applied steps of the task's
    other scalar metrics (_ScalarMetrics), named by the string tensor."""
    stop_on_nonfinite = self.tp.on_nonfinite == base_experiment.NonFinitePolicy.STOP

    def Cond(i, loss_sum, norm, skipped, stop, metric_sums, names):
      del loss_sum, norm, skipped, metric_sums, names
      return tf.logical_and(
          i < num_steps,
          tf.logical_not(tf.logical_or(stop, self.stop_requested.read_value())))

    def Body(i, loss_sum, norm, skipped, stop, metric_sums, names):
      del norm, stop, names
      loss, norm, finite, metrics = self._TrainStep(next(self.train_iterator))
      ok = tf.cast(finite, tf.float32)
      names, values = _ScalarMetrics(metrics)
      # The sums start empty ([0]): the first step pads them to its metrics.
      metric_sums = tf.pad(metric_sums, [[0, tf.size(values) - tf.size(metric_sums)]])
      return (i + 1, loss_sum + tf.where(finite, loss, 0.0), norm,
              skipped + 1 - tf.cast(ok, tf.int32),
              tf.logical_and(tf.logical_not(finite), stop_on_nonfinite),
              metric_sums + tf.where(finite, values, 0.0), names)

    zero = tf.constant(0.0)
    return tf.while_loop(
        Cond, Body, [tf.constant(0), zero, zero, tf.constant(0), tf.constant(False),
                     tf.zeros([0]), tf.zeros([0], tf.string)],
        shape_invariants=[tf.TensorShape([])] * 5 + [tf.TensorShape([None])] * 2)

  def TraceTraining(self) -> None:
    """Traces the loop of training steps, as its first call would (which
    then reuses the trace), raising the model's errors before anything is
    written: e.g. a schedule its FProp cannot train."""
    self.SynchronizeCopies()
    self._train_loop.get_concrete_function(tf.TensorSpec([], tf.int32))

  def Train(self, max_steps: int, after_loop: Optional[Callable[[], None]] = None,
            before_first_save: Optional[Callable[[], None]] = None) -> bool:
    """Trains until global step max_steps, a loop of steps at a time;
    calls after_loop after each loop, and before_first_save once, after the
    first loop that ran a step and before its checkpoint is saved.

    Returns:
      False if stop_requested ended the run early (after the step under way
      and a checkpoint at the step reached), else True.
    """
    tp = self.tp
    batch_size = self.train_input.params.batch_size
    writer = self._Writer('train')
    self.SynchronizeCopies()
    while True:
      step = int(self.global_step.numpy())
      if step >= max_steps:
        return True
      if bool(self.stop_requested.numpy()):
        if self.manager.latest_checkpoint != self._CheckpointPath(step):
          self._Save(step)
        return False
      todo = min(tp.steps_per_loop, max_steps - step)
      start = time.perf_counter()
      ran, loss_sum, norm, skipped, stop, metric_sums, names = self._train_loop(
          tf.constant(todo))
      elapsed = time.perf_counter() - start
      ran, skipped = int(ran), int(skipped)
      step = int(self.global_step.numpy())
      if bool(stop):
        raise NonFiniteLossError(
            f'Non-finite loss or gradients at step {step}; stopped without '
            'applying it (on_nonfinite=STOP). The last checkpoint is '
            f'{self.manager.latest_checkpoint}.')
      if ran:
        applied = max(ran - skipped, 1)
        loss = float(loss_sum) / applied
        metrics = {n.decode(): float(v) / applied
                   for n, v in zip(names.numpy(), metric_sums.numpy())}
        report = loop_report.LoopReport(
            step=step, loss=loss, grad_norm=float(norm),
            examples_per_sec=ran * batch_size / elapsed, step_time=elapsed / ran,
            skipped=skipped, metrics=metrics)
        loop_report.WriteSummaries(writer, report, self.learning_rate)
        self.log(loop_report.ProgressLine(report, max_steps, not self._step_built))
        self._step_built = True
        if before_first_save is not None:
          before_first_save()
          before_first_save = None
      if (tp.save_interval_steps <= 0 or step % tp.save_interval_steps < todo or
          step >= max_steps or bool(self.stop_requested.numpy())):
        self._Save(step)
      if after_loop is not None:
        after_loop()

  def RunStepsUnsaved(self, num_steps: int) -> None:
    """Runs num_steps training steps on the state in memory and nothing
    else: no checkpoint, summary or progress line (the profiler's steps,
    which must leave the logdir as it was)."""
    self.SynchronizeCopies()
    self._train_loop(tf.constant(num_steps))

  def SynchronizeCopies(self) -> None:
    """Before the loop is traced (a tuner's trial calls it first, so that
    all state exists before), and again after a restore: creates the
    optimizer's slots (restoring the checkpoint's), then sets the pipeline
    replicas' copies and their slots to the model's."""
    if self._copies_synchronized:
      return
    optimizers.CreateSlots(self.optimizer, self._trained)
    optimizers.SynchronizeCopies(self.optimizer, self.replica_copies)
    self._copies_synchronized = True

  def _CheckpointPath(self, step: int) -> str:
    return os.path.join(self.checkpoint_dir, f'ckpt-{step}')

  def _Save(self, step: int) -> None:
    """Saves a checkpoint at step, unless a weight or optimizer slot is not
    finite: a checkpoint never holds NaN or inf.

    Raises:
      NonFiniteLossError: naming the step and the first non-finite variables.
    """
    if self._read_only:
      return
    bad = [v.name for v in list(self.task.variables) + list(self.optimizer.variables())
           if v.dtype.is_floating and not bool(tf.reduce_all(tf.math.is_finite(v)))]
    if bad:
      raise NonFiniteLossError(
          f'Non-finite values in {", ".join(bad[:3])}{" ..." if len(bad) > 3 else ""} '
          f'at step {step}; not saved (a checkpoint never holds NaN or inf). The '
          f'last checkpoint is {self.manager.latest_checkpoint}.')
    checkpoints.Save(self.manager, step)

  # --- eval -----------------------------------------------------------------------

  def _EvalStep(self, batch: NestedMap) -> NestedMap:
    return self.task.FProp(self.task.theta, batch)

  def Eval(self, split: str = 'dev') -> Dict[str, float]:
    """Metrics over eval_steps batches of split 'dev' or 'test', written
    under logdir/eval: counts (num_examples, num_tokens: COUNT_PREFIX)
    summed, the others averaged, weighted by num_tokens when the task
    reports it."""
    dataset = self.params.Get(split).Instantiate().Dataset().take(self.tp.eval_steps)
    totals: Dict[str, float] = {}
    weight_sum = 0.0
    with eval_mode.EvalMode():
      for batch in dataset:
        metrics = {k: float(v) for k, v in self._eval_step(batch).items()}
        weight = metrics.get('num_tokens', 1.0)
        weight_sum += weight
        for key, value in metrics.items():
          is_count = key.startswith(loop_report.COUNT_PREFIX)
          totals[key] = totals.get(key, 0.0) + (value if is_count else value * weight)
    if not weight_sum:
      raise ValueError(f'The {split} input produced no batch; check its data and '
                       'batch_size.')
    means = {k: (v if k.startswith(loop_report.COUNT_PREFIX) else v / weight_sum)
             for k, v in totals.items()}
    step = int(self.global_step.numpy())
    with self._Writer('eval').as_default(step=step):
      for key, value in means.items():
        tf.summary.scalar(key, value)
    self._Writer('eval').flush()
    self.log(f'eval at step {step}: ' + '  '.join(
        f'{k} {v:.0f}' if k.startswith(loop_report.COUNT_PREFIX) else f'{k} {v:.4f}'
        for k, v in sorted(means.items())))
    return means


def _ScalarMetrics(metrics: NestedMap) -> Tuple[tf.Tensor, tf.Tensor]:
  """(names, float32 values) of the task's scalar metrics other than loss,
  sorted by name; [0]-shaped when there are none."""
  names = sorted(k for k, v in metrics.items()
                 if k != 'loss' and isinstance(v, tf.Tensor) and v.shape.rank == 0)
  if not names:
    return tf.zeros([0], tf.string), tf.zeros([0])
  return (tf.constant(names, tf.string),
          tf.stack([tf.cast(metrics[k], tf.float32) for k in names]))
