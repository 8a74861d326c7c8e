"""The one lowering: what one step of a schedule runs, as both emissions run it.

`Lower` turns a schedule's actions for M micro-batches, the remat policy,
the number of replicas, the step (training with the loss inside or
outside the pipeline, or evaluation) and the emission (unrolled, or one
loop per device) into a Program: the actions in the order they are
emitted, the remat.Decision of every (cell, micro-batch) (is its forward
kept on a tape for its backward, does its backward recompute it, is it
split into I and W), the micro-batches each W multiplies, and where each
cell's REDUCE runs. It is the one place that knows schedule x remat x
emission: the executors, the loop's tables and the planner read a Program.

Where the two emissions differ, it is because a loop cannot do otherwise:

                      unrolled                         loop
  kept forward        an F whose own B or I is next    the last cell's such F's, with
                      on its device (PER_CELL, unless   the loss inside (forward, loss
                      remat_last); under NONE every F   and backward in one branch)
  other forwards      remat.Decide: recorded under      recomputed by their backward,
                      NONE                              under NONE too (no tape crosses
                                                        the loop's iterations)
  weight gradients    W's of a cell next to each other  one product per W
                      on a device: one product
  REDUCE (replicas)   after the cell's last B or W on   after the loops, the last
                      its device                        cell's first

A loop under NONE so keeps less than the unrolled step and recomputes
more: plan.LoopFromM never loops it unless asked, and the planner prices
the program the step runs.
"""

import dataclasses
import enum
import functools
from typing import Dict, FrozenSet, List, Mapping, Tuple

from lingvo_pipe.pipeline.lowering import remat
from lingvo_pipe.pipeline.schedules import actions
from lingvo_pipe.pipeline.schedules import simulate
from lingvo_pipe.pipeline.schedules.actions import Action, ActionKind


class Step(enum.Enum):
  """What a step computes."""
  LOSS_INSIDE = 'training, the loss inside the pipeline'  # FPropWithLoss
  LOSS_OUTSIDE = 'training, the loss outside the pipeline'  # FProp under a tape
  EVALUATION = 'evaluation'  # the forwards alone

  @property
  def training(self) -> bool:
    return self != Step.EVALUATION


class Emission(enum.Enum):
  """How a step is built into the graph."""
  UNROLLED = 'unrolled'  # every action's ops in the step's graph (executor)
  LOOP = 'loop'  # one tf.while_loop per device (loop_executor)


def EmissionOf(loop_min_micro_batches: int, num_micro: int) -> Emission:
  """LOOP from M = loop_min_micro_batches > 0 on (plan.LoopFromM), and
  only for M > 1 (with one micro-batch the unrolled step is as small)."""
  loops = 0 < loop_min_micro_batches <= num_micro and num_micro > 1
  return Emission.LOOP if loops else Emission.UNROLLED


@dataclasses.dataclass(frozen=True)
class Program:
  """One step of a schedule, lowered (module docstring).

  Attributes:
    schedule: the actions the step runs (evaluation: the forwards).
    step: what the step computes.
    emission: how it is built.
    policy: the remat policy it was lowered for.
    order: every action in the order the unrolled step emits them: by
      start clock with every action one clock, then device; with replicas
      each cell's REDUCE where it runs (a loop's after all the others).
    decisions: (cell, micro-batch) -> its remat.Decision (training only).
    loop_backwards: a loop's per cell the Decision of its traced backward,
      the one of every micro-batch that is not kept (else empty).
    weight_runs: (cell, micro-batch) of each W -> the micro-batches whose
      weight gradients it multiplies (none for a W after its run's first).
  """
  schedule: actions.Schedule
  step: Step
  emission: Emission
  policy: remat.RematPolicy
  order: Tuple[Action, ...]
  decisions: Mapping[Tuple[int, int], remat.Decision]
  loop_backwards: Tuple[remat.Decision, ...]
  weight_runs: Mapping[Tuple[int, int], Tuple[int, ...]]

  @property
  def kept(self) -> FrozenSet[Tuple[int, int]]:
    """(cell, micro-batch) of every forward kept on a tape for its backward."""
    return frozenset(key for key, d in self.decisions.items() if d.record)

  def CellDecisions(self, cell: int) -> List[remat.Decision]:
    """The decisions of `cell`'s micro-batches."""
    return [d for (c, _), d in self.decisions.items() if c == cell]

  def Splits(self, cell: int) -> bool:
    """Whether some backward of `cell` leaves its weight gradients to a W
    (remat.Decision.split; where none does, its W's compute nothing)."""
    return any(d.split for d in self.CellDecisions(cell))

  def KeepsAll(self, cell: int) -> bool:
    """Whether every forward of `cell` is kept on a tape for its backward."""
    return all(d.record for d in self.CellDecisions(cell))

  def DefersToStepEnd(self, cell: int) -> bool:
    """Whether every backward of `cell` defers its projections' weight
    gradients to one product per step (defer, not split into a W)."""
    return all(d.defer and not d.split for d in self.CellDecisions(cell))

  @property
  def reduces(self) -> Tuple[int, ...]:
    """The cells in the order their REDUCE runs (no replicas: none)."""
    return tuple(a.cell for a in self.order if a.kind == ActionKind.REDUCE)

  def RecomputeUnits(self, cell: int, micro: int) -> int:
    """How many forwards of the cell the backward of micro-batch `micro`
    runs again: 0 if kept, 2 per layer (each layer's forward once in the
    cell's recomputation, once in its own), else 1."""
    decision = self.decisions[(cell, micro)]
    return 0 if decision.record else 2 if decision.per_layer else 1

  def ForwardsFirst(self) -> bool:
    """Whether every device runs all its forwards before any backward, so
    the loss can be taken outside the pipeline (FProp's training)."""
    for row in self.schedule.devices:
      kinds = [a.kind == ActionKind.F for a in row]
      if False in kinds and True in kinds[kinds.index(False):]:
        return False
    return True


