"""AmoebaNet-D: structure, metadata, and the pipelined classifier equals its
layers applied per micro-batch."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core.layers import containers
from lingvo_pipe.tasks.image import amoebanet
from lingvo_pipe.tasks.image import layers as image_layers

from tests import transparency
from tests.pipeline import pipeline_models as models

SHAPE = [8, 16, 16, 3]


def _Classifier(k, m, n=1, filters=16):
  p = image_layers.GPipeConvNetClassifier.Params().Set(
      name='amoeba', layers=amoebanet.AmoebaNetDLayers(n, filters, 10),
      num_classes=10, input_shape=SHAPE)
  p.pipeline.Set(num_partitions=k, num_micro_batches=m)
  return p.Instantiate()


def test_layer_sequence_and_shapes():
  layers = amoebanet.AmoebaNetDLayers(2, 16, 10)
  assert [l.name for l in layers] == [
      'stem', 'stack0_normal0', 'stack0_normal1', 'stack1_reduction',
      'stack1_normal1', 'stack1_normal2', 'stack2_reduction', 'stack2_normal1',
      'stack2_normal2', 'head']
  meta = containers.ChainMeta(layers, (SHAPE,))
  assert meta.out_shapes == (tf.TensorShape([8, 10]),)
  net = containers.SequentialLayer.Params().Set(name='net', sub=layers).Instantiate()
  assert net(tf.zeros(SHAPE)).shape == (8, 10)
  params = sum(int(np.prod(v.shape)) for v in net.variables)  # incl. BN averages
  assert meta.param_bytes == 4 * params


def test_reduction_cell_halves_and_concats():
  cell = amoebanet.AmoebaCell.Params().Set(
      name='cell', channels_prev_prev=8, channels_prev=8, channels=8,
      reduction=True).Instantiate()
  new, skip = cell(tf.ones([2, 8, 8, 8]), tf.ones([2, 8, 8, 8]))
  assert new.shape == (2, 4, 4, 8 * len(amoebanet.REDUCTION_CONCAT))
  assert skip.shape == (2, 8, 8, 8)


def test_bad_sizes():
  with pytest.raises(ValueError, match='multiple of 4; got 1, 10'):
    amoebanet.AmoebaNetDLayers(1, 10, 10)


# Seven layers (stem, 5 cells, head), 8 examples.
@pytest.mark.parametrize('k,m', models.KMGrid(ks=(1, 3, 5), ms=(1, 2, 4)))
def test_pipelined_amoebanet_is_transparent(k, m):
  net = _Classifier(k, m)
  assert net.pipeline.num_cells == k
  images = tf.random.stateless_normal(SHAPE, [k, m])
  labels = tf.random.stateless_uniform([SHAPE[0]], [k, 1], 0, 10, tf.int32)
  transparency.CheckTransparent(net.pipeline, (images,), m,
                                loss_fn=models.ClassifierLoss(labels, 10, 0.0))
