"""BaseExperiment, the base of registered experiments, and trainer settings."""

import enum

from lingvo_pipe.core import hyperparams


class OptimizerKind(enum.Enum):
  """The optimizer the trainer builds (TrainerParams().optimizer)."""
  SGD = 'sgd'
  MOMENTUM = 'momentum'
  ADAM = 'adam'
  RMSPROP = 'rmsprop'


class LrSchedule(enum.Enum):
  """How the learning rate follows the step (TrainerParams().lr_schedule)."""
  CONSTANT = 'constant'
  WARMUP_RSQRT = 'warmup_rsqrt'  # linear warmup, then 1/sqrt(step) decay
  COSINE = 'cosine'              # linear warmup, then cosine decay to 0


class NonFinitePolicy(enum.Enum):
  """What the trainer does when the loss or the gradients are NaN or inf."""
  SKIP_STEP = 'skip_step'  # apply nothing, count the step as skipped, go on
  STOP = 'stop'            # apply nothing and stop with an error


class LossScaling(enum.Enum):
  """How the trainer scales the loss before the backward pass
  (TrainerParams().loss_scaling): for float16 compute, whose gradients
  underflow below 6e-8 and overflow above 65504."""
  NONE = 'none'
  DYNAMIC = 'dynamic'  # lower on overflow (step skipped), raise when stable


def TrainerParams() -> hyperparams.Params:
  """Returns the default training settings, BaseExperiment.Trainer()'s."""
  p = hyperparams.Params()
  p.Define('max_steps', 1000, 'Train until this global step.')
  p.Define('steps_per_loop', 100, 'Steps per call of the training loop '
           'function (one host round trip: progress, summaries, checkpoint).')
  p.Define('save_interval_steps', 0, 'Checkpoint every this many steps '
           '(0: after every loop).')
  p.Define('max_checkpoints_to_keep', 5, 'Newest checkpoints kept.')
  p.Define('keep_checkpoint_every_n_hours', 0.0, 'Also keep one checkpoint '
           'per this many hours (0: off).')
  p.Define('eval_steps', 10, 'Batches per evaluation.')
  p.Define('decode_steps', 10, 'Dev batches per decode (--mode=decode and '
           'decode_interval_steps), like eval_steps; 0: the whole dev split '
           '(an endless input then never ends).')
  p.Define('decode_interval_steps', 0, 'In train_and_eval, also decode the '
           'dev split every this many steps, for tasks that can (0: never).')
  p.Define('eval_interval_steps', 0, 'In train and train_and_eval, also '
           'evaluate on the dev split (eval_steps batches, summaries under '
           'logdir/eval) every this many steps, as Lingvo\'s evaler does '
           'beside its trainer (0: never; train_and_eval still evaluates at '
           'the end).')
  p.Define('best_checkpoint_metric', '', 'Keep a copy of the checkpoint with '
           'the best value of this eval metric (e.g. \'loss\') in logdir/best, '
           'apart from max_checkpoints_to_keep, wherever a checkpoint is '
           'evaluated while training (eval_interval_steps, train_and_eval\'s '
           'end) or by --mode=evaler; \'\': none.')
  p.Define('best_checkpoint_higher_is_better', False, 'For '
           'best_checkpoint_metric: higher values are better (accuracy, BLEU), '
           'not lower (loss).')
  p.Define('learning_rate', 1e-3, 'Peak learning rate.')
  p.Define('optimizer', OptimizerKind.ADAM, 'An OptimizerKind.')
  p.Define('momentum', 0.9, 'Momentum of MOMENTUM and RMSPROP.')
  p.Define('lr_schedule', LrSchedule.CONSTANT, 'An LrSchedule.')
  p.Define('warmup_steps', 0, 'Linear warmup steps of WARMUP_RSQRT and '
           'COSINE.')
  p.Define('clip_gradient_norm_to_value', 0.0, 'Clip gradients to this '
           'global norm (0: off).')
  p.Define('on_nonfinite', NonFinitePolicy.STOP, 'A NonFinitePolicy.')
  p.Define('loss_scaling', LossScaling.NONE, 'A LossScaling; DYNAMIC for '
           'float16 compute (fprop_dtype): trainer/loss_scale.py.')
  p.Define('loss_scale_initial', 2.0**15, 'The first loss scale (DYNAMIC).')
  p.Define('loss_scale_factor', 2.0, 'The scale is divided by this on an '
           'overflow and multiplied by it after loss_scale_growth_interval '
           'steps without one (DYNAMIC).')
  p.Define('loss_scale_growth_interval', 2000, 'Overflow-free steps before '
           'the scale grows (DYNAMIC).')
  p.Define('seed', 1234, 'Random seed.')
  p.Define('reset_optimizer_state', False, 'Restore the model, global step '
           'and input position from the checkpoint but start the optimizer '
           'slots (and e.g. Adam\'s beta powers) afresh; for a checkpoint '
           'trained with another optimizer. Once: checkpoints saved after '
           'the reset keep their slots (docs/checkpoints.md).')
  p.Define('init_from_checkpoint_rules', {}, 'Warm start, as in Lingvo: '
           '{checkpoint (prefix, or a logdir or checkpoints directory: its '
           'newest): ([(regex, source name format), ...], [ignore regex, '
           '...])}. A model variable path that re.match-es a regex (and no '
           'ignore regex) is loaded from the source variable '
           'format % match.groups(), e.g. (\'stack/(.*)\', \'stack/%s\'). '
           'Applied only when the logdir has no checkpoint yet '
           '(trainer/checkpointing/warm_start.py).')
  p.Define('num_logical_devices', 0, 'Logical CPU devices to create when no '
           'accelerator exists (0: as many as the pipelines need).')
  return p


class BaseExperiment:
  """The params of one experiment: model, inputs and training settings.

  Subclass it, override Task() and Train() (and Dev(), Test() or Trainer()
  where the defaults do not fit) and register the subclass with
  model_registry.RegisterExperiment; the trainer then runs it by key, e.g.
  --model=lm.StdlibBytesGPipe. Each method returns fresh Params.
  """

  def Task(self) -> hyperparams.Params:
    """Params of the model: a layer whose FProp(theta, batch) returns a
    NestedMap of metrics with 'loss'."""
    raise NotImplementedError(f'{type(self).__name__} must define Task().')

  def Train(self) -> hyperparams.Params:
    """Params of the training input (Instantiate().Dataset())."""
    raise NotImplementedError(f'{type(self).__name__} must define Train().')

  def Dev(self) -> hyperparams.Params:
    """Params of the eval input; default: Train()'s."""
    return self.Train()

  def Test(self) -> hyperparams.Params:
    """Params of the test input; default: Dev()'s."""
    return self.Dev()

  def Trainer(self) -> hyperparams.Params:
    """Training settings; default: TrainerParams()."""
    return TrainerParams()
