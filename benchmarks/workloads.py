"""The standard benchmark workloads (docs/workloads.md) as layer params."""

import dataclasses
from typing import List

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.layers import linear
from lingvo_pipe.core.layers import normalization
from lingvo_pipe.core.layers import transformer


@dataclasses.dataclass(frozen=True)
class Workload:
  name: str
  num_layers: int
  dim: int
  hidden: int
  heads: int
  batch: int
  seq: int

  @property
  def input_shape(self) -> List[int]:
    return [self.batch, self.dim] if not self.seq else [self.batch, self.seq, self.dim]


WORKLOADS = {
    'ffn': Workload('ffn', 16, 512, 2048, 0, 64, 0),
    'transformer': Workload('transformer', 8, 256, 1024, 4, 16, 64),
    'transformer-act': Workload('transformer-act', 8, 256, 1024, 4, 32, 256),
}


def Layers(w: Workload) -> List[hyperparams.Params]:
  """The L layers of a workload (fp32)."""
  if w.name == 'ffn':
    return [containers.ResidualLayer.Params().Set(
        name=f'ffn_{i}', body=containers.SequentialLayer.Params().Set(sub=[
            normalization.LayerNorm.Params().Set(name='ln', input_dim=w.dim),
            linear.FeedForwardLayer.Params().Set(name='ff', input_dim=w.dim,
                                                 hidden_dim=w.hidden)]))
            for i in range(w.num_layers)]
  return [transformer.TransformerEncoderLayer.Params().Set(
      name=f'layer_{i}', input_dim=w.dim, num_heads=w.heads, atten_hidden_dim=w.dim,
      hidden_dim=w.hidden) for i in range(w.num_layers)]
