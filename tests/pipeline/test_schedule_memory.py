"""1F1B keeps fewer micro-batches alive than fill-drain: the allocator peak.

Each configuration runs the benchmark program in a fresh process
(tests/bench_run.py), or a script (fresh_process). Cells of one Transformer layer each, M=8: without
remat, fill-drain keeps all 8 micro-batches' activations on every cell
until its drain, 1F1B at most K-k on cell k (at K=2, 3 of 16 in all; at
K=4, 10 of 32).
"""

import json

import pytest

from tests import bench_run
from tests import fresh_process


def _PeakBytes(schedule: str, remat: str, num_cells: int) -> int:
  return bench_run.PipelineBench(
      '--workload=transformer-act', '--batch=8', '--seq=128', f'--num_layers={num_cells}',
      f'--k={num_cells}', '--m=8', '--steps=1', '--warmup=0', f'--remat={remat}',
      f'--schedule={schedule}')['bfc_peak_bytes']


def test_one_f_one_b_without_remat_peaks_well_below_fill_drain():
  """K=2, half the cell calls of K=4 to trace (most of a run's time).
  Measured 26.4-27.3 against 51.3-53.0 MB (0.51-0.52x); at K=4, 61-65
  against 98-101 MB (0.61-0.66x): weights, their gradients and the
  pipeline's inputs and outputs are the same in both."""
  gpipe = _PeakBytes('gpipe', 'none', num_cells=2)
  one_f = _PeakBytes('one_f_one_b', 'none', num_cells=2)
  assert one_f < 0.75 * gpipe, (one_f, gpipe)


@pytest.mark.slow  # make test keeps the no-remat comparison above
def test_one_f_one_b_with_per_cell_remat_peaks_no_higher_than_fill_drain():
  """K=4. Measured 40.7 against 43.6 MB: both stash only cell inputs, and
  1F1B keeps the last cell's activations of each micro-batch only until
  its backward, which runs next."""
  gpipe = _PeakBytes('gpipe', 'per_cell', num_cells=4)
  one_f = _PeakBytes('one_f_one_b', 'per_cell', num_cells=4)
  assert one_f <= gpipe, (one_f, gpipe)


# make test runs one of each way the sums go (a W's products, accumulators).
@pytest.mark.parametrize('schedule,remat', [
    ('zb_h1', 'per_cell'), pytest.param('zb_v', 'per_cell', marks=pytest.mark.slow),
    ('one_f_one_b', 'none'), pytest.param('gpipe', 'none', marks=pytest.mark.slow)])
def test_weight_gradient_sums_do_not_outlive_the_step(schedule, remat):
  """The step's sums of weight gradients are weight-sized (32 MiB on four of
  ffn's layers): under per-cell remat a zero-bubble W adds its products
  into tensors of the step, and without remat the backwards add into
  accumulators that the step destroys once read. So at most the
  allocator's own small buffers are held after the step (measured at B64
  K=2 M=4: 0.12-0.26 MB; at sixteen layers, 129 MiB when the sums and
  accumulators were variables)."""
  held = bench_run.PipelineBench(
      '--workload=ffn', '--num_layers=4', '--batch=64', '--k=2', '--m=4', '--steps=1', '--warmup=0',
      f'--remat={remat}', f'--schedule={schedule}',
      '--loop_min_micro_batches=0')['bfc_held_bytes']
  assert held < 2**20, held


_ONE_THREAD = '''
import json
import tensorflow as tf
tf.config.threading.set_inter_op_parallelism_threads(1)
from lingvo_pipe.core.layers import containers, dropout, normalization
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.schedules import schedule
from lingvo_pipe.planning import trial

def Pipeline(m):
  sub = []
  for j in range(3):
    sub += [normalization.LayerNorm.Params().Set(name=f'ln{j}', input_dim=512),
            dropout.DropoutLayer.Params().Set(name=f'drop{j}', keep_prob=0.9)]
  blocks = [containers.SequentialLayer.Params().Set(name=f'block{i}', sub=sub) for i in (0, 1)]
  return gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=blocks, num_partitions=1, num_micro_batches=m,
      schedule=schedule.ScheduleKind.ONE_F_ONE_B, input_shapes=[[256, 512]])

x = [tf.random.stateless_normal([256, 512], [1, 2])]
print(json.dumps({m: trial.Run([Pipeline(m)], x)[0][1] for m in (1, 8)}))
'''


def test_a_forward_waits_for_the_whole_backward_before_it():
  """1F1B on one cell runs each micro-batch's backward before the next
  forward, so at M=8 it keeps one eighth of the activations of M=1, also
  where the executor runs one op at a time (one inter-op thread) and its
  order alone decides. The next forward waits for the backward's weight
  gradients too: LayerNorm's read the activations, and where it waited
  for the input gradients alone, M=8 peaked at 0.52 of M=1 (now 0.17)."""
  out = fresh_process.RunPython('-c', _ONE_THREAD, env={'TF_CPU_ALLOCATOR_USE_BFC': 'true'})
  peaks = json.loads(out.stdout.strip().splitlines()[-1])
  assert peaks['8'] < 0.3 * peaks['1'], peaks
