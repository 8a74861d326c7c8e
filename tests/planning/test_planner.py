"""Tests of the planner: its memory model by hand, monotonicity, the
recommendation, errors, and that it partitions like PipeliningLayer."""

import pytest

from lingvo_pipe.core import layer_meta
from lingvo_pipe.core.layers import linear
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.layout import cells as cells_lib
from lingvo_pipe.pipeline.layout import micro_batch
from lingvo_pipe.pipeline.layout import partition
from lingvo_pipe.pipeline.lowering import program
from lingvo_pipe.pipeline.lowering.remat import RematPolicy
from lingvo_pipe.pipeline.schedules import schedule
from lingvo_pipe.pipeline.schedules import simulate
from lingvo_pipe.pipeline.schedules.schedule import ScheduleKind
from lingvo_pipe.planning import choices
from lingvo_pipe.planning import memory_model
from lingvo_pipe.planning import planner

F32 = 4


def _Stack(dims):
  """ProjectionLayers dims[0] -> dims[1] -> ... (bias, no activation)."""
  return [linear.ProjectionLayer.Params().Set(name=f'p{i}', input_dim=a, output_dim=b)
          for i, (a, b) in enumerate(zip(dims, dims[1:]))]


# By hand, for a projection i -> o at batch b (fp32, bias, no activation):
# weights i*o + bias o; the forward produces x@w and x@w+b, 2*b*o elements;
# its input is b*i elements; 2*b*i*o + b*o FLOPs.
def _Params(i, o):
  return (i * o + o) * F32


def _Act(o, b):
  return 2 * b * o * F32


def _In(i, b):
  return b * i * F32


def _Flops(i, o, b):
  return 2 * b * i * o + b * o


@pytest.mark.parametrize('remat_last', [False, True])
@pytest.mark.parametrize('remat', list(RematPolicy))
@pytest.mark.parametrize('m', [1, 2, 4])
def test_memory_and_time_by_hand(remat, m, remat_last):
  d, n, k, slots = 8, 8, 2, 2  # 4 equal layers: cells of 2 layers each
  row = planner.Estimate(_Stack([d] * 5), [[n, d]], k, m, remat, optimizer_slots=slots,
                         remat_last_micro_batch=remat_last)
  mb = n // m
  params = 2 * _Params(d, d)
  update = 2 * _Params(d, d)  # two updates' temporaries: the two layers' params
  big = _Act(d, mb)
  act = {RematPolicy.NONE: 2 * _Act(d, n) + big,
         RematPolicy.PER_CELL: _In(d, n) + 2 * _Act(d, mb) + big,
         RematPolicy.PER_LAYER: _In(d, n) + 2 * _In(d, mb) + 2 * big}[remat]
  recompute = {RematPolicy.NONE: 0, RematPolicy.PER_CELL: 1, RematPolicy.PER_LAYER: 2}
  assert (row.num_cells, row.num_micro_batches, row.remat) == (k, m, remat)
  assert row.param_bytes == [params] * k
  # The gradients are held until the step's end: the updates run after
  # the activations are freed, their temporaries in place of them.
  assert row.state_bytes == [(1 + slots) * params] * k
  assert row.act_bytes == [max(act, update)] * k
  assert row.peak_bytes == [(2 + slots) * params + max(act, update)] * k
  assert row.total_peak_bytes == k * ((2 + slots) * params + max(act, update))
  assert row.shared_peak_bytes == k * (2 + slots) * params + max(act, update)
  assert row.bubble == pytest.approx((k - 1) / (m + k - 1))
  # Each cell keeps its last micro-batch (no recomputation) unless told
  # not to: on the critical path the first backward of the drain, or at
  # M=1 every cell's (F0 F1 B1 B0: both backwards kept).
  saved = (k if m == 1 else 1) if remat == RematPolicy.PER_CELL and not remat_last else 0
  assert row.relative_step_time == 2 * _Flops(d, d, mb) * (
      (3 + recompute[remat]) * (m + k - 1) - saved)


