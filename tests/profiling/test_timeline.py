"""The timeline parser on a recorded profile of one GPipe step (K=4, M=4).

testdata/gpipe_k4_m4.xplane.pb: 8 ReLU ProjectionLayers (128 wide) in 4 cells
on 4 logical CPU devices, 4 micro-batches of 16, per-cell remat, one step of
a tf.function with a GradientTape; host plane only, ThreadpoolListener events
dropped. No timing is asserted, only structure.
"""

import collections
import json
import os
import pathlib

import pytest

from lingvo_pipe.pipeline.schedules import schedule
from lingvo_pipe.profiling import bubble
from lingvo_pipe.profiling import record
from lingvo_pipe.profiling import timeline
from lingvo_pipe.profiling.timeline import Phase

FIXTURE = str(pathlib.Path(__file__).parent / 'testdata' / 'gpipe_k4_m4.xplane.pb')
K, M = 4, 4
# The phases of a (cell, micro-batch); the fixture was recorded before the
# step gradients had a scope of their own, so it has no WEIGHT_GRADIENTS.
CELL_PHASES = (Phase.FORWARD, Phase.RECOMPUTE, Phase.BACKWARD)


@pytest.fixture(scope='module')
def intervals():
  return timeline.Intervals(timeline.LoadTrace(FIXTURE))


def test_every_cell_micro_batch_and_phase_once(intervals):
  found = collections.Counter((i.cell, i.micro_batch, i.phase) for i in intervals)
  assert set(found) == {(k, m, p) for k in range(K) for m in range(M) for p in CELL_PHASES}
  assert set(found.values()) == {1}
  assert bubble.NumCellsAndMicroBatches(intervals) == (K, M)


def test_schedule_order_per_cell(intervals):
  for k in range(K):
    mine = sorted((i for i in intervals if i.cell == k), key=lambda i: i.start_us)
    assert [(i.phase, i.micro_batch) for i in mine] == (
        [(Phase.FORWARD, m) for m in range(M)] +
        [(p, m) for m in reversed(range(M)) for p in (Phase.RECOMPUTE, Phase.BACKWARD)])
    assert all(i.start_us <= i.end_us for i in mine)


def test_a_cell_starts_after_the_previous_cell(intervals):
  def First(k, phase):
    return min(i.start_us for i in intervals if i.cell == k and i.phase == phase)
  for k in range(1, K):
    assert First(k, Phase.FORWARD) > First(k - 1, Phase.FORWARD)
    assert First(k - 1, Phase.RECOMPUTE) > First(k, Phase.RECOMPUTE)


def test_cells_on_distinct_devices(intervals):
  devices = {i.cell: i.device for i in intervals}
  assert len(set(devices.values())) == K
  assert devices[0].endswith('device:CPU:0') and devices[3].endswith('device:CPU:3')
  assert len({(i.cell, i.device) for i in intervals}) == K


def _BubbleBySweep(intervals):
  """1 - busy time / (K * span), the busy time summed over the segments
  between consecutive interval ends, each counted once per cell that runs
  in it (overlapping intervals of a cell count once)."""
  bounds = sorted({t for i in intervals for t in (i.start_us, i.end_us)})
  busy = 0.0
  for lo, hi in zip(bounds, bounds[1:]):
    mid = (lo + hi) / 2
    busy += (hi - lo) * len({i.cell for i in intervals if i.start_us < mid < i.end_us})
  cells = len({i.cell for i in intervals})
  return 1.0 - busy / (cells * (bounds[-1] - bounds[0]))


def _Interval(cell, start, end):
  return timeline.Interval(cell, f'CPU:{cell}', 0, Phase.FORWARD, start, end)


def test_bubble_of_hand_made_intervals():
  """Cell 0 busy over [0, 10) (two overlapping intervals), cell 1 over
  [6, 10): 14 of 20 device-microseconds busy."""
  intervals = [_Interval(0, 0, 10), _Interval(0, 5, 8), _Interval(1, 6, 10)]
  assert bubble.BubbleFraction(intervals) == pytest.approx(0.3)
  assert _BubbleBySweep(intervals) == pytest.approx(0.3)


