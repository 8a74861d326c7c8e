"""trial: a few training steps of one layout, as a trainer would run them."""

import tensorflow as tf

from lingvo_pipe.core.layers import dropout
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.planning import trial


def test_each_step_draws_new_dropout_masks_as_in_training():
  """Step n draws the masks of step seed [n, 0] (a trainer's global step),
  not one constant mask for every step (Grappler folds the masks of a
  constant seed, so a trial would time and hold what training does not):
  the dropout-only pipeline's loss differs from step to step and repeats
  for a new runner."""
  layers = [dropout.DropoutLayer.Params().Set(name=f'drop{i}', keep_prob=0.5)
            for i in range(2)]
  p = gpipe.PipeliningLayer.Params().Set(name='pipe', layers=layers, num_partitions=2,
                                         num_micro_batches=2, input_shapes=[[4, 64]])
  x = [tf.ones([4, 64])]
  run = trial.TrainingSteps(p, x)
  losses = [run(1) for _ in range(3)]
  assert len(set(losses)) == 3, losses
  assert trial.TrainingSteps(p, x)(2) == losses[1]