def test_one_layer_cell():
  """Stashed input at N, the layer's activations at N/M, its temporaries."""
  layers = _Stack([8, 8])
  alone = planner.Estimate(layers, [[8, 8]], 1, 4, RematPolicy.PER_CELL)
  assert alone.act_bytes == [_In(8, 8) + 2 * _Act(8, 2)]


def test_more_micro_batches_less_per_cell_activation():
  layers = _Stack([16] * 9)
  acts = [max(planner.Estimate(layers, [[32, 16]], 2, m, RematPolicy.PER_CELL).act_bytes)
          for m in (1, 2, 4, 8, 16)]
  assert acts == sorted(acts, reverse=True) and len(set(acts)) == len(acts)


def test_a_profile_made_once_predicts_what_estimate_makes_itself():
  """The tuner's Search makes the layers' memory profile once per M for
  all its candidates: given it, Estimate predicts the same, and it is
  what Estimate reads (another M's profile changes the activations)."""
  layers = _Stack([16] * 9)
  shapes = layer_meta.Shapes([32, 16])
  profiles = {m: memory_model.Profile(layers, shapes,
                                      micro_batch.Contract(0, ()).SplitShapes(shapes, m), m)
              for m in (1, 4)}
  for m, k, remat in ((1, 1, RematPolicy.NONE), (4, 4, RematPolicy.PER_CELL),
                      (4, 2, RematPolicy.NONE)):
    assert (planner.Estimate(layers, [[32, 16]], k, m, remat, profile=profiles[m]) ==
            planner.Estimate(layers, [[32, 16]], k, m, remat))
  assert (planner.Estimate(layers, [[32, 16]], 2, 4, RematPolicy.NONE,
                           profile=profiles[1]).act_bytes !=
          planner.Estimate(layers, [[32, 16]], 2, 4, RematPolicy.NONE).act_bytes)


@pytest.mark.parametrize('m', [2, 4, 8])
def test_remat_keeps_less_than_no_remat(m):
  layers = _Stack([16] * 9)
  none, per_cell, per_layer = (
      planner.Estimate(layers, [[32, 16]], 2, m, r) for r in
      (RematPolicy.NONE, RematPolicy.PER_CELL, RematPolicy.PER_LAYER))
  for a, b, c in zip(none.act_bytes, per_cell.act_bytes, per_layer.act_bytes):
    assert a > b >= c


def test_more_cells_fewer_params_per_device():
  layers = _Stack([16] * 9)
  per_device = [max(planner.Estimate(layers, [[32, 16]], k, 4, RematPolicy.PER_CELL).param_bytes)
                for k in (1, 2, 4, 8)]
  assert per_device == sorted(per_device, reverse=True) and len(set(per_device)) == 4
  assert sum(planner.Estimate(layers, [[32, 16]], 4, 4, RematPolicy.NONE).param_bytes) == (
      8 * _Params(16, 16))


@pytest.mark.parametrize('k', [1, 2, 3, 4])
def test_partition_matches_pipelining_layer(k):
  layers = _Stack([4, 32, 8, 64, 16, 2, 24])  # unequal layers
  p = gpipe.PipeliningLayer.Params().Set(name='pipe', layers=layers, num_partitions=k,
                                         input_shapes=[[8, 4]])
  cells = cells_lib.CellParams(p)
  expected = [sum(_Params(lp.input_dim, lp.output_dim) for lp in c.sub) for c in cells]
  row = planner.Estimate(layers, [[8, 4]], k, 2, RematPolicy.PER_CELL)
  assert row.param_bytes == expected


def test_plan_skips_impossible_and_marks_fits():
  layers = _Stack([8] * 4)
  rows = planner.Plan(layers, [[12, 8]], 10**9, cells=(1, 2, 8),
                      micro_batches=(1, 4, 5))
  assert {(r.num_cells, r.num_micro_batches) for r in rows} == {(1, 1), (1, 4), (2, 1), (2, 4)}
  assert len(rows) == 4 * len(RematPolicy) and all(r.fits for r in rows)


