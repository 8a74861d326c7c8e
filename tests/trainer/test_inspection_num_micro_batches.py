"""inspect_model prints the M the pipeline runs, from num_micro_batches or
micro_batch_size, and the bubble (K-1)/(M+K-1) of that M."""

import re

import pytest

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.layers import linear
from lingvo_pipe.pipeline import gpipe
from trainer import inspection


def _Task(**pipeline):
  layers = [linear.ProjectionLayer.Params().Set(name=f'p{i}', input_dim=64, output_dim=64)
            for i in range(4)]
  task = hyperparams.Params()
  task.Define('pipeline', gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, **pipeline), '')
  return task


def _Header(text):
  """(K, M, bubble) of the pipeline's first line."""
  m = re.search(r'K=(\d+) cells, M=(\S+) micro-batches, remat \w+, schedule \w+, bubble (.*)$', text, re.M)
  return int(m[1]), m[2], m[3]


@pytest.mark.parametrize('pipeline,k,m,bubble', [
    (dict(num_micro_batches=4), 2, 4, '20.0%'),
    (dict(micro_batch_size=4), 2, 4, '20.0%'),  # num_micro_batches stays 1
    (dict(micro_batch_size=8, num_micro_batches=4), 4, 2, '60.0%'),
    (dict(micro_batch_size=16), 4, 1, '75.0%'),
])
def test_header_m_and_bubble(pipeline, k, m, bubble):
  """Batch 16; the planner's table is centred on the same M."""
  text = inspection.ModelPlan(_Task(num_partitions=k, input_shapes=[[16, 64]], **pipeline))
  assert _Header(text) == (k, str(m), bubble)
  planner_ms = {int(r[1]) for r in re.finditer(r'^[* ] +\d+ +\d+ +(\d+) (?:NONE|PER_CELL|PER_LAYER) ',
                                                text, re.M)}
  assert planner_ms == {max(m // 2, 1), m, 2 * m}


def test_micro_batch_size_without_input_shapes():
  text = inspection.ModelPlan(_Task(splits=[2], micro_batch_size=4))
  assert _Header(text) == (2, '?', 'unknown (micro_batch_size needs input_shapes)')
