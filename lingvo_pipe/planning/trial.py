"""A few training steps of each of some pipeline layouts, timed: the
tuner's check of its predictions where no trainer runs the model
(benchmarks, notebooks).

The step is the pipeline's alone: the loss inside it (FPropWithLoss, the
mean square of its first output, so every schedule trains), every gradient,
and plain gradient descent on the weights; each step draws new dropout
masks, as a trainer's (step_seeds.Counter). The peak is the allocator's over
the timed steps (warm-up excluded), less what it held before the pipeline
was built: tf.config.experimental.get_memory_info, which on CPU needs
TF_CPU_ALLOCATOR_USE_BFC=true before TensorFlow starts (else None). On CPU
all logical devices share that allocator, so the peak is every device's.
"""

from concurrent import futures
import dataclasses
import functools
import gc
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple

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


# (seconds per step, peak bytes or None): what a trial measures.
Result = Tuple[float, Optional[int]]


@dataclasses.dataclass(frozen=True)
class Steps:
  """Built training steps: `trace()` makes their graph without running it
  and allocates nothing (their state exists when they do), `run(n)` runs
  n of them (the first call traces, if trace() did not)."""
  trace: Callable[[], Any]
  run: Callable[[int], Any]


def Timed(starts: Sequence[Callable[[], Steps]], warmup: int = 1,
          memory_device: str = 'CPU:0') -> List[Result]:
  """(seconds per step, peak bytes or None) of the steps each of `starts`
  builds, one after another: `warmup` steps (the first instantiates the
  traced graph), then StepSeconds; the peak is the allocator's over the
  timed steps, less what it held before that trial was built.

  While a trial warms up, the next one is built and traced: a trace is
  Python, holding its lock, and a first call is mostly TensorFlow
  optimizing the graph in C++, which leaves it free (the demo LM's K=4
  M=16 step: 13 s to trace, 16 s to warm up, 16 s for both beside each
  other; three M=16 trials took 66-75 s, one after another 88-100 s); the
  timed steps run alone. The next trial's state, measured as it is built,
  is not counted in this one's peak.
  """
  if warmup < 1:
    raise ValueError(f'warmup ({warmup}) must be >= 1: the first step traces the graph.')
  results: List[Result] = []
  if not starts:
    return results
  gc.collect()  # an earlier trial's garbage freed now, not during the steps measured
  base = BytesInUse(memory_device)
  steps, _ = _Built(starts[0], memory_device)
  steps.trace()
  for index in range(len(starts)):
    following, following_bytes = (_Built(starts[index + 1], memory_device)
                                  if index + 1 < len(starts) else (None, 0))
    with futures.ThreadPoolExecutor(max_workers=1) as beside:
      warming = beside.submit(steps.run, warmup)
      if following is not None:
        following.trace()
      warming.result()
    if base is not None:
      tf.config.experimental.reset_memory_stats(memory_device)
    seconds = StepSeconds(steps.run)
    peak = None
    if base is not None:
      peak = (tf.config.experimental.get_memory_info(memory_device)['peak'] - base -
              following_bytes)
    results.append((seconds, peak))
    if following is None:
      break
    steps = following
    gc.collect()  # the trial just timed
    if base is not None:
      base = (BytesInUse(memory_device) or 0) - following_bytes
  return results


def _Built(start: Callable[[], Steps], memory_device: str) -> Tuple[Steps, int]:
  """start()'s steps and the bytes the allocator gave them (0 where it
  keeps no statistics)."""
  before = BytesInUse(memory_device)
  steps = start()
  return steps, 0 if before is None else (BytesInUse(memory_device) or 0) - before


def Run(pipelines: Sequence[hyperparams.Params], inputs: Sequence[Any], warmup: int = 1,
        memory_device: str = 'CPU:0') -> List[Result]:
  """Timed training steps of each PipeliningLayer of `pipelines` on
  `inputs` (a whole batch)."""
  return Timed([functools.partial(TrainingSteps, p, inputs) for p in pipelines], warmup,
               memory_device)


def TrainingSteps(pipeline: hyperparams.Params, inputs: Sequence[Any]) -> Steps:
  """Builds the PipeliningLayer `pipeline` (on its default devices): its
  training steps on `inputs` (module docstring), whose run(n) returns the
  last step's loss."""
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

  def RunSteps(n: int) -> float:
    loss = 0.0
    for _ in range(n):
      loss = float(Step(*inputs).numpy())
    return loss

  return Steps(lambda: Step.get_concrete_function(*inputs), RunSteps)


def BytesInUse(device: str = 'CPU:0') -> Optional[int]:
  """The allocator's bytes in use, or None where it keeps no statistics."""
  try:
    return tf.config.experimental.get_memory_info(device)['current']
  except ValueError:
    return None
