"""The one lowering (program.Lower): what each step keeps, recomputes and reduces, pinned per schedule and emission."""

import dataclasses

import pytest

from lingvo_pipe.pipeline.lowering import program
from lingvo_pipe.pipeline.lowering.remat import RematPolicy
from lingvo_pipe.pipeline.schedules import actions
from lingvo_pipe.pipeline.schedules import schedule
from lingvo_pipe.pipeline.schedules.built_in import ScheduleKind

NONE, PER_CELL, PER_LAYER = RematPolicy.NONE, RematPolicy.PER_CELL, RematPolicy.PER_LAYER
UNROLLED, LOOP = program.Emission.UNROLLED, program.Emission.LOOP
INSIDE = program.Step.LOSS_INSIDE
T, F = True, False

# K=2 devices, M=4, two replicas, the loss inside: per cell what each
# micro-batch's backward recomputes (0: its forward is kept on a tape; 1:
# the cell again), which cells split their backwards into I and W, and
# where each cell's REDUCE runs: unrolled, right after the action named on
# its device; in a loop, after the loops in the order given.
_PINNED = {
    ('GPIPE', NONE, UNROLLED): (('0000', '0000'), '--', ('0B0', '1B0')),
    ('GPIPE', NONE, LOOP): (('1111', '1110'), '--', (1, 0)),
    ('GPIPE', PER_CELL, UNROLLED): (('1110', '1110'), '--', ('0B0', '1B0')),
    ('GPIPE', PER_CELL, LOOP): (('1111', '1110'), '--', (1, 0)),
    ('ONE_F_ONE_B', NONE, UNROLLED): (('0000', '0000'), '--', ('0B3', '1B3')),
    ('ONE_F_ONE_B', NONE, LOOP): (('1111', '0000'), '--', (1, 0)),
    ('ONE_F_ONE_B', PER_CELL, UNROLLED): (('1111', '0000'), '--', ('0B3', '1B3')),
    ('ONE_F_ONE_B', PER_CELL, LOOP): (('1111', '0000'), '--', (1, 0)),
    ('INTERLEAVED', NONE, UNROLLED): (('0000',) * 4, '----', ('0B3', '1B3', '2B3', '3B3')),
    ('INTERLEAVED', NONE, LOOP): (('1111',) * 3 + ('0000',), '----', (3, 2, 1, 0)),
    ('INTERLEAVED', PER_CELL, UNROLLED): (('1111',) * 3 + ('0000',), '----',
                                          ('0B3', '1B3', '2B3', '3B3')),
    ('INTERLEAVED', PER_CELL, LOOP): (('1111',) * 3 + ('0000',), '----', (3, 2, 1, 0)),
    ('ZB_H1', NONE, UNROLLED): (('0000', '0000'), 'ss', ('0W3', '1W3')),
    ('ZB_H1', NONE, LOOP): (('1111', '0000'), '--', (1, 0)),
    ('ZB_H1', PER_CELL, UNROLLED): (('1111', '0000'), 'ss', ('0W3', '1W3')),
    ('ZB_H1', PER_CELL, LOOP): (('1111', '0000'), 'ss', (1, 0)),
    ('ZB_H2', NONE, UNROLLED): (('0000', '0000'), 'ss', ('0W3', '1W3')),
    ('ZB_H2', NONE, LOOP): (('1111', '0000'), '--', (1, 0)),
    ('ZB_H2', PER_CELL, UNROLLED): (('1111', '0000'), 'ss', ('0W3', '1W3')),
    ('ZB_H2', PER_CELL, LOOP): (('1111', '0000'), 'ss', (1, 0)),
    ('ZB_V', NONE, UNROLLED): (('0000',) * 4, 'ssss', ('0W3', '1W3', '2W3', '3W3')),
    ('ZB_V', NONE, LOOP): (('1111',) * 3 + ('0000',), '----', (3, 2, 1, 0)),
    ('ZB_V', PER_CELL, UNROLLED): (('1111',) * 3 + ('0000',), 'ssss',
                                   ('0W3', '1W3', '2W3', '3W3')),
    ('ZB_V', PER_CELL, LOOP): (('1111',) * 3 + ('0000',), 'ssss', (3, 2, 1, 0)),
}


def _Schedule(name, k=2, m=4):
  kind = ScheduleKind[name]
  return schedule.Actions(kind, k, m, 2 if kind == ScheduleKind.INTERLEAVED else 1)


