"""The conformance matrix: every schedule x emission x precision x remat x replicas equals the unpartitioned network.

Each case trains one step of four residual feed-forward layers with dropout
(keep 0.7; one to two per cell: the graph's size, not the layers' count,
is what each case costs) and checks outputs, loss and the gradient of every variable and
input against tests/transparency.py's Reference (float32: rtol 1e-5) or
tests/bfloat16_transparency.py's (bfloat16: a few bfloat16 steps). The
schedules run with the loss inside the pipeline (FPropWithLoss); fill-drain
also through FProp with the loss outside. R=2 replicas of M micro-batches
are the R*M micro-batches of one pipeline. Batch norm runs across the
schedules in its own matrix below, and so do evaluation and labels passed
to the loss beside the inputs (loss_inputs).

`make test` runs float32 but R=2 in one emission per remat policy (without
remat in one, per cell in the other, alternating over the schedules), and
bfloat16 at per-cell remat with one replica; `make test-slow` the rest.
"""

import pytest
import tensorflow as tf

from lingvo_pipe.core import eval_mode
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.core import step_seeds
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.step.loop import loop_executor

from tests import bfloat16_transparency
from tests import transparency
from tests.pipeline.conformance_cases import BATCH, EMISSIONS, REMATS, SCHEDULES
from tests.pipeline import pipeline_models as models


def _Pipeline(name, emission, remat, replicas, layers, shape, **kwargs):
  params, cells, m, _ = SCHEDULES[name]
  shape = [BATCH] + shape[1:]
  pipe = models.Pipeline(layers, shape, cells, m, remat=remat, num_replicas=replicas,
                         loop_min_micro_batches=EMISSIONS[emission], **params, **kwargs)
  x = tf.random.stateless_normal(shape, [cells, m])
  return pipe, x, m * replicas


def _Cases(dtype):
  cases = []
  for i, name in enumerate(SCHEDULES):
    for emission in EMISSIONS:
      for remat in REMATS:
        for replicas in (1, 2):
          if dtype == 'bfloat16':
            slow = remat != gpipe.RematPolicy.PER_CELL or replicas > 1
          else:  # R=2: NONE in one emission, PER_CELL in the other
            slow = replicas > 1 and emission != list(EMISSIONS)[(i + REMATS.index(remat)) % 2]
          cases.append(pytest.param(name, emission, remat, replicas,
                                    id=f'{name}-{emission}-{remat.name}-R{replicas}',
                                    marks=pytest.mark.slow if slow else ()))
  return cases


@pytest.mark.parametrize('name,emission,remat,replicas', _Cases('float32'))
def test_float32(name, emission, remat, replicas):
  layers, shape = models.FfnLayers(keep_prob=0.7)
  pipe, x, num_micro = _Pipeline(name, emission, remat, replicas, layers, shape)
  transparency.CheckTransparentWithLoss(pipe, (x,), num_micro, loss_inside=SCHEDULES[name][3])


@pytest.mark.parametrize('name,emission,remat,replicas', _Cases('bfloat16'))
def test_bfloat16(name, emission, remat, replicas):
  layers, shape = models.FfnLayers(keep_prob=0.7, dim=16)
  pipe, x, num_micro = _Pipeline(name, emission, remat, replicas, layers, shape,
                                 fprop_dtype=bfloat16_transparency.DTYPE)
  bfloat16_transparency.CheckBf16Transparent(pipe, [x], num_micro, SCHEDULES[name][3])


@pytest.mark.parametrize('name', ['fill_drain_fprop', 'one_f_one_b', 'zb_h1'])
def test_an_eager_step_runs_unrolled_where_a_graph_would_loop(name, monkeypatch):
  """Eagerly the loop's devices would run one after another, the first
  waiting forever on the second's queue: an eager step runs its actions
  unrolled (a loop executor refused, so a regression fails here, not
  hangs) and equals the unpartitioned network."""
  def Refused(*args, **kwargs):
    raise AssertionError('an eager step built a loop per device')

  monkeypatch.setattr(loop_executor, 'LoopExecutor', Refused)
  layers, shape = models.FfnLayers(keep_prob=0.7)
  pipe, x, num_micro = _Pipeline(name, 'loop', gpipe.RematPolicy.PER_CELL, 1, layers, shape)
  transparency.CheckTransparentWithLoss(pipe, (x,), num_micro, eager=True,
                                        loss_inside=SCHEDULES[name][3])


