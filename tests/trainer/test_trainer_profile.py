"""The trainer binary's --mode=profile, run in a subprocess on the tiny LM."""

import json

import pytest

from tests.trainer import in_process


def test_profile_mode_writes_the_timeline(tmp_path):
  result = in_process.Run('--model=lm.StdlibBytesTiny',
                                   '--mode=profile', '--logdir=' + str(tmp_path))
  assert 'K=2 M=2 bubble: measured ' in result.stdout
  assert 'theoretical (K-1)/(M+K-1) = 0.333' in result.stdout
  # No checkpoint in the logdir: it says what it profiled, and that it made
  # a new timeline.
  assert 'with no checkpoint in the logdir it profiled the initial weights' in result.stdout
  assert 'replacing' not in result.stdout
  with open(tmp_path / 'timeline.json') as f:
    spans = [e for e in json.load(f)['traceEvents'] if e['ph'] == 'X']
  assert {(e['tid'], e['args']['micro_batch']) for e in spans} == {
      (k, m) for k in range(2) for m in (-1, 0, 1)}  # -1: step weight gradients
  assert {e['cat'] for e in spans} >= {'forward', 'backward', 'weight_gradients'}
  with open(tmp_path / 'timeline.png', 'rb') as f:
    assert f.read(4) == b'\x89PNG'
  _CheckSummaries(tmp_path / 'profile')


def _CheckSummaries(summary_dir):
  """The profile's TensorBoard summaries: bubble, busy fractions, picture."""
  import glob  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  values = {}
  for path in glob.glob(str(summary_dir / 'events.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      for v in event.summary.value:
        values[v.tag] = tf.make_ndarray(v.tensor)
  busy = {tag: float(x) for tag, x in values.items()
          if tag.startswith('pipeline/busy_fraction/')}
  assert sorted(busy) == ['pipeline/busy_fraction/CPU_0', 'pipeline/busy_fraction/CPU_1']
  assert all(0 < b <= 1 for b in busy.values())
  bubble = float(values['pipeline/bubble_measured'])
  assert abs(bubble - (1 - sum(busy.values()) / 2)) < 1e-6
  assert abs(float(values['pipeline/bubble_theoretical']) - 1 / 3) < 1e-6
  image = values['pipeline/timeline']  # width, height, PNG bytes
  assert image.shape == (3,) and image[2][:4] == b'\x89PNG'


def test_tensorboard_shows_the_schedules_theoretical_bubble(tmp_path):
  """Interleaved on 2 devices, v=2, M=4: TensorBoard's theoretical bubble
  is the schedule's (0.111, schedule.Bubble, as the planner's), as on the
  console, not (K-1)/(M+K-1) of the profiled 4 cells (0.429)."""
  import pathlib  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.pipeline.schedules import schedule  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.profiling import bubble  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.profiling import timeline  # pylint: disable=g-import-not-at-top
  from trainer import profiling  # pylint: disable=g-import-not-at-top
  fixture = pathlib.Path(__file__).parents[1] / 'profiling' / 'testdata' / 'gpipe_k4_m4.xplane.pb'
  intervals = timeline.Intervals(timeline.LoadTrace(str(fixture)))  # 4 cells, M=4
  interleaved = schedule.Actions(schedule.ScheduleKind.INTERLEAVED, 2, 4, 2)
  png = tmp_path / 'timeline.png'
  png.write_bytes(tf.io.encode_png(tf.zeros([1, 1, 4], tf.uint8)).numpy())
  profiling.WriteSummaries(intervals, str(png), str(tmp_path / 'profile'), 3, interleaved)
  (path,) = (tmp_path / 'profile').glob('events.*')
  theoretical = [float(tf.make_ndarray(v.tensor))
                 for event in tf.compat.v1.train.summary_iterator(str(path))
                 for v in event.summary.value if v.tag == 'pipeline/bubble_theoretical']
  assert theoretical == [pytest.approx(schedule.Bubble(interleaved))]
  assert abs(theoretical[0] - 1 / 9) < 1e-6
  assert f'schedule (F = I = W) {theoretical[0]:.3f}' in bubble.Summary(intervals, interleaved)
