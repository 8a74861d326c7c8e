"""1F1B (PipeDream-flush, Narayanan et al.) as data: warm up, one forward one backward, cool down.

K=3 devices, M=4 micro-batches, one cell per device (F and B one clock
each; `python -m benchmarks.schedule_sim --schedules=one_f_one_b
--k=3 --m=4 --backward=1 --format=table` prints it):

    clock    0   1   2   3   4   5   6   7   8   9  10  11
    dev 0  0F0 0F1 0F2   .   . 0B0 0F3 0B1   . 0B2   . 0B3
    dev 1    . 1F0 1F1   . 1B0 1F2 1B1 1F3 1B2   . 1B3   .
    dev 2    .   . 2F0 2B0 2F1 2B1 2F2 2B2 2F3 2B3   .   .

Device d warms up with K-d-1 forwards (all M if fewer), then alternates one
forward and one backward, then runs the remaining backwards. The bubble is
fill-drain's, (K-1)/(M+K-1), but cell d holds at most K-d micro-batches.
"""

from typing import List, Sequence, Tuple

from lingvo_pipe.pipeline.schedules import actions

CellMicro = Tuple[int, int]  # (cell, micro-batch)


def Alternate(forwards: Sequence[CellMicro], backwards: Sequence[CellMicro],
              warm_up: int) -> List[actions.Action]:
  """One device's 1F1B order: `warm_up` forwards (at most all), then one
  forward and one backward in turn, then the remaining backwards; the
  backwards are B actions, taken in the order given."""
  warm_up = min(warm_up, len(forwards))
  row = [actions.Forward(c, m) for c, m in forwards[:warm_up]]
  for (fc, fm), (bc, bm) in zip(forwards[warm_up:], backwards):
    row += [actions.Forward(fc, fm), actions.Backward(bc, bm)]
  row += [actions.Backward(c, m) for c, m in backwards[len(forwards) - warm_up:]]
  return row


def OneFOneB(num_devices: int, num_micro_batches: int) -> actions.Schedule:
  """The 1F1B schedule of K=num_devices cells on as many devices.

  Raises:
    ValueError: unless K >= 1 and M >= 1.
  """
  actions.CheckSizes(num_devices, num_micro_batches)
  k, m = num_devices, num_micro_batches
  rows = []
  for d in range(k):
    micro = [(d, i) for i in range(m)]
    rows.append(Alternate(micro, micro, k - d - 1))
  return actions.Schedule.Make(rows, range(k), m)
