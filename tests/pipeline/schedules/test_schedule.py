"""The clock tables of the schedules (every action one clock) and what they count."""

import pytest

from lingvo_pipe.pipeline.schedules import schedule
from lingvo_pipe.pipeline.schedules import simulate
from lingvo_pipe.pipeline.schedules.actions import ActionKind
from lingvo_pipe.pipeline.schedules.schedule import ScheduleKind

KIND = ScheduleKind


def test_bubble_fraction():
  assert schedule.BubbleFraction(4, 4) == pytest.approx(3 / 7)
  assert schedule.BubbleFraction(1, 8) == 0.0


def test_gpipe_table_k3_m4():
  assert schedule.ClockTable(schedule.Actions(KIND.GPIPE, 3, 4)) == '\n'.join([
      'clock   0  1  2  3  4  5  6  7  8  9 10 11',
      'dev 0  F0 F1 F2 F3  .  .  .  . B3 B2 B1 B0',
      'dev 1   . F0 F1 F2 F3  .  . B3 B2 B1 B0  .',
      'dev 2   .  . F0 F1 F2 F3 B3 B2 B1 B0  .  .'])


def test_one_f_one_b_table_k3_m4():
  """Warm-up K-k-1 forwards, one forward one backward, cool-down."""
  assert schedule.ClockTable(schedule.Actions(KIND.ONE_F_ONE_B, 3, 4)) == '\n'.join([
      'clock   0  1  2  3  4  5  6  7  8  9 10 11',
      'dev 0  F0 F1 F2  .  . B0 F3 B1  . B2  . B3',
      'dev 1   . F0 F1  . B0 F2 B1 F3 B2  . B3  .',
      'dev 2   .  . F0 B0 F1 B1 F2 B2 F3 B3  .  .'])


def test_interleaved_table_k2_m4_v2():
  """Cells 0, 2 on device 0 and 1, 3 on device 1; micro-batches in groups
  of K=2; device d warms up with 2(K-d-1) + (v-1)K forwards."""
  assert schedule.ClockTable(schedule.Actions(KIND.INTERLEAVED, 2, 4, 2)) == '\n'.join([
      'clock     0    1    2    3    4    5    6    7    8    9   10   11   12   13   14   15   16   17',
      'dev 0  F0.0 F1.0 F0.2 F1.2 F2.0 B0.2 F3.0 B1.2 F2.2 B0.0 F3.2 B1.0    . B2.2    . B3.2 B2.0 B3.0',
      'dev 1     . F0.1 F1.1 F0.3 B0.3 F1.3 B1.3 F2.1 B0.1 F3.1 B1.1 F2.3 B2.3 F3.3 B3.3 B2.1 B3.1    .'])


_SHAPES = [(KIND.GPIPE, k, m, 1) for k, m in [(1, 1), (2, 3), (4, 8), (8, 16), (4, 2)]] + [
    (KIND.ONE_F_ONE_B, k, m, 1) for k, m in [(1, 1), (1, 4), (2, 3), (4, 8), (4, 2),
                                              (8, 16), (8, 3)]] + [
    (KIND.INTERLEAVED, k, m, v) for k, m, v in [(1, 3, 2), (2, 2, 2), (2, 4, 3), (4, 8, 2),
                                                 (4, 8, 3), (4, 4, 2), (8, 16, 2), (3, 6, 2)]]


@pytest.mark.parametrize('kind,k,m,v', _SHAPES)
def test_properties_of_every_schedule(kind, k, m, v):
  """Each (cell, micro-batch) forward and backward exactly once, on device
  cell mod K; a device runs one action per clock (every action one
  clock); F(j, m) after F(j-1, m); B(j, m) after F(j, m) and B(j+1, m)."""
  timeline = simulate.Simulate(schedule.Actions(kind, k, m, v), simulate.UNIT_COSTS).timeline
  timed = [t for row in timeline for t in row]
  cells = k * v
  for kinds in ((ActionKind.F,), (ActionKind.B,)):
    assert sorted((t.action.cell, t.action.micro) for t in timed
                  if t.action.kind in kinds) == [(c, b) for c in range(cells) for b in range(m)]
  assert all(t.device == t.action.cell % k for t in timed)
  slots = [(t.device, t.start) for t in timed]
  assert len(slots) == len(set(slots))
  clock = {(t.action.kind, t.action.cell, t.action.micro): t.start for t in timed}
  F, B = ActionKind.F, ActionKind.B
  for c in range(cells):
    for b in range(m):
      assert clock[(B, c, b)] > clock[(F, c, b)]
      if c:
        assert clock[(F, c, b)] > clock[(F, c - 1, b)]
      if c + 1 < cells:
        assert clock[(B, c, b)] > clock[(B, c + 1, b)]


