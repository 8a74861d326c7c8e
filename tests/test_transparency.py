"""The transparency check fails on partition bugs that a reference built
from the pipeline's own cells would share, and passes on correct cell_tpl
pipelines."""

import pytest
import tensorflow as tf

from lingvo_pipe.core.layers import containers
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.layout import partition

from tests import transparency
from tests.pipeline import pipeline_models as models


def _BrokenPartition(monkeypatch, edit):
  """Makes the automatic partition pass its cells' layer lists through
  `edit` (a partition bug), then builds the FFN pipeline (K=2, M=2)."""
  original = partition.SplitLayers
  monkeypatch.setattr(partition, 'SplitLayers',
                      lambda layers, splits: edit(original(layers, splits)))
  layers, shape = models.FfnLayers()
  pipe = models.Pipeline(layers, shape, 2, 2)
  return pipe, (tf.random.stateless_normal(shape, [1, 2]),)


def test_a_dropped_layer_fails(monkeypatch):
  pipe, inputs = _BrokenPartition(monkeypatch, lambda cells: [cells[0][:-1]] + cells[1:])
  with pytest.raises(AssertionError, match="0 layers named 'res1'"):
    transparency.CheckTransparent(pipe, inputs, 2)


def test_a_duplicated_layer_fails(monkeypatch):
  pipe, inputs = _BrokenPartition(
      monkeypatch, lambda cells: [cells[0], [cells[0][-1]] + cells[1]])
  # Two layers of one name: the pipeline names both by their place instead.
  with pytest.raises(AssertionError, match="0 layers named 'res1'"):
    transparency.CheckTransparent(pipe, inputs, 2)


def test_reordered_layers_fail(monkeypatch):
  pipe, inputs = _BrokenPartition(
      monkeypatch, lambda cells: [cells[0][1::-1] + cells[0][2:]] + cells[1:])
  assert [l.params.name for l in pipe.cells[0].sub][:2] == ['res1', 'res0']
  with pytest.raises(AssertionError, match='outputs'):
    transparency.CheckTransparent(pipe, inputs, 2)


class _SkipsItsSecondLayer(containers.SequentialLayer):
  """A cell that holds all its layers but does not apply the second."""

  def FPropWithUpdates(self, theta, *inputs):
    out, updates = self.sub[0].FPropWithUpdates(theta.sub[0], *inputs)
    for layer, layer_theta in list(zip(self.sub, theta.sub))[2:]:
      out, _ = layer.FPropWithUpdates(layer_theta, out)
    return out, updates


def _CellTplPipeline(cell_cls, **kwargs):
  layers, shape = models.FfnLayers(keep_prob=0.7)
  cells = [cell_cls.Params().Set(name=f'c{k}', sub=layers[2 * k:2 * k + 2])
           for k in range(2)]
  pipe = gpipe.PipeliningLayer.Params().Set(
      name='pipe', cell_tpl=cells, num_micro_batches=4, input_shapes=[shape],
      **kwargs).Instantiate()
  return pipe, (tf.random.stateless_normal(shape, [3, 4]),)


def test_a_cell_that_skips_a_layer_fails():
  pipe, inputs = _CellTplPipeline(_SkipsItsSecondLayer)
  with pytest.raises(AssertionError, match='outputs'):
    transparency.CheckTransparent(pipe, inputs, 4)


def test_cell_tpl_pipeline_with_a_random_seed_is_transparent(monkeypatch):
  """The pipeline passes its random_seed down to its dropout masks, and so
  does the reference; one that did not would draw other masks (the
  weights are copied, so only the masks can differ)."""
  pipe, inputs = _CellTplPipeline(containers.SequentialLayer, random_seed=5)
  transparency.CheckTransparent(pipe, inputs, 4)
  monkeypatch.setattr(transparency, '_INHERITED', tuple(
      k for k in transparency._INHERITED if k != 'random_seed'))
  with pytest.raises(AssertionError, match='outputs'):
    transparency.CheckTransparent(pipe, inputs, 4)
