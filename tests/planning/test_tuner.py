"""The tuner: its step prediction against hand-computed simulator figures,
its search against the budget, its override pasted back, and one real
tuning of a small stack on two devices."""

import dataclasses

import pytest
import tensorflow as tf

from lingvo_pipe.core.layers import linear
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.lowering import program
from lingvo_pipe.pipeline.lowering.remat import RematPolicy
from lingvo_pipe.pipeline.schedules import schedule
from lingvo_pipe.pipeline.schedules.schedule import ScheduleKind
from lingvo_pipe.planning import calibration
from lingvo_pipe.planning import candidates
from lingvo_pipe.planning import measured_costs
from lingvo_pipe.planning import overheads
from lingvo_pipe.planning import step_prediction
from lingvo_pipe.planning import trial
from lingvo_pipe.planning import tuner

UNIT = measured_costs.LayerCost(1.0, 1.0, 1.0)


def _Program(kind, k, m, remat=RematPolicy.NONE, v=1):
  return program.Lower(schedule.Actions(kind, k, m, v), remat, False, 1,
                       program.Step.LOSS_INSIDE, program.Emission.UNROLLED)


def test_prediction_simulates_the_devices_sharing_cores():
  """K=2, M=4 fill-drain, F = I = W = 1 a cell: on separate machines
  the step is (M + K - 1) * (F + B) = 5 * 3 = 15, and at a concurrency of
  2 too; at 1 all 24 of work run one at a time; at 1.5 only what the
  schedule runs on both devices at once slows down: three forwards and
  three backwards a device (18 of work) take 18 / 1.5, the other 6 alone."""
  step = _Program(ScheduleKind.GPIPE, 2, 4)
  predicted = {c: step_prediction.Predict(step, [UNIT, UNIT], c) for c in (1.0, 1.5, 2.0)}
  assert {c: (p.critical, p.shared, p.seconds) for c, p in predicted.items()} == {
      1.0: (15.0, 24.0, 24.0), 1.5: (15.0, 18.0, 18.0), 2.0: (15.0, 15.0, 15.0)}
  # 0.5 s more per action and 1 s per step: (1.5 + 2.5) * 5 + 1 apart;
  # at 1.5, 8 alone and 24 at once (6 F of 1.5, 6 B of 2.5): 8 + 24 / 1.5 + 1.
  extra = overheads.Overheads(step_s=1.0, action_s=0.5, loop_action_s=9.0)
  padded = step_prediction.Predict(step, [UNIT, UNIT], 1.5, extra)
  assert (padded.critical, padded.shared) == (21.0, 25.0)


def test_recomputation_and_split_backwards_cost_what_the_program_says():
  """PER_CELL at M=1 keeps the only micro-batch (nothing recomputed);
  at M=2 the first is recomputed (one more F); a zero-bubble schedule's
  I and W add up to the B of fill-drain; deferred weight gradients cost
  one product over the whole batch."""
  one = step_prediction.Predict(_Program(ScheduleKind.GPIPE, 1, 1, RematPolicy.PER_CELL),
                                [UNIT], 1.0)
  assert one.seconds == 3.0
  two = step_prediction.Predict(_Program(ScheduleKind.GPIPE, 1, 2, RematPolicy.PER_CELL),
                                [UNIT], 1.0)
  assert two.seconds == 7.0
  # PER_CELL at M=2 defers the weight gradients to one product over the
  # whole batch, in the last backward: F F, I, I + F again, W once (0.5 at
  # the whole batch, given; else M = 2 micro-batches' worth, as above).
  deferred = measured_costs.LayerCost(0.0, 0.0, 0.5)
  assert step_prediction.Predict(_Program(ScheduleKind.GPIPE, 1, 2, RematPolicy.PER_CELL),
                                 [UNIT], 1.0, deferred=[deferred]).seconds == 5.5
  # A quarter of the weights deferred (DeferringCosts): each backward makes
  # the other 3/4 of W (0.75) and the second adds them (0.75 of 0.5), the
  # deferred quarter's product at the whole batch is 0.25 of 2.
  adds = measured_costs.LayerCost(1.0, 1.0, 1.0, accumulate_s=0.5)
  deferring, deferred_part = step_prediction.DeferringCosts(
      [adds], [measured_costs.LayerCost(3.0, 3.0, 2.0)], [0.25])
  assert step_prediction.Predict(_Program(ScheduleKind.GPIPE, 1, 2, RematPolicy.PER_CELL),
                                 [adds], 1.0, deferring=deferring,
                                 deferred=deferred_part).seconds == (
                                     5.0 + 2 * 0.75 + 0.75 * 0.5 + 0.25 * 2)
  zero_bubble = step_prediction.Predict(_Program(ScheduleKind.ZB_H1, 2, 4), [UNIT, UNIT], 1.0)
  assert zero_bubble.shared == 24.0


