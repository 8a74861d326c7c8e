"""The Action type and a schedule as data: per device, the actions it runs in order.

An action is one piece of work of one cell on one micro-batch:

    kind    text     what the cell computes
    F       0F3      forward of micro-batch 3 through cell 0
    B       2B3      backward of cell 2: input and weight gradients together
    I       1I0      backward for cell 1's input only (sends the gradient on)
    W       1W0      cell 1's weight gradient of micro-batch 0, after its I
    REDUCE  0REDUCE_GRAD   data-parallel reduction of cell 0's gradient sum

The text of an action is PyTorch pipelining's: stage (our cell), type,
micro-batch (none for REDUCE_GRAD). Every (cell, micro-batch) has one F and
either one B, or one I and one W. A Schedule holds, per device, its actions
in the order the device runs them, and the device each cell sits on (cell
j on device j mod K for the interleaved schedule, a V for ZB-V).

What an action reads (`Schedule.Inputs`, the one home of the dependency
rule): F of cell c needs F of c-1 (same micro-batch); B or I of c needs F
of c and the B or I of c+1 (the last cell's loss is part of its F); W needs
its I; REDUCE of c needs every B and W of c.
"""

import dataclasses
import enum
import functools
from typing import Dict, Iterator, List, Optional, Sequence, Tuple


class ActionKind(enum.Enum):
  """What an action computes; the value is its letter in the text form."""
  F = 'F'  # forward
  B = 'B'  # backward: input and weight gradients at once
  I = 'I'  # backward for the input only
  W = 'W'  # weight gradient only
  REDUCE = 'REDUCE_GRAD'  # data-parallel reduction of a cell's gradients


# Kinds that produce the gradient the previous cell's backward reads.
INPUT_BACKWARDS = (ActionKind.B, ActionKind.I)
# Kinds after which a cell's weight gradient of a micro-batch is complete.
WEIGHT_BACKWARDS = (ActionKind.B, ActionKind.W)


@dataclasses.dataclass(frozen=True)
class Action:
  """`kind` of cell `cell` on micro-batch `micro_batch` (None for REDUCE)."""
  kind: ActionKind
  cell: int
  micro_batch: Optional[int] = None

  def __post_init__(self) -> None:
    if not isinstance(self.kind, ActionKind):
      raise TypeError(f'Action kind must be an ActionKind, got {self.kind!r}.')
    if self.cell < 0:
      raise ValueError(f'Action cell must be >= 0, got {self.cell}.')
    if self.kind == ActionKind.REDUCE:
      if self.micro_batch is not None:
        raise ValueError(f'REDUCE reduces a cell over all micro-batches; got '
                         f'micro_batch={self.micro_batch}, pass None.')
    elif self.micro_batch is None or self.micro_batch < 0:
      raise ValueError(f'{self.kind.name} needs a micro-batch >= 0, got '
                       f'{self.micro_batch!r}.')

  @property
  def micro(self) -> int:
    """The micro-batch of an F, B, I or W."""
    if self.micro_batch is None:
      raise ValueError(f'{self} is a REDUCE: it has no micro-batch.')
    return self.micro_batch

  def __str__(self) -> str:
    suffix = '' if self.micro_batch is None else str(self.micro_batch)
    return f'{self.cell}{self.kind.value}{suffix}'


def Forward(cell: int, micro_batch: int) -> Action:
  return Action(ActionKind.F, cell, micro_batch)


def Backward(cell: int, micro_batch: int) -> Action:
  return Action(ActionKind.B, cell, micro_batch)


def InputGrad(cell: int, micro_batch: int) -> Action:
  return Action(ActionKind.I, cell, micro_batch)


def WeightGrad(cell: int, micro_batch: int) -> Action:
  return Action(ActionKind.W, cell, micro_batch)


def Reduce(cell: int) -> Action:
  return Action(ActionKind.REDUCE, cell)


