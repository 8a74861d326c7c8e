"""What is alive at the allocator's peak of one profiled step; prints JSON.

Reads a pipeline_bench --timeline_dir profile (TF_CPU_ALLOCATOR_USE_BFC=true:
the BFC allocator records every allocation and release, with the op, shape,
dtype and the bytes in use after it). At the step's largest bytes in use it
lists the allocations made during the step and not yet released, grouped
by dtype and by the op that made them; what the step did not allocate (the
variables: float32 master weights, the shapeless gradient accumulators,
the input) is `before_step_bytes`. One step, all logical devices (they
share the CPU's allocator).

  TF_CPU_ALLOCATOR_USE_BFC=true python -m benchmarks.pipeline_bench \\
      --workload=transformer-act --k=4 --m=8 --steps=1 --timeline_dir=DIR
  python -m benchmarks.peak_parts --logdir=DIR
"""

import collections
import json
import re
from typing import Any, Dict, List

from absl import app
from absl import flags

from lingvo_pipe.profiling import trace_calls

FLAGS = flags.FLAGS

# DataType enum values of the allocation events (tensorflow/core/framework/types.proto).
_DTYPES = {1: 'float32', 3: 'int32', 4: 'uint8', 9: 'int64', 10: 'bool',
           14: 'bfloat16', 19: 'float16'}


def _OpGroup(tf_op: str) -> str:
  """The op's name with call prefixes and _N suffixes dropped: e.g.
  'gradient_tape/layer_1/atten/Softmax_3' -> 'gradient_tape/atten/Softmax'
  keeps the scope words that tell the part of the model."""
  segments = [re.sub(r'_\d+$', '', s) for s in tf_op.split('/')]
  words = [s for s in segments if not re.fullmatch(r'(layer|cell|p|ffn)(_\d+)?', s)]
  return '/'.join(words[-3:])


def LiveAtPeak(space: Any, top: int) -> Dict[str, Any]:
  """The step's peak bytes in use and what was alive then (module doc)."""
  events = [e for e in trace_calls.HostEvents(space)
            if e.name in ('MemoryAllocation', 'MemoryDeallocation')
            and 'addr' in e.stats]
  if not events:
    raise ValueError('The profile has no allocator events: run with '
                     'TF_CPU_ALLOCATOR_USE_BFC=true.')
  events.sort(key=lambda e: e.start_ps)
  live: Dict[int, Dict[str, Any]] = {}
  peak_bytes, peak_live, peak_at = -1, {}, 0
  for e in events:
    if e.name == 'MemoryAllocation':
      live[e.stats['addr']] = e.stats
    else:
      live.pop(e.stats['addr'], None)
    if e.stats['bytes_allocated'] > peak_bytes:
      peak_bytes, peak_live, peak_at = e.stats['bytes_allocated'], dict(live), e.start_ps
  by_dtype: Dict[str, int] = collections.Counter()
  by_op: Dict[str, List[int]] = collections.defaultdict(lambda: [0, 0])
  by_shape: Dict[str, List[int]] = collections.defaultdict(lambda: [0, 0])
  for stats in peak_live.values():
    dtype = _DTYPES.get(stats.get('data_type'), str(stats.get('data_type')))
    size = stats['allocation_bytes']
    by_dtype[dtype] += size
    entry = by_op[f"{dtype} {stats.get('region_type', '?')} "
                  f"{_OpGroup(str(stats.get('tf_op', '?')))}"]
    entry[0] += 1
    entry[1] += size
    entry = by_shape[f"{dtype} {stats.get('shape', '?')}"]
    entry[0] += 1
    entry[1] += size
  in_step = sum(by_dtype.values())

  def Rows(table):
    rows = sorted(table.items(), key=lambda kv: -kv[1][1])[:top]
    return [dict(group=k, tensors=c, bytes=b) for k, (c, b) in rows]

  return dict(
      peak_bytes=peak_bytes, peak_ms_after_first_event=round(
          (peak_at - events[0].start_ps) / 1e9, 1),
      step_allocated_live_bytes=in_step, before_step_bytes=peak_bytes - in_step,
      by_dtype=dict(by_dtype),
      by_op=Rows(by_op), by_shape=Rows(by_shape))


def main(argv):
  del argv
  print(json.dumps(LiveAtPeak(trace_calls.LoadNewestTrace(FLAGS.logdir), FLAGS.top), indent=1))


def _DefineFlags():
  """Only when run, so importing this beside other benchmarks does not clash."""
  flags.DEFINE_string('logdir', '', 'A --timeline_dir of pipeline_bench.')
  flags.DEFINE_integer('top', 25, 'Groups of live tensors listed, by bytes.')


if __name__ == '__main__':
  _DefineFlags()
  app.run(main)
