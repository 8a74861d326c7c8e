"""Choosing among the planner's predictions: the recommendation, the
override that sets it, the table that shows the candidates, and the
largest stack that fits (the GPipe paper's Table 1)."""

from typing import Any, Callable, List, Optional, Sequence

from lingvo_pipe.core import hyperparams
from lingvo_pipe.pipeline.lowering.remat import RematPolicy
from lingvo_pipe.planning import planner


def Override(row: planner.PlanRow) -> str:
  """The pipeline params of the row as an override takes them:
  'num_partitions=4; num_micro_batches=8; remat=PER_CELL; schedule=INTERLEAVED;
  cells_per_device=2' (cells_per_device only where it is not 1)."""
  items = [f'num_partitions={row.num_devices * row.cells_per_device}',
           f'num_micro_batches={row.num_micro_batches}', f'remat={row.remat.name}',
           f'schedule={row.schedule_kind.name}']
  if row.cells_per_device != 1:
    items.append(f'cells_per_device={row.cells_per_device}')
  return '; '.join(items)


def Recommend(rows: Sequence[planner.PlanRow]) -> Optional[planner.PlanRow]:
  """The fitting row with the smallest step time (ties: less memory), or
  None if no row fits."""
  fitting = [r for r in rows if r.fits]
  if not fitting:
    return None
  return min(fitting, key=lambda r: (r.relative_step_time, r.max_peak_bytes))


def FormatTable(rows: Sequence[planner.PlanRow]) -> str:
  """A text table of the rows, step time as a multiple of the fastest row's;
  the recommendation is marked with '*'. K counts devices, v the cells per
  device (cells_per_device), the schedule is named as an override takes it;
  per row the figures are the device with the largest peak's."""
  best = Recommend(rows)
  fastest = min((r.relative_step_time for r in rows), default=0.0) or 1.0
  lines = [f'  {"K":>3} {"v":>2} {"M":>3} {"remat":<9} {"schedule":<11} {"params MiB":>10} '
           f'{"state MiB":>10} {"act MiB":>10} {"peak MiB":>10} '
           f'{"total MiB":>10} {"bubble":>7} {"time x":>7}  fits']
  for r in rows:
    k = r.peak_bytes.index(r.max_peak_bytes)  # the device with the peak
    mib = [b / 2**20 for b in (r.param_bytes[k], r.state_bytes[k], r.act_bytes[k],
                               r.peak_bytes[k], r.total_peak_bytes)]
    lines.append(
        f'{"*" if r is best else " "} {r.num_devices:>3} {r.cells_per_device:>2} '
        f'{r.num_micro_batches:>3} {r.remat.name:<9} {r.schedule_kind.name:<11} '
        f'{"".join(f"{x:>10.1f} " for x in mib)}'
        f'{r.bubble:>7.1%} '
        f'{r.relative_step_time / fastest:>7.2f}  {"yes" if r.fits else "no"}')
  if best is None:
    lines.append('  No candidate fits the budget.')
  return '\n'.join(lines)


def LargestFittingStack(make_layers: Callable[[int], List[hyperparams.Params]],
                        input_shapes: Sequence[Any], budget_bytes: int,
                        num_cells: int, num_micro_batches: int,
                        remat: RematPolicy, optimizer_slots: int = 0,
                        batch_dim: int = 0, max_layers: int = 4096) -> int:
  """The largest L in [num_cells, max_layers] whose predicted per-device
  peak fits the budget, 0 if none does (the paper's Table 1).

  Searches by doubling then bisection, so it assumes the peak grows with L.

  Args:
    make_layers: returns the params of a stack of L layers.
    max_layers: the search stops there.
    Others: as for planner.Estimate.

  Raises:
    ValueError: if budget_bytes <= 0 or max_layers < num_cells, or as
      planner.Estimate for other bad values.
  """
  if budget_bytes <= 0 or max_layers < num_cells:
    raise ValueError(f'budget_bytes ({budget_bytes}) must be > 0 and '
                     f'max_layers ({max_layers}) >= num_cells ({num_cells}).')

  def Fits(num_layers: int) -> bool:
    row = planner.Estimate(make_layers(num_layers), input_shapes, num_cells,
                   num_micro_batches, remat, optimizer_slots, batch_dim)
    return row.max_peak_bytes <= budget_bytes

  if not Fits(num_cells):
    return 0
  good, bad = num_cells, None
  while bad is None:
    trial = min(2 * good, max_layers)
    if trial == good:
      return good
    if Fits(trial):
      good = trial
    else:
      bad = trial
  while bad - good > 1:
    mid = (good + bad) // 2
    good, bad = (mid, bad) if Fits(mid) else (good, mid)
  return good