@pytest.mark.parametrize('name', ['fill_drain_fprop', 'one_f_one_b', 'zb_h1', 'zb_v'])
@pytest.mark.parametrize('emission', list(EMISSIONS))
@pytest.mark.parametrize('replicas', [1, 2])
def test_batch_norm(name, emission, replicas):
  """The convnet's batch norm: outputs, gradients and the moving averages
  after the step."""
  layers, shape = models.ConvNetLayers(keep_prob=0.8)
  pipe, x, num_micro = _Pipeline(name, emission, gpipe.RematPolicy.PER_CELL, replicas,
                                 layers, shape)
  ref = transparency.CheckTransparentWithLoss(pipe, (x,), num_micro,
                                              loss_inside=SCHEDULES[name][3])
  transparency.CheckMovingAverages(pipe, ref.bn_inputs)


@pytest.mark.parametrize('name', list(SCHEDULES))
@pytest.mark.parametrize('emission', list(EMISSIONS))
@pytest.mark.parametrize('replicas', [1, 2])
def test_evaluation(name, emission, replicas):
  """Evaluation runs replica 0's forwards alone on the whole batch, as
  loops where training would loop: the convnet's outputs (batch norm on
  its moving averages, no dropout), through FProp and FPropWithLoss, and
  the loss equal the unpartitioned network's in eval mode."""
  layers, shape = models.ConvNetLayers(keep_prob=0.8)
  pipe, x, _ = _Pipeline(name, emission, gpipe.RematPolicy.PER_CELL, replicas, layers, shape)
  num_micro = SCHEDULES[name][2]
  with eval_mode.EvalMode():
    expected = transparency.Reference(pipe).Forward((x,), num_micro, step=0)
    fprop = tf.function(lambda x: pipe.FProp(pipe.theta, x), autograph=False)
    with_loss = tf.function(lambda x: pipe.FPropWithLoss(
        pipe.theta, models.MicroLoss(num_micro), x), autograph=False)
    y = fprop(x)
    loss, y_with_loss = with_loss(x)
    graph = fprop.get_concrete_function(x).graph
  transparency.AssertClose(y, expected, 'outputs')
  transparency.AssertClose(y_with_loss, expected, 'outputs of FPropWithLoss')
  transparency.AssertClose(loss, models.Loss(expected), 'loss')
  loops = [op.type for op in graph.get_operations() if op.type in ('While', 'StatelessWhile')]
  assert bool(loops) == (emission == 'loop'), loops


def _LossInputCases():
  """Each schedule with the loss inside; in `make test` one (emission, R)
  each, the four pairs in turn over the schedules."""
  pairs = [(e, r) for r in (1, 2) for e in EMISSIONS]
  names = [name for name in SCHEDULES if SCHEDULES[name][3]]
  return [pytest.param(name, emission, replicas, id=f'{name}-{emission}-R{replicas}',
                       marks=() if pairs[i % len(pairs)] == (emission, replicas)
                       else pytest.mark.slow)
          for i, name in enumerate(names) for emission, replicas in pairs]


def _WeightedXent(logits, targets, norm):
  xent = tf.nn.sparse_softmax_cross_entropy_with_logits(targets.labels, logits)
  return tf.reduce_sum(xent * targets.weights) / norm


@pytest.mark.parametrize('name,emission,replicas', _LossInputCases())
def test_loss_inputs(name, emission, replicas):
  """Labels and weights given beside the inputs (loss_inputs) reach each
  micro-batch's loss as that micro-batch's slice, never through the
  cells: outputs, loss and gradients of a step, and the loss in
  evaluation, equal the unpartitioned network's with the whole batch's
  labels and weights."""
  layers, shape = models.FfnLayers(keep_prob=0.7)
  pipe, x, num_micro = _Pipeline(name, emission, gpipe.RematPolicy.PER_CELL, replicas,
                                 layers, shape)
  targets = NestedMap(
      labels=tf.random.stateless_uniform([BATCH], [3, 4], 0, shape[-1], tf.int32),
      weights=tf.random.stateless_uniform([BATCH], [5, 6]) * tf.cast(
          tf.range(BATCH) % 3 > 0, tf.float32))
  norm = tf.reduce_sum(targets.weights)
  variables = list(pipe.trainable_variables)

  def PipelineLoss(x):
    theta = step_seeds.WithStepSeed(pipe.theta, [7, 0])
    return pipe.FPropWithLoss(theta, lambda out, t: _WeightedXent(out, t, norm), x,
                              loss_inputs=targets)

  @tf.function(autograph=False)
  def Step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      loss, y = PipelineLoss(x)
    return y, loss, tape.gradient(loss, variables + [x])

  reference_loss = lambda y: _WeightedXent(y, targets, norm)
  transparency.CheckTransparent(pipe, (x,), num_micro, loss_fn=reference_loss,
                                train_step=Step)
  with eval_mode.EvalMode():
    expected = transparency.Reference(pipe).Forward((x,), SCHEDULES[name][2], step=7)
    loss, _ = tf.function(PipelineLoss, autograph=False)(x)
  transparency.AssertClose(loss, reference_loss(expected), 'evaluation loss')
