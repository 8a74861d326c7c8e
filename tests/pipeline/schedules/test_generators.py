"""The schedule generators by literal equality and validity over a grid."""

import pytest

from lingvo_pipe.pipeline.schedules import actions
from lingvo_pipe.pipeline.schedules import built_in
from lingvo_pipe.pipeline.schedules import fill_drain
from lingvo_pipe.pipeline.schedules import interleaved
from lingvo_pipe.pipeline.schedules import one_f_one_b
from lingvo_pipe.pipeline.schedules import validate
from lingvo_pipe.pipeline.schedules import zero_bubble

ScheduleKind = built_in.ScheduleKind


def _Rows(s: actions.Schedule):
  """Per device its actions in text form, space-separated."""
  return [' '.join(str(a) for a in row) for row in s.devices]


def test_fill_drain_k2_m3():
  s = fill_drain.FillDrain(2, 3)
  assert _Rows(s) == ['0F0 0F1 0F2 0B2 0B1 0B0',
                      '1F0 1F1 1F2 1B2 1B1 1B0']
  assert s.cell_devices == (0, 1) and s.num_micro_batches == 3


def test_one_f_one_b_k3_m4():
  assert _Rows(one_f_one_b.OneFOneB(3, 4)) == [
      '0F0 0F1 0F2 0B0 0F3 0B1 0B2 0B3',
      '1F0 1F1 1B0 1F2 1B1 1F3 1B2 1B3',
      '2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3']


def test_one_f_one_b_fewer_micro_batches_than_devices():
  assert _Rows(one_f_one_b.OneFOneB(4, 2)) == [
      '0F0 0F1 0B0 0B1', '1F0 1F1 1B0 1B1', '2F0 2F1 2B0 2B1', '3F0 3B0 3F1 3B1']


def test_interleaved_k2_m4_v2():
  s = interleaved.Interleaved(2, 4, 2)
  assert _Rows(s) == [
      '0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3',
      '1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3']
  assert s.cell_devices == (0, 1, 0, 1)


def test_interleaved_m_not_a_multiple_of_k_runs_one_larger_round():
  """K=3, M=4: one round of 4 micro-batches, warm-up 2(K-d-1) + (v-1)4."""
  assert interleaved.Rounds(3, 4) == [range(0, 4)]
  assert interleaved.Rounds(4, 10) == [range(0, 5), range(5, 10)]
  assert interleaved.Rounds(4, 9) == [range(0, 5), range(5, 9)]
  assert _Rows(interleaved.Interleaved(3, 4, 2)) == [
      '0F0 0F1 0F2 0F3 3F0 3F1 3F2 3F3 3B0 3B1 3B2 3B3 0B0 0B1 0B2 0B3',
      '1F0 1F1 1F2 1F3 4F0 4F1 4F2 4B0 4F3 4B1 4B2 4B3 1B0 1B1 1B2 1B3',
      '2F0 2F1 2F2 2F3 5F0 5B0 5F1 5B1 5F2 5B2 5F3 5B3 2B0 2B1 2B2 2B3']


def test_zb_h1_k3_m4():
  """Device d defers its first d W's; the cool-down alternates I and W."""
  assert _Rows(zero_bubble.ZeroBubbleH1(3, 4)) == [
      '0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3',
      '1F0 1F1 1I0 1F2 1I1 1W0 1F3 1I2 1W1 1I3 1W2 1W3',
      '2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2W2 2W3']


def test_zb_h1_fewer_micro_batches_than_devices():
  assert _Rows(zero_bubble.ZeroBubbleH1(4, 2)) == [
      '0F0 0F1 0I0 0W0 0I1 0W1', '1F0 1F1 1I0 1W0 1I1 1W1',
      '2F0 2F1 2I0 2I1 2W0 2W1', '3F0 3I0 3F1 3I1 3W0 3W1']


def test_zb_h2_k3_m5():
  """Warm-up of 2K-1-2d forwards, then I first, F while under 2K-1 held, W."""
  assert _Rows(zero_bubble.ZeroBubbleH2(3, 5)) == [
      '0F0 0F1 0F2 0F3 0F4 0I0 0W0 0I1 0W1 0I2 0W2 0I3 0W3 0I4 0W4',
      '1F0 1F1 1F2 1I0 1F3 1I1 1F4 1I2 1W0 1I3 1W1 1I4 1W2 1W3 1W4',
      '2F0 2I0 2F1 2I1 2F2 2I2 2F3 2I3 2F4 2I4 2W0 2W1 2W2 2W3 2W4']


def test_zb_h2_fewer_micro_batches_than_devices():
  assert _Rows(zero_bubble.ZeroBubbleH2(4, 2)) == [
      '0F0 0F1 0I0 0W0 0I1 0W1', '1F0 1F1 1I0 1W0 1I1 1W1',
      '2F0 2F1 2I0 2W0 2I1 2W1', '3F0 3I0 3F1 3I1 3W0 3W1']


def test_zb_v_k2_m4():
  s = zero_bubble.ZeroBubbleV(2, 4)
  assert s.cell_devices == (0, 1, 1, 0)
  assert _Rows(s) == [
      '0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 '
      '3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 0I2 0W2 0I3 0W3',
      '1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 '
      '1F3 1I1 1W1 2F3 2I2 2W2 1I2 2I3 1I3 1W2 2W3 1W3']


def test_zb_v_fewer_micro_batches_than_planned_drops_the_missing_ones():
  """Planned for 2K-1 = 3 micro-batches; micro-batch 2's actions are left out."""
  assert _Rows(zero_bubble.ZeroBubbleV(2, 2)) == [
      '0F0 0F1 3F0 3I0 3W0 3F1 3I1 3W1 0I0 0W0 0I1 0W1',
      '1F0 2F0 1F1 2F1 2I0 2W0 1I0 1W0 2I1 2W1 1I1 1W1']


_GRID = [(kind, k, m, v) for kind in ScheduleKind for k in (1, 2, 3, 4)
         for m in range(1, 10)
         for v in ((2, 3) if kind == ScheduleKind.INTERLEAVED else (None,))]


@pytest.mark.parametrize('kind,k,m,v', _GRID)
def test_every_generator_passes_the_validator(kind, k, m, v):
  s = built_in.Build(kind, k, m, v)
  validate.Validate(s)
  cells = k * built_in.CellsPerDevice(kind, v)
  assert s.num_devices == k and s.num_cells == cells and s.num_micro_batches == m
  assert sorted(s.cell_devices) == sorted(list(range(k)) * (cells // k))


@pytest.mark.parametrize('call,match', [
    (lambda: fill_drain.FillDrain(0, 4), 'num_devices=0'),
    (lambda: one_f_one_b.OneFOneB(2, 0), 'num_micro_batches=0'),
    (lambda: interleaved.Interleaved(2, 4, 0), 'cells_per_device=0'),
    (lambda: zero_bubble.ZeroBubbleV(-1, 4), 'num_devices=-1'),
    (lambda: built_in.Build(ScheduleKind.ZB_V, 2, 4, 3), 'ZB_V runs 2 cell'),
    (lambda: built_in.Build(ScheduleKind.ONE_F_ONE_B, 2, 4, 2), 'use INTERLEAVED'),
    (lambda: built_in.Build(ScheduleKind.INTERLEAVED, 2, 4), 'needs cells_per_device'),
    (lambda: built_in.Build('zb_h1', 2, 4), 'must be a ScheduleKind'),
])
def test_bad_sizes_raise_naming_the_value(call, match):
  with pytest.raises((ValueError, TypeError), match=match):
    call()
