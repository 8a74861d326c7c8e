"""Kernel time by op type in one profiled step (a pipeline_bench --timeline_dir profile); prints JSON."""

import collections
import json

from absl import app
from absl import flags

from lingvo_pipe.profiling import trace_calls

FLAGS = flags.FLAGS

# Ops that run other ops (their kernels are counted inside them too).
_CALLERS = ('PartitionedCall', 'StatefulPartitionedCall', 'While', 'If',
            'StatelessWhile', 'StatelessIf', 'IdentityN')


def Summarize(space, top: int) -> dict:
  """Per op type: kernels run, total and mean ms; other host events by name."""
  events = trace_calls.HostEvents(space)
  ops = collections.defaultdict(lambda: [0, 0])
  other = collections.defaultdict(lambda: [0, 0])
  for e in events:
    parent_is_executor = e.parent is not None and e.parent.name == 'ExecutorState::Process'
    if parent_is_executor and ':' in e.name and '::' not in e.name:
      entry = ops[e.name.rsplit(':', 1)[1]]
    else:
      entry = other[e.name]
    entry[0] += 1
    entry[1] += e.end_ps - e.start_ps
  compute_ps = sum(v[1] for k, v in ops.items() if k not in _CALLERS)
  span_ps = (max(e.end_ps for e in events) - min(e.start_ps for e in events)) if events else 0

  def Rows(table):
    rows = sorted(table.items(), key=lambda kv: -kv[1][1])[:top]
    return [dict(name=k, count=c, total_ms=round(ps / 1e9, 3),
                 mean_us=round(ps / 1e6 / max(c, 1), 1)) for k, (c, ps) in rows]

  return dict(span_ms=round(span_ps / 1e9, 1),
              kernel_ms_excluding_calls=round(compute_ps / 1e9, 1),
              kernels=sum(v[0] for k, v in ops.items() if k not in _CALLERS),
              casts=ops['Cast'][0], cast_ms=round(ops['Cast'][1] / 1e9, 2),
              op_types=Rows(ops), other_events=Rows(other))


def main(argv):
  del argv
  print(json.dumps(Summarize(trace_calls.LoadNewestTrace(FLAGS.logdir), FLAGS.top), indent=1))


def _DefineFlags():
  """Only when run, so importing this beside other benchmarks does not clash."""
  flags.DEFINE_string('logdir', '', 'A --timeline_dir of pipeline_bench (or any TF profiler logdir).')
  flags.DEFINE_integer('top', 15, 'Op types (and other host events) listed, by total time.')


if __name__ == '__main__':
  _DefineFlags()
  app.run(main)