def test_each_backward_but_a_cells_first_adds_into_its_accumulators():
  """Adding a cell's weight gradients costs 0.5: fill-drain at M=2 on one
  device adds once (F F B B+0.5); ZB-H1 at K=2 M=4 three times a cell,
  in its W actions; PER_CELL at M=2 defers them (no add: as without)."""
  adds = measured_costs.LayerCost(1.0, 1.0, 1.0, accumulate_s=0.5)
  assert step_prediction.Predict(_Program(ScheduleKind.GPIPE, 1, 2), [adds], 1.0).seconds == 6.5
  zero_bubble = _Program(ScheduleKind.ZB_H1, 2, 4)
  assert step_prediction.Predict(zero_bubble, [adds, adds], 1.0).shared == 24.0 + 6 * 0.5
  assert step_prediction.Predict(_Program(ScheduleKind.GPIPE, 1, 2, RematPolicy.PER_CELL),
                                 [adds], 1.0).seconds == 7.0


def test_cell_costs_sum_the_layers_of_each_cell():
  costs = [measured_costs.LayerCost(i, 2 * i, 3 * i, accumulate_s=i) for i in (1.0, 2.0, 3.0)]
  assert step_prediction.CellCosts(costs, [1]) == [
      measured_costs.LayerCost(1.0, 2.0, 3.0, accumulate_s=1.0),
      measured_costs.LayerCost(5.0, 10.0, 15.0, accumulate_s=5.0)]


def _Stack(num_layers=4, dim=64, batch=16):
  layers = [linear.ProjectionLayer.Params().Set(name=f'p{i}', input_dim=dim, output_dim=dim)
            for i in range(num_layers)]
  return gpipe.PipeliningLayer.Params().Set(name='pipe', layers=layers,
                                            input_shapes=[[batch, dim]]), [batch, dim]


def _Each(trial_of):
  """Trials (calibration.Trials) of a function of one candidate."""
  return lambda chosen: [trial_of(c) for c in chosen]


def _Measured(pipeline, space, per_micro=lambda m: 1.0 / m, concurrency=1.5):
  """Every layer costing per_micro(M) for each of F, I and W."""
  counts = tuner.MicroBatchCounts(pipeline, space)
  costs = {m: [measured_costs.LayerCost(*[per_micro(m)] * 3)] * len(pipeline.layers)
           for m in counts}
  return candidates.Measurements(costs, concurrency={(d, r): concurrency
                                                     for d in (2, 4) for r in RematPolicy})


def test_search_splits_where_the_step_balances_with_its_recomputed_forwards():
  """Four forward-only layers (F = 3) then four of F = I = W = 1: alike
  alone, so 4 + 4 without remat; fill-drain at K=2 M=4 with per-cell
  remat runs 3 of 4 forwards again (21 against 15 a layer): 3 + 5."""
  pipeline, _ = _Stack(num_layers=8)
  space = tuner.Space(schedules=[(ScheduleKind.GPIPE, 1)], devices=(2,), micro_batches=(4,),
                      remats=[RematPolicy.NONE, RematPolicy.PER_CELL])
  layers = ([measured_costs.LayerCost(3.0, 0.0, 0.0)] * 4 +
            [measured_costs.LayerCost(1.0, 1.0, 1.0)] * 4)
  rows = tuner.Search(pipeline, candidates.Measurements({4: layers}), 1 << 40, space)
  assert {r.candidate.remat: r.candidate.splits for r in rows} == {
      RematPolicy.NONE: (4,), RematPolicy.PER_CELL: (3,)}


