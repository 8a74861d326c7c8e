"""What the executor promises beyond equal numbers (those are test_conformance's):
the loop's graph does not grow with M and each device's loop runs on its
device, its rings hold only what is in flight, remat keeps what it says,
and every schedule's errors come at build (replicas: test_data_parallel)."""

import pytest
import tensorflow as tf

from lingvo_pipe.core import eval_mode
from lingvo_pipe.core import step_seeds
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.layout import plan as plan_lib
from lingvo_pipe.pipeline.layout.cell_compilation import CellCompilation
from lingvo_pipe.pipeline.lowering import loop_tables
from lingvo_pipe.pipeline.lowering import program
from lingvo_pipe.pipeline.lowering.remat import RematPolicy
from lingvo_pipe.pipeline.schedules import built_in
from lingvo_pipe.pipeline.schedules import schedule_text
from lingvo_pipe.pipeline.schedules.actions import ActionKind
from lingvo_pipe.pipeline.schedules.built_in import ScheduleKind

from tests import transparency
from tests.pipeline import pipeline_models as models

ONE_F = ScheduleKind.ONE_F_ONE_B


def _Graph(pipe, shape, m, loss_inside=True):
  step = (models.TrainStepWithLoss(pipe, 0, m) if loss_inside else
          models.TrainStep(pipe, step=0))
  return step.get_concrete_function(tf.TensorSpec(shape)).graph


def _Nodes(pipe, shape, m, loss_inside=True):
  graph_def = _Graph(pipe, shape, m, loss_inside).as_graph_def()
  return list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]


def _CalledFunctions(pipe, shape, m):
  return [n.attr['f'].func.name for n in _Nodes(pipe, shape, m) if 'f' in n.attr]


_GRAPH_KINDS = [(ScheduleKind.GPIPE, 2), (ONE_F, 2), (ScheduleKind.INTERLEAVED, 4),
                (ScheduleKind.ZB_H1, 2), (ScheduleKind.ZB_V, 4)]


def _StepOps(kind, cells, m, loop):
  """The ops of a training step's graph, constants aside (tf.zeros is a
  Const below 1000 elements and a Fill above: not growth)."""
  layers, shape = models.FfnLayers(dim=64)
  pipe = models.Pipeline(layers, shape, cells, m, loop_min_micro_batches=loop,
                         schedule=kind, cells_per_device=2 if kind == ScheduleKind.INTERLEAVED else 1)
  nodes = _Nodes(pipe, shape, m)
  assert any(n.op == 'While' for n in nodes) == bool(loop)
  return len([n for n in nodes if n.op not in ('Const', 'Fill')])


@pytest.mark.parametrize('kind,cells', _GRAPH_KINDS)
def test_loop_graph_does_not_grow_with_m(kind, cells):
  """Every op of the step, not just the cell calls: micro-batches enter and
  leave the loop as one gather per tensor, so M=16 holds as many ops as
  M=4."""
  looped = [_StepOps(kind, cells, m, 2) for m in (4, 16)]
  assert looped[0] == looped[1], looped


# Tracing the unrolled step at M=16 is most of the time: make test runs
# fill-drain, make test-slow the others.
@pytest.mark.parametrize('kind,cells', [
    pytest.param(kind, cells, marks=() if kind == ScheduleKind.GPIPE else pytest.mark.slow)
    for kind, cells in _GRAPH_KINDS])
def test_the_unrolled_graph_at_m16_is_bigger_than_the_loop(kind, cells):
  assert _StepOps(kind, cells, 16, 0) > _StepOps(kind, cells, 16, 2)


def test_fprop_loop_graph_does_not_grow_with_m():
  """The loss outside (FProp): a loop of the forwards' clocks and one of
  the rest, each as many ops at M=16 as at M=4."""
  layers, shape = models.FfnLayers(dim=64)
  ops = [len([n for n in _Nodes(models.Pipeline(layers, shape, 2, m, loop_min_micro_batches=2),
                                shape, m, loss_inside=False) if n.op not in ('Const', 'Fill')])
         for m in (4, 16)]
  assert ops[0] == ops[1], ops


