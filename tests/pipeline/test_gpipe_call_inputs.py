"""Cell calls get no inputs that Grappler can fold into constants.

Grappler specializes a called function for each distinct constant input,
so a per-micro-batch constant (such as the step seed of micro-batch m derived
from a constant step seed) would give each of the K*M calls its own copy of
the cell's function, and the first step would grow with K*M. The zeros that
TensorFlow feeds a derived backward for each intermediate, when more than
one tape watches a recorded call, are such constants too.
"""

import pytest
import tensorflow as tf

from lingvo_pipe.pipeline import gpipe

from tests.pipeline import pipeline_models as models

# Ops that Grappler's constant folding never replaces by a constant.
_RUNTIME_VALUES = ('Placeholder', 'PlaceholderWithDefault')


def _Foldable(tensor: tf.Tensor) -> bool:
  """Whether `tensor` is computed from constants only, through stateless ops."""
  op = tensor.op
  if op.type == 'Const':
    return True
  if op.type in _RUNTIME_VALUES or op.op_def.is_stateful or not op.inputs:
    return False
  return all(_Foldable(x) for x in op.inputs)


# RematPolicy.NONE inlines every forward and backward: no cell calls.
@pytest.mark.parametrize('remat', [gpipe.RematPolicy.PER_CELL, gpipe.RematPolicy.PER_LAYER])
def test_no_cell_call_has_a_constant_input(remat):
  layers, shape = models.FfnLayers()  # with dropout: per-micro-batch seeds
  pipe = models.Pipeline(layers, shape, 2, 4, remat=remat)
  step = models.TrainStep(pipe, step=3)  # a constant step seed
  graph = step.get_concrete_function(tf.TensorSpec(shape)).graph
  calls = [op for op in graph.get_operations()
           if op.type in ('PartitionedCall', 'StatefulPartitionedCall')
           and 'cell_' in op.get_attr('f').name]
  assert calls
  for op in calls:
    folded = [x.name for x in op.inputs if _Foldable(x)]
    assert not folded, (op.name, op.get_attr('f').name, folded)