def test_search_keeps_the_budget_ranks_by_prediction_and_counts_each_step_once():
  pipeline, _ = _Stack()
  space = tuner.Space(micro_batches=(1, 2, 4))
  measured = _Measured(pipeline, space)
  everything = tuner.Search(pipeline, measured, 1 << 40, space)
  single = max(r.peak_bytes for r in everything if r.candidate.num_devices == 1)
  budget = single - 1
  rows = tuner.Search(pipeline, measured, budget, space)
  assert {r.fits for r in rows} == {True, False}
  assert all((r.peak_bytes <= budget) == r.fits for r in rows)
  fitting = [round(r.predicted.seconds, 6) for r in rows if r.fits]  # Search's ties
  assert fitting == sorted(fitting) and not rows[-1].fits
  # One micro-batch on one device: every schedule runs fill-drain's step
  # (or splits its backward: the zero-bubble ones), so it appears twice
  # per remat policy; 1F1B differs from M=2 on (each backward follows
  # its forward).
  alone = [r.candidate for r in everything if r.candidate.num_devices == 1]
  assert {c.schedule_kind for c in alone if c.num_micro_batches == 1} == {
      ScheduleKind.GPIPE, ScheduleKind.ZB_H1}
  assert ScheduleKind.ONE_F_ONE_B in {c.schedule_kind for c in alone}
  assert all(c.splits == () for c in alone)
  # Balanced by the (equal) measured seconds: four layers in 2 or 4 cells.
  assert {r.candidate.splits for r in everything if r.candidate.num_devices *
          r.candidate.cells_per_device == 2} == {(2,)}


def test_the_table_shows_the_fastest_predicted_and_every_row_that_ran():
  """A pick predicted slower than the first `limit` rows (a calibration
  run that measured fastest) is shown and marked; what fits and is not
  shown, and what does not fit, are counted."""
  pipeline, _ = _Stack()
  space = tuner.Space(micro_batches=(1, 2, 4))
  measured = _Measured(pipeline, space)
  everything = tuner.Search(pipeline, measured, 1 << 40, space)
  budget = max(r.peak_bytes for r in everything if r.candidate.num_devices == 1) - 1
  rows = tuner.Search(pipeline, measured, budget, space)
  fitting = [r for r in rows if r.fits]
  pick = fitting[-1]
  pick.measured_s = 0.001
  lines = tuner.FormatTable(rows, pick, limit=2).splitlines()
  assert len(lines) == 1 + 3 + 2 and lines[3].startswith('*')
  assert lines[4] == f'  ({len(fitting) - 3} more candidates fit, predicted slower, not run)'
  assert lines[5] == f'  ({len(rows) - len(fitting)} more candidates do not fit the budget)'


def test_a_budget_nothing_fits_and_untunable_pipelines_are_named():
  pipeline, _ = _Stack()
  space = tuner.Space(micro_batches=(1, 2))
  rows = tuner.Search(pipeline, _Measured(pipeline, space), 1000, space)
  smallest = min(r.peak_bytes for r in rows) / 2**20
  with pytest.raises(ValueError, match=(
      rf'No layout fits 0.0 MiB per device: the smallest predicted peak is {smallest:.1f} '
      rf'MiB \(K=\d.*\)\. Give a budget of at least {smallest:.1f} MiB, or more devices')):
    tuner.CheckFits(rows, 1000)
  with pytest.raises(ValueError, match='memory budget must be > 0 bytes, got 0'):
    tuner.Search(pipeline, _Measured(pipeline, space), 0, space)
  manual = gpipe.PipeliningLayer.Params().Set(name='manual', cell_tpl=pipeline.layers[:2])
  with pytest.raises(ValueError, match=r"'manual': tuning needs p.layers and p.input_shapes"):
    tuner.Search(manual, _Measured(pipeline, space), 1 << 30, space)
  replicas = pipeline.Copy().Set(num_replicas=2)
  with pytest.raises(ValueError, match=r"'pipe' has num_replicas=2; the tuner lays out one"):
    tuner.Search(replicas, _Measured(pipeline, space), 1 << 30, space)


