"""Tests of inspect_model's text: the cell table and the planner's table."""

import re

import pytest

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.layers import linear
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.lowering.remat import RematPolicy
from lingvo_pipe.pipeline.schedules import schedule
from trainer import inspection


class _EverySchedule:
  """A pipeline owner that trains every schedule (FPropWithLoss for all)."""
  PIPELINE_SCHEDULES = tuple(schedule.ScheduleKind)


def _Task(num_partitions=2, num_micro_batches=4, owner=_EverySchedule, **kwargs):
  layers = [linear.ProjectionLayer.Params().Set(name=f'p{i}', input_dim=64, output_dim=64)
            for i in range(4)]
  task = hyperparams.InstantiableParams(owner)
  task.Define('pipeline', gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, num_partitions=num_partitions,
      num_micro_batches=num_micro_batches, **{'input_shapes': [[32, 64]], **kwargs}), '')
  return task


def _PlannerRows(text):
  """(marked, K, M, remat, schedule/v) of each row of the planner's table."""
  return [(m[1] == '*', m[2], m[4], m[5], f'{m[6]}/{m[3]}') for m in re.finditer(
      r'^([* ]) +(\d+) +(\d+) +(\d+) (NONE|PER_CELL|PER_LAYER) +(\S+) ', text, re.M)]


def test_model_plan_prints_candidates_around_the_configuration():
  text = inspection.ModelPlan(_Task())
  assert 'K=2 cells, M=4 micro-batches' in text
  assert 'budget 1024 MiB per device' in text
  assert 'K=2 cells, M=4 micro-batches, remat PER_CELL, schedule GPIPE' in text
  assert 'training step: unrolled at M=4; a loop per device from M=32' in text
  rows = _PlannerRows(text)
  # Fill-drain, 1F1B, ZB-H1 and ZB-H2: K in {1, 2, 4}; interleaved and
  # ZB-V, two cells a device of the four layers: K=2 (K=1 would be one
  # device); every M and remat.
  assert len(rows) == 4 * 3 * 3 * 3 + 2 * 1 * 3 * 3
  # Schedules are named as an override takes them, v beside.
  for name, ks in (('GPIPE/1', '124'), ('ONE_F_ONE_B/1', '124'), ('INTERLEAVED/2', '2'),
                   ('ZB_H1/1', '124'), ('ZB_H2/1', '124'), ('ZB_V/2', '2')):
    assert {(k, m) for _, k, m, _, s in rows if s == name} == {
        (k, m) for k in ks for m in ('2', '4', '8')}
  assert {r[3] for r in rows} == {'NONE', 'PER_CELL', 'PER_LAYER'}
  assert [r[0] for r in rows].count(True) == 1


@pytest.mark.parametrize('kwargs,emission', [
    (dict(num_micro_batches=128, input_shapes=[[128, 64]]),
     'a loop per device at M=128; a loop per device from M=32'),
    (dict(loop_min_micro_batches=0), 'unrolled at every M'),
    (dict(remat=RematPolicy.NONE), 'unrolled at every M'),
])
def test_model_plan_says_how_the_training_step_runs(kwargs, emission):
  assert f'training step: {emission} (loop_min_micro_batches)' in inspection.ModelPlan(
      _Task(**kwargs))


def test_the_planner_weighs_only_the_schedules_the_owner_trains():
  """An owner that declares no PIPELINE_SCHEDULES calls FProp: GPIPE only."""
  rows = _PlannerRows(inspection.ModelPlan(_Task(owner=object)))
  assert {r[4] for r in rows} == {'GPIPE/1'} and len(rows) == 3 * 3 * 3


def test_model_plan_budget_and_slots():
  text = inspection.ModelPlan(_Task(), budget_bytes=1000, optimizer_slots=2)
  assert 'none fits' in text and 'No candidate fits the budget' in text
  assert '2 optimizer slot(s)' in text


def test_model_plan_micro_batch_size():
  text = inspection.ModelPlan(_Task(num_micro_batches=1, micro_batch_size=4))
  ms = {r[2] for r in _PlannerRows(text)}
  assert ms == {'4', '8', '16'}


def _Times(text):
  """The time column of the planner's table, by (K, M, remat, schedule)."""
  return {(m[1], m[2], m[3], m[4]): float(m[5]) for m in re.finditer(
      r'^[* ] +(\d+) +\d+ +(\d+) (NONE|PER_CELL|PER_LAYER) +(\S+) .* ([\d.]+)  (?:yes|no)$',
      text, re.M)}


def test_model_plan_reads_remat_last_micro_batch():
  """Recomputing the last micro-batch too makes fill-drain's PER_CELL
  slower against the other policies, whose rows do not change. (Under the
  other schedules the first cell keeps no micro-batch, and the micro-batches
  the last cell keeps need not be on the critical path.)"""
  kept = _Times(inspection.ModelPlan(_Task()))
  recomputed = _Times(inspection.ModelPlan(_Task(remat_last_micro_batch=True)))
  assert kept.keys() == recomputed.keys() and len(kept) == 126
  for key in kept:
    if key[2] == 'PER_CELL' and key[3] == 'GPIPE':
      assert recomputed[key] > kept[key], key
    elif key[2] == 'PER_CELL':
      assert recomputed[key] >= kept[key], key
    else:
      assert recomputed[key] == kept[key], key
