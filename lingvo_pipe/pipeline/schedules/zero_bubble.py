"""Zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism", arXiv 2401.10241) as data.

The backward splits into I (gradient for the cell's input, which the
previous cell waits for) and W (the weight gradient, which nobody waits
for), so W can fill what would be bubbles.

ZB-H1: 1F1B's warm-up and memory, with device d deferring its first d W's.
I then reaches the earlier devices sooner and the deferred W's fill the
cool-down. With F = I = W and M >= K each device idles (K-1)(F+I-W) =
K-1 clocks, a third of 1F1B's (K-1)(F+I+W); in general (K-1)max(F,
F+I-W), since the last device waits (K-1)F for its first forward. Held
micro-batches (from F until W) peak at K on every device, 1F1B's peak on
device 0. K=3, M=4
(`python -m benchmarks.schedule_sim --schedules=zb_h1 --k=3 --m=4
--format=table`):

    clock    0   1   2   3   4   5   6   7   8   9  10  11  12  13
    dev 0  0F0 0F1 0F2   .   . 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3
    dev 1    . 1F0 1F1   . 1I0 1F2 1I1 1W0 1F3 1I2 1W1 1I3 1W2 1W3
    dev 2    .   . 2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2W2 2W3

ZB-H2: zero bubble at twice 1F1B's memory. Device d warms up with up to
2K-1-2d forwards and the W's move to the tail, so the step is a
parallelogram: with F = I = W and M >= 2K-1 no device idles within its
own first-to-last span (each still waits (K-1)F for its first forward in
a synchronized step, ZB-H1's idle; the zero needs steps that overlap, no
step-wide synchronization, the paper's section 4). The order is that of a
unit-clock rule: at each clock a device runs the first that is ready of
its next I, its next F while it holds fewer than 2K-1 micro-batches (F
until W; 1F1B holds K), and its oldest pending W. K=3, M=5:

    clock    0   1   2   3   4   5   6   7   8   9  10  11  12  13  14  15  16
    dev 0  0F0 0F1 0F2 0F3 0F4 0I0 0W0 0I1 0W1 0I2 0W2 0I3 0W3 0I4 0W4   .   .
    dev 1    . 1F0 1F1 1F2 1I0 1F3 1I1 1F4 1I2 1W0 1I3 1W1 1I4 1W2 1W3 1W4   .
    dev 2    .   . 2F0 2I0 2F1 2I1 2F2 2I2 2F3 2I3 2F4 2I4 2W0 2W1 2W2 2W3 2W4

ZB-V: 2K cells, device d holding cell d and cell 2K-1-d, so a micro-batch
goes down the devices and back up in a V and the first and last cells
share device 0. Its order (the paper's section 6, as PyTorch's
ScheduleZBVZeroBubble also runs it) is planned for at least 2K-1
micro-batches; with fewer the actions of the missing ones are left out.
With F = I = W per cell and M >= 2K-1 a device idles only while the
first forward arrives, (K-1) cell-clocks (half a ZB-H1 clock each);
within its own first-to-last span none idles, so with steps that overlap
(no synchronized optimizer step, the paper's section 4) the bubble is 0.
Held micro-batches peak at 2K cells of half a device's layers, 1F1B's
memory.
K=2, M=3 (`... --schedules=zb_v --k=2 --m=3 --format=table`):

    clock    0   1   2   3   4   5   6   7   8   9  10  11  12  13  14  15  16  17  18
    dev 0  0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0I0 0W0 3F2 3I2 3W2 0I1 0W1 0I2 0W2   .
    dev 1    . 1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1I1 2I2 1I2 1W1 2W2 1W2
"""

from typing import Dict, List, Tuple

from lingvo_pipe.pipeline.schedules import actions


class _Row:
  """One device's actions, built in order; counts each cell's next
  micro-batch per kind so the generators say only which kind of which cell."""

  def __init__(self) -> None:
    self.actions: List[actions.Action] = []
    self._next: Dict[Tuple[actions.ActionKind, int], int] = {}

  def Count(self, kind: actions.ActionKind, cell: int) -> int:
    return self._next.get((kind, cell), 0)

  def Add(self, kind: actions.ActionKind, cell: int) -> None:
    m = self.Count(kind, cell)
    self._next[(kind, cell)] = m + 1
    self.actions.append(actions.Action(kind, cell, m))