def test_a_one_device_candidate_measured_over_the_budget_does_not_fit():
  """Verify runs the fastest predicted fitting rows; a one-device row
  whose measured peak exceeds the budget (its device's own peak) drops
  out, and the next verified one is picked. On several logical devices
  the measured peak is all of theirs together: the prediction decides."""
  pipeline, _ = _Stack()
  space = tuner.Space(micro_batches=(1, 2), remats=[RematPolicy.NONE])
  rows = tuner.Search(pipeline, _Measured(pipeline, space), 1 << 40, space)
  rows.sort(key=lambda r: r.candidate.num_devices)  # as if one device were fastest
  budget = max(r.peak_bytes for r in rows)
  over = {r.candidate for r in rows if r.candidate.num_devices == 1}
  ran = []

  def Trial(candidate):
    ran.append(candidate)
    return 1.0 + len(ran), budget + 1 if candidate in over or candidate.num_devices > 1 else 0

  fitting = [r for r in rows if r.fits]
  assert fitting[0].candidate in over and fitting[1].candidate in over
  pick = tuner.Verify(rows, _Each(Trial), budget, top=2)
  assert pick.candidate.num_devices > 1 and pick.measured_peak_bytes == budget + 1
  assert [r.fits for r in fitting[:len(over)]] == [False] * len(over)
  # The one-device rows dropped out; two rows that still fit were verified.
  assert sum(r.fits and r.measured_s is not None for r in rows) == 2
  assert len(ran) == len(over) + 2
  with pytest.raises(ValueError, match=r'those predicted to fit measured more on one device'):
    tuner.Verify([r for r in rows if r.candidate in over], _Each(Trial), budget)


@pytest.mark.parametrize('first_measure_slow', [True, False])
def test_verify_runs_the_next_rows_while_one_not_run_is_predicted_faster(first_measure_slow):
  """Where every verified row measures slower than the next row's
  prediction, the predictions were wrong about them: the next `top` run
  (at most `more` times), and the pick is the fastest of all that ran.
  Where one measures as predicted, the rest are not run."""
  pipeline, _ = _Stack()
  space = tuner.Space(micro_batches=(1, 2, 4), remats=[RematPolicy.NONE])
  rows = tuner.Search(pipeline, _Measured(pipeline, space), 1 << 40, space)
  fitting = [r for r in rows if r.fits]
  assert len(fitting) >= 7
  ran = []

  def Trial(candidate):
    ran.append(candidate)
    row = next(r for r in fitting if r.candidate == candidate)
    slow = first_measure_slow and fitting.index(row) < 4
    return row.predicted.seconds * (3.0 if slow else 1.0), 0

  pick = tuner.Verify(rows, _Each(Trial), 1 << 40, top=2, more=2)
  if first_measure_slow:  # rows 0-3 slow: two rounds more, rows 4-5 the fastest measured
    assert sorted(map(str, ran)) == sorted(str(r.candidate) for r in fitting[:6])
    assert pick is fitting[4]
  else:
    assert sorted(map(str, ran)) == sorted(str(r.candidate) for r in fitting[:2])
    assert pick is fitting[0]


def test_a_concurrency_is_probed_at_the_largest_m_up_to_8_else_the_next_larger():
  """A step's trace and first call grow with M (the demo LM's M=16
  trials took twice as long as its M=8 ones)."""
  assert calibration._ConcurrencyProbeMs([16, 1, 8, 2, 4]) == [8, 4, 2, 1, 16]
  assert calibration._ConcurrencyProbeMs([32, 16]) == [16, 32]


def test_trials_run_the_fewest_micro_batches_first_then_the_most_down_to_the_next_fewest():
  """The first trace and the last first call run alone (trial.Timed): the
  two smallest steps go there; each result comes back to its candidate."""
  chosen = [candidates.Candidate(ScheduleKind.GPIPE, 1, 1, m, RematPolicy.NONE, ())
            for m in (4, 1, 16, 2, 8)]
  ran = []

  def Trials(order):
    ran.extend(c.num_micro_batches for c in order)
    return [(float(c.num_micro_batches), None) for c in order]

  assert calibration.Trialled(chosen, Trials) == [(4.0, None), (1.0, None), (16.0, None),
                                                  (2.0, None), (8.0, None)]
  assert ran == [1, 16, 8, 4, 2]
  assert calibration.Trialled([], Trials) == []