def test_unoverlapped_all_reduce_of_hand_made_intervals():
  """Over [0, 20): device 0 computes [0, 10), device 1 [0, 12); their
  all-reduces run [8, 16) and [9, 18): [12, 18) has no computation, 6 of
  20 microseconds; the bubble leaves the all-reduce out."""
  reduce = [timeline.Interval(c, f'CPU:{c}', -1, Phase.ALL_REDUCE, lo, hi)
            for c, lo, hi in ((0, 8, 16), (1, 9, 18))]
  compute = [_Interval(0, 0, 10), _Interval(1, 0, 12), _Interval(1, 19, 20)]
  assert bubble.UnoverlappedAllReduceShare(compute + reduce) == pytest.approx(0.3)
  assert bubble.UnoverlappedAllReduceShare(compute) == 0.0
  assert bubble.BubbleFraction(compute + reduce) == pytest.approx(
      1 - (10 + 13) / 40)


def test_replicas_are_labelled_by_their_devices(tmp_path):
  """R=2 x K=2, given the replicas' devices: each replica's two devices
  run cells 0 and 1 (without them the four devices read as cells 0-3 in
  the order of their first calls, which interleave); each device has an
  ALL_REDUCE interval, after its step gradients start; the summary, the
  trace's threads and the chart's rows count K=2 per replica."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.core.layers import linear
  from lingvo_pipe.pipeline import gpipe
  from lingvo_pipe.pipeline.replicas import replica_variables
  layers = [linear.ProjectionLayer.Params().Set(
      name=f'p{i}', input_dim=16, output_dim=16, activation=linear.Activation.RELU)
            for i in range(4)]
  pipe = gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, num_partitions=2, num_micro_batches=2, num_replicas=2,
      input_shapes=[[8, 16]]).Instantiate()
  trained = replica_variables.TrainedVariables(pipe)

  @tf.function(autograph=False)
  def Step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(pipe(tf.ones([8, 16]))))
    return loss, tape.gradient(loss, trained)

  names = pipe.plan.DeviceNames()
  intervals = timeline.ProfileIntervals(Step, str(tmp_path), replica_devices=names)
  placed = {(i.replica, i.cell, i.device) for i in intervals}
  assert placed == {(r, c, names[r][c]) for r in range(2) for c in range(2)}
  assert collections.Counter(
      (i.replica, i.cell, i.micro_batch, i.phase) for i in intervals
      if i.phase in (Phase.FORWARD, Phase.BACKWARD)) == {
          (r, c, m, p): 1 for r in range(2) for c in range(2) for m in range(2)
          for p in (Phase.FORWARD, Phase.BACKWARD)}
  assert bubble.Summary(intervals).startswith('K=2 M=2 R=2 bubble: ')
  record.WriteChromeTrace(intervals, str(tmp_path / 'timeline.json'))
  with open(tmp_path / 'timeline.json') as f:
    threads = [e['args']['name'] for e in json.load(f)['traceEvents'] if e['ph'] == 'M']
  assert threads == [f'replica_{r} cell_{c} ({names[r][c]})' for r in range(2) for c in range(2)]
  with pytest.raises(ValueError, match='replicas run on'):
    timeline.Intervals(timeline.LoadTrace(timeline.Profile(Step, str(tmp_path / 'one'))),
                       replica_devices=names[:1])
  reduce = {i.device: i for i in intervals if i.phase == Phase.ALL_REDUCE}
  weights = {i.device: i for i in intervals if i.phase == Phase.WEIGHT_GRADIENTS}
  assert len(reduce) == 4 and set(reduce) == set(weights)
  for device, interval in reduce.items():
    assert interval.start_us >= weights[device].start_us
  assert 0.0 <= bubble.UnoverlappedAllReduceShare(intervals) < 1.0


def test_bubble_and_summary(intervals):
  fraction = bubble.BubbleFraction(intervals)
  assert fraction == pytest.approx(_BubbleBySweep(intervals), abs=1e-9)
  summary = bubble.Summary(intervals)
  assert summary.startswith(f'K=4 M=4 bubble: measured {fraction:.3f} (cell calls alone '
                            f'{bubble.CellCallsBubbleFraction(intervals):.3f}), ')
  assert f'{schedule.BubbleFraction(K, M):.3f}' in summary


def test_chrome_trace_schema(intervals, tmp_path):
  path = str(tmp_path / 'timeline.json')
  record.WriteChromeTrace(intervals, path)
  with open(path) as f:
    events = json.load(f)['traceEvents']
  spans = [e for e in events if e['ph'] == 'X']
  assert len(spans) == len(intervals) == K * M * len(CELL_PHASES)
  assert sorted((e['tid'], e['args']['micro_batch'], e['cat'], e['ts'], e['dur'])
                for e in spans) == sorted(
                    (i.cell, i.micro_batch, i.phase.value, i.start_us, i.end_us - i.start_us)
                    for i in intervals)
  assert all({'name', 'pid'} <= set(e) for e in spans)
  names = [e['args']['name'] for e in events if e['ph'] == 'M']
  assert len(names) == K and names[0].startswith('cell_0 (')


def test_gantt_png_written(intervals, tmp_path):
  path = str(tmp_path / 'timeline.png')
  record.WriteGantt(intervals, path)
  with open(path, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'


def test_trace_without_cells_raises():
  space = timeline.LoadTrace(FIXTURE)
  for plane in space.planes:
    for line in plane.lines:
      del line.events[:]
  with pytest.raises(ValueError, match='no pipeline cell events'):
    timeline.Intervals(space)
  del space.planes[:]
  with pytest.raises(ValueError, match='No /host:CPU plane'):
    timeline.Intervals(space)


def test_empty_intervals_raise():
  with pytest.raises(ValueError, match='No intervals'):
    bubble.BubbleFraction([])


def test_profile_of_a_live_step(tmp_path):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.pipeline import gpipe
  from lingvo_pipe.core.layers import linear
  # ReLU and a squared loss: each backward needs its forward's activations.
  layers = [linear.ProjectionLayer.Params().Set(
      name=f'p{i}', input_dim=16, output_dim=16, activation=linear.Activation.RELU)
            for i in range(4)]
  pipe = gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, num_partitions=2, num_micro_batches=2,
      input_shapes=[[8, 16]]).Instantiate()
  x = tf.ones([8, 16])

  @tf.function(autograph=False)
  def Step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(pipe(x)))
    return loss, tape.gradient(loss, pipe.trainable_variables)

  summary = bubble.Summary(record.Record(Step, str(tmp_path)))
  assert summary.startswith('K=2 M=2 bubble: measured ')
  assert os.path.exists(tmp_path / 'timeline.json')
  assert os.path.exists(tmp_path / 'timeline.png')
  # Micro-batch 1, the last, keeps its activations: its forward and backward
  # run as kept-scope ops, not calls, and nothing recomputes it. Each
  # device's step gradients come after its last backward starts.
  one = timeline.ProfileIntervals(Step, str(tmp_path / 'one'), warmup=0)
  weights = [i for i in one if i.phase == timeline.Phase.WEIGHT_GRADIENTS]
  assert sorted(i.cell for i in weights) == [0, 1] and {i.micro_batch for i in weights} == {-1}
  for w in weights:
    assert w.start_us >= max(i.start_us for i in one if i.cell == w.cell
                             and i.phase == timeline.Phase.BACKWARD)
  assert bubble.NumCellsAndMicroBatches(one) == (2, 2)
  for cell in (0, 1):
    phases = {(i.micro_batch, i.phase): i for i in one if i.cell == cell}
    assert set(phases) >= {(m, p) for m in (0, 1) for p in (timeline.Phase.FORWARD,
                                                             timeline.Phase.BACKWARD)}
    assert (1, timeline.Phase.RECOMPUTE) not in phases
    assert (phases[(1, timeline.Phase.FORWARD)].start_us <
            phases[(1, timeline.Phase.BACKWARD)].start_us)
  two_steps = timeline.Profile(lambda: (Step(), Step()), str(tmp_path / 'two'), warmup=0)
  with pytest.raises(ValueError, match='profile exactly one'):
    timeline.Intervals(timeline.LoadTrace(two_steps))
  # A trace that does not parse is profiled again.
  calls = []

  def TwoStepsFirst():
    calls.append(1)
    return (Step(), Step()) if len(calls) == 1 else Step()

  again = timeline.ProfileIntervals(TwoStepsFirst, str(tmp_path / 'again'), warmup=0)
  assert len(calls) == 2 and bubble.NumCellsAndMicroBatches(again) == (2, 2)
  with pytest.raises(ValueError, match='profile exactly one'):
    timeline.ProfileIntervals(lambda: (Step(), Step()), str(tmp_path / 'never'),
                              warmup=0, attempts=2)
  with pytest.raises(ValueError, match='attempts must be >= 1, got 0'):
    timeline.ProfileIntervals(Step, str(tmp_path / 'none'), attempts=0)

  @tf.function(autograph=False)
  def Loop():  # two steps in one function, as the trainer's loop runs them
    return tf.while_loop(lambda i, _: i < 2, lambda i, _: (i + 1, Step()[0]),
                         [tf.constant(0), tf.constant(0.0)])

  loop = timeline.Profile(Loop, str(tmp_path / 'loop'))
  with pytest.raises(ValueError, match='2 steps in one loop'):
    timeline.Intervals(timeline.LoadTrace(loop))
  # Refused by the schedule's forward count, or earlier where the profiler
  # kept a partial call (seen under load: op counts [2, 10, 10]).
  with pytest.raises(ValueError, match=r'profile exactly one, with steps_per_loop=1'):
    timeline.Intervals(timeline.LoadTrace(loop), pipe.plan.Actions(2))


def test_a_loop_step_labelled_by_its_schedule(tmp_path):
  """A loop step runs an action per iteration: with the schedule the
  timeline reads it as it reads an unrolled step (ZB-H1: each (cell,
  micro-batch) one forward and one backward, the forward first; W's that
  ran in iterations of their own); without it it cannot tell iterations
  from steps and says so."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.pipeline.schedules import built_in  # pylint: disable=g-import-not-at-top
  from tests.pipeline import pipeline_models as models  # pylint: disable=g-import-not-at-top
  layers, shape = models.FfnLayers(dim=32)
  pipe = models.Pipeline(layers, shape, 2, 4, schedule=built_in.ScheduleKind.ZB_H1,
                         loop_min_micro_batches=2)
  step = models.TrainStepWithLoss(pipe, 0, 4)
  x = tf.ones(shape)
  intervals = timeline.ProfileIntervals(lambda: step(x), str(tmp_path),
                                        schedule=pipe.plan.Actions(4))
  every = [(c, m) for c in (0, 1) for m in range(4)]
  starts = {}
  for phase in (Phase.FORWARD, Phase.BACKWARD):
    own = {(i.cell, i.micro_batch): i.start_us for i in intervals if i.phase == phase}
    assert sorted(own) == every, phase
    starts[phase] = own
  assert all(starts[Phase.FORWARD][key] < starts[Phase.BACKWARD][key] for key in every)
  for cell in (0, 1):
    assert len([i for i in intervals if i.cell == cell
                and i.phase == Phase.WEIGHT_GRADIENTS]) > 1
  with pytest.raises(ValueError, match='loop iterations.*pass the step\'s schedule'):
    timeline.Intervals(timeline.LoadTrace(timeline.Profile(lambda: step(x),
                                                           str(tmp_path / 'no_tasks'))))


