"""The text form of a schedule: one line per device, PyTorch pipelining's action notation.

Each line lists one device's actions in order, `<cell><kind><micro-batch>`:
`0F0` (forward), `2B3` (backward), `1I0` and `1W0` (input and weight
gradient), `0REDUCE_GRAD` (no micro-batch). This is the notation and the
CSV layout (one row per rank, one action per field, empty fields for idle
steps) that PyTorch's `torch.distributed.pipelining` loads and dumps for
its schedules, so a schedule written for one runs in the other. K=2, M=2
under 1F1B:

    0F0,0F1,0B0,0B1
    1F0,1B0,1F1,1B1

`Format` writes that CSV; `Parse` also takes ';' between lines (for
command lines: `0F0,0F1,0B0,0B1;1F0,1B0,1F1,1B1`), spaces between actions, skips
empty fields (idle steps), and ignores `#` comments and blank lines (so
every device runs at least one action). Cells are
placed on the device whose line names them first, unless cell_devices
says otherwise. Parsing checks only the notation; `validate.Validate`
checks that the schedule can run.
"""

import re
from typing import List, Optional, Sequence

from lingvo_pipe.pipeline.schedules import actions

_TOKEN = re.compile(r'(\d+)(F|B|I|W|REDUCE_GRAD)(\d*)')
# PyTorch action types that its lowering passes add; ours are the executor's.
_LOWERED = ('SEND_F', 'RECV_F', 'SEND_B', 'RECV_B', 'UNSHARD', 'RESHARD',
            'OVERLAP_F_B')


def ParseAction(token: str) -> actions.Action:
  """One action from its text, e.g. '1I0' or '0REDUCE_GRAD'.

  Raises:
    ValueError: naming the token and the notation it should follow.
  """
  match = _TOKEN.fullmatch(token.strip())
  if match is None:
    lowered = [t for t in _LOWERED if t in token]
    hint = (f' ({lowered[0]} is added by the executor, not written in a '
            'schedule)' if lowered else '')
    raise ValueError(f'{token!r} is not an action{hint}: write <cell><kind>'
                     '<micro-batch> with kind F, B, I or W (e.g. 0F0, 1I0, '
                     '2B3), or <cell>REDUCE_GRAD.')
  cell, kind, micro = match.groups()
  if kind == 'REDUCE_GRAD':
    if micro:
      raise ValueError(f'{token!r}: REDUCE_GRAD reduces a cell over all '
                       f'micro-batches; write {cell}REDUCE_GRAD.')
    return actions.Reduce(int(cell))
  if not micro:
    raise ValueError(f'{token!r} has no micro-batch: write e.g. {cell}{kind}0.')
  return actions.Action(actions.ActionKind(kind), int(cell), int(micro))


def Parse(text: str, cell_devices: Optional[Sequence[int]] = None,
          num_micro_batches: Optional[int] = None) -> actions.Schedule:
  """The schedule that `text` writes, one line per device.

  Args:
    text: the text form (see the module docstring).
    cell_devices: the device of each cell; by default the device whose
      line names the cell first.
    num_micro_batches: M; by default one more than the largest micro-batch.

  Raises:
    ValueError: naming the line and the token that is not an action, or
      for a text without actions.
  """
  rows: List[List[actions.Action]] = []
  for number, line in enumerate(re.split(r'[\n;]', text), start=1):
    tokens = [t for t in re.split(r'[,\s]+', line.split('#', 1)[0]) if t]
    if not tokens:
      continue
    row = []
    for token in tokens:
      try:
        row.append(ParseAction(token))
      except ValueError as e:
        raise ValueError(f'line {number} (device {len(rows)}): {e}') from None
    rows.append(row)
  if not any(rows):
    raise ValueError('The text holds no action; write one line per device, '
                     'e.g. "0F0,0B0".')
  return actions.Schedule.Make(rows, cell_devices, num_micro_batches)


def Format(schedule: actions.Schedule) -> str:
  """`schedule` as text: one comma-separated line per device (PyTorch's CSV)."""
  return ''.join(','.join(str(a) for a in row) + '\n' for row in schedule.devices)
