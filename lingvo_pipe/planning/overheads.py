"""What a pipelined step costs beyond its layers, measured on this machine.

A pipeline of two cells of one 8 x 8 projection each (nothing to
compute) runs fill-drain training steps (planning/trial.py) at M=1 and
M=8 unrolled, and at M=8 as a loop per device. Fill-drain at K=2 runs 4M
actions (each cell's F and B per micro-batch); the unrolled step's
seconds grow with M by `action_s` per action, what is left at M=1 is
`step_s` (the call, the loss, the update); a loop's iteration (one per
action: lowering/loop_tables) costs `loop_action_s`.
"""

import dataclasses
from typing import Sequence

import tensorflow as tf

from lingvo_pipe.core.layers import linear
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.planning import trial

_MICRO = 8  # micro-batches of the longer steps
_ACTIONS_PER_MICRO = 4  # K=2 fill-drain: F and B of both cells


@dataclasses.dataclass(frozen=True)
class Overheads:
  """Seconds a step costs beyond its actions' layers."""
  step_s: float = 0.0
  action_s: float = 0.0
  loop_action_s: float = 0.0


def Measure(devices: Sequence[str]) -> Overheads:
  """The overheads of a two-cell pipeline on devices[:2] (module docstring)."""
  if len(devices) < 2:
    raise ValueError(f'Measuring the overheads needs two devices, got {list(devices)}.')
  layers = [linear.ProjectionLayer.Params().Set(name=f'p{i}', input_dim=8, output_dim=8)
            for i in range(2)]
  base = gpipe.PipeliningLayer.Params().Set(
      name='overheads', layers=layers, num_partitions=2, input_shapes=[[_MICRO, 8]],
      devices=list(devices[:2]), remat=gpipe.RematPolicy.PER_CELL)
  x = [tf.ones([_MICRO, 8])]

  steps = [base.Copy().Set(num_micro_batches=m, loop_min_micro_batches=2 if loop else 0)
           for m, loop in ((1, False), (_MICRO, False), (_MICRO, True))]
  one, unrolled, looped = (seconds for seconds, _ in trial.Run(steps, x))
  action = max(unrolled - one, 0.0) / (_ACTIONS_PER_MICRO * (_MICRO - 1))
  step = max(one - _ACTIONS_PER_MICRO * action, 0.0)
  loop_action = max(looped - step, 0.0) / (_ACTIONS_PER_MICRO * _MICRO)
  return Overheads(step, action, loop_action)
