"""Building blocks of pipelined models: CarryLayer and PipelinedModel.

A layer of a pipelined stack maps a tuple to a tuple: CarryLayer applies a
layer to the leading tensors and carries the rest (paddings, labels) along,
so any partition into cells works. PipelinedModel owns one PipeliningLayer
built from its params.
"""

import dataclasses
from typing import Any, List, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import base_params
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline import gpipe


class CarryLayer(base_layer.BaseLayer):
  """Applies `body` to the first `num_body_inputs` inputs; the body's
  outputs replace the first `num_replaced_inputs` inputs and all other
  inputs pass through unchanged."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('body', None, 'Params of the wrapped layer.')
    p.Define('num_body_inputs', 1, 'How many leading inputs the body takes.')
    p.Define('num_replaced_inputs', 1, 'How many leading inputs the body\'s '
             'outputs replace.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    p = self.params
    if p.body is None or p.num_body_inputs < 1 or p.num_replaced_inputs < 0:
      raise ValueError(f'CarryLayer {p.name!r} needs p.body, num_body_inputs '
                       f'>= 1 and num_replaced_inputs >= 0 (got '
                       f'{p.num_body_inputs}, {p.num_replaced_inputs}).')
    self.CreateChild('body', p.body)

  def FProp(self, theta: NestedMap, *inputs: Any) -> tuple:
    return self.FPropWithUpdates(theta, *inputs)[0]

  def FPropWithUpdates(self, theta: NestedMap, *inputs: Any) -> Tuple[tuple, NestedMap]:
    p = self.params
    out, updates = self.body.FPropWithUpdates(theta.body, *inputs[:p.num_body_inputs])
    return containers.AsTuple(out) + tuple(inputs[p.num_replaced_inputs:]), NestedMap(body=updates)

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, *input_shapes: Any) -> layer_meta.LayerMeta:
    body = params.body.cls.FPropMeta(params.body, *input_shapes[:params.num_body_inputs])
    rest = tuple(tf.TensorShape(s) for s in input_shapes[params.num_replaced_inputs:])
    return dataclasses.replace(body, out_shapes=tuple(body.out_shapes) + rest)


class PipelinedModel(base_layer.BaseLayer):
  """A model whose layers run in one PipeliningLayer child, 'pipeline',
  built from the classmethod PipelineParams(params); PipelineInputShapes
  says which of its FProp's inputs the pipeline takes (the others, such
  as labels, reach only the loss), OutputShapes what its FProp makes of
  the pipeline's outputs."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('pipeline', gpipe.PipeliningLayer.Params(), 'PipeliningLayer '
             'params: num_partitions or splits, num_micro_batches, remat, '
             'devices. Its layers and input shapes are filled in by '
             'PipelineParams.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    self.CreateChild('pipeline', self.PipelineParams(self.params))

  @classmethod
  def PipelineParams(cls, p: hyperparams.Params) -> hyperparams.Params:
    raise NotImplementedError(f'{cls.__name__} must define PipelineParams.')

  @classmethod
  def PipelineInputShapes(cls, *input_shapes: Any) -> tuple:
    """The shapes of the pipeline's inputs from those of FProp's: all."""
    return input_shapes

  @classmethod
  def OutputShapes(cls, *pipeline_shapes: tf.TensorShape) -> NestedMap:
    """The shapes of FProp's outputs from those of the pipeline's."""
    raise NotImplementedError(f'{cls.__name__} must define OutputShapes: the '
                              f'shapes of its FProp\'s outputs from the pipeline\'s '
                              f'{pipeline_shapes}.')

  @classmethod
  def FPropMeta(cls, params: hyperparams.Params, *input_shapes: Any) -> layer_meta.LayerMeta:
    """The pipeline's costs, with FProp's output shapes."""
    pp = cls.PipelineParams(params)
    base_params.InheritBaseParams(pp, params)
    meta = pp.cls.FPropMeta(pp, *cls.PipelineInputShapes(*input_shapes))
    return dataclasses.replace(meta, out_shapes=(cls.OutputShapes(*meta.out_shapes),))


def UpdatesOutsidePipelines(layer: base_layer.BaseLayer) -> List[str]:
  """The paths of the layers in `layer` (itself included) with statistics
  to update in training (batch norm's moving averages) that no
  PipeliningLayer holds: only a pipeline applies them."""
  outside = layer.Walk(enter=lambda l: not isinstance(l, gpipe.PipeliningLayer))
  return [l.path for l in outside if l.HAS_OWN_UPDATES]
