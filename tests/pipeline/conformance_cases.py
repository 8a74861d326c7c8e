"""The schedules, emissions and remat policies every conformance matrix
runs (tests/pipeline/test_conformance.py for the project's layers,
tests/pipeline/test_keras_conformance.py for a Keras model)."""

from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.schedules.built_in import ScheduleKind

BATCH = 24
# name -> (pipeline params, cells, M, loss inside)
SCHEDULES = {
    'fill_drain': (dict(schedule=ScheduleKind.GPIPE), 2, 3, True),
    'fill_drain_fprop': (dict(schedule=ScheduleKind.GPIPE), 2, 3, False),
    'one_f_one_b': (dict(schedule=ScheduleKind.ONE_F_ONE_B), 3, 4, True),
    'interleaved': (dict(schedule=ScheduleKind.INTERLEAVED, cells_per_device=2), 4, 4, True),
    'zb_h1': (dict(schedule=ScheduleKind.ZB_H1), 3, 4, True),
    'zb_h2': (dict(schedule=ScheduleKind.ZB_H2), 2, 3, True),
    'zb_v': (dict(schedule=ScheduleKind.ZB_V), 4, 3, True),
}
EMISSIONS = {'unrolled': 0, 'loop': 2}  # name -> loop_min_micro_batches
REMATS = (gpipe.RematPolicy.NONE, gpipe.RematPolicy.PER_CELL)
