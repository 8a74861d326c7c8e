"""A user's own experiment module: lm.StdlibBytesTiny with layer_3 renamed.

Imported before the trainer binary runs (`python -c "import ...; from
trainer import trainer; trainer.Run()" --model=TinyRenamedLayer ...`), as a
user registers experiments of their own; its checkpoints name the last
Transformer layer `block_3`.
"""

from lingvo_pipe import model_registry
from lingvo_pipe.core import hyperparams
from lingvo_pipe.tasks.lm import layers as lm_layers
from model_params import lm


class RenamedStack(lm_layers.GPipeTransformerStack):
  """The stack with its layer_3 named block_3."""

  @classmethod
  def PipelineParams(cls, p: hyperparams.Params) -> hyperparams.Params:
    out = super().PipelineParams(p)
    for layer in out.layers:
      if layer.name == 'layer_3':
        layer.name = 'block_3'
    return out


@model_registry.RegisterExperiment
class TinyRenamedLayer(lm.StdlibBytesTiny):
  """StdlibBytesTiny, 4 layers, the last one named block_3."""

  def Task(self) -> hyperparams.Params:
    p = super().Task()
    stack = RenamedStack.Params()
    for name, value in p.stack.IterParams():
      if name != 'cls':
        stack.Set(**{name: value})
    p.stack = stack.Set(num_layers=4)
    return p