def test_recommend_is_the_fastest_that_fits():
  layers = _Stack([64] * 9)
  rows = planner.Plan(layers, [[64, 64]], 10**9)
  budget = sorted(r.max_peak_bytes for r in rows)[len(rows) // 2]
  rows = planner.Plan(layers, [[64, 64]], budget)
  fitting = [r for r in rows if r.max_peak_bytes <= budget]
  assert [r for r in rows if r.fits] == fitting
  best = choices.Recommend(rows)
  fastest = min(r.relative_step_time for r in fitting)
  assert best.fits and best.relative_step_time == fastest
  assert best.max_peak_bytes == min(r.max_peak_bytes for r in fitting
                                    if r.relative_step_time == fastest)
  table = choices.FormatTable(rows)
  marked = [line for line in table.splitlines() if line.startswith('*')]
  assert len(marked) == 1 and marked[0].split()[1:5] == [
      str(best.num_cells), '1', str(best.num_micro_batches), best.remat.name]


def test_recommend_none_when_nothing_fits():
  rows = planner.Plan(_Stack([64] * 5), [[64, 64]], 1)
  assert rows and not any(r.fits for r in rows)
  assert choices.Recommend(rows) is None
  assert 'No candidate fits' in choices.FormatTable(rows)


def test_errors_name_the_values():
  layers = _Stack([8] * 5)
  with pytest.raises(ValueError, match=r'budget_bytes must be > 0, got 0'):
    planner.Plan(layers, [[8, 8]], 0)
  with pytest.raises(ValueError, match='Cannot split 4 layers into 5 cells'):
    planner.Estimate(layers, [[8, 8]], 5, 1, RematPolicy.NONE)
  with pytest.raises(ValueError, match=r'num_micro_batches \(3\) must divide the batch size \(8\)'):
    planner.Estimate(layers, [[8, 8]], 2, 3, RematPolicy.NONE)
  with pytest.raises(ValueError, match=r'optimizer_slots \(-1\)'):
    planner.Estimate(layers, [[8, 8]], 2, 2, RematPolicy.NONE, optimizer_slots=-1)
  with pytest.raises(ValueError, match='layers is empty'):
    planner.Estimate([], [[8, 8]], 1, 1, RematPolicy.NONE)
  with pytest.raises(TypeError, match="'none'"):
    planner.Estimate(layers, [[8, 8]], 2, 2, 'none')
  with pytest.raises(ValueError, match='no static size at batch_dim=1'):
    planner.Estimate(layers, [[8]], 1, 1, RematPolicy.NONE, batch_dim=1)


def test_largest_fitting_stack_grows_with_the_budget():
  def Largest(budget):
    return choices.LargestFittingStack(lambda n: _Stack([32] * (n + 1)), [[16, 32]],
                                       budget, 2, 4, RematPolicy.PER_CELL,
                                       optimizer_slots=1, max_layers=200)

  one = planner.Estimate(_Stack([32] * 3), [[16, 32]], 2, 4, RematPolicy.PER_CELL,
                         optimizer_slots=1).max_peak_bytes
  assert Largest(one - 1) == 0
  assert Largest(one) == 2
  sizes = [Largest(b) for b in range(one, 40 * one, 3 * one)]
  assert sizes == sorted(sizes) and sizes[-1] > 2 * sizes[0]
  for budget, size in zip(range(one, 40 * one, 3 * one), sizes):
    def Peak(n):
      return planner.Estimate(_Stack([32] * (n + 1)), [[16, 32]], 2, 4,
                              RematPolicy.PER_CELL, optimizer_slots=1).max_peak_bytes
    assert Peak(size) <= budget < Peak(size + 1)
  assert Largest(10**12) == 200
  with pytest.raises(ValueError, match=r'max_layers \(1\) >= num_cells \(2\)'):
    choices.LargestFittingStack(lambda n: _Stack([8] * (n + 1)), [[8, 8]], 10**6, 2, 1,
                                RematPolicy.NONE, max_layers=1)


# --- schedules -----------------------------------------------------------------


@pytest.mark.parametrize('remat', list(RematPolicy))
def test_one_f_one_b_keeps_k_minus_k_micro_batches_by_hand(remat):
  """K=2 cells of two layers, M=4: fill-drain keeps 4 micro-batches on each
  cell, 1F1B 2 on cell 0 and 1 on cell 1; same bubble and, but for the
  micro-batches it records, the same time."""
  d, n, k, m = 8, 8, 2, 4
  mb = n // m
  # Updates as the gradients are made: act is the activations alone.
  row = planner.Estimate(_Stack([d] * 5), [[n, d]], k, m, remat,
                         schedule_kind=ScheduleKind.ONE_F_ONE_B, gradients_held=False)
  big = _Act(d, mb)
  kept = [2, 1]
  act = {RematPolicy.NONE: [2 * f * _Act(d, mb) + big for f in kept],
         RematPolicy.PER_CELL: [f * _In(d, mb) + 2 * _Act(d, mb) + big for f in kept],
         RematPolicy.PER_LAYER: [f * _In(d, mb) + 2 * _In(d, mb) + 2 * big for f in kept]}[remat]
  assert row.act_bytes == act
  assert row.param_bytes == [2 * _Params(d, d)] * k
  assert row.bubble == pytest.approx((k - 1) / (m + k - 1))
  gpipe_row = planner.Estimate(_Stack([d] * 5), [[n, d]], k, m, remat)
  # PER_CELL: fill-drain keeps each cell's last micro-batch, 1F1B every
  # micro-batch of the last cell. By hand in units of a cell's forward (F 1,
  # B 3, a kept B 2): fill-drain's step takes 19 (4 F, then cell 1's B3 kept
  # and three more, cell 0's last B), 1F1B's 18 (its cell 1 never recomputes).
  saved = {RematPolicy.PER_CELL: 1}.get(remat, 0)
  flops = 2 * _Flops(d, d, mb)
  assert gpipe_row.relative_step_time - row.relative_step_time == saved * flops
  assert row.schedule_kind == ScheduleKind.ONE_F_ONE_B


def test_interleaved_sums_the_cells_of_each_device():
  """K=2 devices, v=2: four one-layer cells, cells 0 and 2 on device 0;
  the bubble (K-1)/(vM+K-1)."""
  d, n, m = 8, 8, 4
  row = planner.Estimate(_Stack([d] * 5), [[n, d]], 4, m, RematPolicy.PER_CELL,
                         schedule_kind=ScheduleKind.INTERLEAVED, cells_per_device=2)
  assert row.num_devices == 2 and len(row.peak_bytes) == 2
  assert row.param_bytes == [2 * _Params(d, d)] * 2
  assert row.bubble == pytest.approx(1 / (2 * m + 1))
  fill = planner.Estimate(_Stack([d] * 5), [[n, d]], 2, m, RematPolicy.PER_CELL)
  assert row.relative_step_time < fill.relative_step_time


def test_a_device_of_several_cells_counts_one_backward_at_a_time():
  """Interleaved K=2, v=2, M=4, PER_CELL, four one-layer cells: each cell
  holds the inputs of its micro-batches in flight (the simulator's f(k)),
  but a device recomputes one cell's micro-batch at a time: act is the
  sum of its cells' stashes plus one cell's recomputed activations and
  temporaries (big), not two."""
  d, n, m = 8, 8, 4
  row = planner.Estimate(_Stack([d] * 5), [[n, d]], 4, m, RematPolicy.PER_CELL,
                         schedule_kind=ScheduleKind.INTERLEAVED, cells_per_device=2,
                         gradients_held=False)
  flights = simulate.Simulate(schedule.Actions(ScheduleKind.INTERLEAVED, 2, m, 2),
                              simulate.UNIT_COSTS).CellPeaks(4)
  mb = n // m
  stash = [f * _In(d, mb) for f, _ in flights]
  backward = _Act(d, mb) + _Act(d, mb)  # one layer's recomputation + big
  assert row.act_bytes == [stash[0] + stash[2] + backward, stash[1] + stash[3] + backward]


def test_plan_recommends_a_schedule():
  """Without remat, 1F1B takes fill-drain's time in less memory: with a
  budget between the two, only 1F1B fits and is recommended."""
  layers = _Stack([64] * 9)
  kinds = [(ScheduleKind.GPIPE, 1), (ScheduleKind.ONE_F_ONE_B, 1)]
  rows = planner.Plan(layers, [[64, 64]], 10**9, cells=(4,), micro_batches=(8,),
                      remats=(RematPolicy.NONE,), schedules=kinds)
  gpipe_row, one_f = rows
  assert one_f.max_peak_bytes < gpipe_row.max_peak_bytes
  assert one_f.relative_step_time == gpipe_row.relative_step_time
  budget = (one_f.max_peak_bytes + gpipe_row.max_peak_bytes) // 2
  rows = planner.Plan(layers, [[64, 64]], budget, cells=(4,), micro_batches=(8,),
                      remats=(RematPolicy.NONE,), schedules=kinds)
  assert choices.Recommend(rows).schedule_kind == ScheduleKind.ONE_F_ONE_B
  assert 'ONE_F_ONE_B' in choices.FormatTable(rows).splitlines()[2]


def test_plan_skips_what_a_schedule_cannot_run():
  """Interleaved v=2: K*v cells within the 4 layers, K > 1 (two cells on
  one device is no pipeline); any M."""
  rows = planner.Plan(_Stack([8] * 5), [[8, 8]], 10**9, cells=(1, 2, 4), micro_batches=(1, 2),
                      remats=(RematPolicy.NONE,), schedules=[(ScheduleKind.INTERLEAVED, 2)])
  assert [(r.num_devices, r.num_micro_batches) for r in rows] == [(2, 1), (2, 2)]


def test_zb_v_sums_the_cells_it_puts_on_each_device():
  """ZB-V at K=2 puts cells 0 and 3 on device 0, 1 and 2 on device 1 (not
  j mod K): per device the params of those cells."""
  layers, shape = _Stack([8, 16, 32, 16, 8]), [[8, 8]]  # four cells of one layer
  per_cell = planner.Estimate(layers, shape, 4, 4, RematPolicy.PER_CELL).param_bytes
  row = planner.Estimate(layers, shape, 4, 4, RematPolicy.PER_CELL,
                         schedule_kind=ScheduleKind.ZB_V, cells_per_device=2)
  assert row.param_bytes == [per_cell[0] + per_cell[3], per_cell[1] + per_cell[2]]


@pytest.mark.parametrize('remat', [RematPolicy.NONE, RematPolicy.PER_LAYER])
def test_zero_bubble_memory_counts_the_weight_gradient_inputs_held(remat):
  """ZB-H2 at K=3, M=6 holds the weight-gradient inputs of micro-batches
  from their I to their W: each device's act counts them beside its
  activations in flight, at least the simulator's peak of both held at
  once (5 on every device, where activations alone are 5, 3, 1). Under
  PER_LAYER nothing is deferred: its activations alone count."""
  d, n, k, m = 8, 12, 3, 6
  row = planner.Estimate(_Stack([d] * 4), [[n, d]], k, m, remat,
                         schedule_kind=ScheduleKind.ZB_H2)
  held = simulate.Simulate(schedule.Actions(ScheduleKind.ZB_H2, k, m),
                           simulate.UNIT_COSTS).peak_held
  assert held == (5, 5, 5)
  micro, big = _Act(d, n // m), _Act(d, n // m)
  if remat == RematPolicy.NONE:
    held_per_device = [(a - big) // micro for a in row.act_bytes]
    assert all(h >= p for h, p in zip(held_per_device, held)), held_per_device
    assert held_per_device[-1] > 1  # activations alone: 1
  else:  # the inputs of the activations in flight alone (5, 3, 1), as by hand
    mb = n // m
    assert row.act_bytes == [f * _In(d, mb) + _In(d, mb) + 2 * big for f in (5, 3, 1)]


def test_a_loop_is_priced_as_the_program_it_runs():
  """A loop step (from loop_min_micro_batches) recomputes every forward
  but the last cell's kept ones, under NONE too: fill-drain K=2, M=4
  under NONE is then priced as PER_CELL's memory, and its time as the
  recomputations' (by hand, in forwards of a cell: unrolled, 4 F's and
  4 B's of 2 on the critical path, 15 with the fill; in the loop cell 1
  runs B3 in 2 and the others in 3, 5 to 16, cell 0's B3 (recomputed
  now, which unrolled PER_CELL keeps) 7 to 10 while cell 1 runs its B2,
  then B2, B1, B0 to 19, as unrolled PER_CELL); from
  M=loop_min_micro_batches only."""
  stack, shape = _Stack([8] * 5), [[8, 8]]
  unrolled = planner.Estimate(stack, shape, 2, 4, RematPolicy.NONE)
  loop = planner.Estimate(stack, shape, 2, 4, RematPolicy.NONE, loop_min_micro_batches=4)
  per_cell = planner.Estimate(stack, shape, 2, 4, RematPolicy.PER_CELL)
  assert (unrolled.emission, loop.emission) == (program.Emission.UNROLLED,
                                                program.Emission.LOOP)
  assert loop.act_bytes == per_cell.act_bytes < unrolled.act_bytes
  forward = 2 * _Flops(8, 8, 2)  # a cell of two layers, one micro-batch
  assert unrolled.relative_step_time == 3 * forward * 5
  assert loop.relative_step_time == per_cell.relative_step_time == 19 * forward
  assert planner.Estimate(stack, shape, 2, 4, RematPolicy.NONE,
                          loop_min_micro_batches=8).emission == program.Emission.UNROLLED


@pytest.mark.parametrize('remat,kind,m,defers', [
    (RematPolicy.PER_CELL, ScheduleKind.GPIPE, 4, True),
    (RematPolicy.PER_CELL, ScheduleKind.ONE_F_ONE_B, 4, True),
    (RematPolicy.PER_CELL, ScheduleKind.GPIPE, 1, False),  # one micro-batch: no sum
    (RematPolicy.NONE, ScheduleKind.GPIPE, 4, False),  # recorded forwards do not defer
    (RematPolicy.PER_CELL, ScheduleKind.ZB_H1, 4, False),  # W's add into sums
])
def test_weights_deferred_to_one_product_keep_no_gradient_sum(remat, kind, m, defers):
  """A wide projection with few rows (64 -> 256, 2 rows a micro-batch at
  M=4: 4*2*(64+256) elements of factors <= 64*256 of weight) takes its
  gradient as one product per step where the program defers without
  splitting: the cell holds its factors for all M micro-batches, not a
  gradient sum of its weight (the bias's sum stays)."""
  slots = 1
  row = planner.Estimate(_Stack([64, 256, 64]), [[8, 64]], 2, m, remat,
                         optimizer_slots=slots, schedule_kind=kind)
  params = [_Params(64, 256), _Params(256, 64)]
  if defers:
    factors = m * (8 // m) * (64 + 256) * F32
    expected = [slots * p + p - 64 * 256 * F32 + factors for p in params]
  else:
    expected = [(1 + slots) * p for p in params]
  assert row.state_bytes == expected
  # The update's temporary (the cell's one layer) after the activations.
  activations = planner.Estimate(_Stack([64, 256, 64]), [[8, 64]], 2, m, remat,
                                 schedule_kind=kind, gradients_held=False).act_bytes
  assert row.act_bytes == [max(a, p) for a, p in zip(activations, params)]


@pytest.mark.parametrize('held', [True, False])
@pytest.mark.parametrize('m', [1, 2])
def test_a_device_of_two_cells_runs_two_updates_at_once(m, held):
  """Interleaved, v=2: two cells of two equal layers on each device. The
  updates' temporaries are the device's two largest layers, not two per
  cell: TensorFlow runs two at once per device, whatever its cells. Where
  weights are updated as their gradients are made, at M=1 the device
  holds one gradient at a time, not one per cell."""
  d, n = 64, 2  # weights far larger than the activations
  row = planner.Estimate(_Stack([d] * 9), [[n, d]], 4, m, RematPolicy.NONE,
                         schedule_kind=ScheduleKind.INTERLEAVED, cells_per_device=2,
                         gradients_held=held)
  params, update = 4 * _Params(d, d), 2 * _Params(d, d)
  assert row.param_bytes == [params] * 2
  if held:
    assert row.state_bytes == [params] * 2 and row.act_bytes == [update] * 2
  else:
    gradients = _Params(d, d) if m == 1 else params
    assert row.state_bytes == [gradients + update] * 2 and max(row.act_bytes) < update


def test_given_layer_costs_partition_as_the_pipeline_does():
  """Four equal layers: by FLOPs two a cell; by the given costs 1, 1, 1, 10
  the last alone, as PipeliningLayer's cost=CostKind.GIVEN splits them."""
  stack, shape = _Stack([8] * 5), [[8, 8]]
  flops = planner.Estimate(stack, shape, 2, 2, RematPolicy.NONE)
  given = planner.Estimate(stack, shape, 2, 2, RematPolicy.NONE,
                           cost=partition.CostKind.GIVEN, layer_costs=[1, 1, 1, 10])
  assert flops.param_bytes == [2 * _Params(8, 8)] * 2
  assert given.param_bytes == [3 * _Params(8, 8), _Params(8, 8)]


@pytest.mark.parametrize('held', [True, False])
@pytest.mark.parametrize('remat', list(RematPolicy))
@pytest.mark.parametrize('m', [1, 2])
def test_measured_kept_bytes_and_gradient_use_by_hand(remat, m, held):
  """Given what each layer keeps (kept_bytes at n), act counts that (M
  times it at N) and the backward's temporaries are a layer's output at n.
  A step that updates each weight as its gradient is made holds one
  layer's gradient at M=1 where the cell's backward runs inline (no
  recomputation), else every gradient."""
  d, n, k, slots, kept = 8, 8, 2, 1, 100
  row = planner.Estimate(_Stack([d] * 5), [[n, d]], k, m, remat, optimizer_slots=slots,
                         kept_bytes=[kept] * 4, gradients_held=held)
  mb = n // m
  params = 2 * _Params(d, d)
  out = _In(d, mb)  # a layer's output at n
  act = {RematPolicy.NONE: 2 * m * kept + out,
         RematPolicy.PER_CELL: _In(d, n) + 2 * kept + out,
         RematPolicy.PER_LAYER: _In(d, n) + 2 * _In(d, mb) + kept + out}[remat]
  one_gradient = not held and m == 1 and remat == RematPolicy.NONE
  gradients = _Params(d, d) if one_gradient else params
  update = 2 * _Params(d, d)  # two updates' temporaries: the two layers' params
  if held:  # the updates after the activations are freed
    assert row.act_bytes == [max(act, update)] * k
    assert row.state_bytes == [slots * params + gradients] * k
  else:  # the updates while the activations live
    assert row.act_bytes == [act] * k
    assert row.state_bytes == [slots * params + gradients + update] * k
  with pytest.raises(ValueError, match=r'kept_bytes has 3 entries for 4 layers'):
    planner.Estimate(_Stack([d] * 5), [[n, d]], k, m, remat, kept_bytes=[kept] * 3)