def test_calibration_scales_each_m_by_its_step_with_the_fewest_devices_that_fits():
  """Steps that run twice as long as their uncalibrated prediction: where
  an unpipelined step fits, each M's factor is 2 and each K's concurrency
  makes its probe's prediction its measured step; under a budget no
  one-device step fits, the M's factor comes from the step on the fewest
  devices that fits (its concurrency taken as 1), which then also gives
  that K's concurrency of 1. No trial runs twice."""
  pipeline, _ = _Stack()
  space = tuner.Space(micro_batches=(1, 2), remats=[RematPolicy.NONE])
  measured = candidates.Measurements(_Measured(pipeline, space).costs)
  single = min(r.peak_bytes for r in tuner.Search(pipeline, measured, 1 << 40, space)
               if r.candidate.num_devices == 1)
  for budget, fewest in ((1 << 40, 1), (single - 1, 2)):
    ran, calibrated, predicted = _Calibrated(pipeline, measured, budget, space,
                                             {RematPolicy.NONE: 2.0})
    assert calibrated.scale == pytest.approx({1: 2.0, 2: 2.0})
    assert min(c.num_devices for c in ran) == fewest
    for c in ran:
      again = candidates.Predict(c, candidates.Program(c, c.Apply(pipeline)), calibrated)
      assert again.seconds == pytest.approx(2 * predicted[c])


def test_an_m_is_scaled_by_a_step_without_remat_where_one_fits_on_more_devices():
  """Under a budget where at M=2 one device fits only per-cell remat, and
  two devices fit without it: M=2's factor is the two-device step's, not
  the remat step's (one-device remat steps ran 1.1-1.25x their
  prediction on ffn: that factor would have carried into every step
  without remat at M=2 and into two devices' concurrency)."""
  pipeline, _ = _Stack()
  space = tuner.Space(micro_batches=(2,), remats=[RematPolicy.NONE, RematPolicy.PER_CELL])
  measured = candidates.Measurements(_Measured(pipeline, space).costs)
  rows = tuner.Search(pipeline, measured, 1 << 40, space)
  budget = min(r.peak_bytes for r in rows
               if r.candidate.num_devices == 1 and r.candidate.remat == RematPolicy.PER_CELL)
  assert all(r.peak_bytes > budget for r in rows
             if r.candidate.num_devices == 1 and r.candidate.remat == RematPolicy.NONE)
  ran, calibrated, _ = _Calibrated(pipeline, measured, budget, space, {
      RematPolicy.NONE: 2.0, RematPolicy.PER_CELL: 2.0}, single=3.0)
  assert calibrated.scale == pytest.approx({2: 2.0})
  assert (1, RematPolicy.PER_CELL) not in {(c.num_devices, c.remat) for c in ran}
  assert calibrated.concurrency[2, RematPolicy.NONE] == pytest.approx(1.0)


def test_steps_with_and_without_remat_get_their_own_concurrency():
  """Pipelined steps under remat run 1.8x their uncalibrated prediction
  where the rest run 2x: one probe per device count without remat and
  one with it (per-cell, the least recomputing), each predicted as it
  ran; per-layer remat shares per-cell's, and a policy without a figure
  takes the least recomputing one's."""
  pipeline, _ = _Stack()
  space = tuner.Space(micro_batches=(1, 2), remats=list(RematPolicy))
  measured = candidates.Measurements(_Measured(pipeline, space).costs)
  ran, calibrated, predicted = _Calibrated(pipeline, measured, 1 << 40, space, {
      RematPolicy.NONE: 2.0, RematPolicy.PER_CELL: 1.8, RematPolicy.PER_LAYER: 1.8})
  assert set(calibrated.concurrency) == {(d, r) for d in (2, 4) for r in RematPolicy}
  for d in (2, 4):
    assert calibrated.concurrency[d, RematPolicy.PER_LAYER] == calibrated.concurrency[
        d, RematPolicy.PER_CELL] > calibrated.concurrency[d, RematPolicy.NONE]
  assert {(c.num_devices, c.remat) for c in ran if c.num_devices > 1} == {
      (d, r) for d in (2, 4) for r in (RematPolicy.NONE, RematPolicy.PER_CELL)}
  for c in ran:
    again = candidates.Predict(c, candidates.Program(c, c.Apply(pipeline)), calibrated).seconds
    factor = 1.8 if c.remat == RematPolicy.PER_CELL and c.num_devices > 1 else 2.0
    assert again == pytest.approx(factor * predicted[c])
  layer = dataclasses.replace(measured, concurrency={(2, RematPolicy.NONE): 1.5})
  assert candidates.Concurrency(layer, dataclasses.replace(
      ran[-1], num_devices=2, remat=RematPolicy.PER_LAYER)) == 1.5


