"""Runs the trainer binary as a child process that tests can kill, stop and
restart, and compares the checkpoints two runs end with."""

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional

import numpy as np
import tensorflow as tf

from tests import fresh_process

TINY = 'lm.StdlibBytesTiny'
# Counts saves, so a run restarted k times has a larger one by design.
SAVE_COUNTER = 'save_counter/.ATTRIBUTES/VARIABLE_VALUE'


def Overrides(max_steps: int, steps_per_loop: int) -> str:
  """The overrides of every run: the learning-rate schedule spans the run
  (TINY's COSINE reaches 0 at its trainer.max_steps=8, after which the
  weights would stop changing and a final comparison would check only the
  optimizer state), and one micro-batch (a cheaper step; the kills, not the
  schedule, are under test)."""
  return (f'trainer.steps_per_loop={steps_per_loop}; trainer.max_steps={max_steps}; '
          'task.stack.pipeline.num_micro_batches=1')


def TrainerArgs(logdir: str, max_steps: int, steps_per_loop: int) -> List[str]:
  return [sys.executable, '-m', 'trainer.trainer', f'--model={TINY}', '--mode=train',
          f'--logdir={logdir}', f'--max_steps={max_steps}',
          f'--model_params_override={Overrides(max_steps, steps_per_loop)}']


class Child:
  """The trainer in a child process; its stdout lines are collected as
  they come. Always call Kill() (or Wait()) in a finally block."""

  def __init__(self, args: List[str]) -> None:
    env = dict(os.environ, PYTHONPATH=str(fresh_process.ROOT), TF_CPP_MIN_LOG_LEVEL='3')
    self.process = subprocess.Popen(args, cwd=fresh_process.ROOT, env=env, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    self.lines: List[str] = []
    self._reader = threading.Thread(target=self._Read, daemon=True)
    self._reader.start()

  def _Read(self) -> None:
    assert self.process.stdout is not None
    for line in self.process.stdout:
      self.lines.append(line.rstrip('\n'))

  def WaitFor(self, predicate: Callable[[], bool], timeout_s: float,
              poll_s: float = 0.01) -> bool:
    """Polls predicate until true (True), the child exits or the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
      if predicate():
        return True
      if self.process.poll() is not None:
        return predicate()
      time.sleep(poll_s)
    return False

  def RestoredStep(self) -> int:
    """The step this run restored (0: it started from scratch)."""
    restored = [l for l in self.lines if l.startswith('Restored ')]
    return int(restored[0].rsplit(' ', 1)[1].rstrip('.')) if restored else 0

  def LastStep(self) -> int:
    """The global step of the last progress line (0: none yet)."""
    steps = [int(l.split()[1].split('/')[0]) for l in self.lines if l.startswith('step ')]
    return steps[-1] if steps else 0

  def Signal(self, signum: int) -> None:
    if self.process.poll() is None:
      self.process.send_signal(signum)

  def Kill(self) -> None:
    if self.process.poll() is None:
      self.process.send_signal(signal.SIGKILL)
    self.Wait(60)

  def Wait(self, timeout_s: float) -> int:
    try:
      code = self.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      self.process.kill()
      code = self.process.wait()
    self._reader.join(timeout=10)
    return code

  def Stderr(self) -> str:
    assert self.process.stderr is not None
    return self.process.stderr.read() if self.process.poll() is not None else ''


def RunToEnd(args: List[str], timeout_s: float = 600) -> Child:
  child = Child(args)
  try:
    code = child.Wait(timeout_s)
  finally:
    child.Kill()
  assert code == 0, (code, child.lines[-5:], child.Stderr()[-2000:])
  return child


def CheckpointTensors(prefix: str) -> Dict[str, np.ndarray]:
  """Every tensor of a checkpoint but the iterator's variant state (checked
  by NextBatch instead) and the save counter."""
  reader = tf.train.load_checkpoint(prefix)
  return {k: np.asarray(reader.get_tensor(k))
          for k, d in reader.get_variable_to_dtype_map().items()
          if d != tf.variant and k != SAVE_COUNTER}


def AssertBitwiseEqual(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]) -> None:
  assert sorted(a) == sorted(b)
  different = [k for k in a if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or
               a[k].tobytes() != b[k].tobytes()]
  assert not different, different


def NextBatch(logdir: str, max_steps: int, steps_per_loop: int) -> Optional[np.ndarray]:
  """The ids of the batch the restored input iterator yields next: equal
  batches mean equal input positions. Builds the trainer with the runs'
  overrides (TrainerArgs)."""
  from lingvo_pipe import model_registry  # pylint: disable=g-import-not-at-top
  from trainer import experiment_params
  from trainer import loop
  params = experiment_params.ExperimentParams(model_registry.GetExperiment(TINY))
  experiment_params.ApplyOverrides(params, Overrides(max_steps, steps_per_loop))
  trainer = loop.Trainer(params, logdir, log=lambda _: None)
  trainer.Restore()
  return next(trainer.train_iterator).ids.numpy()
