"""schedule_sim's rows against the known formulas, and the table docs/schedules.md quotes."""

import pathlib

import pytest

from benchmarks import schedule_sim

ROOT = pathlib.Path(__file__).resolve().parents[2]
ALL = ['fill_drain', 'one_f_one_b', 'interleaved', 'zb_h1', 'zb_h2', 'zb_v']


def test_rows_follow_the_formulas():
  k = 4
  for m in (8, 16):
    rows = {r['schedule']: r for r in schedule_sim.Rows(ALL, k, [m])}
    assert rows['fill_drain']['bubble_fraction'] == pytest.approx((k - 1) / (m + k - 1))
    assert rows['one_f_one_b']['bubble_fraction'] == pytest.approx((k - 1) / (m + k - 1))
    assert rows['interleaved']['bubble_fraction'] == pytest.approx((k - 1) / (2 * m + k - 1))
    assert rows['zb_h1']['bubble_fraction'] == pytest.approx((k - 1) / (3 * m + k - 1))
    assert rows['zb_h2']['span_bubble_fraction'] == 0.0
    assert rows['zb_h2']['step_time'] == 3 * m + k - 1
    assert rows['zb_v']['span_bubble_fraction'] == 0.0
    assert rows['zb_v']['step_time'] == 3 * m + (k - 1) / 2
    assert [rows[s]['peak_held_devices'] for s in ALL] == [m, k, 5.5, k, 2 * k - 1, k]


def test_device_costs_split_over_cells():
  costs = schedule_sim.DeviceCosts(2, forward=3, backward_input=2, backward_weight=1)
  assert (costs.forward, costs.backward_input, costs.backward_weight, costs.backward) == (
      1.5, 1.0, 0.5, None)


def test_docs_quote_the_current_table():
  table = schedule_sim.Markdown(schedule_sim.Rows(ALL, 4, [8, 16]))
  assert table in (ROOT / 'docs' / 'schedules.md').read_text(), (
      'docs/schedules.md is stale: paste the output of python -m '
      'benchmarks.schedule_sim --k=4 --m=8,16 --format=markdown')
