"""The pipeline's logical layers, and its cells as views of runs of them.

A PipeliningLayer owns its layers, in order, as the unpartitioned network
would: their variables are named by the layer's path in that network and
initialized from it, whatever the partition. A cell is a contiguous run of
those layers placed on one device; it owns nothing (CellView), so K, the
schedule and the replicas change no variable name, initial value or
checkpoint key.
"""

from typing import Any, List, Sequence, Tuple

import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import base_params
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.layers import dropout
from lingvo_pipe.core.nested_map import NestedMap
from lingvo_pipe.pipeline.layout import micro_batch
from lingvo_pipe.pipeline.layout import micro_batch_count
from lingvo_pipe.pipeline.layout import partition


class CellView(containers.SequentialLayer):
  """Cell k: applies its run of the pipeline's layers one after another.

  Its `sub` are the pipeline's own layer objects, not copies: it creates
  no variables, and its theta is NestedMap(sub=[the layers' thetas]),
  taken from the pipeline's theta by CellTheta.
  """

  def __init__(self, params: hyperparams.Params,
               layers: Sequence[base_layer.BaseLayer]) -> None:
    base_layer.BaseLayer.__init__(self, params)  # pylint: disable=non-parent-init-called
    self._child_names.append('sub')
    setattr(self, 'sub', list(layers))


def CellTheta(layers_theta: Sequence[NestedMap], indices: Sequence[int]) -> NestedMap:
  """A cell's theta from the pipeline's per-layer thetas."""
  return NestedMap(sub=[layers_theta[i] for i in indices])


def LogicalLayers(p: hyperparams.Params
                  ) -> Tuple[List[hyperparams.Params], List[List[int]]]:
  """The params of the pipeline's layers, in order, with the base params
  (dtype, fprop_dtype...) they inherit when built, and per cell the
  indices of its layers.

  From p.layers the cells are the partition's (num_partitions or splits).
  From p.cell_tpl a SequentialLayer cell contributes its sublayers, any
  other cell is one layer.
  """
  if p.cell_tpl and p.layers:
    raise ValueError(f'PipeliningLayer {p.name!r}: set either cell_tpl '
                     f'({len(p.cell_tpl)} cells) or layers ({len(p.layers)} '
                     'layers), not both.')
  if p.cell_tpl:
    runs = [_CellLayers(k, cp, p) for k, cp in enumerate(p.cell_tpl)]
  elif p.layers:
    runs = [[_Inherited(lp, p) for lp in run] for run in _Partition(p)]
  else:
    raise ValueError(f'PipeliningLayer {p.name!r} has no cells: set cell_tpl '
                     'or layers (with num_partitions or splits).')
  layers: List[hyperparams.Params] = []
  indices: List[List[int]] = []
  for k, run in enumerate(runs):
    if not run:
      raise ValueError(f'PipeliningLayer {p.name!r}: cell {k} is empty; every '
                       'cell needs at least one layer.')
    indices.append(list(range(len(layers), len(layers) + len(run))))
    layers += run
  return layers, indices


def CellParams(p: hyperparams.Params) -> List[hyperparams.Params]:
  """Each cell as SequentialLayer params of its layers: what FPropMeta, the
  boundary checks and the planner read."""
  return CellParamsOf(p, *LogicalLayers(p))


def CellParamsOf(p: hyperparams.Params, layers: Sequence[hyperparams.Params],
                 indices: Sequence[Sequence[int]]) -> List[hyperparams.Params]:
  """CellParams from what LogicalLayers(p) returned."""
  return [_Inherited(containers.SequentialLayer.Params().Set(
      name=f'cell_{k}', sub=[layers[i] for i in run]), p)
          for k, run in enumerate(indices)]


def _Inherited(layer: hyperparams.Params, *parents: hyperparams.Params
               ) -> hyperparams.Params:
  """`layer` with the base params it takes from `parents` (innermost
  first) and passes on to its own sublayers."""
  out = layer.Copy()
  for parent in parents:
    base_params.InheritBaseParams(out, parent)
  return base_params.WithInheritedBaseParams(out)


def _CellLayers(k: int, cell: Any, p: hyperparams.Params) -> List[hyperparams.Params]:
  if not isinstance(cell, hyperparams.Params) or 'cls' not in cell:
    raise TypeError(f'PipeliningLayer {p.name!r}: cell_tpl[{k}] must be layer '
                    f'params, got {type(cell).__name__}.')
  if cell.cls is not containers.SequentialLayer:
    return [_Inherited(cell, p)]
  outer = cell.Copy()
  base_params.InheritBaseParams(outer, p)
  return [_Inherited(lp, outer) for lp in cell.sub]


