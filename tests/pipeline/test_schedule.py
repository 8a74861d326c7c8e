"""Tests of the pure schedule generators, by literal equality."""

import pytest

from lingvo_pipe.pipeline import schedule
from lingvo_pipe.pipeline.schedule import Phase, ScheduleKind


def _Grid(cycles):
  """(cell, micro_batch) pairs per clock cycle."""
  return [[(t.cell, t.micro_batch) for t in cycle] for cycle in cycles]


def test_forward_fill_k3_m4():
  assert _Grid(schedule.ForwardClockCycles(3, 4)) == [
      [(0, 0)],
      [(0, 1), (1, 0)],
      [(0, 2), (1, 1), (2, 0)],
      [(0, 3), (1, 2), (2, 1)],
      [(1, 3), (2, 2)],
      [(2, 3)],
  ]


def test_backward_drain_k3_m4():
  assert _Grid(schedule.BackwardClockCycles(3, 4)) == [
      [(2, 3)],
      [(2, 2), (1, 3)],
      [(2, 1), (1, 2), (0, 3)],
      [(2, 0), (1, 1), (0, 2)],
      [(1, 0), (0, 1)],
      [(0, 0)],
  ]


def test_single_cell_is_sequential():
  assert _Grid(schedule.ForwardClockCycles(1, 3)) == [[(0, 0)], [(0, 1)], [(0, 2)]]
  assert _Grid(schedule.BackwardClockCycles(1, 3)) == [[(0, 2)], [(0, 1)], [(0, 0)]]


def test_schedule_flattens_cycles_in_order():
  tasks = schedule.Schedule(ScheduleKind.GPIPE, 2, 2, Phase.FORWARD)
  assert [(t.clock, t.cell, t.micro_batch) for t in tasks] == [
      (0, 0, 0), (1, 0, 1), (1, 1, 0), (2, 1, 1)]
  assert all(t.phase == Phase.FORWARD for t in tasks)


@pytest.mark.parametrize('k,m', [(1, 1), (2, 3), (4, 8), (8, 16)])
def test_every_task_exactly_once_and_dependencies_hold(k, m):
  fwd = schedule.Schedule(ScheduleKind.GPIPE, k, m, Phase.FORWARD)
  bwd = schedule.Schedule(ScheduleKind.GPIPE, k, m, Phase.BACKWARD)
  for tasks in (fwd, bwd):
    assert sorted((t.cell, t.micro_batch) for t in tasks) == [
        (c, b) for c in range(k) for b in range(m)]
  clock = {(t.cell, t.micro_batch): t.clock for t in fwd}
  for c in range(1, k):
    for b in range(m):
      assert clock[(c, b)] > clock[(c - 1, b)]
  clock = {(t.cell, t.micro_batch): t.clock for t in bwd}
  for c in range(k - 1):
    for b in range(m):
      assert clock[(c, b)] > clock[(c + 1, b)]
  assert max(t.clock for t in fwd) == m + k - 2


def test_bubble_fraction():
  assert schedule.BubbleFraction(4, 4) == pytest.approx(3 / 7)
  assert schedule.BubbleFraction(1, 8) == 0.0


@pytest.mark.parametrize('k,m', [(0, 4), (2, 0), (-1, 3)])
def test_bad_sizes_raise(k, m):
  with pytest.raises(ValueError, match=f'num_cells={k}, num_micro_batches={m}'):
    list(schedule.ForwardClockCycles(k, m))