def test_schedules_that_split_backwards_get_their_concurrency_from_a_probe_per_remat():
  """Zero-bubble steps at K > 1 run 1.6x their uncalibrated prediction
  without remat and 1.9x with it, where the rest run 2x and 1.8x: one
  ZB-H1 step on the devices and micro-batches of the largest K's probe
  without remat, and one of its probe with remat, is each predicted as it
  ran, and its concurrency over that probe's is the factor on every
  concurrency of a schedule that splits its backwards under that remat
  class."""
  pipeline, _ = _Stack()
  space = tuner.Space(micro_batches=(1, 2, 4), remats=[RematPolicy.NONE, RematPolicy.PER_CELL])
  measured = candidates.Measurements(_Measured(pipeline, space).costs)
  split = {RematPolicy.NONE: 1.6, RematPolicy.PER_CELL: 1.9}
  ran, calibrated, predicted = _Calibrated(
      pipeline, measured, 1 << 40, space,
      {RematPolicy.NONE: 2.0, RematPolicy.PER_CELL: 1.8}, split=split)
  zbs = [c for c in ran if c.schedule_kind in candidates.SPLIT_BACKWARD]
  assert sorted((c.schedule_kind, c.num_devices, c.num_micro_batches, c.remat.name)
                for c in zbs) == [(ScheduleKind.ZB_H1, 4, 4, 'NONE'),
                                  (ScheduleKind.ZB_H1, 4, 4, 'PER_CELL')]
  for zb in zbs:
    again = candidates.Predict(zb, candidates.Program(zb, zb.Apply(pipeline)), calibrated)
    assert again.seconds == pytest.approx(split[zb.remat] * predicted[zb])
  assert calibrated.split_backward > 1.0 > calibrated.split_backward_remat
  factors = {RematPolicy.NONE: calibrated.split_backward,
             RematPolicy.PER_CELL: calibrated.split_backward_remat}
  for c in predicted:
    if c.schedule_kind in candidates.SPLIT_BACKWARD and c.num_devices == 4:
      whole = calibrated.concurrency[4, c.remat]
      assert candidates.Concurrency(calibrated, c) == pytest.approx(
          min(max(whole * factors[c.remat], 1.0), 4.0))
  assert candidates.Concurrency(calibrated, dataclasses.replace(zbs[0], num_devices=1)) == 1.0


def _Calibrated(pipeline, measured, budget, space, factors, single=2.0, split=None):
  """calibration.Calibrate on trials that run factors[remat] x the
  uncalibrated prediction on several devices (split[remat] x for the
  zero-bubble schedules, if given; `single` x on one, but 2x without
  remat): (candidates run, each once; the calibrated measurements; the
  uncalibrated predictions)."""
  rows = tuner.Search(pipeline, measured, budget, space)
  predicted = {r.candidate: r.predicted.seconds for r in rows}
  ran = []

  def Trial(candidate):
    ran.append(candidate)
    if candidate.num_devices > 1 and split and candidate.schedule_kind in (
        candidates.SPLIT_BACKWARD):
      factor = split[candidate.remat]
    elif candidate.num_devices > 1:
      factor = factors[candidate.remat]
    else:
      factor = 2.0 if candidate.remat == RematPolicy.NONE else single
    return factor * predicted[candidate], None

  calibrated = calibration.Calibrate(pipeline, measured, rows, _Each(Trial))
  assert len(ran) == len(set(ran))
  return ran, calibrated, predicted


