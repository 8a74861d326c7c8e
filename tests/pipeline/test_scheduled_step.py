"""Transparency of the loss-inside training step (PipeliningLayer.
FPropWithLoss) under every schedule: 1F1B, interleaved, and fill-drain."""

import pytest
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.schedule import ScheduleKind

from tests import transparency
from tests.pipeline import pipeline_models as models

ONE_F = ScheduleKind.ONE_F_ONE_B
# K in {1, 2, 4} x M in {1, 2, 4, 8, 16}: the diagonal in `make test`, the
# rest under the slow mark (`make test-slow`).
GRID = models.KMGrid(ks=(1, 2, 4))


def _Check(pipe, inputs, m, step=7):
  return transparency.CheckTransparent(
      pipe, inputs, m, step=step, loss_fn=models.ConstantNormLoss,
      train_step=models.TrainStepWithLoss(pipe, step, m))


def _CheckLayers(layers, shape, k, m, **kwargs):
  pipe = models.Pipeline(layers, shape, k, m, **kwargs)
  x = tf.random.stateless_normal(shape, [k, m])
  return pipe, _Check(pipe, (x,), m)


@pytest.mark.parametrize('k,m', GRID)
def test_one_f_one_b_convnet_with_batch_norm_and_dropout(k, m):
  layers, shape = models.ConvNetLayers(keep_prob=0.8)
  pipe, ref = _CheckLayers(layers, shape, k, m, schedule=ONE_F)
  transparency.CheckMovingAverages(pipe, ref.bn_inputs)


# The stack's diagonal costs 80 s: `make test` runs K=2 and K=4 of it (the
# convnet above runs all of it); the rest is under the slow mark.
_STACK_GRID = [pytest.param(*p.values, marks=pytest.mark.slow, id=p.id)
               if p.values not in ((2, 2), (4, 4)) else p for p in GRID]


@pytest.mark.parametrize('k,m', _STACK_GRID)
def test_one_f_one_b_transformer_stack_with_dropout(k, m):
  pipe = models.TransformerStackPipeline(k, m, schedule=ONE_F)
  _Check(pipe, models.TransformerInputs(seed=k * 100 + m), m)


# remat_last_micro_batch changes only PER_CELL; the others under the slow mark.
@pytest.mark.parametrize('remat,remat_last', [
    pytest.param(remat, remat_last, id=f'{remat.name}-{remat_last}', marks=(
        pytest.mark.slow if remat_last and remat != gpipe.RematPolicy.PER_CELL else ()))
    for remat in gpipe.RematPolicy for remat_last in (False, True)])
def test_one_f_one_b_every_remat_policy(remat, remat_last):
  layers, shape = models.FfnLayers(keep_prob=0.7)
  _CheckLayers(layers, shape, 4, 8, schedule=ONE_F, remat=remat,
               remat_last_micro_batch=remat_last)


@pytest.mark.parametrize('v,k,m', [
    (2, 1, 2), (2, 2, 4), (2, 4, 8), (3, 2, 2), (3, 2, 8),
    pytest.param(2, 2, 2, marks=pytest.mark.slow), pytest.param(2, 2, 16, marks=pytest.mark.slow),
    pytest.param(2, 4, 4, marks=pytest.mark.slow), pytest.param(2, 4, 16, marks=pytest.mark.slow),
    pytest.param(3, 1, 4, marks=pytest.mark.slow), pytest.param(3, 2, 4, marks=pytest.mark.slow),
    pytest.param(3, 2, 16, marks=pytest.mark.slow)])
def test_interleaved_convnet_with_batch_norm_and_dropout(v, k, m):
  """K*v cells of the eight layers, cell j on device j mod K."""
  layers, shape = models.ConvNetLayers(keep_prob=0.8)
  pipe, _ = _CheckLayers(layers, shape, k * v, m, schedule=ScheduleKind.INTERLEAVED,
                         cells_per_device=v)
  assert pipe.num_devices == k
  assert [d.name for d in pipe.devices] == [pipe.devices[j % k].name for j in range(k * v)]
  assert len({d.name for d in pipe.devices}) == k


@pytest.mark.parametrize('v,k,m', [(2, 2, 4), pytest.param(3, 2, 2, marks=pytest.mark.slow),
                                   pytest.param(2, 4, 8, marks=pytest.mark.slow),
                                   pytest.param(3, 2, 8, marks=pytest.mark.slow)])
def test_interleaved_transformer_stack_with_dropout(v, k, m):
  pipe = models.TransformerStackPipeline(k * v, m, schedule=ScheduleKind.INTERLEAVED,
                                         cells_per_device=v)
  _Check(pipe, models.TransformerInputs(seed=k * 100 + m), m)


@pytest.mark.parametrize('k,m', [(2, 4), (4, 2)])
def test_fill_drain_through_the_loss_inside_path(k, m):
  layers, shape = models.ConvNetLayers(keep_prob=0.8)
  _CheckLayers(layers, shape, k, m, schedule=ScheduleKind.GPIPE)