@pytest.mark.parametrize('name,policy,emission', list(_PINNED))
def test_what_each_step_keeps_recomputes_and_reduces(name, policy, emission):
  """Fill-drain keeps each cell's last micro-batch under PER_CELL
  (torchgpipe's except_last), the others the last cell's; NONE keeps every
  forward unrolled, in a loop only the last cell's kept ones (no tape
  crosses its iterations), and defers no weight gradient there."""
  s = _Schedule(name)
  step = program.Lower(s, policy, False, 2, INSIDE, emission)
  recompute, split, reduces = _PINNED[(name, policy, emission)]
  assert tuple(''.join(str(step.RecomputeUnits(c, m)) for m in range(4))
               for c in range(s.num_cells)) == recompute
  assert ''.join('s' if step.Splits(c) else '-' for c in range(s.num_cells)) == split
  assert step.kept == {(c, m) for c in range(s.num_cells) for m in range(4)
                       if recompute[c][m] == '0'}
  if emission == LOOP:
    assert step.reduces == reduces
    assert all(a.kind != actions.ActionKind.REDUCE for a in step.order[:-len(reduces)])
    return
  for c, after in enumerate(reduces):
    at = step.order.index(actions.Reduce(c))
    on_device = [a for a in step.order[:at] if a.kind != actions.ActionKind.REDUCE
                 and s.cell_devices[a.cell] == s.cell_devices[c]]
    assert str(on_device[-1]) == after, (c, step.order)


@pytest.mark.parametrize('name', [k.name for k in ScheduleKind])
@pytest.mark.parametrize('policy', list(RematPolicy))
@pytest.mark.parametrize('k,m', [(2, 2), (2, 4), (4, 8)])
def test_the_emissions_agree_but_where_a_loop_cannot_keep(name, policy, k, m):
  """The loop keeps a subset of what the unrolled step keeps (the last
  cell's); every other forward has the same decision in both but the
  ones only the unrolled step keeps, and under NONE, where the loop
  defers no weight gradient; a W of the loop multiplies its own
  micro-batch."""
  s = _Schedule(name, k, m)
  unrolled = program.Lower(s, policy, False, 1, INSIDE, UNROLLED)
  loop = program.Lower(s, policy, False, 1, INSIDE, LOOP)
  assert loop.kept <= unrolled.kept
  assert {c for c, _ in loop.kept} <= {s.num_cells - 1}
  for key, decision in unrolled.decisions.items():
    if policy == NONE:
      assert loop.decisions[key].record == (key in loop.kept) and not loop.decisions[key].defer
    elif key in unrolled.kept - loop.kept:
      assert not loop.decisions[key].record
    else:
      assert loop.decisions[key] == decision, key
  assert set(loop.weight_runs) == set(unrolled.weight_runs)
  assert all(loop.weight_runs[(c, mb)] == (mb,) for c, mb in loop.weight_runs)
  assert [a for a in loop.order if a.kind != actions.ActionKind.REDUCE] == [
      a for a in unrolled.order if a.kind != actions.ActionKind.REDUCE]


# A loop step at M=4: (policy, remat_last_micro_batch, the schedule splits)
# -> the decision of the last cell's kept forwards (None: none kept) and of
# every other forward: (record, inline, per_layer, defer, split).
_LOOP_DECISIONS = {
    (NONE, F, F): ((T, T, F, F, F), (F, F, F, F, F)),
    (NONE, F, T): ((T, T, F, F, F), (F, F, F, F, F)),
    (NONE, T, F): ((T, T, F, F, F), (F, F, F, F, F)),
    (PER_CELL, F, F): ((T, T, F, T, F), (F, F, F, T, F)),
    (PER_CELL, F, T): ((T, T, F, T, T), (F, F, F, T, T)),
    (PER_CELL, T, F): (None, (F, F, F, T, F)),
    (PER_CELL, T, T): (None, (F, F, F, T, T)),
    (PER_LAYER, F, F): (None, (F, F, T, F, F)),
    (PER_LAYER, F, T): (None, (F, F, T, F, F)),
}


@pytest.mark.parametrize('case', list(_LOOP_DECISIONS))
def test_a_loop_recomputes_all_but_the_last_cell_s_kept_forwards(case):
  """1F1B (B's) or ZB-H1 (I's and W's), K=2: the last cell's forwards are
  kept where the policy keeps a forward its backward follows; every other
  is recomputed, under NONE too, and defers (and splits) only under
  PER_CELL."""
  policy, remat_last, splits = case
  s = _Schedule('ZB_H1' if splits else 'ONE_F_ONE_B')
  step = program.Lower(s, policy, remat_last, 1, INSIDE, LOOP)
  kept, other = _LOOP_DECISIONS[case]
  assert [dataclasses.astuple(d) for d in step.loop_backwards] == [other, other]
  assert dataclasses.astuple(step.decisions[(0, 2)]) == other
  assert dataclasses.astuple(step.decisions[(1, 2)]) == (kept or other)
  assert step.kept == ({(1, m) for m in range(4)} if kept else set())