def _Partition(p: hyperparams.Params) -> List[List[hyperparams.Params]]:
  layers = list(p.layers)
  if p.splits:
    splits = partition.CheckSplits(p.splits, len(layers))
    if p.num_partitions and p.num_partitions != len(splits) + 1:
      raise ValueError(f'splits {list(p.splits)} make {len(splits) + 1} cells '
                       f'but num_partitions is {p.num_partitions}.')
  else:
    if p.num_partitions < 1:
      raise ValueError(f'PipeliningLayer {p.name!r}: num_partitions '
                       f'({p.num_partitions}) must be >= 1 (or give splits).')
    if p.layer_costs and p.cost != partition.CostKind.GIVEN:
      raise ValueError(f'PipeliningLayer {p.name!r}: layer_costs are set but cost is '
                       f'{p.cost}; set cost=CostKind.GIVEN to balance them.')
    if p.input_shapes is None and p.cost != partition.CostKind.GIVEN:
      raise ValueError(f'PipeliningLayer {p.name!r}: the automatic partition '
                       'needs input_shapes (one shape per input, batch '
                       'included) to cost the layers; set p.input_shapes or '
                       'give p.splits.')
    costs = partition.LayerCosts(layers, p.input_shapes, p.cost, p.layer_costs,
                                 where=f'PipeliningLayer {p.name!r}: ')
    splits = partition.BalancedSplits(costs, p.num_partitions)
  return [list(run) for run in partition.SplitLayers(layers, splits)]


def CheckBoundaries(p: hyperparams.Params, contract: micro_batch.Contract,
                    cell_params: Sequence[hyperparams.Params]) -> None:
  """Checks M, and with p.input_shapes the cell boundaries (FPropMeta
  chained through the cells) and the micro-batch contract, before any
  cell is built: no summed output may change shape with the batch."""
  micro_batch_count.NumMicroBatches(p, None)
  if p.input_shapes is None:
    return
  inputs = layer_meta.Shapes(*p.input_shapes)
  batch = contract.InputLayout(inputs).batch_size
  num_micro = micro_batch_count.NumMicroBatches(p, batch, p.num_replicas) * p.num_replicas
  outputs = containers.AsTuple(_OutputShapes(cell_params, inputs))
  summed = contract.SummedOutputs(outputs)
  if num_micro == 1 or not any(summed):
    return
  micro = containers.AsTuple(_OutputShapes(cell_params, contract.SplitShapes(inputs, num_micro),
                                           f' at micro-batch shapes (the batch / {num_micro})'))
  for path, whole, one, s in zip(micro_batch.LeafPaths(outputs), tf.nest.flatten(outputs),
                                 tf.nest.flatten(micro), summed):
    if s and whole != one:
      raise ValueError(
          f'PipeliningLayer {p.name!r}: summed output {path!r} has shape {one} in a '
          f'micro-batch of {batch // num_micro} and {whole} in the batch of {batch}: it '
          'carries the batch, so summing it over micro-batches would add different '
          "examples' values. Leave it out of summed_outputs to concatenate it, or reduce "
          'it over the batch in the last cell.')


def _OutputShapes(cell_params: Sequence[hyperparams.Params], shapes: Any,
                  where: str = '') -> Any:
  """The last cell's output shapes: FPropMeta chained through the cells."""
  for k, cp in enumerate(cell_params):
    try:
      shapes = cp.cls.FPropMeta(cp, *shapes).out_shapes
    except (ValueError, TypeError) as e:
      given = f'the output of cell {k - 1}' if k else "the pipeline's inputs"
      raise ValueError(f'Cell {k} does not accept {given}{where} '
                       f'(shapes {[str(s) for s in shapes]}): {e}') from e
  return shapes


def CheckExampleAxes(p: hyperparams.Params, layers: Sequence[base_layer.BaseLayer]) -> None:
  """A time-major pipeline refuses dropouts that do not say which axis of
  their inputs indexes examples: drawn along time, their masks would change
  with M."""
  if p.batch_dim == 0:
    return
  unset = [path for layer in layers for path in dropout.UnsetExampleAxes(layer)]
  if unset:
    raise ValueError(
        f'PipeliningLayer {p.name!r} splits its batch along batch_dim={p.batch_dim}, but '
        f'DropoutLayers {unset} leave example_axis unset (read as 0: along time where '
        'their inputs are time-major, so their masks would change with M): set their '
        'example_axis to 1 where their inputs are time-major, 0 where a cell made them '
        'batch-major.')
