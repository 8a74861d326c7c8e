"""The schedule flags of the programs that run one pipeline step
(pipeline_bench, cluster_bench), and the schedules' names on their
command lines."""

from absl import flags

from lingvo_pipe.pipeline.schedules import built_in

# --schedule values: 'gpipe' is fill-drain with the loss outside (FProp),
# the others ScheduleKind values with the loss inside (FPropWithLoss).
SCHEDULES = ('gpipe', 'one_f_one_b', 'interleaved', 'zb_h1', 'zb_h2', 'zb_v')


def Define() -> None:
  """Defines --schedule, --cells_per_device and --loop_min_micro_batches."""
  flags.DEFINE_enum('schedule', 'gpipe', list(SCHEDULES),
                    'The pipeline schedule (ScheduleKind value); other than gpipe, '
                    'the step computes the loss inside the pipeline (FPropWithLoss).')
  flags.DEFINE_integer('cells_per_device', 1, 'v, cells per device of interleaved '
                       '(which needs 2 or more; ZB-V\'s is 2, whatever this says): the '
                       'layers go into k*v cells on k devices.')
  flags.DEFINE_integer('loop_min_micro_batches', 0, 'The training step (any '
                       'schedule) as a tf.while_loop per device when M >= this '
                       '(0: unrolled).')


def CellsPerDevice() -> int:
  """v of --schedule: its own (ZB-V's 2) unless --cells_per_device gives it."""
  kind = built_in.ScheduleKind(flags.FLAGS.schedule)
  return built_in.CellsPerDeviceParam(kind, flags.FLAGS.cells_per_device)
