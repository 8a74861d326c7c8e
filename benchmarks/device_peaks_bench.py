"""Each device's own peak: the tuner's picks run with a worker process per device.

On one host, logical CPU devices share one allocator, so a budget per
device cannot be checked there (tune_bench compares the allocator's peak
with the planner's range for all devices together). Here every device of
a layout is a loopback `tf.distribute.Server` of its own, started as
--mode=worker starts it (trainer/cluster/worker.StartServer), under
TensorFlow's BFC allocator: a process has one CPU allocator, which its
server's ops use, so the process's peak is its device's. Per layout:

1. the workers start; each reports the bytes its allocator holds;
2. a client process connects (trainer/cluster/cluster_client), builds the
   pipeline (its weights on the workers) and runs planning/trial.py's
   training step once (the trace);
3. every worker resets its allocator's statistics; the client runs the
   timed steps (trial.StepSeconds); every worker reports its peak, less
   what it held in 1: trial.Timed's measure, per device.

  python -m benchmarks.device_peaks_bench --tune_json=docs/benchmarks/tune.json

(with the uneven stack's flags the tune_bench run had, if any)

checks every budget's pick of a tune_bench JSON (its `pick_layout`) and
prints one JSON object: per pick its budget, its predicted peak (the
fullest device's) and every device's measured peak. Workers and client
read their orders on stdin and end when it closes, so none outlives
this program.
"""

import json
import os
import subprocess
import sys
from typing import Any, Dict, List

from absl import app
from absl import flags

from benchmarks import partition_bench
from benchmarks import runner

FLAGS = flags.FLAGS
_MIB = 2.0**20
# How long a worker or the client may take to answer (a trace, TensorFlow's import).
_TIMEOUT_S = 600


def _DefineFlags() -> None:
  flags.DEFINE_string('tune_json', 'docs/benchmarks/tune.json',
                      "A tune_bench JSON whose picks ('pick_layout') to run.")
  flags.DEFINE_integer('serve', -1, 'Internal: serve this task of --cluster_spec.')
  flags.DEFINE_string('client', '', 'Internal: run this check (JSON) as the client.')
  flags.DEFINE_string('cluster_spec', '', 'Internal: worker=host:port,...')


def _Serve() -> None:
  """A worker: serves its task; answers each stdin line with its
  allocator's statistics ('reset' resets them first); ends at EOF."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from trainer.cluster import cluster_spec  # pylint: disable=g-import-not-at-top
  from trainer.cluster import worker  # pylint: disable=g-import-not-at-top
  worker.StartServer(cluster_spec.Parse(FLAGS.cluster_spec), FLAGS.serve, threads=1)
  print('ready', flush=True)
  for line in sys.stdin:
    if line.strip() == 'reset':
      tf.config.experimental.reset_memory_stats('CPU:0')
    print(json.dumps(tf.config.experimental.get_memory_info('CPU:0')), flush=True)
  os._exit(0)  # the server's threads would hold the interpreter


def _Client() -> None:
  """The client: builds the check's layout on the cluster, steps once,
  says 'warm', waits for a stdin line, prints the timed step seconds."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.pipeline import gpipe  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.planning import trial  # pylint: disable=g-import-not-at-top
  from trainer.cluster import cluster_client  # pylint: disable=g-import-not-at-top
  from trainer.cluster import cluster_spec  # pylint: disable=g-import-not-at-top
  check = json.loads(FLAGS.client)
  cluster_client.Connect(cluster_spec.Parse(FLAGS.cluster_spec), _TIMEOUT_S)
  layers, shape = partition_bench.Workload(check['workload'])
  pipeline = gpipe.PipeliningLayer.Params().Set(name='pipe', layers=layers,
                                                input_shapes=[shape])
  steps = trial.TrainingSteps(_Candidate(check['layout']).Apply(pipeline),
                              [tf.random.stateless_normal(shape, [1, 2])])
  steps.run(1)
  print('warm', flush=True)
  if sys.stdin.readline():
    print(json.dumps(dict(step_s=trial.StepSeconds(steps.run))), flush=True)
  os._exit(0)


def _Candidate(layout: Dict[str, Any]) -> Any:
  """The candidates.Candidate of a tune_bench 'pick_layout'."""
  from lingvo_pipe.pipeline.lowering.remat import RematPolicy  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.pipeline.schedules import schedule  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.planning import candidates  # pylint: disable=g-import-not-at-top
  return candidates.Candidate(schedule.ScheduleKind[layout['schedule']], layout['devices'],
                              layout['v'], layout['micro_batches'],
                              RematPolicy[layout['remat']], tuple(layout['splits']))