@dataclasses.dataclass(frozen=True)
class Schedule:
  """Per device its actions in order; cell_devices[c] is cell c's device.

  Build one with `Schedule.Make`, which infers what is not given. It is
  data only: `validate.Validate` says whether it can run.
  """
  devices: Tuple[Tuple[Action, ...], ...]
  cell_devices: Tuple[int, ...]
  num_micro_batches: int

  @classmethod
  def Make(cls, devices: Sequence[Sequence[Action]],
           cell_devices: Optional[Sequence[int]] = None,
           num_micro_batches: Optional[int] = None) -> 'Schedule':
    """A Schedule of `devices` (per device, its actions in order).

    Args:
      devices: per device, its actions in the order it runs them.
      cell_devices: the device of each cell; by default the device of each
        cell's first action (cells must then be numbered 0..N-1).
      num_micro_batches: M; by default one more than the largest
        micro-batch of any action.

    Raises:
      ValueError: if a default cannot be inferred (a cell number without
        an action, or no action at all).
    """
    rows = tuple(tuple(row) for row in devices)
    if not any(rows):
      raise ValueError('A schedule needs at least one action; every device '
                       f'list is empty ({len(rows)} devices).')
    if cell_devices is None:
      first: Dict[int, int] = {}
      for d, row in enumerate(rows):
        for a in row:
          first.setdefault(a.cell, d)
      missing = sorted(set(range(max(first) + 1)) - set(first))
      if missing:
        raise ValueError(f'Cells are numbered 0..{max(first)} but cells '
                         f'{missing} have no action; number the cells '
                         'without gaps or pass cell_devices.')
      cell_devices = [first[c] for c in range(len(first))]
    if num_micro_batches is None:
      num_micro_batches = 1 + max((a.micro_batch for row in rows for a in row
                                   if a.micro_batch is not None), default=-1)
    return cls(rows, tuple(cell_devices), num_micro_batches)

  @property
  def num_devices(self) -> int:
    return len(self.devices)

  @property
  def num_cells(self) -> int:
    return len(self.cell_devices)

  def Positions(self) -> Iterator[Tuple[int, int, Action]]:
    """Yields (device, position, action) for every action, device by device."""
    for d, row in enumerate(self.devices):
      for p, a in enumerate(row):
        yield d, p, a

  @functools.cached_property
  def _index(self) -> Dict[Action, Tuple[int, int]]:
    index: Dict[Action, Tuple[int, int]] = {}
    for d, p, a in self.Positions():
      index.setdefault(a, (d, p))
    return index

  @functools.cached_property
  def split_cells(self) -> Tuple[bool, ...]:
    """Per cell whether it runs I's: its backwards split into I and W."""
    cells = {a.cell for _, _, a in self.Positions() if a.kind == ActionKind.I}
    return tuple(c in cells for c in range(self.num_cells))

  def Find(self, action: Action) -> Optional[Tuple[int, int]]:
    """(device, position) of the first occurrence of `action`, or None."""
    return self._index.get(action)

  def InputBackward(self, cell: int, micro_batch: Optional[int]) -> Action:
    """The action that sends (cell, micro_batch)'s input gradient: its B if
    the schedule has one, else its I."""
    b = Action(ActionKind.B, cell, micro_batch)
    return b if b in self._index else Action(ActionKind.I, cell, micro_batch)

  def Inputs(self, action: Action) -> List[Action]:
    """The actions whose results `action` reads (see the module docstring)."""
    known = self._inputs.get(action)
    return list(known) if known is not None else self._InputsOf(action)

  @functools.cached_property
  def _inputs(self) -> Dict[Action, Tuple[Action, ...]]:
    """Inputs of every action of the schedule, found once: the simulator
    and the validator ask for each many times."""
    return {a: tuple(self._InputsOf(a)) for _, _, a in self.Positions()}

  def _InputsOf(self, action: Action) -> List[Action]:
    if action.kind == ActionKind.REDUCE:
      return [a for row in self.devices for a in row
              if a.cell == action.cell and a.kind in WEIGHT_BACKWARDS]
    next_backward = self.InputBackward(action.cell + 1, action.micro_batch).kind
    return MicroBatchInputs(action, self.num_cells, next_backward)


def MicroBatchInputs(action: Action, num_cells: int,
                     next_backward: ActionKind = ActionKind.I) -> List[Action]:
  """What an F, B, I or W reads, of its own micro-batch; `next_backward`
  is the kind (B or I) that sends the next cell's input gradient."""
  c, m = action.cell, action.micro_batch
  if action.kind == ActionKind.F:
    return [Action(ActionKind.F, c - 1, m)] if c else []
  if action.kind in INPUT_BACKWARDS:
    needs = [Action(ActionKind.F, c, m)]
    if c + 1 < num_cells:
      needs.append(Action(next_backward, c + 1, m))
    return needs
  if action.kind == ActionKind.W:
    return [Action(ActionKind.I, c, m)]
  raise ValueError(f'{action} reads every micro-batch of its cell; ask '
                   'Schedule.Inputs, which knows them.')


def CheckSizes(num_devices: int, num_micro_batches: int,
               cells_per_device: int = 1) -> None:
  """Raises ValueError naming the value unless K, M and v are all >= 1."""
  if num_devices < 1 or num_micro_batches < 1 or cells_per_device < 1:
    raise ValueError(f'A schedule needs num_devices >= 1, num_micro_batches '
                     f'>= 1 and cells_per_device >= 1; got num_devices='
                     f'{num_devices}, num_micro_batches={num_micro_batches}, '
                     f'cells_per_device={cells_per_device}.')


def WithReduce(schedule: Schedule) -> Schedule:
  """`schedule` with a REDUCE of each cell right after the cell's last B or
  W on its device, where its data-parallel gradient reduction can start."""
  rows = []
  for row in schedule.devices:
    last = {a.cell: p for p, a in enumerate(row) if a.kind in WEIGHT_BACKWARDS}
    new_row: List[Action] = []
    for p, a in enumerate(row):
      new_row.append(a)
      if last.get(a.cell) == p:
        new_row.append(Reduce(a.cell))
    rows.append(new_row)
  return Schedule.Make(rows, schedule.cell_devices, schedule.num_micro_batches)