@functools.lru_cache(maxsize=256)
def Lower(schedule: actions.Schedule, policy: remat.RematPolicy,
          remat_last_micro_batch: bool, num_replicas: int, step: Step,
          emission: Emission) -> Program:
  """The Program of one step of `schedule` (module docstring).

  Raises:
    TypeError: if policy is not a RematPolicy.
  """
  if not isinstance(policy, remat.RematPolicy):
    raise TypeError(f'policy must be a RematPolicy, got {policy!r}.')
  order = _Order(actions.WithReduce(schedule) if num_replicas > 1 else schedule)
  if not step.training:
    forwards = actions.Schedule.Make(
        [[a for a in row if a.kind == ActionKind.F] for row in schedule.devices],
        schedule.cell_devices, schedule.num_micro_batches)
    return Program(forwards, step, emission, policy,
                   tuple(a for a in order if a.kind == ActionKind.F), {}, (), {})
  follows = _BackwardFollows(schedule)
  split = {(a.cell, a.micro) for _, _, a in schedule.Positions() if a.kind == ActionKind.I}
  num_micro = schedule.num_micro_batches
  decisions: Dict[Tuple[int, int], remat.Decision] = {}
  loop_backwards: Tuple[remat.Decision, ...] = ()
  if emission == Emission.UNROLLED:
    for (c, m) in _Forwards(schedule):
      decisions[(c, m)] = remat.Decide(policy, remat_last_micro_batch, m, num_micro,
                                       backward_follows=(c, m) in follows,
                                       split=(c, m) in split)
    weight_runs = _WeightRuns(schedule)
  else:
    last = schedule.num_cells - 1
    kept_decision = remat.Decide(policy, remat_last_micro_batch, 0, num_micro,
                                 backward_follows=True)
    keeps = step == Step.LOSS_INSIDE and kept_decision.record
    recompute = remat.Decision(record=False, inline=False,
                               per_layer=policy == remat.RematPolicy.PER_LAYER,
                               defer=policy == remat.RematPolicy.PER_CELL)
    loop_backwards = tuple(dataclasses.replace(recompute, split=recompute.defer and s)
                           for s in schedule.split_cells)
    for (c, m) in _Forwards(schedule):
      if keeps and c == last and (c, m) in follows:
        decisions[(c, m)] = dataclasses.replace(
            kept_decision, split=kept_decision.defer and schedule.split_cells[c])
      else:
        decisions[(c, m)] = loop_backwards[c]
    weight_runs = {(a.cell, a.micro): (a.micro,) for _, _, a in schedule.Positions()
                   if a.kind == ActionKind.W}
    reduces = [a for a in order if a.kind == ActionKind.REDUCE]
    order = tuple(a for a in order if a.kind != ActionKind.REDUCE) + tuple(
        sorted(reduces, key=lambda a: -a.cell))
  return Program(schedule, step, emission, policy, order, decisions, loop_backwards,
                 weight_runs)


def _Forwards(schedule: actions.Schedule) -> Tuple[Tuple[int, int], ...]:
  return tuple((a.cell, a.micro) for _, _, a in schedule.Positions()
               if a.kind == ActionKind.F)


def _BackwardFollows(schedule: actions.Schedule) -> FrozenSet[Tuple[int, int]]:
  """(cell, micro-batch) of every F whose own B or I is the next action on
  its device: keeping its activations costs no device's peak, since
  recomputing would restore them at once."""
  follows = set()
  for row in schedule.devices:
    for a, b in zip(row, row[1:]):
      if (a.kind == ActionKind.F and b.kind in actions.INPUT_BACKWARDS and
          (b.cell, b.micro) == (a.cell, a.micro)):
        follows.add((a.cell, a.micro))
  return frozenset(follows)


def _WeightRuns(schedule: actions.Schedule) -> Dict[Tuple[int, int], Tuple[int, ...]]:
  """Per (cell, micro-batch) of a W, the micro-batches whose weight
  gradients it computes: a run of W's of one cell next to each other on a
  device is one product of their factors (one addition into each weight's
  accumulator instead of one per W), which the run's first W computes,
  the others none. Every I of a run comes before its first W."""
  runs: Dict[Tuple[int, int], Tuple[int, ...]] = {}
  for row in schedule.devices:
    start = None
    for a in row:
      if a.kind != ActionKind.W:
        start = None
      elif start is not None and start.cell == a.cell:
        runs[(start.cell, start.micro)] += (a.micro,)
        runs[(a.cell, a.micro)] = ()
      else:
        start = a
        runs[(a.cell, a.micro)] = (a.micro,)
  return runs


def _Order(schedule: actions.Schedule) -> Tuple[Action, ...]:
  timeline = simulate.Simulate(schedule, simulate.UNIT_COSTS).timeline
  timed = sorted((t for row in timeline for t in row), key=lambda t: (t.start, t.device))
  return tuple(t.action for t in timed)
