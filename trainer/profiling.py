"""The trainer's profile mode: a pipeline timeline of one training step."""

import os
from typing import List, Optional, Tuple

import tensorflow as tf

from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.lowering import program
from lingvo_pipe.pipeline.schedules import actions
from lingvo_pipe.pipeline.schedules import schedule
from lingvo_pipe.profiling import bubble
from lingvo_pipe.profiling import record
from lingvo_pipe.profiling import timeline
from trainer import loop


def ProfileOneStep(trainer_obj: loop.Trainer, warmup_steps: int = 2) -> str:
  """Warms up, then profiles one training step and writes its timeline.

  Each profiled or warm-up call is one loop of one step, so the trace holds
  exactly one step. The steps run on the state in memory only: no
  checkpoint, training summary or params.txt is written, so the logdir's
  global step and checkpoints stay as they were.

  Args:
    trainer_obj: a restored loop.Trainer; its variables in memory change.
    warmup_steps: unprofiled steps first; the first one traces the step.

  Returns:
    The bubble Summary line; logdir/timeline.json and logdir/timeline.png
    are written, the raw profile under logdir/plugins/profile, and the
    bubble, each device's busy fraction and the picture as TensorBoard
    summaries under logdir/profile (WriteSummaries).

  Raises:
    ValueError: warmup_steps < 1, or the step has no pipeline cell calls.
  """
  if warmup_steps < 1:
    raise ValueError(f'warmup_steps ({warmup_steps}) must be >= 1: the first '
                     'step traces the function and must not be profiled.')

  def OneStep() -> None:
    trainer_obj.RunStepsUnsaved(1)

  logdir = os.path.abspath(trainer_obj.logdir)
  step = int(trainer_obj.global_step.numpy())  # of the checkpoint profiled
  schedule_actions, replica_devices = _Layout(trainer_obj.task)
  intervals = record.Record(OneStep, logdir, warmup=warmup_steps,
                            schedule_actions=schedule_actions,
                            replica_devices=replica_devices)
  WriteSummaries(intervals, os.path.join(logdir, 'timeline.png'),
                 os.path.join(logdir, 'profile'), step, schedule_actions)
  return bubble.Summary(intervals, schedule_actions)


def _Layout(task: tf.Module) -> Tuple[Optional[actions.Schedule],
                                      Optional[List[List[str]]]]:
  """What labels the timeline of the task's pipeline: its schedule's
  actions if it has a fixed M and runs a schedule other than fill-drain or
  a loop step, else None; with replicas their devices' names, else None."""
  for module in task.submodules:
    if isinstance(module, gpipe.PipeliningLayer):
      p, plan = module.params, module.plan
      replica_devices = plan.DeviceNames() if plan.num_replicas > 1 else None
      fill_drain = p.schedule == schedule.ScheduleKind.GPIPE and not p.schedule_text
      loops = plan.Emission(p.num_micro_batches) == program.Emission.LOOP
      if (fill_drain and not loops) or p.micro_batch_size:
        return None, replica_devices
      return plan.Actions(p.num_micro_batches), replica_devices
  return None, None


def WriteSummaries(intervals: List[timeline.Interval], png_path: str,
                   summary_dir: str, step: int,
                   schedule_actions: Optional[actions.Schedule] = None) -> None:
  """Writes the profiled step to TensorBoard (summary_dir, at `step`), next
  to the training curves: scalars pipeline/bubble_measured,
  pipeline/bubble_theoretical (the schedule's, bubble.ScheduleBubble of
  its actions, as the console's line) and per device
  pipeline/busy_fraction/<device>, and the timeline PNG as the image
  pipeline/timeline."""
  writer = tf.summary.create_file_writer(summary_dir)
  with writer.as_default(step=step):
    tf.summary.scalar('pipeline/bubble_measured', bubble.BubbleFraction(intervals))
    tf.summary.scalar('pipeline/bubble_theoretical',
                      bubble.ScheduleBubble(intervals, schedule_actions))
    for device, busy in bubble.BusyFractions(intervals).items():
      name = device.rsplit('device:', 1)[-1].replace(':', '_').replace(' ', '_')
      tf.summary.scalar(f'pipeline/busy_fraction/{name}', busy)
    with open(png_path, 'rb') as f:
      image = tf.image.decode_png(f.read(), channels=4)
    tf.summary.image('pipeline/timeline', image[None], max_outputs=1)
  writer.flush()
