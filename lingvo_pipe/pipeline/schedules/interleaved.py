"""Interleaved 1F1B (Megatron-LM, Narayanan et al. 2021) as data: v cells per device.

K devices hold v cells each, cell j on device j mod K, so a micro-batch goes
round the devices v times. Micro-batches go in rounds: a device runs the
forwards of one round on its first cell, then on its second, and so on;
backwards take its cells in reverse. There are max(1, M // K) rounds of
as equal sizes as they can be, larger ones first (so each holds at least K
micro-batches, exactly K when K divides M; PyTorch's Interleaved1F1B also
uses M // K rounds but needs them equal). Device d warms up with
2(K-d-1) + (v-1)G forwards, G the first round's size (all of them when
M = K), then alternates one forward and one backward as 1F1B does.
A clock is a cell's forward or backward, 1/v of a device's work. K=2, v=2,
M=4 (`python -m benchmarks.schedule_sim --schedules=interleaved --k=2
--m=4 --backward=1 --format=table` prints it; 1F0 is micro-batch 0 on
cell 1):

    clock    0   1   2   3   4   5   6   7   8   9  10  11  12  13  14  15  16  17
    dev 0  0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1   . 2B2   . 2B3 0B2 0B3
    dev 1    . 1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3   .

For M a multiple of K this is schedule.DeviceOrders(INTERLEAVED), action
for action; the bubble is (K-1)/(vM+K-1).
"""

from typing import List

from lingvo_pipe.pipeline.schedules import actions
from lingvo_pipe.pipeline.schedules import one_f_one_b


def Rounds(num_devices: int, num_micro_batches: int) -> List[range]:
  """The micro-batches of each round: max(1, M // K) rounds, sizes that
  differ by at most one, larger first."""
  count = max(1, num_micro_batches // num_devices)
  size, larger = divmod(num_micro_batches, count)
  rounds, start = [], 0
  for r in range(count):
    end = start + size + (1 if r < larger else 0)
    rounds.append(range(start, end))
    start = end
  return rounds


def _Order(device: int, num_devices: int, rounds: List[range],
           cells_per_device: int, backward: bool) -> List[one_f_one_b.CellMicro]:
  """(cell, micro-batch) of a device's forwards (or backwards) in order:
  round by round, within a round cell by cell (in reverse for backwards)."""
  k, v = num_devices, cells_per_device
  order = []
  for micro in rounds:
    chunks = reversed(range(v)) if backward else range(v)
    for chunk in chunks:
      order += [(chunk * k + device, m) for m in micro]
  return order


def Interleaved(num_devices: int, num_micro_batches: int,
                cells_per_device: int) -> actions.Schedule:
  """Megatron's interleaved 1F1B of K*v cells on K=num_devices devices.

  Raises:
    ValueError: unless K, M and v=cells_per_device are >= 1.
  """
  actions.CheckSizes(num_devices, num_micro_batches, cells_per_device)
  k, m, v = num_devices, num_micro_batches, cells_per_device
  rows = []
  rounds = Rounds(k, m)
  for d in range(k):
    forwards = _Order(d, k, rounds, v, backward=False)
    backwards = _Order(d, k, rounds, v, backward=True)
    warm_up = len(forwards) if m == k and v > 1 else (
        2 * (k - d - 1) + (v - 1) * len(rounds[0]))
    rows.append(one_f_one_b.Alternate(forwards, backwards, warm_up))
  return actions.Schedule.Make(rows, [j % k for j in range(k * v)], m)
