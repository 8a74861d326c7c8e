"""What one loop of training steps reports: summaries and a progress line."""

import dataclasses
from typing import Callable, Dict

import tensorflow as tf

# Metrics whose name starts so are counts: summed by Eval, not averaged, and
# left off the progress line.
COUNT_PREFIX = 'num_'


@dataclasses.dataclass(frozen=True)
class LoopReport:
  """One loop's figures: means over its applied steps."""
  step: int  # the global step the loop reached
  loss: float
  grad_norm: float  # the last step's
  examples_per_sec: float
  step_time: float
  skipped: int  # non-finite steps skipped in this loop
  metrics: Dict[str, float]  # the task's other scalar metrics


def WriteSummaries(writer: tf.summary.SummaryWriter, report: LoopReport,
                   learning_rate: Callable[[], tf.Tensor]) -> None:
  with writer.as_default(step=report.step):
    tf.summary.scalar('loss', report.loss)
    for name, value in report.metrics.items():
      tf.summary.scalar(name, value)
    tf.summary.scalar('nonfinite_steps_skipped', report.skipped)
    tf.summary.scalar('learning_rate', learning_rate())
    tf.summary.scalar('grad_norm', report.grad_norm)
    tf.summary.scalar('examples_per_sec', report.examples_per_sec)
    tf.summary.scalar('step_time_s', report.step_time)
  writer.flush()


def ProgressLine(report: LoopReport, max_steps: int, first_loop: bool) -> str:
  """One line per loop; the run's first loop, whose time includes building
  the step, gives no ETA unless it is the last."""
  eta = int((max_steps - report.step) * report.step_time)
  eta_text = (f'ETA {eta // 60}m{eta % 60:02d}s'
              if not first_loop or report.step >= max_steps
              else 'ETA from the next loop (this one built the step)')
  note = f' ({report.skipped} non-finite steps skipped)' if report.skipped else ''
  shown = ''.join(f'  {k} {v:.4f}' for k, v in report.metrics.items()
                  if not k.startswith(COUNT_PREFIX))
  return (f'step {report.step:>6}/{max_steps}  loss {report.loss:.4f}{shown}  '
          f'{report.examples_per_sec:8.1f} examples/s  {report.step_time:.3f} s/step  '
          f'{eta_text}{note}')