def test_a_loop_step_that_failed_halfway_leaves_nothing_to_the_next():
  """The last cell fails on micro-batch 0 while the first cell passes on
  its forwards; the next step, from clean inputs, gives the gradients of
  a pipeline that never failed: the queues between the devices' loops,
  which the failed step left holding micro-batches, are drained at the
  start of each step."""
  layers, shape = models.FfnLayers(keep_prob=1.0)
  pipe = models.Pipeline(layers, shape, 2, 4, loop_min_micro_batches=2,
                         schedule=ScheduleKind.GPIPE)
  variables = list(pipe.trainable_variables)

  def Loss(y):
    # Checked after some milliseconds of products (of the identity, as a
    # function of y: a constant would be folded), by which time the first
    # cell has passed on its other forwards. Without the drain this test
    # failed 6 runs of 6.
    delay = tf.eye(256) * (1.0 + tf.minimum(tf.abs(tf.reduce_mean(y)), 0.0))
    for _ in range(20):
      delay = tf.matmul(delay, delay)
    y = y + 0.0 * tf.reduce_sum(delay)
    return tf.reduce_sum(tf.square(tf.debugging.assert_all_finite(y, 'not finite')))

  @tf.function(autograph=False)
  def Gradients(x):
    with tf.GradientTape() as tape:
      loss, _ = pipe.FPropWithLoss(pipe.theta, Loss, x)
    return tape.gradient(loss, variables)

  x = tf.random.stateless_normal(shape, [1, 2])
  before = Gradients(x)
  poisoned = tf.tensor_scatter_nd_update(x, [[0]], tf.fill([1, shape[1]], float('nan')))
  with pytest.raises(tf.errors.InvalidArgumentError, match='not finite'):
    Gradients(poisoned)
  for got, want in zip(Gradients(x), before):
    transparency.AssertClose(got, want)


def test_below_the_switch_point_the_step_is_unrolled():
  layers, shape = models.FfnLayers()
  pipe = models.Pipeline(layers, shape, 2, 4, loop_min_micro_batches=8, schedule=ONE_F)
  assert not any(n.op == 'While' for n in _Nodes(pipe, shape, 4))


@pytest.mark.parametrize('kwargs,loop_from', [
    (dict(), plan_lib.LOOP_FROM_M.get(ScheduleKind.GPIPE, 0)),
    (dict(schedule=ONE_F), plan_lib.LOOP_FROM_M.get(ONE_F, 0)),
    (dict(loop_min_micro_batches=0), 0),
    (dict(loop_min_micro_batches=3), 3),
    # Measured only with per-cell remat and uncompiled cells: not the default else.
    (dict(remat=RematPolicy.NONE), 0),
    (dict(remat=RematPolicy.PER_LAYER), 0),
    (dict(jit_compile=CellCompilation.XLA), 0),
    # A text may order a boundary's micro-batches in a way the loop refuses.
    (dict(schedule_text='0F0,0F1,0B0,0B1;1F0,1B0,1F1,1B1'), 0),
])
def test_the_loop_starts_where_the_schedule_s_was_measured_no_slower(kwargs, loop_from):
  p = gpipe.PipeliningLayer.Params().Set(name='pipe', num_partitions=2, **kwargs)
  assert plan_lib.LoopFromM(p) == loop_from


@pytest.mark.skipif(ScheduleKind.GPIPE not in plan_lib.LOOP_FROM_M,
                    reason='fill-drain never loops by default')
