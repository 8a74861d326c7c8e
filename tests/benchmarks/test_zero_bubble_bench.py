"""zero_bubble_bench's configurations and its page, from made-up runs."""

from benchmarks import zero_bubble_bench


def test_entries_compare_every_schedule_alike():
  entries = zero_bubble_bench.Entries(256)
  assert len(entries) == (len(zero_bubble_bench.SCHEDULES) * len(zero_bubble_bench.MICRO_BATCHES)
                          * len(zero_bubble_bench.REMATS))
  zb_v = entries['zb_v_M4_per_cell']
  assert {'--schedule=zb_v', '--cells_per_device=2', '--k=2', '--batch=256',
          '--intra_op_threads=1'} <= set(zb_v)
  assert '--cells_per_device=1' in entries['one_f_one_b_M8_none']


def test_predicted_bubble_is_the_simulators():
  """K=2, F = I = W: 1F1B idles (K-1)/(M+K-1) of a B = 2-clock step;
  ZB-H1 much less."""
  assert zero_bubble_bench.PredictedBubble('one_f_one_b', 4) == 0.2
  assert zero_bubble_bench.PredictedBubble('zb_h1', 4) < 0.1


def test_render_ratios_against_1f1b():
  def Runs(step, peak):
    return dict(command='c', runs=[dict(step_s_median=step, bfc_peak_bytes=peak,
                                        first_step_s=1.0)] * 2)

  runs = {name: Runs(0.2, 100 * 2**20) for name in zero_bubble_bench.Entries(256)}
  runs['zb_h1_M4_per_cell'] = Runs(0.18, 110 * 2**20)
  page = zero_bubble_bench.Render(dict(batch=256, repeats=2, runs=runs,
                                       machine=dict(cpu='cpu', nproc='2')))
  assert '| zb_h1 | 4 | 0.180 | 0.90x | 110.0 | 1.10x |' in page
  assert '| one_f_one_b | 8 | 0.200 | 1.00x | 100.0 | 1.00x |' in page
