"""One validator for a schedule as data: the first action that cannot run, and why.

`Validate(schedule)` returns None for a schedule that an executor can follow
and otherwise raises one ValueError whose message starts with the broken
action, `device D position P: <action in text form>: <why>`. It checks, in
this order, each in the devices' order:

1. placement: every cell placed on an existing device, every action on a
   cell of its own device, micro-batches below M;
2. each action at most once, and per (cell, micro-batch) either B or I and W;
3. order on a device: B or I after the cell's F, W after its I, REDUCE
   after the cell's last B or W;
4. completeness: every (cell, micro-batch) has one F and its backward(s);
5. progress: with each device running its list in order, every action's
   inputs (`Schedule.Inputs`, also across devices) are produced before
   it; if not, the message follows the chain of waits to where it closes
   on itself (a deadlock; a forward before its input exists is one).
"""

from typing import Dict, List, Optional, Set, Tuple
import weakref

from lingvo_pipe.pipeline.schedules import actions

Action = actions.Action
Kind = actions.ActionKind

# The schedules found valid, by id while they live: a schedule never
# changes, and the tuner simulates each of its candidates' many times.
_VALID: 'weakref.WeakValueDictionary[int, actions.Schedule]' = weakref.WeakValueDictionary()


def _Where(schedule: actions.Schedule, action: Action) -> str:
  found = schedule.Find(action)
  return 'nowhere' if found is None else f'device {found[0]} position {found[1]}'


def _Fail(device: int, position: int, action: Action, why: str) -> None:
  raise ValueError(f'device {device} position {position}: {action}: {why}')


def _CheckPlacement(schedule: actions.Schedule) -> None:
  for c, d in enumerate(schedule.cell_devices):
    if not 0 <= d < schedule.num_devices:
      raise ValueError(f'cell {c} is placed on device {d}, but the schedule '
                       f'has devices 0..{schedule.num_devices - 1}; place it '
                       'on one of those.')
  for d, p, a in schedule.Positions():
    if a.cell >= schedule.num_cells:
      _Fail(d, p, a, f'cell {a.cell} does not exist (cells 0..'
            f'{schedule.num_cells - 1}).')
    if schedule.cell_devices[a.cell] != d:
      _Fail(d, p, a, f'cell {a.cell} is on device '
            f'{schedule.cell_devices[a.cell]}, not on device {d}; run it there.')
    if a.micro_batch is not None and a.micro_batch >= schedule.num_micro_batches:
      _Fail(d, p, a, f'micro-batch {a.micro_batch} does not exist (M='
            f'{schedule.num_micro_batches}).')


def _CheckOnceAndOrder(schedule: actions.Schedule) -> None:
  seen: Dict[Action, Tuple[int, int]] = {}
  kinds: Dict[Tuple[int, Optional[int]], Set[Kind]] = {}
  for d, row in enumerate(schedule.devices):
    done: Set[Action] = set()
    for p, a in enumerate(row):
      if a in seen:
        _Fail(d, p, a, f'runs twice (first at device {seen[a][0]} position '
              f'{seen[a][1]}); run each action once.')
      seen[a] = (d, p)
      key = (a.cell, a.micro_batch)
      has = kinds.setdefault(key, set())
      if (a.kind == Kind.B and has & {Kind.I, Kind.W}) or (
          a.kind in (Kind.I, Kind.W) and Kind.B in has):
        _Fail(d, p, a, f'cell {a.cell} micro-batch {a.micro_batch} has both B '
              'and a split backward; use either B, or I and W.')
      has.add(a.kind)
      _CheckBefore(schedule, d, p, a, done)
      done.add(a)