def test_by_default_fill_drain_loops_from_its_measured_m():
  layers, shape = models.FfnLayers(dim=8)
  m = plan_lib.LOOP_FROM_M[ScheduleKind.GPIPE]
  shape = [m] + shape[1:]
  for num_micro, loops in ((m // 2, False), (m, True)):
    pipe = models.Pipeline(layers, shape, 2, num_micro)
    nodes = _Nodes(pipe, shape, num_micro, loss_inside=False)
    assert any(n.op == 'While' for n in nodes) == loops, num_micro


@pytest.mark.parametrize('replicas', [1, 2])
def test_each_device_loop_runs_on_its_device(replicas):
  """One loop per device of each replica, and inside each body every
  switch, micro-batch gather and array read and write is placed on that
  one device (replica 1's on its own)."""
  layers, shape = models.FfnLayers(dim=64)
  pipe = models.Pipeline(layers, shape, 2, 4, loop_min_micro_batches=2, schedule=ONE_F,
                         num_replicas=replicas)
  graph_def = _Graph(pipe, shape, 4 * replicas).as_graph_def()
  bodies = [f for f in graph_def.library.function if '_body_' in f.signature.name]
  assert len(bodies) == 2 * replicas, [f.signature.name for f in bodies]
  placed = ('TensorListGetItem', 'TensorListSetItem', 'GatherV2', 'Case', 'StatelessCase')
  devices = set()
  for body in bodies:
    on = {n.device for n in body.node_def if n.op in placed}
    assert len(on) == 1 and all(on), (body.signature.name, on)
    devices |= {device.split(':')[-1] for device in on}
  assert devices == {str(i) for i in range(2 * replicas)}, devices


def _Tables(schedule, keep_last):
  """The loop tables of a per-cell remat step of `schedule`: with
  keep_last the loss inside (the last cell's kept forwards run as KEPT),
  else outside (nothing kept)."""
  step = program.Step.LOSS_INSIDE if keep_last else program.Step.LOSS_OUTSIDE
  return loop_tables.Build(program.Lower(schedule, RematPolicy.PER_CELL, False, 1, step,
                                         program.Emission.LOOP))


def test_one_f_one_b_rings_hold_the_micro_batches_in_flight():
  """1F1B K=4 M=16: each cell's ring of inputs (from its forward to its
  backward's recomputation) holds at most K micro-batches (the ones in
  flight), not M, whether the last cell's backwards run with their
  forwards (per-cell remat) or later; fill-drain's need all M."""
  one_f = built_in.Build(ONE_F, 4, 16)
  kept = _Tables(one_f, keep_last=True)
  assert kept.kept == frozenset(range(16))
  for tables in (_Tables(one_f, keep_last=False), kept):
    assert all(1 <= s <= 4 for s in tables.input_rings[1:]), tables.input_rings
    assert tables.loss_gradients == 1
  fill_drain = _Tables(built_in.Build(ScheduleKind.GPIPE, 4, 16), False)
  assert fill_drain.input_rings[1:] == [16] * 3, fill_drain.input_rings


def test_a_split_cell_s_factors_wait_for_their_w_in_a_ring():
  """K=4 M=16: an I's factors are held until its W, in a ring as deep as
  the I's whose W has not run (ZB-H1: cell k's W's trail its I's by k+1,
  not M); a B's factors, all M, wait for the products after the loop."""
  zb_h1 = _Tables(built_in.Build(ScheduleKind.ZB_H1, 4, 16), False)
  assert zb_h1.factor_rings == [1, 2, 3, 4], zb_h1.factor_rings
  one_f = _Tables(built_in.Build(ONE_F, 4, 16), False)
  assert one_f.factor_rings == [16] * 4, one_f.factor_rings


@pytest.mark.parametrize('kind', [ScheduleKind.ZB_H1, ScheduleKind.ZB_V,
                                  ScheduleKind.INTERLEAVED])
def test_each_device_runs_its_actions_in_the_schedule_s_order(kind):
  """A device's table is its row of the schedule, one branch per action,
  but a kept micro-batch's backward, which its forward's branch runs."""
  schedule = built_in.Build(kind, 2, 8, 2 if kind == ScheduleKind.INTERLEAVED else None)
  tables = _Tables(schedule, keep_last=True)
  last = schedule.num_cells - 1
  kinds = {ActionKind.F: loop_tables.F, ActionKind.B: loop_tables.X,
           ActionKind.I: loop_tables.X, ActionKind.W: loop_tables.W}
  for d, row in enumerate(schedule.devices):
    table = tables.devices[d]
    expected = []
    for a in row:
      kind_of = kinds[a.kind]
      if a.cell == last and a.micro in tables.kept and kind_of != loop_tables.W:
        if kind_of == loop_tables.X:
          continue
        kind_of = loop_tables.KEPT
      expected.append((1 + loop_tables.KINDS * table.cells.index(a.cell) + kind_of, a.micro))
    assert list(zip(table.branches.tolist(), table.micro.tolist())) == expected


def test_a_boundary_whose_cells_differ_in_micro_batch_order_is_refused():
  """Cells pass tensors through a FIFO queue: cell 1 taking its forwards
  in another order than cell 0 makes them is refused, naming both."""
  text = '0F0 0F1 0B0 0B1\n1F1 1F0 1B0 1B1'
  schedule = schedule_text.Parse(text)
  with pytest.raises(ValueError, match=r'Cells 0 and 1 run their forwards in different '
                     r'micro-batch orders \(\[0, 1\] and \[1, 0\]\)'):
    _Tables(schedule, keep_last=False)


def test_a_text_the_loop_refuses_fails_at_build_naming_the_pipeline():
  layers, shape = models.FfnLayers()
  text = '0F0,0F1,0B0,0B1;1F1,1F0,1B0,1B1'
  with pytest.raises(ValueError, match=r"PipeliningLayer 'pipe': Cells 0 and 1 run their "
                     r'forwards in different micro-batch orders.*loop_min_micro_batches=0'):
    models.Pipeline(layers, shape, 2, 2, schedule_text=text, loop_min_micro_batches=2)
  models.Pipeline(layers, shape, 2, 2, schedule_text=text)  # unrolled by default


def test_ring_depth_is_the_smallest_without_overwrite():
  # Micro-batch m written at clock m, last read at clock m + 2: the write
  # of m + 3 (clock m + 3) is the first after it.
  assert loop_tables.RingDepth([0, 1, 2, 3, 4], [2, 3, 4, 5, 6]) == 3
  assert loop_tables.RingDepth([0, 2, 4], [1, 3, 5]) == 1
  assert loop_tables.RingDepth([0, 1], [5, 6]) == 2


@pytest.mark.parametrize('loop', [0, 2])
def test_deferred_weight_gradients_are_one_product_per_step(loop):
  """64 -> 128 -> 64 feed-forward layers at 16/M rows per micro-batch:
  per-cell remat defers their weight gradients (deferred_grads), whose
  factors are multiplied once per step (in the loop, taken out of it in
  M-sized arrays); the gradients still equal the reference's."""
  layers, shape = models.FfnLayers(keep_prob=0.8, dim=64)
  pipe = models.Pipeline(layers, shape, 2, 4, schedule=ONE_F, loop_min_micro_batches=loop)
  transparency.CheckTransparentWithLoss(pipe, (tf.random.stateless_normal(shape, [2, 9]),), 4)
  nodes = _Nodes(pipe, shape, 4)
  assert [n for n in nodes if n.op == 'MatMul' and n.attr['transpose_a'].b], (
      'no deferred product')


@pytest.mark.parametrize('loop,backwards', [(0, 4), (2, 1)])
def test_one_f_one_b_keeps_the_last_cell_and_recomputes_the_others(loop, backwards):
  """Per-cell remat under 1F1B (K=2, M=4): the last cell runs each
  micro-batch's backward right after its forward, so it records them all
  and never calls its recomputing backward; cell 0 (F0 F1 B0 F2 B1 F3 B2
  B3) recomputes all four (unrolled: four calls; the loop: one call, in
  its body)."""
  layers, shape = models.FfnLayers()
  pipe = models.Pipeline(layers, shape, 2, 4, schedule=ONE_F, loop_min_micro_batches=loop)
  called = _CalledFunctions(pipe, shape, 4)
  assert not [f for f in called if 'cell_1_backward_' in f], called
  assert len([f for f in called if 'cell_0_backward_' in f]) == backwards, called


def test_fprop_of_a_one_f_one_b_pipeline_says_to_use_fprop_with_loss():
  layers, shape = models.FfnLayers()
  pipe = models.Pipeline(layers, shape, 2, 2, schedule=ONE_F)
  with pytest.raises(ValueError, match='call FPropWithLoss'):
    pipe.FProp(pipe.theta, tf.ones(shape))


@pytest.mark.parametrize('loop', [0, 2])
def test_interleaved_trains_at_an_m_not_a_multiple_of_k(loop):
  """Interleaved takes any M: M=3 on K=2 devices (v=2, four cells) runs
  rounds of two and one micro-batches, unrolled and as loops, and equals
  the unpartitioned network."""
  layers, shape = models.FfnLayers(keep_prob=0.7)
  shape = [6] + shape[1:]
  pipe = models.Pipeline(layers, shape, 4, 3, schedule=ScheduleKind.INTERLEAVED,
                         cells_per_device=2, loop_min_micro_batches=loop)
  x = tf.random.stateless_normal(shape, [5, 6])
  transparency.CheckTransparentWithLoss(pipe, (x,), 3)


def test_eval_mode_loss_is_the_sum_of_micro_batch_losses():
  layers, shape = models.FfnLayers(keep_prob=0.5)
  pipe = models.Pipeline(layers, shape, 2, 4, schedule=ONE_F, num_replicas=2)
  x = tf.random.stateless_normal(shape, [3, 4])
  with eval_mode.EvalMode():
    loss, y = pipe.FPropWithLoss(pipe.theta, models.MicroLoss(4), x)
    transparency.AssertClose(y, pipe.FProp(pipe.theta, x))
  transparency.AssertClose(loss, models.Loss(y))


@pytest.mark.parametrize('kwargs,match', [
    (dict(num_partitions=6, num_micro_batches=4, schedule=ScheduleKind.INTERLEAVED,
          cells_per_device=4), '6 cells do not make cells_per_device=4'),
    (dict(num_partitions=4, num_micro_batches=4, schedule=ONE_F, cells_per_device=2),
     r'ONE_F_ONE_B runs 1 cell\(s\) per device'),
    (dict(num_partitions=3, num_micro_batches=4, schedule=ScheduleKind.ZB_V),
     '3 cells do not make cells_per_device=2'),
    (dict(num_partitions=2, num_micro_batches=2, num_replicas=8),
     '8 replicas x 2 cells at 1 per device need 16 devices but only 8'),
    (dict(num_partitions=2, num_micro_batches=2, num_replicas=0), r'num_replicas \(0\) must be >= 1'),
    (dict(num_partitions=2, num_micro_batches=2, num_replicas=2,
          devices=['CPU:0', 'CPU:1', 'CPU:2']), 'need 4 devices but only 3'),
])
def test_bad_layouts_fail_at_build(kwargs, match):
  layers, shape = models.FfnLayers(num_layers=6)  # up to six cells
  with pytest.raises((ValueError, TypeError), match=match):
    gpipe.PipeliningLayer.Params().Set(name='pipe', layers=layers, input_shapes=[shape],
                                       **kwargs).Instantiate()


def test_consecutive_cells_per_device_packs_replicas():
  layers, shape = models.FfnLayers()
  pipe = models.Pipeline(layers, shape, 2, 2, num_replicas=2, consecutive_cells_per_device=2,
                         devices=['CPU:4', 'CPU:5'])
  assert [[d.index for d in row] for row in pipe.replica_devices] == [[4, 4], [5, 5]]
  transparency.CheckTransparent(pipe, (tf.random.stateless_normal(shape, [1, 2]),), 4)


@pytest.mark.parametrize('kind,loop', [(ONE_F, 0), (ScheduleKind.ZB_H1, 2)])
def test_transformer_stack_with_dropout(kind, loop):
  pipe = models.TransformerStackPipeline(2, 2, schedule=kind, loop_min_micro_batches=loop)
  transparency.CheckTransparentWithLoss(pipe, models.TransformerInputs(24), 2,
                                        labels=models.TransformerLabels(24))


def test_language_model_task_trains_the_same_under_every_schedule():
  """The lm task (one FPropWithLoss call, whatever the schedule) gives the
  same loss, metrics and weight gradients under fill-drain, 1F1B and ZB-H1
  with the same weights."""
  from lingvo_pipe.tasks.lm import model as lm_model  # pylint: disable=g-import-not-at-top

  def Task(kind):
    p = lm_model.LanguageModelTask.Params().Set(name='lm', random_seed=3)
    p.stack.Set(vocab_size=16, model_dim=8, num_heads=2, hidden_dim=16, num_layers=2,
                batch_size=models.BATCH, seq_len=4, residual_keep_prob=0.8)
    p.stack.pipeline.Set(num_partitions=4, num_micro_batches=4, schedule=kind)
    return p.Instantiate()

  batch = models.TransformerBatch(seed=5)
  results = []
  for kind in (ScheduleKind.GPIPE, ONE_F, ScheduleKind.ZB_H1):
    task = Task(kind)
    if results:
      for v, w in zip(task.trainable_variables, results[0][2]):
        v.assign(w)

    @tf.function(autograph=False)
    def Step(task=task):
      with tf.GradientTape() as tape:
        metrics = task.FProp(step_seeds.WithStepSeed(task.theta, [1, 0]), batch)
      return metrics, tape.gradient(metrics.loss, task.trainable_variables)

    metrics, grads = Step()
    results.append((metrics, grads, list(task.trainable_variables)))
  (m0, g0, _) = results[0]
  for m1, g1, _ in results[1:]:
    for key in ('loss', 'bits_per_byte', 'accuracy', 'num_tokens'):
      transparency.AssertClose(m1[key], m0[key], key)
    for a, b in zip(g1, g0):
      transparency.AssertClose(a, b, 'gradient')


@pytest.mark.parametrize('loop', [0, 2])
def test_loss_inside_honours_loss_scaling(loop):
  """Under precision.LossScaling(s) (the trainer's float16 loss scaling)
  the backwards inside the pipeline start from s times the loss's
  gradient, and the outer tape, which differentiates s * loss, gets s
  times the unscaled gradients: divided by s, they equal them."""
  from lingvo_pipe.core import precision  # pylint: disable=g-import-not-at-top
  layers, shape = models.FfnLayers()
  pipe = models.Pipeline(layers, shape, 2, 4, schedule=ScheduleKind.ZB_H1,
                         loop_min_micro_batches=loop)
  x = tf.random.stateless_normal(shape, [4, 2])
  variables = list(pipe.trainable_variables)

  @tf.function(autograph=False)
  def Grads(scale):
    with tf.GradientTape() as tape:
      if scale is None:
        loss, _ = pipe.FPropWithLoss(pipe.theta, models.MicroLoss(4), x)
        objective = loss
      else:
        with precision.LossScaling(tf.constant(scale)):
          loss, _ = pipe.FPropWithLoss(pipe.theta, models.MicroLoss(4), x)
        objective = loss * scale
    return loss, tape.gradient(objective, variables)

  loss, grads = Grads(None)
  scaled_loss, scaled = Grads(1024.0)
  transparency.AssertClose(scaled_loss, loss, 'loss')
  for g, s in zip(grads, scaled):
    transparency.AssertClose(s / 1024.0, g, 'gradient')