def test_a_zero_bubble_table_shows_i_and_w():
  """ZB-H1 K=2 M=2, the backwards split into I and W, each a clock: the
  last device defers its W's behind its I's, which the first device's
  I's wait for."""
  assert schedule.ClockTable(schedule.Actions(KIND.ZB_H1, 2, 2)) == '\n'.join([
      'clock   0  1  2  3  4  5  6',
      'dev 0  F0 F1  . I0 W0 I1 W1',
      'dev 1   . F0 I0 F1 I1 W0 W1'])


@pytest.mark.parametrize('k,m', [(1, 4), (2, 3), (3, 4), (4, 8), (4, 2), (8, 32)])
def test_one_f_one_b_in_flight_bounded_by_k_minus_k(k, m):
  """1F1B: cell c holds at most K-c micro-batches (min M); GPipe all M;
  both have fill-drain's bubble."""
  def ActivationPeaks(kind):
    sim = simulate.Simulate(schedule.Actions(kind, k, m), simulate.UNIT_COSTS)
    return [a for a, _ in sim.CellPeaks(k)]

  assert ActivationPeaks(KIND.ONE_F_ONE_B) == [min(k - c, m) for c in range(k)]
  assert ActivationPeaks(KIND.GPIPE) == [m] * k
  for kind in (KIND.ONE_F_ONE_B, KIND.GPIPE):
    assert schedule.Bubble(schedule.Actions(kind, k, m)) == pytest.approx(
        schedule.BubbleFraction(k, m))


@pytest.mark.parametrize('k,m,v', [(2, 4, 2), (4, 8, 2), (4, 8, 3), (4, 16, 2), (8, 32, 2)])
def test_interleaved_bubble_divided_by_about_v(k, m, v):
  bubble = schedule.Bubble(schedule.Actions(KIND.INTERLEAVED, k, m, v))
  assert bubble == pytest.approx((k - 1) / (v * m + k - 1))
  assert bubble < schedule.BubbleFraction(k, m)


@pytest.mark.parametrize('k,m,v', [(2, 3, 2), (3, 4, 2), (3, 5, 3), (4, 6, 2)])
def test_interleaved_takes_any_m(k, m, v):
  """M not a multiple of K: rounds of near-equal size, the same bubble
  from M = K on; below, a device waits for micro-batches (more)."""
  bubble = schedule.Bubble(schedule.Actions(KIND.INTERLEAVED, k, m, v))
  assert bubble == pytest.approx((k - 1) / (v * m + k - 1))
  assert schedule.Bubble(schedule.Actions(KIND.INTERLEAVED, k, k - 1, v)) > (
      (k - 1) / (v * (k - 1) + k - 1))


@pytest.mark.parametrize('kind,k,m,v,match', [
    (KIND.ONE_F_ONE_B, 2, 4, 2, 'ONE_F_ONE_B runs 1 cell.s. per device, got '
                                'cells_per_device=2'),
    (KIND.INTERLEAVED, 2, 4, 0, 'cells_per_device=0'),
    (KIND.INTERLEAVED, 2, 4, 1, r'of 2 or more, got 1 \(v=1 is ONE_F_ONE_B\)'),
    (KIND.ONE_F_ONE_B, 0, 4, 1, 'num_devices=0, num_micro_batches=4'),
])
def test_bad_shapes_raise(kind, k, m, v, match):
  with pytest.raises(ValueError, match=match):
    schedule.Actions(kind, k, m, v)


@pytest.mark.parametrize('k,m', [(2, 4), (4, 8), (4, 4)])
def test_zb_h1_bubble_is_a_third_of_one_f_one_bs(k, m):
  """With F = I = W each device of ZB-H1 idles K-1 units of a step of
  3M + K - 1, where 1F1B idles 3(K-1) of 3(M + K - 1)."""
  assert schedule.Bubble(schedule.Actions(KIND.ZB_H1, k, m)) == pytest.approx(
      (k - 1) / (3 * m + k - 1))