def _Start(*flag_args: str) -> subprocess.Popen:
  env = dict(os.environ, TF_CPU_ALLOCATOR_USE_BFC='true', TF_CPP_MIN_LOG_LEVEL='3',
             PYTHONPATH=str(runner.REPO_ROOT))
  return subprocess.Popen([sys.executable, '-m', 'benchmarks.device_peaks_bench', *flag_args],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
                          cwd=runner.REPO_ROOT)


def _Line(process: subprocess.Popen, order: str = '') -> str:
  """Sends `order` (if any) and returns the process's next stdout line."""
  if order:
    process.stdin.write(order + '\n')
    process.stdin.flush()
  line = process.stdout.readline()
  if not line:
    raise RuntimeError(f'{process.args} ended (status {process.wait(_TIMEOUT_S)}) '
                       'before answering; its stderr is above.')
  return line.strip()


def Check(workload: str, layout: Dict[str, Any]) -> Dict[str, Any]:
  """Every device's measured peak (module docstring) and the step seconds
  of `layout` (a tune_bench 'pick_layout') on `workload`."""
  ports = runner.FreePorts(layout['devices'])
  spec = 'worker=' + ','.join(f'localhost:{p}' for p in ports)
  processes: List[subprocess.Popen] = []
  try:
    workers = [_Start(f'--serve={t}', f'--cluster_spec={spec}') for t in range(len(ports))]
    processes.extend(workers)
    for w in workers:
      if _Line(w) != 'ready':
        raise RuntimeError(f'worker {w.args} did not say ready.')
    before = [json.loads(_Line(w, 'current'))['current'] for w in workers]
    client = _Start(f'--client={json.dumps(dict(workload=workload, layout=layout))}',
                    f'--cluster_spec={spec}', f'--uneven_layers={FLAGS.uneven_layers}',
                    f'--dim={FLAGS.dim}', f'--uneven_batch={FLAGS.uneven_batch}')
    processes.append(client)
    if _Line(client) != 'warm':
      raise RuntimeError('the client did not say warm.')
    for w in workers:
      _Line(w, 'reset')
    step_s = json.loads(_Line(client, 'go'))['step_s']
    peaks = [json.loads(_Line(w, 'peak'))['peak'] - b for w, b in zip(workers, before)]
    return dict(step_s=step_s, device_peaks_mb=[p / _MIB for p in peaks])
  finally:
    for p in processes:
      p.stdin.close()
      try:
        p.wait(30)
      except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def _Picks(tune: Dict[str, Any]) -> List[Dict[str, Any]]:
  """Every budget's pick of a tune_bench JSON, each layout checked once."""
  checked: Dict[str, Dict[str, Any]] = {}
  picks = []
  for row in tune['rows']:
    for budget in row['budgets']:
      if not budget.get('fits'):
        continue
      key = json.dumps([row['workload'], budget['pick_layout']], sort_keys=True)
      if key not in checked:
        checked[key] = Check(row['workload'], budget['pick_layout'])
      measured = checked[key]
      picks.append(dict(
          workload=row['workload'], share=budget['share'], budget_mb=budget['budget_mb'],
          pick=budget['pick'], predicted_peak_mb=budget['pick_predicted_peak_mb'],
          device_peaks_mb=measured['device_peaks_mb'], step_s=measured['step_s'],
          within_budget=max(measured['device_peaks_mb']) <= budget['budget_mb'],
          measured_over_predicted=(max(measured['device_peaks_mb']) /
                                   budget['pick_predicted_peak_mb'])))
  return picks


def main(argv):
  del argv
  if FLAGS.serve >= 0:
    _Serve()
  elif FLAGS.client:
    _Client()
  else:
    with open(FLAGS.tune_json) as f:
      tune = json.load(f)
    picks = _Picks(tune)
    print(json.dumps(dict(machine=runner.MachineInfo(), tune_command=tune.get('command'),
                          picks=picks,
                          all_within_budget=all(p['within_budget'] for p in picks))))


if __name__ == '__main__':
  _DefineFlags()
  partition_bench.DefineWorkloadFlags()
  app.run(main)