def _CheckBefore(schedule: actions.Schedule, d: int, p: int, a: Action,
                 done: Set[Action]) -> None:
  """Raises unless what `a` needs from its own cell ran earlier on `d`."""
  c, m = a.cell, a.micro_batch
  if a.kind in actions.INPUT_BACKWARDS:
    first = Action(Kind.F, c, m)
    if first not in done:
      where = _Where(schedule, first)
      _Fail(d, p, a, f'has no forward {first}.' if where == 'nowhere' else
            f'runs before its forward {first} ({where}).')
  elif a.kind == Kind.W:
    first = Action(Kind.I, c, m)
    if first not in done:
      where = _Where(schedule, first)
      _Fail(d, p, a, f'has no {first}: a W needs its I before it.'
            if where == 'nowhere' else
            f'runs before its I {first} ({where}); a W needs its I first.')
  elif a.kind == Kind.REDUCE:
    later = [b for b in schedule.devices[d][p + 1:]
             if b.cell == c and b.kind in actions.WEIGHT_BACKWARDS]
    if later:
      _Fail(d, p, a, f'runs before {later[0]} ({_Where(schedule, later[0])}); '
            'REDUCE goes after the cell\'s last B or W.')


def _CheckComplete(schedule: actions.Schedule) -> None:
  for d, p, a in schedule.Positions():
    c, m = a.cell, a.micro_batch
    if a.kind == Kind.F:
      if schedule.Find(Action(Kind.B, c, m)) is None and schedule.Find(
          Action(Kind.I, c, m)) is None:
        _Fail(d, p, a, f'has no backward: add {c}B{m}, or {c}I{m} and {c}W{m}.')
    elif a.kind == Kind.I and schedule.Find(Action(Kind.W, c, m)) is None:
      _Fail(d, p, a, f'has no W: add {c}W{m} after it.')
  for c in range(schedule.num_cells):
    for m in range(schedule.num_micro_batches):
      if schedule.Find(Action(Kind.F, c, m)) is None:
        raise ValueError(f'cell {c} micro-batch {m} is missing: no device runs '
                         f'{c}F{m} (cell {c} is on device '
                         f'{schedule.cell_devices[c]}); add it and its backward.')


def _WaitChain(schedule: actions.Schedule, heads: List[int],
               done: Set[Action], start: Action) -> Tuple[str, Set[int]]:
  """The waits from `start` (a stuck device's next action) until they close
  on themselves, 'it waits for X (where), behind H (where), which waits..',
  and the devices on the way."""
  text, current, visited = 'it', start, [start]
  devices: Set[int] = set()
  while True:
    needed = next(x for x in schedule.Inputs(current) if x not in done)
    d, q = schedule.Find(needed) or (-1, -1)  # every input exists by now
    devices.add(d)
    text += f' waits for {needed} (device {d} position {q})'
    head = schedule.devices[d][heads[d]]
    if head != needed:
      own = ' itself' if head == start else ''
      text += f', behind {head}{own} (device {d} position {heads[d]})'
    current = head
    if current in visited:
      return text, devices
    visited.append(current)
    text += ', which'


def _CheckProgress(schedule: actions.Schedule) -> None:
  heads = [0] * schedule.num_devices
  done: Set[Action] = set()
  progressed = True
  while progressed:
    progressed = False
    for d, row in enumerate(schedule.devices):
      while heads[d] < len(row) and all(
          x in done for x in schedule.Inputs(row[heads[d]])):
        done.add(row[heads[d]])
        heads[d] += 1
        progressed = True
  for d, row in enumerate(schedule.devices):
    if heads[d] < len(row):
      chain, devices = _WaitChain(schedule, heads, done, row[heads[d]])
      why = (f'device {d} produces an input of it only after it' if devices == {d}
             else 'the devices wait on each other (deadlock)')
      _Fail(d, heads[d], row[heads[d]], f'can never run: {chain}; {why}: '
            'reorder so that every input comes first.')


def Validate(schedule: actions.Schedule) -> None:
  """Returns None if an executor can follow `schedule`, else raises.

  Raises:
    ValueError: naming the first broken action (device, position, action
      in text form) and why (see the module docstring for the checks).
  """
  if _VALID.get(id(schedule)) is schedule:
    return
  _CheckPlacement(schedule)
  _CheckOnceAndOrder(schedule)
  _CheckComplete(schedule)
  _CheckProgress(schedule)
  _VALID[id(schedule)] = schedule
