"""A few training steps of one pipeline layout, timed: the tuner's check
of its predictions where no trainer runs the model (benchmarks, notebooks).

The step is the pipeline's alone: the loss inside it (FPropWithLoss, the
mean square of its first output, so every schedule trains), every gradient,
and plain gradient descent on the weights; each step draws new dropout
masks, as a trainer's (step_seeds.Counter). The peak is the allocator's over
the timed steps (warm-up excluded), less what it held before the pipeline
was built: tf.config.experimental.get_memory_info, which on CPU needs
TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow starts (else None). On CPU
all logical devices share that allocator, so the peak is every device's.
"""

import gc
import time
from typing import Any, Callable, Optional, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import step_seeds

# Run's step updates each weight as soon as its gradient exists (nothing
# reads all of them first): planner.Estimate's gradients_held.
GRADIENTS_HELD = False


def StepSeconds(run: Callable[[int], Any], rounds: int = 5, round_s: float = 0.2) -> float:
  """The fastest of `rounds` rounds' seconds per step of `run(n)` (runs n
  steps), n such that a round takes about `round_s` (at least one step): a
  short step is timed over many, so that a timer's and a call's noise does
  not decide between two layouts. The fastest, not the median: on a shared
  machine other work only ever adds time (ffn at K=1 M=4, four trials of one
  layout: medians of 3 rounds 0.172-0.190 s, fastest of 5 0.172-0.174).
  Call it after a warm-up."""
  start = time.perf_counter()
  run(1)
  steps = max(1, min(100, int(round_s / max(time.perf_counter() - start, 1e-6))))
  seconds = []
  for _ in range(max(rounds, 1)):
    start = time.perf_counter()
    run(steps)
    seconds.append((time.perf_counter() - start) / steps)
  return min(seconds)


def Timed(start: Callable[[], Callable[[int], Any]], warmup: int = 1,
          memory_device: str = 'CPU:0') -> Tuple[float, Optional[int]]:
  """(seconds per step, peak bytes or None) of the steps `start()` returns
  a runner of (run(n) runs n steps): `warmup` steps first (the first
  traces), then StepSeconds; the peak is the allocator's over the timed
  steps, less what it held before `start` built anything."""
  if warmup < 1:
    raise ValueError(f'warmup ({warmup}) must be >= 1: the first step traces the graph.')
  gc.collect()  # an earlier trial's garbage freed now, not during the steps measured
  before = BytesInUse(memory_device)
  run = start()
  run(warmup)
  if before is not None:
    tf.config.experimental.reset_memory_stats(memory_device)
  seconds = StepSeconds(run)
  peak = None
  if before is not None:
    peak = tf.config.experimental.get_memory_info(memory_device)['peak'] - before
  return seconds, peak


def Run(pipeline: hyperparams.Params, inputs: Sequence[Any], warmup: int = 1,
        memory_device: str = 'CPU:0') -> Tuple[float, Optional[int]]:
  """Timed training steps of the PipeliningLayer `pipeline` on `inputs` (a
  whole batch)."""
  return Timed(lambda: TrainingSteps(pipeline, inputs), warmup, memory_device)


def TrainingSteps(pipeline: hyperparams.Params, inputs: Sequence[Any]
                  ) -> Callable[[int], float]:
  """Builds the PipeliningLayer `pipeline` (on its default devices) and
  returns a runner of n training steps on `inputs` (module docstring)
  that returns the last step's loss."""
  pipe = pipeline.Instantiate()
  variables = pipe.trainable_variables
  seeds = step_seeds.Counter()

  def Loss(out: Any) -> tf.Tensor:
    first = tf.nest.flatten(out)[0]
    return tf.reduce_mean(tf.square(tf.cast(first, tf.float32)))

  @tf.function(autograph=False)
  def Step(*x):
    with tf.GradientTape() as tape:
      loss = pipe.FPropWithLoss(seeds.Next(pipe.theta), Loss, *x)[0]
    for v, g in zip(variables, tape.gradient(loss, variables)):
      if g is not None:
        with tf.device(v.device):
          v.assign_sub(1e-6 * tf.convert_to_tensor(g))
    return loss

  def Steps(n: int) -> float:
    loss = 0.0
    for _ in range(n):
      loss = float(Step(*inputs).numpy())
    return loss

  return Steps


def BytesInUse(device: str = 'CPU:0') -> Optional[int]:
  """The allocator's bytes in use, or None where it keeps no statistics."""
  try:
    return tf.config.experimental.get_memory_info(device)['current']
  except ValueError:
    return None
