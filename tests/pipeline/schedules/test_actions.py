"""The Action type, Schedule.Make's defaults, the dependency rule, WithReduce and split cells."""

import pytest

from lingvo_pipe.pipeline.schedules import actions

F, B, I, W = actions.Forward, actions.Backward, actions.InputGrad, actions.WeightGrad


def test_action_text_is_pytorchs_notation():
  assert [str(a) for a in (F(0, 0), I(1, 0), W(1, 0), B(2, 3), actions.Reduce(4))] == [
      '0F0', '1I0', '1W0', '2B3', '4REDUCE_GRAD']


@pytest.mark.parametrize('make,match', [
    (lambda: actions.Action(actions.ActionKind.F, -1, 0), 'cell must be >= 0, got -1'),
    (lambda: actions.Action(actions.ActionKind.F, 0), 'F needs a micro-batch >= 0, got None'),
    (lambda: actions.Action(actions.ActionKind.W, 0, -2), 'W needs a micro-batch >= 0, got -2'),
    (lambda: actions.Action(actions.ActionKind.REDUCE, 0, 1), 'micro_batch=1, pass None'),
    (lambda: actions.Action('F', 0, 0), 'must be an ActionKind'),
])
def test_bad_actions_raise(make, match):
  with pytest.raises((ValueError, TypeError), match=match):
    make()


def test_make_infers_placement_and_micro_batches():
  s = actions.Schedule.Make([[F(0, 0), F(2, 0), B(2, 0), B(0, 0)], [F(1, 0), B(1, 0)]])
  assert s.cell_devices == (0, 1, 0)
  assert (s.num_devices, s.num_cells, s.num_micro_batches) == (2, 3, 1)
  assert s.Find(B(2, 0)) == (0, 2) and s.Find(W(2, 0)) is None
  assert list(s.Positions())[:2] == [(0, 0, F(0, 0)), (0, 1, F(2, 0))]


def test_make_refuses_gaps_and_empty_schedules():
  with pytest.raises(ValueError, match=r'cells \[1\] have no action'):
    actions.Schedule.Make([[F(0, 0), F(2, 0)]])
  with pytest.raises(ValueError, match='needs at least one action'):
    actions.Schedule.Make([[], []])


def test_inputs_follow_the_dependency_rule():
  split = actions.Schedule.Make([[F(0, 0), I(0, 0), W(0, 0)], [F(1, 0), I(1, 0), W(1, 0)]])
  assert split.Inputs(F(0, 0)) == []
  assert split.Inputs(F(1, 0)) == [F(0, 0)]
  assert split.Inputs(I(1, 0)) == [F(1, 0)]  # the last cell's loss is in its F
  assert split.Inputs(I(0, 0)) == [F(0, 0), I(1, 0)]
  assert split.Inputs(W(0, 0)) == [I(0, 0)]
  full = actions.Schedule.Make([[F(0, 0), B(0, 0)], [F(1, 0), B(1, 0)]])
  assert full.Inputs(B(0, 0)) == [F(0, 0), B(1, 0)]
  assert full.Inputs(actions.Reduce(1)) == [B(1, 0)]
  assert split.Inputs(actions.Reduce(0)) == [W(0, 0)]


def test_micro_batch_inputs_need_no_schedule():
  assert actions.MicroBatchInputs(I(0, 3), 2) == [F(0, 3), I(1, 3)]
  assert actions.MicroBatchInputs(B(0, 3), 2, actions.ActionKind.B) == [F(0, 3), B(1, 3)]
  with pytest.raises(ValueError, match='0REDUCE_GRAD reads every micro-batch'):
    actions.MicroBatchInputs(actions.Reduce(0), 2)


def test_with_reduce_follows_each_cells_last_weight_gradient():
  s = actions.Schedule.Make([[F(0, 0), F(2, 0), I(2, 0), W(2, 0), I(0, 0), W(0, 0)],
                             [F(1, 0), B(1, 0)]])
  assert [[str(a) for a in row] for row in actions.WithReduce(s).devices] == [
      ['0F0', '2F0', '2I0', '2W0', '2REDUCE_GRAD', '0I0', '0W0', '0REDUCE_GRAD'],
      ['1F0', '1B0', '1REDUCE_GRAD']]


def test_check_sizes():
  actions.CheckSizes(1, 1, 1)
  with pytest.raises(ValueError,
                     match='got num_devices=2, num_micro_batches=0, cells_per_device=1'):
    actions.CheckSizes(2, 0)


def test_split_cells_are_those_that_run_input_gradients():
  """Cell 0 splits its backwards into I and W, cell 1 does not: the one
  answer the lowering and the loop tables both read."""
  f, b, i, w = actions.Forward, actions.Backward, actions.InputGrad, actions.WeightGrad
  schedule = actions.Schedule.Make([[f(0, 0), i(0, 0), w(0, 0)], [f(1, 0), b(1, 0)]], [0, 1])
  assert schedule.split_cells == (True, False)