def test_a_candidate_builds_the_cells_its_splits_name():
  pipeline, _ = _Stack(num_layers=5)
  candidate = candidates.Candidate(ScheduleKind.INTERLEAVED, 2, 2, 4, RematPolicy.PER_CELL,
                                   (1, 2, 4))
  pipe = candidate.Apply(pipeline).Instantiate()
  assert pipe.CellLayerIndices() == [[0], [1], [2, 3], [4]]
  assert candidate.Override('task.pipe') == (
      'task.pipe.num_partitions=4; task.pipe.num_micro_batches=4; '
      'task.pipe.micro_batch_size=0; task.pipe.remat=PER_CELL; '
      'task.pipe.schedule=INTERLEAVED; task.pipe.cells_per_device=2; '
      'task.pipe.splits=[1, 2, 4]')


def test_tune_measures_predicts_and_runs_the_fastest_that_fit():
  """Four 256-wide projections on 64 rows, two devices, a budget below
  the unpipelined step's peak: the pick fits and is the fastest of the
  rows that ran."""
  pipeline, shape = _Stack(dim=256, batch=64)
  x = [tf.random.stateless_normal(shape, [1, 2])]
  space = tuner.Space(schedules=[(ScheduleKind.GPIPE, 1), (ScheduleKind.ONE_F_ONE_B, 1)],
                      devices=(1, 2), micro_batches=(1, 4), remats=[RematPolicy.NONE])
  devices = [d.name for d in tf.config.list_logical_devices('CPU')[:2]]
  ran = []

  def Trials(chosen):
    ran.extend(chosen)
    return trial.Run([c.Apply(pipeline) for c in chosen], x)

  held = trial.GRADIENTS_HELD
  unpipelined = tuner.Search(pipeline, tuner.Measure(pipeline, x, space, devices, 1),
                             1 << 40, space, gradients_held=held)
  budget = min(r.peak_bytes for r in unpipelined if r.candidate.num_devices == 1) - 1
  tuned = tuner.Tune(pipeline, x, budget, devices, Trials, space, verify=2, repeats=1,
                     gradients_held=held)
  rows, pick = tuned.rows, tuned.pick
  # Calibration ran, for each M, the step on two devices (one device does
  # not fit): fill-drain at M=1 (1F1B's step there is the same, and one
  # row stands for both), then 1F1B at M=4 if it fits (the split of the
  # measured seconds is 2 + 2 layers unless the machine is busy), which is
  # also the concurrency's probe; verification the two fastest predicted
  # that fit (one, if only one does), unless they ran already.
  fits_at_4 = any(r.fits and r.candidate.num_devices == 2 and r.candidate.num_micro_batches == 4
                  and r.candidate.schedule_kind == ScheduleKind.ONE_F_ONE_B for r in rows)
  probes = ran[:1 + fits_at_4]
  assert [(c.num_devices, c.num_micro_batches) for c in probes] == [(2, 1), (2, 4)][:len(probes)]
  assert probes[-1].schedule_kind == (ScheduleKind.ONE_F_ONE_B if fits_at_4 else
                                      ScheduleKind.GPIPE)
  verified = [r for r in rows if r.measured_s is not None]
  fastest = [r.candidate for r in rows if r.fits][:2]
  assert {r.candidate for r in verified} == set(ran) and len(ran) == len(set(ran))
  assert len(ran) <= len(probes) + len(fastest)
  assert all(r.fits for r in verified) and set(fastest) <= set(ran)
  assert pick.peak_bytes <= budget and pick.candidate.num_devices == 2
  assert pick.measured_s == min(r.measured_s for r in verified)
  phases = tuned.phases
  assert (phases.calibration_trials, phases.verification_trials) == (len(probes),
                                                                     len(ran) - len(probes))
  assert phases.measure_s > 0 and phases.calibration_s > 0 and phases.verification_s >= 0
  marked = [l for l in tuner.FormatTable(rows, pick).splitlines() if l.startswith('*')]
  assert len(marked) == 1 and str(pick.candidate.splits[0]) in marked[0]
