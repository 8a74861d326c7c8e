"""A translation task: a GPipe Transformer encoder-decoder and its metrics."""

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.tasks.lm import model as lm_model
from lingvo_pipe.tasks.mt import layers as mt_layers


class TranslationTask(base_layer.BaseLayer):
  """FProp(theta, batch) -> metrics (see lm_model.TokenMetrics) of the
  target given the source; batches come from ParallelTextInput."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('model', mt_layers.GPipeTransformerSeq2Seq.Params(),
             'The pipelined encoder-decoder.')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    self.CreateChild('model', self.params.model)

  def FProp(self, theta: NestedMap, batch: NestedMap) -> NestedMap:
    out = self.model.FProp(theta.model, batch.src_ids, batch.src_paddings,
                           batch.tgt_ids, batch.tgt_paddings, batch.labels)
    return lm_model.TokenMetrics(out, batch.labels)