def _CalledFunctions(pipe, shape, m):
  graph_def = models.TrainStepWithLoss(pipe, 0, m).get_concrete_function(
      tf.TensorSpec(shape)).graph.as_graph_def()
  return [n.attr['f'].func.name for n in graph_def.node if 'f' in n.attr]


def test_one_f_one_b_keeps_the_last_cell_and_recomputes_the_others():
  """Per-cell remat under 1F1B (K=2, M=4): the last cell runs each
  micro-batch's backward right after its forward, so it records them all
  and recomputes none; cell 0 (F0 F1 B0 F2 B1 F3 B2 B3) never does, and
  recomputes all four."""
  layers, shape = models.FfnLayers()
  pipe = models.Pipeline(layers, shape, 2, 4, schedule=ONE_F)
  called = _CalledFunctions(pipe, shape, 4)
  assert len([f for f in called if 'cell_1_backward_' in f]) == 0, called
  assert len([f for f in called if 'cell_0_backward_' in f]) == 4, called


def test_fprop_of_a_one_f_one_b_pipeline_says_to_use_fprop_with_loss():
  layers, shape = models.FfnLayers()
  pipe = models.Pipeline(layers, shape, 2, 2, schedule=ONE_F)
  with pytest.raises(ValueError, match='call FPropWithLoss'):
    pipe.FProp(pipe.theta, tf.ones(shape))


def test_eval_mode_loss_is_the_sum_of_micro_batch_losses():
  layers, shape = models.FfnLayers(keep_prob=0.5)
  pipe = models.Pipeline(layers, shape, 2, 4, schedule=ONE_F)
  x = tf.random.stateless_normal(shape, [3, 4])
  with base_layer.EvalMode():
    loss, y = pipe.FPropWithLoss(pipe.theta, models.MicroLoss((x,), 4), x)
    transparency.AssertClose(y, pipe.FProp(pipe.theta, x))
  transparency.AssertClose(loss, models.Loss(y))


@pytest.mark.parametrize('kwargs,match', [
    (dict(num_partitions=6, num_micro_batches=4, schedule=ScheduleKind.INTERLEAVED,
          cells_per_device=2), 'num_micro_batches=4 must be a multiple of the number of '
                               'devices K=3; use M=6'),
    (dict(num_partitions=6, num_micro_batches=4, schedule=ScheduleKind.INTERLEAVED,
          cells_per_device=4), '6 cells do not make cells_per_device=4'),
    (dict(num_partitions=4, num_micro_batches=4, schedule=ONE_F, cells_per_device=2),
     'ONE_F_ONE_B runs 1 cell(s) per device'),
])
def test_bad_schedule_shapes_fail_at_build(kwargs, match):
  layers, shape = models.FfnLayers()
  with pytest.raises((ValueError, TypeError), match=match):
    gpipe.PipeliningLayer.Params().Set(name='pipe', layers=layers, input_shapes=[shape],
                                       **kwargs).Instantiate()


def test_language_model_task_trains_the_same_under_1f1b():
  """The lm task (loss inside the pipeline under 1F1B) gives the loss and
  the weight gradients of the GPipe task with the same weights."""
  from lingvo_pipe.tasks.lm import model as lm_model  # pylint: disable=g-import-not-at-top

  def Task(kind):
    p = lm_model.LanguageModelTask.Params().Set(name='lm', random_seed=3)
    p.stack.Set(vocab_size=16, model_dim=8, num_heads=2, hidden_dim=16, num_layers=2,
                batch_size=models.BATCH, seq_len=4, residual_keep_prob=0.8)
    p.stack.pipeline.Set(num_partitions=4, num_micro_batches=4, schedule=kind)
    return p.Instantiate()

  ids, paddings, labels = models.TransformerInputs(seed=5)
  batch = base_layer.NestedMap(ids=ids, paddings=paddings, labels=labels)
  results = []
  for kind in (ScheduleKind.GPIPE, ONE_F):
    task = Task(kind)
    if results:
      for v, w in zip(task.trainable_variables, results[0][2]):
        v.assign(w)

    @tf.function(autograph=False)
    def Step(task=task):
      with tf.GradientTape() as tape:
        metrics = task.FProp(base_layer.WithStepSeed(task.theta, [1, 0]), batch)
      return metrics, tape.gradient(metrics.loss, task.trainable_variables)

    metrics, grads = Step()
    results.append((metrics, grads, list(task.trainable_variables)))
  (m0, g0, _), (m1, g1, _) = results
  for key in ('loss', 'bits_per_byte', 'accuracy', 'num_tokens'):
    transparency.AssertClose(m1[key], m0[key], key)
  for a, b in zip(g1, g0):
    transparency.AssertClose(a, b, 'gradient')
