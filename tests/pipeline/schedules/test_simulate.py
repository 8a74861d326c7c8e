"""The simulator against the known figures: 1F1B's and interleaved's bubbles, ZB-H1's third, ZB-V's zero."""

import pytest

from lingvo_pipe.pipeline.schedules import actions
from lingvo_pipe.pipeline.schedules import built_in
from lingvo_pipe.pipeline.schedules import schedule_text
from lingvo_pipe.pipeline.schedules import simulate

ScheduleKind = built_in.ScheduleKind
EQUAL_F_B = simulate.Costs(forward=1, backward=1)  # a B takes one clock, as an F
EQUAL_F_I_W = simulate.Costs()  # F = I = W = 1, B = I + W = 2


def _Simulate(kind, k, m, v=None, costs=EQUAL_F_I_W, **kwargs):
  return simulate.Simulate(built_in.Build(kind, k, m, v), costs, **kwargs)


_KM = [(k, m) for k in (1, 2, 3, 4, 8) for m in (1, 2, 3, 4, 5, 8, 16)]


@pytest.mark.parametrize('k,m', _KM)
def test_fill_drain_and_1f1b_bubble_is_k_minus_1_over_m_plus_k_minus_1(k, m):
  for kind in (ScheduleKind.FILL_DRAIN, ScheduleKind.ONE_F_ONE_B):
    for costs in (EQUAL_F_B, EQUAL_F_I_W):
      sim = _Simulate(kind, k, m, costs=costs)
      assert sim.bubble_fraction == pytest.approx((k - 1) / (m + k - 1))
      # (K-1)(F+B) of idle on every device.
      assert sim.idle == pytest.approx([(k - 1) * (1 + costs.Of(actions.Backward(0, 0)))] * k)


@pytest.mark.parametrize('k,m,v', [(2, 4, 2), (4, 8, 2), (4, 8, 3), (4, 16, 2), (3, 6, 2)])
def test_interleaved_bubble_is_k_minus_1_over_vm_plus_k_minus_1(k, m, v):
  sim = _Simulate(ScheduleKind.INTERLEAVED, k, m, v, costs=EQUAL_F_B)
  assert sim.bubble_fraction == pytest.approx((k - 1) / (v * m + k - 1))


@pytest.mark.parametrize('k,m', [(k, m) for k in (2, 3, 4, 8) for m in (k, 2 * k, 16)])
def test_zb_h1_idles_a_third_of_1f1b_with_f_equal_i_equal_w(k, m):
  """Qi et al.: 1F1B idles (K-1)(F+I+W), ZB-H1 (K-1)(F+I-W)."""
  zb = _Simulate(ScheduleKind.ZB_H1, k, m)
  one_f = _Simulate(ScheduleKind.ONE_F_ONE_B, k, m)
  assert one_f.idle == pytest.approx([3 * (k - 1)] * k)
  assert zb.idle == pytest.approx([k - 1] * k)
  assert zb.bubble_fraction == pytest.approx((k - 1) / (3 * m + k - 1))
  assert zb.step_time == one_f.step_time - 2 * (k - 1)


@pytest.mark.parametrize('f,i,w', [(2, 1.5, 1), (1, 2, 1), (1, 1, 0.5), (2, 2, 1), (1, 1, 2)])
def test_zb_h1_idle_with_unequal_costs(f, i, w):
  """(K-1)(F+I-W), but never below (K-1)F: the last device waits that long
  for its first forward."""
  costs = simulate.Costs(forward=f, backward_input=i, backward_weight=w)
  for k, m in ((2, 4), (4, 8), (4, 16)):
    sim = _Simulate(ScheduleKind.ZB_H1, k, m, costs=costs)
    assert sim.idle == pytest.approx([(k - 1) * max(f, f + i - w)] * k)


@pytest.mark.parametrize('k,m', [(2, 3), (2, 8), (3, 5), (4, 7), (4, 8), (4, 16), (6, 11)])
def test_zb_h2_has_no_bubble_within_each_device_span_at_twice_the_memory(k, m):
  """A parallelogram: with M >= 2K-1 no device idles between its first and
  last action; in the step each waits (K-1)F for its first forward, as
  under ZB-H1; it holds 2K-1 micro-batches (the paper's (2p-1) M_B)."""
  sim = _Simulate(ScheduleKind.ZB_H2, k, m)
  assert sim.span_bubble_fraction == 0.0
  assert sim.idle == pytest.approx([k - 1] * k)
  assert max(sim.peak_held) == 2 * k - 1


@pytest.mark.parametrize('k,m', [(2, 3), (2, 8), (3, 5), (4, 7), (4, 8), (4, 16)])
def test_zb_v_has_no_bubble_within_each_device_span(k, m):
  """With M >= 2K-1 and F = I = W per cell, no device idles between its first
  and its last action; in the step each idles only while its first forward
  arrives, K-1 cell-clocks."""
  sim = _Simulate(ScheduleKind.ZB_V, k, m)
  assert sim.span_bubble_fraction == 0.0
  assert sim.idle == pytest.approx([k - 1] * k)


@pytest.mark.parametrize('k,m', [(1, 4), (2, 3), (3, 4), (4, 2), (4, 8), (8, 32)])
def test_peaks_of_1f1b_and_zb_h1(k, m):
  """1F1B holds min(K-d, M) on device d; ZB-H1 holds as many activations
  (F until I) on every device, and counting the W's inputs it holds K at
  most, 1F1B's peak."""
  one_f = _Simulate(ScheduleKind.ONE_F_ONE_B, k, m)
  zb = _Simulate(ScheduleKind.ZB_H1, k, m)
  assert one_f.peak_activations == tuple(min(k - d, m) for d in range(k))
  assert zb.peak_activations == one_f.peak_activations
  assert max(zb.peak_held) == max(one_f.peak_held) == min(k, m)
  assert _Simulate(ScheduleKind.FILL_DRAIN, k, m).peak_held == (m,) * k


