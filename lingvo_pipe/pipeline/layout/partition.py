"""Balancing a sequence of L layers into K cells by cost, or by manual splits."""

import enum
import math
import numbers
from typing import Any, List, Sequence

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import layer_meta


class CostKind(enum.Enum):
  """Which per-layer cost the partitioner balances."""
  FLOPS = 'flops'
  PARAM_BYTES = 'param_bytes'
  ACT_BYTES = 'act_bytes'
  GIVEN = 'given'  # the user's own per layer, e.g. measured (planning/measured_costs)


def LayerCosts(layer_params: Sequence[hyperparams.Params],
               input_shapes: Sequence[Any],
               kind: CostKind = CostKind.FLOPS,
               given: Sequence[float] = (), where: str = '') -> List[float]:
  """The cost of each layer: `given` (CostKind.GIVEN), else from its
  FPropMeta, chaining output shapes into the next layer.

  Raises:
    ValueError: (after `where`, e.g. the layer) if given costs are not one
      positive finite number per layer.
  """
  if kind == CostKind.GIVEN:
    return CheckGivenCosts(given, len(layer_params), where)
  costs: List[float] = []
  shapes = layer_meta.Shapes(*input_shapes)
  for p in layer_params:
    meta: layer_meta.LayerMeta = p.cls.FPropMeta(p, *shapes)
    costs.append(getattr(meta, kind.value))
    shapes = meta.out_shapes
  return costs


def CheckGivenCosts(given: Sequence[float], num_layers: int, where: str = '') -> List[float]:
  """`given` as a list, if it is one positive finite cost per layer."""
  given = list(given)
  if len(given) != num_layers:
    raise ValueError(f'{where}cost=CostKind.GIVEN needs one cost per layer: layer_costs '
                     f'has {len(given)} for {num_layers} layers.')
  bad = [(i, c) for i, c in enumerate(given)
         if not isinstance(c, numbers.Real) or isinstance(c, bool) or not math.isfinite(c)
         or c <= 0]
  if bad:
    raise ValueError(f'{where}layer_costs[{bad[0][0]}] is {bad[0][1]!r}; every cost must be a '
                     'positive finite number (e.g. seconds measured by '
                     'planning.measured_costs.Measure).')
  return [float(c) for c in given]


def BalancedSplits(costs: Sequence[float], num_cells: int) -> List[int]:
  """Split points (exclusive end index of each cell but the last) that
  minimize the cost of the most expensive cell; every cell gets >= 1 layer.

  Raises:
    ValueError: if num_cells < 1 or there are fewer layers than cells.
  """
  n = len(costs)
  if num_cells < 1:
    raise ValueError(f'num_cells must be >= 1, got {num_cells}.')
  if n < num_cells:
    raise ValueError(f'Cannot split {n} layers into {num_cells} cells: each '
                     f'cell needs at least one layer; use at most {n} cells.')
  prefix = [0.0]
  for c in costs:
    prefix.append(prefix[-1] + c)
  inf = float('inf')
  # best[k][i]: minimal max-cell cost of the first i layers in k cells.
  best = [[inf] * (n + 1) for _ in range(num_cells + 1)]
  cut = [[0] * (n + 1) for _ in range(num_cells + 1)]
  best[0][0] = 0.0
  for k in range(1, num_cells + 1):
    for i in range(k, n - (num_cells - k) + 1):
      for j in range(k - 1, i):
        cost = max(best[k - 1][j], prefix[i] - prefix[j])
        if cost < best[k][i]:
          best[k][i], cut[k][i] = cost, j
  splits, i = [], n
  for k in range(num_cells, 1, -1):
    i = cut[k][i]
    splits.append(i)
  return sorted(splits)


def CheckSplits(splits: Sequence[int], num_layers: int) -> List[int]:
  """Validates manual split points such as [3, 7, 12] for 16 layers.

  Raises:
    ValueError: unless 0 < s_1 < s_2 < ... < num_layers.
  """
  splits = list(splits)
  bounds = [0] + splits + [num_layers]
  if any(a >= b for a, b in zip(bounds, bounds[1:])):
    raise ValueError(
        f'Split points {splits} for {num_layers} layers must be strictly '
        f'increasing and within (0, {num_layers}); every cell needs at least '
        'one layer.')
  return splits


def SplitLayers(layer_params: Sequence[Any],
                splits: Sequence[int]) -> List[List[Any]]:
  """Cuts the layer list at the split points into cells."""
  bounds = [0] + list(splits) + [len(layer_params)]
  return [list(layer_params[a:b]) for a, b in zip(bounds, bounds[1:])]
