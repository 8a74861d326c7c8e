"""Fill-drain (GPipe, Huang et al.) as data: every forward, then every backward.

K=3 devices, M=4 micro-batches, one cell per device (F and B one clock
each; `python -m benchmarks.schedule_sim --schedules=fill_drain --k=3
--m=4 --backward=1 --format=table` prints it):

    clock    0   1   2   3   4   5   6   7   8   9  10  11
    dev 0  0F0 0F1 0F2 0F3   .   .   .   . 0B3 0B2 0B1 0B0
    dev 1    . 1F0 1F1 1F2 1F3   .   . 1B3 1B2 1B1 1B0   .
    dev 2    .   . 2F0 2F1 2F2 2F3 2B3 2B2 2B1 2B0   .   .

Device d runs cell d: F0..F(M-1), then B(M-1)..B0, so the last forward's
backward comes first. Cell d keeps all M micro-batches until its drain;
the bubble is (K-1)/(M+K-1).
"""

from lingvo_pipe.pipeline.schedules import actions


def FillDrain(num_devices: int, num_micro_batches: int) -> actions.Schedule:
  """The fill-drain schedule of K=num_devices cells on as many devices.

  Raises:
    ValueError: unless K >= 1 and M >= 1.
  """
  actions.CheckSizes(num_devices, num_micro_batches)
  rows = []
  for d in range(num_devices):
    rows.append([actions.Forward(d, m) for m in range(num_micro_batches)] +
                [actions.Backward(d, m) for m in reversed(range(num_micro_batches))])
  return actions.Schedule.Make(rows, range(num_devices), num_micro_batches)
