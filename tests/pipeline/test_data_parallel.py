"""Pipeline replicas as data parallelism: each replica trains its own copy
of the variables with the gradient all-reduced by TensorFlow's collectives,
and R replicas train exactly as one pipeline on the same global batch."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core import step_seeds
from lingvo_pipe.pipeline.cell import scope_names
from lingvo_pipe.pipeline.lowering import program
from lingvo_pipe.pipeline.replicas import replica_variables
from lingvo_pipe.pipeline.schedules.actions import ActionKind
from lingvo_pipe.pipeline.schedules.built_in import ScheduleKind

from tests import transparency
from tests.pipeline import pipeline_models as models

# Cells per pipeline and schedule kwargs: two devices per replica.
_LAYOUTS = {
    ScheduleKind.GPIPE: (2, {}),
    ScheduleKind.ONE_F_ONE_B: (2, {}),
    ScheduleKind.INTERLEAVED: (4, dict(cells_per_device=2)),
    ScheduleKind.ZB_H1: (2, {}),
    ScheduleKind.ZB_H2: (2, {}),
    ScheduleKind.ZB_V: (4, {}),
}


def _Pipeline(kind, replicas, num_micro, loop):
  layers, shape = models.FfnLayers(keep_prob=0.7)
  cells, kwargs = _LAYOUTS[kind]
  return models.Pipeline(layers, shape, cells, num_micro, num_replicas=replicas,
                         schedule=kind, loop_min_micro_batches=loop, **kwargs), shape


def _Train(pipe, shape, num_micro, steps, optimizer):
  """Trains `steps` steps (loss inside the pipeline) on batches that
  depend on the step alone; returns the losses. `num_micro`: micro-batches
  of all replicas."""
  trained = replica_variables.TrainedVariables(pipe)

  @tf.function(autograph=False)
  def Step(step):
    x = tf.random.stateless_normal(shape, tf.stack([step, 9]))
    with tf.GradientTape() as tape:
      theta = step_seeds.WithStepSeed(pipe.theta, tf.stack([tf.cast(step, tf.int64), 0]))
      loss, _ = pipe.FPropWithLoss(theta, models.MicroLoss(num_micro), x)
    grads = tape.gradient(loss, trained)
    with tf.control_dependencies([optimizer.apply_gradients(zip(grads, trained))]):
      return tf.identity(loss)

  return [float(Step(tf.constant(s))) for s in range(steps)]


def _Trained(kind, replicas, loop):
  """(losses, {variable name: value}) after three momentum steps of R
  replicas of 8/R micro-batches each."""
  pipe, shape = _Pipeline(kind, replicas, 8 // replicas, loop)
  losses = _Train(pipe, shape, 8, 3, tf.compat.v1.train.MomentumOptimizer(0.1, 0.9))
  return losses, {v.name: v.numpy() for v in pipe.trainable_variables}


_FAST = (ScheduleKind.GPIPE, ScheduleKind.INTERLEAVED, ScheduleKind.ZB_V)
_ONE_PIPELINE = {}  # kind -> _Trained(kind, 1, 0): unrolled, which the loop equals


def _Case(i, kind, replicas, loop):
  """make test runs three schedules once each (fill-drain at R=2 unrolled,
  interleaved at R=2 in a loop, ZB-V at R=4 in a loop: the conformance
  matrix runs every schedule at R=2 for a step); the rest of the matrix is
  slow (make test-slow)."""
  fast = kind in _FAST and (replicas, loop) == ((2, 0), (4, 2), (2, 2), (4, 0))[i % 4]
  return pytest.param(kind, replicas, loop, id=f'{kind.name}-R{replicas}-loop{loop}',
                      marks=() if fast else pytest.mark.slow)


@pytest.mark.parametrize('kind,replicas,loop', [
    _Case(i, kind, r, loop) for i, kind in enumerate(_LAYOUTS)
    for r in (2, 4) for loop in (0, 2)])
def test_replicas_train_like_one_pipeline(kind, replicas, loop):
  """R replicas of M micro-batches against one pipeline of R*M on the same
  global batches, dropout on: the losses and every variable after three
  momentum steps (rtol 1e-5)."""
  if kind not in _ONE_PIPELINE:
    _ONE_PIPELINE[kind] = _Trained(kind, 1, 0)
  (losses1, weights1), (losses_r, weights_r) = _ONE_PIPELINE[kind], _Trained(
      kind, replicas, loop)
  transparency.AssertClose(losses_r, losses1, 'losses')
  assert sorted(weights1) == sorted(weights_r)
  for name in weights1:
    transparency.AssertClose(weights_r[name], weights1[name], name)


@pytest.mark.parametrize('loop', [0, 2])
def test_replica_copies_stay_bitwise_identical(loop):
  """After ten Adam steps every replica's copy equals its original bit for
  bit, and so do their slots."""
  pipe, shape = _Pipeline(ScheduleKind.ZB_H1, 4, 2, loop)
  optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
  _Train(pipe, shape, 8, 10, optimizer)
  pairs = replica_variables.CopiesIn(pipe)
  assert len(pairs) == len(pipe.trainable_variables)
  for original, copies in pairs:
    assert len(copies) == 3
    for copy in copies:
      np.testing.assert_array_equal(copy.numpy(), original.numpy(), err_msg=original.name)
      for slot in optimizer.get_slot_names():
        np.testing.assert_array_equal(optimizer.get_slot(copy, slot).numpy(),
                                      optimizer.get_slot(original, slot).numpy())


def test_copies_live_on_their_replicas_devices_and_are_not_the_models():
  pipe, _ = _Pipeline(ScheduleKind.GPIPE, 2, 2, 0)
  assert all(c.trainable for _, copies in replica_variables.CopiesIn(pipe) for c in copies)
  model_ids = {id(v) for v in pipe.variables}
  for original, (copy,) in replica_variables.CopiesIn(pipe):
    assert id(copy) not in model_ids
    index = {tf.DeviceSpec.from_string(v.device).device_index for v in (original, copy)}
    assert index in ({0, 2}, {1, 3}), (original.device, copy.device)


def test_a_replicated_step_is_traced_once():
  """The all-reduces' ordering tokens exist before the first trace: made
  during it, they would make tf.function trace the whole step twice."""
  pipe, shape = _Pipeline(ScheduleKind.ZB_H1, 2, 2, 2)
  step = models.TrainStepWithLoss(pipe, 7, 4)
  step(tf.random.stateless_normal(shape, [1, 2]))
  assert step.experimental_get_tracing_count() == 1


@pytest.mark.parametrize('kind,loop', [(ScheduleKind.GPIPE, 0), (ScheduleKind.ZB_H1, 2)])
def test_gradients_are_all_reduced_on_every_replica_device(kind, loop):
  """One CollectiveReduceV2 per cell on each of its replica devices (the
  float32 gradients packed), and no sum of replica gradients on one
  device."""
  pipe, shape = _Pipeline(kind, 2, 2, loop)
  trained = replica_variables.TrainedVariables(pipe)

  @tf.function(autograph=False)
  def Grads(x):
    with tf.GradientTape() as tape:
      loss, _ = pipe.FPropWithLoss(pipe.theta, models.MicroLoss(2), x)
    return tape.gradient(loss, trained)

  graph = Grads.get_concrete_function(tf.TensorSpec(shape)).graph
  ops = list(graph.get_operations())
  for function in graph.as_graph_def().library.function:
    ops.extend(n for n in function.node_def)
  collectives = [op for op in ops if getattr(op, 'type', getattr(op, 'op', None)) ==
                 'CollectiveReduceV2']
  assert len(collectives) == 2 * 2
  indices = sorted(tf.DeviceSpec.from_string(op.device).device_index for op in collectives)
  assert indices == [0, 1, 2, 3]
  assert all(scope_names.ALL_REDUCE_SCOPE in op.name for op in collectives)


@pytest.mark.parametrize('kind', [ScheduleKind.ZB_V, ScheduleKind.INTERLEAVED])
def test_each_cell_reduces_right_after_its_last_weight_gradient(kind):
  """With replicas the unrolled program's order has one REDUCE per cell, right after
  the cell's last B or W on its device, where its all-reduce is emitted
  (also when the device's other cell still has backwards to run); one
  replica has none."""
  pipe, _ = _Pipeline(kind, 2, 4, 0)
  order = pipe.plan.Program(4, program.Step.LOSS_INSIDE).order
  devices = pipe.plan.cell_devices
  for c in range(pipe.num_cells):
    (at,) = [i for i, a in enumerate(order) if a.kind == ActionKind.REDUCE and a.cell == c]
    on_device = [i for i, a in enumerate(order) if devices[a.cell] == devices[c]
                 and a.kind != ActionKind.REDUCE]
    last = max(i for i in on_device
               if order[i].cell == c and order[i].kind in (ActionKind.B, ActionKind.W))
    assert not [i for i in on_device if last < i < at], (c, order)
  assert len([a for a in order if a.kind == ActionKind.REDUCE]) == pipe.num_cells
  one, _ = _Pipeline(kind, 1, 8, 0)
  assert not [a for a in one.plan.Program(8, program.Step.LOSS_INSIDE).order
              if a.kind == ActionKind.REDUCE]


@pytest.mark.parametrize('kind', [ScheduleKind.ONE_F_ONE_B, ScheduleKind.ZB_V])
def test_loop_reduces_a_finished_cell_while_the_others_still_work(kind):
  """A loop step runs one loop per device of each replica: the all-reduce
  of a cell waits for its devices' loops only, not for the loops of the
  cells still working."""
  def StepGraph(replicas):
    pipe, shape = _Pipeline(kind, replicas, 4, 2)

    @tf.function(autograph=False)
    def Loss(x):
      return pipe.FPropWithLoss(pipe.theta, models.MicroLoss(4 * replicas), x)[0]

    return pipe, Loss.get_concrete_function(tf.TensorSpec(shape)).graph

  _, graph = StepGraph(2)
  loops = [op for op in graph.get_operations() if op.type in ('While', 'StatelessWhile')]
  assert len(loops) > 1

  def Ancestors(op):
    seen, todo = set(), [op]
    while todo:
      current = todo.pop()
      for parent in [t.op for t in current.inputs] + list(current.control_inputs):
        if parent not in seen:
          seen.add(parent)
          todo.append(parent)
    return seen

  collectives = [op for op in graph.get_operations() if op.type == 'CollectiveReduceV2']
  early = [op for op in collectives if loops[-1] not in Ancestors(op)]
  assert early and len(early) < len(collectives)
  pipe, one = StepGraph(1)
  assert len([op for op in one.get_operations() if op.type in ('While', 'StatelessWhile')]) == pipe.plan.num_devices