def test_labels_follow_the_schedule_s_device_orders():
  """Without a schedule: fill-drain, a cell per device; with 1F1B or the
  interleaved schedule: each device's forwards and backwards in
  the order of its schedule, with the cell that runs them."""
  from lingvo_pipe.pipeline.schedules.schedule import ScheduleKind  # pylint: disable=g-import-not-at-top
  assert timeline._Labels(None, 2, 2) == [  # pylint: disable=protected-access
      ([(0, 0), (0, 1)], [(0, 1), (0, 0)]), ([(1, 0), (1, 1)], [(1, 1), (1, 0)])]
  one_f = schedule.Actions(ScheduleKind.ONE_F_ONE_B, 2, 2)
  assert timeline._Labels(one_f, 2, 2) == [  # pylint: disable=protected-access
      ([(0, 0), (0, 1)], [(0, 0), (0, 1)]), ([(1, 0), (1, 1)], [(1, 0), (1, 1)])]
  interleaved = schedule.Actions(ScheduleKind.INTERLEAVED, 2, 2, 2)
  assert timeline._Labels(interleaved, 2, 4)[0] == (  # pylint: disable=protected-access
      [(0, 0), (0, 1), (2, 0), (2, 1)], [(2, 0), (2, 1), (0, 0), (0, 1)])
  with pytest.raises(ValueError, match='runs \\[4, 4\\] forwards per device; the trace 2'):
    timeline._Labels(interleaved, 2, 2)  # pylint: disable=protected-access
