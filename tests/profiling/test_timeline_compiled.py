"""The timeline of a profiled step whose cells are compiled with XLA.

Compiled calls show no per-op events (trace_calls), so a device's calls
take the phases of its schedule in time order. Tiny pipelines (K=2, M=3,
per-cell remat) in fill-drain and 1F1B, one live profile each; the
uncompiled 1F1B step, whose last cell keeps every micro-batch in kept
scopes, is labelled too. No timing is asserted, only structure.
"""

import collections

import pytest
import tensorflow as tf

from lingvo_pipe.core.layers import linear
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.schedules import schedule
from lingvo_pipe.pipeline.schedules.actions import ActionKind
from lingvo_pipe.pipeline.schedules.schedule import ScheduleKind
from lingvo_pipe.profiling import bubble
from lingvo_pipe.profiling import timeline
from lingvo_pipe.profiling.timeline import Phase

K, M = 2, 3


def _Profile(tmp_path, kind: ScheduleKind, jit: gpipe.CellCompilation):
  """The intervals of one profiled training step, and the schedule's actions
  (None for fill-drain)."""
  layers = [linear.ProjectionLayer.Params().Set(
      name=f'p{i}', input_dim=16, output_dim=16, activation=linear.Activation.RELU)
            for i in range(4)]
  pipe = gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, num_partitions=K, num_micro_batches=M,
      input_shapes=[[6, 16]], remat=gpipe.RematPolicy.PER_CELL, jit_compile=jit,
      schedule=kind).Instantiate()
  x = tf.ones([6, 16])
  fill_drain = kind == ScheduleKind.GPIPE

  @tf.function(autograph=False)
  def Step():
    with tf.GradientTape() as tape:
      if fill_drain:
        loss = tf.reduce_sum(tf.square(pipe(x)))
      else:
        loss = pipe.FPropWithLoss(pipe.theta, lambda y: tf.reduce_sum(tf.square(y)), x)[0]
    return loss, tape.gradient(loss, pipe.trainable_variables)

  actions = None if fill_drain else schedule.Actions(kind, K, M)
  return timeline.ProfileIntervals(Step, str(tmp_path), schedule=actions), actions


def _CheckStructure(intervals, actions):
  """Every (cell, micro-batch) has one forward and one backward; each cell's
  phases follow its schedule (fill-drain: forwards 0..M-1, backwards
  M-1..0); a micro-batch's backward starts after its forward ends; the
  bubble is in [0, 1)."""
  found = collections.Counter((i.cell, i.micro_batch, i.phase) for i in intervals
                              if i.phase in (Phase.FORWARD, Phase.BACKWARD))
  assert set(found) == {(k, m, p) for k in range(K) for m in range(M)
                        for p in (Phase.FORWARD, Phase.BACKWARD)}
  assert set(found.values()) == {1}
  assert len({i.device for i in intervals}) == K
  for k in range(K):
    mine = sorted((i for i in intervals if i.cell == k and
                   i.phase in (Phase.FORWARD, Phase.BACKWARD)), key=lambda i: i.start_us)
    if actions is None:
      expected = ([(Phase.FORWARD, m) for m in range(M)] +
                  [(Phase.BACKWARD, m) for m in reversed(range(M))])
    else:
      expected = [(Phase.FORWARD if a.kind == ActionKind.F else Phase.BACKWARD, a.micro)
                  for a in actions.devices[k] if a.kind != ActionKind.W]
    assert [(i.phase, i.micro_batch) for i in mine] == expected
    for m in range(M):
      forward, backward = (next(i for i in mine if (i.phase, i.micro_batch) == (p, m))
                           for p in (Phase.FORWARD, Phase.BACKWARD))
      assert forward.start_us <= forward.end_us <= backward.start_us <= backward.end_us
  assert 0 <= bubble.BubbleFraction(intervals) < 1


@pytest.mark.parametrize('kind', [ScheduleKind.GPIPE, ScheduleKind.ONE_F_ONE_B])
def test_compiled_cells(tmp_path, kind):
  intervals, actions = _Profile(tmp_path, kind, gpipe.CellCompilation.XLA)
  _CheckStructure(intervals, actions)
  # The recomputation runs inside the compiled gradient: no RECOMPUTE.
  assert all(i.phase != Phase.RECOMPUTE for i in intervals)


def test_one_f_one_b_keeps_every_micro_batch_of_the_last_cell(tmp_path):
  """Uncompiled 1F1B: the last cell keeps all M micro-batches, each its own
  kept forward and backward scope; the first cell recomputes."""
  intervals, actions = _Profile(tmp_path, ScheduleKind.ONE_F_ONE_B,
                              gpipe.CellCompilation.NONE)
  _CheckStructure(intervals, actions)
  recomputed = {(i.cell, i.micro_batch) for i in intervals if i.phase == Phase.RECOMPUTE}
  assert {k for k, _ in recomputed} == {0}