def test_only_the_loss_inside_keeps_in_a_loop():
  """With the loss outside, the last cell's backward waits for the outer
  tape: a loop keeps nothing; unrolled, what its schedule keeps."""
  s = _Schedule('GPIPE')
  outside = program.Step.LOSS_OUTSIDE
  assert not program.Lower(s, PER_CELL, False, 1, outside, LOOP).kept
  assert program.Lower(s, PER_CELL, False, 1, outside, UNROLLED).kept == {(0, 3), (1, 3)}


def test_kept_forwards_are_those_their_backward_follows():
  """K=3, M=4 under PER_CELL: fill-drain keeps each cell's last
  micro-batch; 1F1B every micro-batch of the last cell, none of the
  others; remat_last_micro_batch keeps none."""
  def Kept(name, remat_last=False):
    return program.Lower(_Schedule(name, 3, 4), PER_CELL, remat_last, 1, INSIDE, UNROLLED).kept

  assert Kept('GPIPE') == {(0, 3), (1, 3), (2, 3)}
  assert Kept('ONE_F_ONE_B') == {(2, 0), (2, 1), (2, 2), (2, 3)}
  assert not Kept('ONE_F_ONE_B', remat_last=True)


def test_evaluation_runs_the_forwards_alone():
  step = program.Lower(_Schedule('ZB_H1'), PER_CELL, False, 2, program.Step.EVALUATION,
                       UNROLLED)
  assert {a.kind for a in step.order} == {actions.ActionKind.F}
  assert {a.kind for _, _, a in step.schedule.Positions()} == {actions.ActionKind.F}
  assert not step.decisions and not step.weight_runs and not step.reduces


def test_weight_runs_group_a_cells_adjacent_ws_on_a_device():
  """Unrolled, runs end at another kind or another cell's W: device 0
  runs 2W0 and 2W1 as one product, then 0W0 and 0W1, then 2W2 and 0W2
  alone (cells 0 and 2 on device 0, cell 1 on device 1)."""
  Fw, B, I, W = actions.Forward, actions.Backward, actions.InputGrad, actions.WeightGrad
  s = actions.Schedule.Make(
      [[Fw(0, m) for m in range(3)] + [Fw(2, m) for m in range(3)] +
       [I(2, 0), I(2, 1), W(2, 0), W(2, 1), I(0, 0), I(0, 1), W(0, 0), W(0, 1),
        I(2, 2), W(2, 2), I(0, 2), W(0, 2)],
       [Fw(1, m) for m in range(3)] + [B(1, m) for m in range(3)]])
  step = program.Lower(s, PER_CELL, False, 1, INSIDE, UNROLLED)
  assert step.weight_runs == {(2, 0): (0, 1), (2, 1): (), (0, 0): (0, 1), (0, 1): (),
                              (2, 2): (2,), (0, 2): (2,)}


def test_emission_from_m():
  assert program.EmissionOf(0, 64) == UNROLLED
  assert program.EmissionOf(8, 4) == UNROLLED
  assert program.EmissionOf(8, 8) == LOOP
  assert program.EmissionOf(1, 1) == UNROLLED  # one micro-batch: as small unrolled


def test_a_bad_policy_is_refused():
  with pytest.raises(TypeError, match="policy must be a RematPolicy, got 'none'"):
    program.Lower(_Schedule('GPIPE'), 'none', False, 1, INSIDE, UNROLLED)


def test_per_cell_answers_of_the_program():
  """1F1B at K=2, M=2 under PER_CELL, unrolled: the last cell keeps both
  forwards (its backward follows each), the first keeps only its last;
  every backward defers to one product per step and none splits. ZB-H1
  splits its backwards into W's, so it does not defer them to the step's
  end."""
  one_f_one_b = program.Lower(schedule.Actions(ScheduleKind.ONE_F_ONE_B, 2, 2),
                              RematPolicy.PER_CELL, False, 1, program.Step.LOSS_INSIDE,
                              program.Emission.UNROLLED)
  assert [one_f_one_b.KeepsAll(c) for c in (0, 1)] == [False, True]
  assert [one_f_one_b.DefersToStepEnd(c) for c in (0, 1)] == [True, True]
  assert not one_f_one_b.Splits(0) and len(one_f_one_b.CellDecisions(0)) == 2
  zb = program.Lower(schedule.Actions(ScheduleKind.ZB_H1, 2, 2), RematPolicy.PER_CELL,
                     False, 1, program.Step.LOSS_INSIDE, program.Emission.UNROLLED)
  assert zb.Splits(0) and not zb.DefersToStepEnd(0)
