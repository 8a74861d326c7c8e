"""inspect_model counts the experiment's optimizer slots and takes the
planner's budget from --planner_budget_mb."""

import pytest
import tensorflow as tf

from lingvo_pipe import base_experiment
from tests.trainer import in_process
from trainer import inspection
from trainer import optimizers


@pytest.mark.parametrize('kind', list(base_experiment.OptimizerKind))
def test_optimizer_slots_are_those_the_trainer_s_optimizer_makes(kind):
  """Counted against TensorFlow: the slots the optimizer creates for one
  weight when it applies a gradient."""
  tp = base_experiment.TrainerParams().Set(optimizer=kind)
  opt = optimizers.Optimizer(tp, lambda: tf.constant(0.1))
  w = tf.Variable(tf.ones([3]))
  opt.apply_gradients([(tf.ones([3]), w)])
  slots = [opt.get_slot(w, name) for name in opt.get_slot_names()]
  assert inspection.OptimizerSlots(kind) == len([s for s in slots if s is not None])


def _InspectModel(*flags, check=True):
  return in_process.Run('--model=lm.StdlibBytesTiny',
                                 '--mode=inspect_model', *flags, check=check)


def test_budget_flag_and_adam_slots_reach_the_planner():
  out = _InspectModel('--planner_budget_mb=3').stdout
  assert 'budget 3 MiB per device, 2 optimizer slot(s)' in out  # Tiny trains with Adam
  assert 'schedule GPIPE' in out


def test_bad_budget_is_a_one_line_error():
  result = _InspectModel('--planner_budget_mb=0', check=False)
  assert result.returncode == 2 and 'Traceback' not in result.stderr
  assert ('error: --planner_budget_mb=0 must be > 0' in result.stderr), result.stderr
