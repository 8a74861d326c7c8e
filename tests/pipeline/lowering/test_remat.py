"""remat.Decide against its table, written out case by case."""

import dataclasses

import pytest

from lingvo_pipe.core import import_path
from lingvo_pipe.pipeline.lowering import remat
from lingvo_pipe.pipeline.lowering.remat import RematPolicy

NONE, PER_CELL, PER_LAYER = RematPolicy.NONE, RematPolicy.PER_CELL, RematPolicy.PER_LAYER
T, F = True, False

# (policy, remat_last_micro_batch, m, M): (record, inline, per_layer, defer)
_TABLE = {
    (NONE, F, 0, 1): (T, T, F, F),
    (NONE, F, 0, 2): (T, T, F, F),
    (NONE, F, 1, 2): (T, T, F, F),
    (NONE, F, 0, 3): (T, T, F, F),
    (NONE, F, 1, 3): (T, T, F, F),
    (NONE, F, 2, 3): (T, T, F, F),
    (NONE, T, 0, 1): (T, T, F, F),
    (NONE, T, 0, 2): (T, T, F, F),
    (NONE, T, 1, 2): (T, T, F, F),
    (NONE, T, 0, 3): (T, T, F, F),
    (NONE, T, 1, 3): (T, T, F, F),
    (NONE, T, 2, 3): (T, T, F, F),
    (PER_CELL, F, 0, 1): (T, T, F, F),
    (PER_CELL, F, 0, 2): (F, F, F, T),
    (PER_CELL, F, 1, 2): (T, T, F, T),
    (PER_CELL, F, 0, 3): (F, F, F, T),
    (PER_CELL, F, 1, 3): (F, F, F, T),
    (PER_CELL, F, 2, 3): (T, T, F, T),
    (PER_CELL, T, 0, 1): (F, F, F, F),
    (PER_CELL, T, 0, 2): (F, F, F, T),
    (PER_CELL, T, 1, 2): (F, F, F, T),
    (PER_CELL, T, 0, 3): (F, F, F, T),
    (PER_CELL, T, 1, 3): (F, F, F, T),
    (PER_CELL, T, 2, 3): (F, F, F, T),
    (PER_LAYER, F, 0, 1): (F, F, T, F),
    (PER_LAYER, F, 0, 2): (F, F, T, F),
    (PER_LAYER, F, 1, 2): (F, F, T, F),
    (PER_LAYER, F, 0, 3): (F, F, T, F),
    (PER_LAYER, F, 1, 3): (F, F, T, F),
    (PER_LAYER, F, 2, 3): (F, F, T, F),
    (PER_LAYER, T, 0, 1): (F, F, T, F),
    (PER_LAYER, T, 0, 2): (F, F, T, F),
    (PER_LAYER, T, 1, 2): (F, F, T, F),
    (PER_LAYER, T, 0, 3): (F, F, T, F),
    (PER_LAYER, T, 1, 3): (F, F, T, F),
    (PER_LAYER, T, 2, 3): (F, F, T, F),
}


def test_table_lists_every_case_up_to_three_micro_batches():
  assert set(_TABLE) == {(policy, last, m, num_micro)
                         for policy in RematPolicy for last in (F, T)
                         for num_micro in (1, 2, 3) for m in range(num_micro)}


@pytest.mark.parametrize('case', list(_TABLE))
def test_decide_matches_the_table(case):
  assert dataclasses.astuple(remat.Decide(*case)) == _TABLE[case] + (False,)  # never split


@pytest.mark.parametrize('case', list(_TABLE))
def test_a_split_backward_defers_everything_with_several_micro_batches_but_per_layer(case):
  """A backward the schedule splits into I and W: under NONE and PER_CELL
  with M > 1 it defers (and splits); else it stays the table's B."""
  policy, _, _, num_micro = case
  splits = num_micro > 1 and policy != PER_LAYER
  record, inline, per_layer, defer = _TABLE[case]
  assert dataclasses.astuple(remat.Decide(*case, split=True)) == (
      record, inline, per_layer, defer or splits, splits)


def test_bad_arguments():
  with pytest.raises(TypeError, match="policy must be a RematPolicy, got 'none'"):
    remat.Decide('none', False, 0, 1)
  with pytest.raises(ValueError, match=r'micro_batch \(2\) must be in .* = \[0, 2\)'):
    remat.Decide(NONE, False, 2, 2)
  with pytest.raises(ValueError, match='defers weight gradients only if inlined'):
    remat.Decision(record=T, inline=F, per_layer=F, defer=T)


def test_params_text_path_from_before_the_move_resolves():
  """Params text written while RematPolicy was in cell_runner, or in
  pipeline/remat.py before the folders, still loads."""
  for module in ('lingvo_pipe.core.cell_runner', 'lingvo_pipe.pipeline.cell_runner',
                 'lingvo_pipe.pipeline.remat'):
    assert import_path.ImportByPath(f'{module}.RematPolicy') is RematPolicy