_F, _I, _W = actions.ActionKind.F, actions.ActionKind.I, actions.ActionKind.W


def ZeroBubbleH1(num_devices: int, num_micro_batches: int) -> actions.Schedule:
  """ZB-H1 of K=num_devices cells on as many devices.

  Raises:
    ValueError: unless K >= 1 and M >= 1.
  """
  actions.CheckSizes(num_devices, num_micro_batches)
  k, m = num_devices, num_micro_batches
  rows = []
  for d in range(k):
    row = _Row()
    warm_up = min(k - d - 1, m)
    for _ in range(warm_up):
      row.Add(_F, d)
    for j in range(m - warm_up):  # steady: F, I, and W once d are deferred
      row.Add(_F, d)
      row.Add(_I, d)
      if j >= d:
        row.Add(_W, d)
    while row.Count(_I, d) < m:  # cool-down: each I, then the oldest W
      row.Add(_I, d)
      row.Add(_W, d)
    while row.Count(_W, d) < m:
      row.Add(_W, d)
    rows.append(row.actions)
  return actions.Schedule.Make(rows, range(k), m)


def ZeroBubbleH2(num_devices: int, num_micro_batches: int) -> actions.Schedule:
  """ZB-H2 of K=num_devices cells on as many devices, by its greedy rule.

  Raises:
    ValueError: unless K >= 1 and M >= 1.
  """
  actions.CheckSizes(num_devices, num_micro_batches)
  k, m = num_devices, num_micro_batches
  rows = [_Row() for _ in range(k)]
  ends: Dict[actions.Action, int] = {}  # clock at which each action ends
  clock = 0
  while any(row.Count(_W, d) < m for d, row in enumerate(rows)):
    for d, row in enumerate(rows):
      f, i, w = (row.Count(kind, d) for kind in (_F, _I, _W))
      for kind, left in ((_I, i < f), (_F, f < m and f - w < 2 * k - 1), (_W, w < i)):
        candidate = actions.Action(kind, d, row.Count(kind, d))
        if left and all(ends.get(x, clock + 1) <= clock
                        for x in actions.MicroBatchInputs(candidate, k)):
          row.Add(kind, d)
          ends[candidate] = clock + 1
          break
    clock += 1
  return actions.Schedule.Make([row.actions for row in rows], range(k), m)


def VCellDevices(num_devices: int) -> List[int]:
  """Device of each of the 2K cells of a V: 0, 1, .., K-1, K-1, .., 1, 0."""
  return list(range(num_devices)) + list(reversed(range(num_devices)))


def ZeroBubbleV(num_devices: int, num_micro_batches: int) -> actions.Schedule:
  """ZB-V of 2K cells on K=num_devices devices, cell j on VCellDevices()[j].

  Raises:
    ValueError: unless K >= 1 and M >= 1.
  """
  actions.CheckSizes(num_devices, num_micro_batches)
  k, m = num_devices, num_micro_batches
  planned = max(2 * k - 1, m)
  rows = []
  for d in range(k):
    down, up = d, 2 * k - 1 - d
    row = _Row()
    for _ in range(2 * (k - d) - 1):
      row.Add(_F, down)
    for _ in range(d):
      row.Add(_F, up)
      row.Add(_F, down)
    for _ in range(k - d):
      for kind in (_F, _I, _W):
        row.Add(kind, up)
    while row.Count(_F, up) < row.Count(_F, down) or row.Count(_F, down) < planned:
      if row.Count(_F, down) < planned:
        row.Add(_F, down)
      row.Add(_I, down)
      row.Add(_W, down)
      for kind in (_F, _I, _W):
        row.Add(kind, up)
    for _ in range(d):  # cool-down: input gradients first, W's fill behind
      row.Add(_I, down)
      row.Add(_I, up)
    for _ in range(k - d):
      row.Add(_I, down)
      row.Add(_W, down)
    for cell in (up, down):
      while row.Count(_W, cell) < row.Count(_I, cell):
        row.Add(_W, cell)
    rows.append([a for a in row.actions if (a.micro_batch or 0) < m])
  return actions.Schedule.Make(rows, VCellDevices(k), m)