@pytest.mark.parametrize('k,m', [(2, 4), (4, 8), (4, 16)])
def test_zb_v_holds_1f1b_memory_in_half_cells(k, m):
  """2K cells of half a device's layers each: 2K of them is K devices' worth."""
  sim = _Simulate(ScheduleKind.ZB_V, k, m)
  assert sim.peak_held == (2 * k,) * k


def test_live_over_time_frees_before_it_allocates_at_equal_times():
  sim = _Simulate(ScheduleKind.ZB_H1, 1, 2)
  assert sim.live == (((0.0, 1, 0), (2.0, 0, 1), (3.0, 0, 0), (3.0, 1, 0),
                       (5.0, 0, 1), (6.0, 0, 0)),)


def test_transfer_latency_and_per_cell_costs():
  """K=2, M=2 fill-drain, cell 1 twice as slow, a transfer costs 0.5."""
  costs = simulate.Costs(forward=[1, 2], backward=[1, 2])
  sim = simulate.Simulate(built_in.Build(ScheduleKind.FILL_DRAIN, 2, 2), costs, 0.5)
  starts = [[(str(t.action), t.start, t.end) for t in row] for row in sim.timeline]
  assert starts == [
      [('0F0', 0.0, 1.0), ('0F1', 1.0, 2.0), ('0B1', 8.0, 9.0), ('0B0', 10.0, 11.0)],
      [('1F0', 1.5, 3.5), ('1F1', 3.5, 5.5), ('1B1', 5.5, 7.5), ('1B0', 7.5, 9.5)]]
  assert sim.step_time == 11.0
  assert sim.busy == (4.0, 8.0)


def test_devices_that_share_cores_slow_each_other_while_both_are_busy():
  """K=2, M=2 fill-drain, F = B = 1 (8 of work): on separate machines
  (M + K - 1) * (F + B) = 6; on one core's worth of compute all 8; on
  1.5 the two devices run at 0.75 each while both are busy (0F1 with 1F0,
  0B1 with 1B0), so each such pair takes 2 / 1.5 where it took 1."""
  fill_drain = built_in.Build(ScheduleKind.FILL_DRAIN, 2, 2)
  assert simulate.Simulate(fill_drain, EQUAL_F_B).step_time == 6.0
  assert simulate.Simulate(fill_drain, EQUAL_F_B, concurrency=2.0).step_time == 6.0
  assert simulate.Simulate(fill_drain, EQUAL_F_B, concurrency=1.0).step_time == 8.0
  shared = simulate.Simulate(fill_drain, EQUAL_F_B, concurrency=1.5)
  ends = [[(str(t.action), t.end) for t in row] for row in shared.timeline]
  assert ends == [[('0F0', 1.0), ('0F1', pytest.approx(7 / 3)), ('0B1', pytest.approx(17 / 3)),
                   ('0B0', pytest.approx(20 / 3))],
                  [('1F0', pytest.approx(7 / 3)), ('1F1', pytest.approx(10 / 3)),
                   ('1B1', pytest.approx(13 / 3)), ('1B0', pytest.approx(17 / 3))]]
  assert shared.step_time == pytest.approx(20 / 3)
  with pytest.raises(ValueError, match=r'concurrency must be > 0 .* got 0'):
    simulate.Simulate(fill_drain, EQUAL_F_B, concurrency=0)


def test_reduce_actions_take_their_time_on_their_device():
  s = actions.WithReduce(built_in.Build(ScheduleKind.ONE_F_ONE_B, 2, 2))
  assert schedule_text.Format(s) == (
      '0F0,0F1,0B0,0B1,0REDUCE_GRAD\n1F0,1B0,1F1,1B1,1REDUCE_GRAD\n')
  plain = simulate.Simulate(s, EQUAL_F_B)
  slow = simulate.Simulate(s, simulate.Costs(forward=1, backward=1, reduce=3))
  assert slow.step_time == plain.step_time + 3


def test_clock_table_of_1f1b_k3_m4():
  table = simulate.ClockTable(_Simulate(ScheduleKind.ONE_F_ONE_B, 3, 4, costs=EQUAL_F_B))
  assert table == '\n'.join([
      'clock    0   1   2   3   4   5   6   7   8   9  10  11',
      'dev 0  0F0 0F1 0F2   .   . 0B0 0F3 0B1   . 0B2   . 0B3',
      'dev 1    . 1F0 1F1   . 1B0 1F2 1B1 1F3 1B2   . 1B3   .',
      'dev 2    .   . 2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3   .   .'])


def test_a_deadlock_raises_the_validators_message():
  deadlocked = schedule_text.Parse('0F0,0B0,0F1,0B1\n1F0,1F1,1B0,1B1\n')
  with pytest.raises(ValueError, match=r'device 0 position 1: 0B0: can never run.*deadlock'):
    simulate.Simulate(deadlocked)


def test_per_cell_costs_need_one_entry_per_cell():
  with pytest.raises(ValueError, match='Costs.forward has 3 entries but the schedule has 2 cells'):
    simulate.Simulate(built_in.Build(ScheduleKind.FILL_DRAIN, 2, 2), simulate.Costs(forward=[1, 1, 1]))


def test_clock_table_needs_whole_clocks():
  sim = _Simulate(ScheduleKind.FILL_DRAIN, 2, 2, costs=simulate.Costs(forward=0.5))
  with pytest.raises(ValueError, match='whole-clock times; 0F0 runs from 0.0 to 0.5'):
    simulate.ClockTable(sim)
