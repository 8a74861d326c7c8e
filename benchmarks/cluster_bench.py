"""Step time of R x K pipelines on loopback worker processes or on logical
devices of one process, and the bytes each worker sends and receives.

  python -m benchmarks.cluster_bench --pairs=5          # local vs workers
  python -m benchmarks.cluster_bench --configs=workers:1x1,workers:2x1
  python -m benchmarks.cluster_bench --run=workers --replicas=2 --k=2  # one run
  python -m benchmarks.cluster_bench --schedule=zb_h1 --loop_min_micro_batches=2

Each measured run is a fresh process (--run=local|workers). `workers`
starts its own `--mode=worker` processes (one intra-op thread each) on free
loopback ports, R*K of them, and kills them at the end; the client connects
with tf.config.experimental_connect_to_cluster. Bytes are the TCP
bytes_sent and bytes_received of the workers' sockets (`ss -tinp`), read
before and after the timed steps: per worker task, and in all split into
worker-to-worker (boundary tensors, all-reduce) and worker-to-client.
A local run with replicas also profiles one step after the timed ones and
reports the timeline's share of the step in all-reduce that no computation
overlapped (profiling/bubble.UnoverlappedAllReduceShare).
"""

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

from absl import app
from absl import flags

from benchmarks import runner
from benchmarks import schedule_flags

FLAGS = flags.FLAGS
flags.DEFINE_enum('run', '', ['', 'local', 'workers'], 'One run of this '
                  'placement; empty: alternate both --pairs times.')
flags.DEFINE_integer('pairs', 5, 'Alternations of local and workers runs.')
flags.DEFINE_integer('replicas', 1, 'R pipeline replicas (R*K devices or workers).')
flags.DEFINE_integer('k', 2, 'Cells.')
flags.DEFINE_integer('m', 4, 'Micro-batches per replica.')
schedule_flags.Define()
flags.DEFINE_integer('num_layers', 16, 'Residual feed-forward blocks (ffn workload).')
flags.DEFINE_integer('batch', 64, 'Global batch.')
flags.DEFINE_integer('steps', 20, 'Timed steps per run.')
flags.DEFINE_integer('warmup', 3, 'Untimed steps after the first.')
flags.DEFINE_integer('threads', 1, 'Intra-op threads of each worker and of the '
                     'local process.')
flags.DEFINE_bool('pin_workers', False, 'Pin worker task t to core t mod the '
                  "cores (taskset): a worker's ops then share one core (its "
                  'inter-op threads would otherwise use two).')
flags.DEFINE_list('configs', [], 'With --run empty: the runs to alternate, '
                  'each PLACEMENT:RxK (e.g. workers:2x1); empty: local and '
                  'workers at --replicas x --k.')


def _Bytes(pids: Dict[int, int]) -> Dict[str, int]:
  """Bytes of the worker processes' TCP sockets (`pids`: pid -> task):
  sent by all workers to another worker and to the client, and per task
  'task_T_sent' and 'task_T_received' (to and from anyone)."""
  out = subprocess.run(['ss', '-tinpH'], capture_output=True, text=True,
                       check=True).stdout
  sockets = []
  owner_of_port = {}
  for entry in re.split(r'\n(?=\S)', out):
    owner = re.search(r'pid=(\d+)', entry)
    addrs = re.findall(r'(?:127\.0\.0\.1|\[::1\]|\[::ffff:127\.0\.0\.1\]):(\d+)', entry)
    if not owner or len(addrs) < 2:
      continue
    sent = re.search(r'bytes_sent:(\d+)', entry)
    received = re.search(r'bytes_received:(\d+)', entry)
    local, peer = int(addrs[0]), int(addrs[1])
    owner_of_port.setdefault(local, int(owner.group(1)))
    sockets.append((int(owner.group(1)), peer, int(sent.group(1)) if sent else 0,
                    int(received.group(1)) if received else 0))
  totals = {'worker_to_worker': 0, 'worker_to_client': 0}
  for task in pids.values():
    totals[f'task_{task}_sent'] = totals[f'task_{task}_received'] = 0
  for pid, peer, sent, received in sockets:
    if pid not in pids:
      continue
    totals[f'task_{pids[pid]}_sent'] += sent
    totals[f'task_{pids[pid]}_received'] += received
    other = owner_of_port.get(peer)
    if other in pids and other != pid:
      totals['worker_to_worker'] += sent
    elif other is not None and other not in pids:
      totals['worker_to_client'] += sent
  return totals


def _Run() -> dict:
  """One measured run in this process."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from benchmarks import workloads
  from trainer.cluster import cluster_spec
  from lingvo_pipe.pipeline import gpipe
  from lingvo_pipe.pipeline.replicas import replica_variables
  from lingvo_pipe.pipeline.schedules import schedule
  from trainer.cluster import cluster_client
  num_devices = FLAGS.k * FLAGS.replicas
  workers, pids, ports = [], {}, []
  try:
    if FLAGS.run == 'workers':
      ports = runner.FreePorts(num_devices)
      spec = 'worker=' + ','.join(f'localhost:{p}' for p in ports)
      env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
      for t in range(num_devices):
        pin = ['taskset', '-c', str(t % os.cpu_count())] if FLAGS.pin_workers else []
        workers.append(subprocess.Popen(
            pin + [sys.executable, '-m', 'trainer.trainer', '--mode=worker', f'--task={t}',
             f'--cluster_spec={spec}', f'--worker_threads={FLAGS.threads}'],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True))
        pids[workers[-1].pid] = t
      tf.config.threading.set_intra_op_parallelism_threads(FLAGS.threads)
      cluster_client.Connect(cluster_spec.Parse(spec), 120)
    else:
      cpu = tf.config.list_physical_devices('CPU')[0]
      tf.config.set_logical_device_configuration(
          cpu, [tf.config.LogicalDeviceConfiguration()] * num_devices)
      # The devices of one process share its intra-op threads: as many as
      # the workers have together.
      tf.config.threading.set_intra_op_parallelism_threads(FLAGS.threads * num_devices)
    w = workloads.WORKLOADS['ffn']
    shape = [FLAGS.batch, w.dim]
    model = gpipe.PipeliningLayer.Params().Set(
        name='model', num_partitions=FLAGS.k * schedule_flags.CellsPerDevice(),
        num_micro_batches=FLAGS.m, num_replicas=FLAGS.replicas, input_shapes=[shape],
        schedule=schedule.ScheduleKind(FLAGS.schedule),
        cells_per_device=FLAGS.cells_per_device,
        loop_min_micro_batches=FLAGS.loop_min_micro_batches,
        layers=workloads.Layers(workloads.WORKLOADS['ffn'].__class__(
            'ffn', FLAGS.num_layers, w.dim, w.hidden, 0, FLAGS.batch, 0))).Instantiate()
    variables = list(model.trainable_variables)
    trained = replica_variables.TrainedVariables(model)  # and the replicas' copies
    with tf.device(model.devices[0].name):
      x = tf.random.stateless_normal(shape, [1, 2])

    @tf.function(autograph=False)
    def Step(x):
      with tf.GradientTape() as tape:
        if FLAGS.schedule == 'gpipe':
          loss = tf.reduce_mean(tf.square(model(x)))
        else:  # the same loss, a sum of per-micro-batch terms
          loss = model.FPropWithLoss(
              model.theta, lambda y: tf.reduce_sum(tf.square(y)) / x.shape.num_elements(),
              x)[0]
      for v, g in zip(trained, tape.gradient(loss, trained)):
        with tf.device(v.device):
          v.assign_sub(1e-3 * tf.convert_to_tensor(g))
      return loss

    start = time.perf_counter()
    Step(x).numpy()
    first = time.perf_counter() - start
    for _ in range(FLAGS.warmup):
      Step(x).numpy()
    before = _Bytes(pids) if workers else {}
    times = []
    for _ in range(FLAGS.steps):
      t0 = time.perf_counter()
      Step(x).numpy()
      times.append(time.perf_counter() - t0)
    after = _Bytes(pids) if workers else {}
    profiled = {}
    if FLAGS.run == 'local' and FLAGS.replicas > 1:
      from lingvo_pipe.profiling import bubble  # pylint: disable=g-import-not-at-top
      from lingvo_pipe.profiling import timeline  # pylint: disable=g-import-not-at-top
      with tempfile.TemporaryDirectory() as logdir:
        intervals = timeline.ProfileIntervals(
            lambda: Step(x), logdir, warmup=0,
            schedule=model.plan.Actions(FLAGS.m),
            replica_devices=model.plan.DeviceNames())
      profiled = dict(
          profiled_step_us=max(i.end_us for i in intervals) - min(i.start_us for i in intervals),
          unoverlapped_all_reduce_share=bubble.UnoverlappedAllReduceShare(intervals),
          all_reduce_us_per_device=statistics.median(
              i.end_us - i.start_us for i in intervals
              if i.phase == timeline.Phase.ALL_REDUCE))
    boundary = 2 * FLAGS.batch * w.dim * 4 * (FLAGS.k - 1)  # activations + gradients
    result = dict(run=FLAGS.run, K=FLAGS.k, M=FLAGS.m, R=FLAGS.replicas,
                  schedule=FLAGS.schedule, cells_per_device=FLAGS.cells_per_device,
                  loop_min_micro_batches=FLAGS.loop_min_micro_batches,
                  num_layers=FLAGS.num_layers, batch=FLAGS.batch,
                  threads=FLAGS.threads, pinned=FLAGS.pin_workers, steps=FLAGS.steps,
                  step_s_median=statistics.median(times), step_s_min=min(times),
                  first_step_s=first,
                  examples_per_s=FLAGS.batch / statistics.median(times),
                  boundary_bytes_per_step=boundary,
                  weight_bytes=sum(int(v.shape.num_elements()) * 4 for v in variables),
                  tf_version=tf.__version__, **profiled)
    if workers:
      for key in after:
        result[f'{key}_bytes_per_step'] = (after[key] - before[key]) / FLAGS.steps
      result['busiest_worker_bytes_per_step'] = max(
          result[f'task_{t}_sent_bytes_per_step'] + result[f'task_{t}_received_bytes_per_step']
          for t in pids.values())
    return result
  finally:
    for p in workers:
      p.kill()
      p.wait()


def _Child(run: str, replicas: int, k: int) -> dict:
  args = [sys.executable, '-m', 'benchmarks.cluster_bench', f'--run={run}',
          f'--replicas={replicas}', f'--k={k}', f'--m={FLAGS.m}',
          f'--num_layers={FLAGS.num_layers}', f'--batch={FLAGS.batch}',
          f'--steps={FLAGS.steps}', f'--warmup={FLAGS.warmup}',
          f'--threads={FLAGS.threads}', f'--pin_workers={FLAGS.pin_workers}',
          f'--schedule={FLAGS.schedule}', f'--cells_per_device={FLAGS.cells_per_device}',
          f'--loop_min_micro_batches={FLAGS.loop_min_micro_batches}']
  out = subprocess.run(args, capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3'))
  if out.returncode:
    raise RuntimeError(f'{args} failed:\n{out.stderr[-3000:]}')
  return json.loads(out.stdout.strip().splitlines()[-1])


def _Configs() -> List[Tuple[str, int, int]]:
  """(placement, R, K) of each run to alternate."""
  if not FLAGS.configs:
    return [('local', FLAGS.replicas, FLAGS.k), ('workers', FLAGS.replicas, FLAGS.k)]
  configs = []
  for text in FLAGS.configs:
    match = re.fullmatch(r'(local|workers):(\d+)x(\d+)', text)
    if not match:
      raise ValueError(f'--configs entry {text!r}: write PLACEMENT:RxK, e.g. '
                       'workers:2x1 (placement local or workers).')
    configs.append((match.group(1), int(match.group(2)), int(match.group(3))))
  return configs


def _Alternate() -> dict:
  configs = _Configs()
  names = [f'{run}_R{r}xK{k}' for run, r, k in configs]
  runs: Dict[str, List[dict]] = {name: [] for name in names}
  for _ in range(FLAGS.pairs):
    for name, (run, replicas, k) in zip(names, configs):
      runs[name].append(_Child(run, replicas, k))
  first = runs[names[0]]
  summary = {
      'compare': names, 'pairs': FLAGS.pairs,
      'step_s_medians': {key: statistics.median(r['step_s_median'] for r in rs)
                         for key, rs in runs.items()},
      'examples_per_s_medians': {key: statistics.median(r['examples_per_s'] for r in rs)
                                 for key, rs in runs.items()},
      # Paired by alternation: each run's examples/s over the first config's.
      'examples_per_s_ratio_medians': {
          key: statistics.median(r['examples_per_s'] / f['examples_per_s']
                                 for f, r in zip(first, rs))
          for key, rs in runs.items()},
      'runs': runs}
  for key, rs in runs.items():
    if 'busiest_worker_bytes_per_step' in rs[0]:
      summary.setdefault('busiest_worker_bytes_per_step_medians', {})[key] = (
          statistics.median(r['busiest_worker_bytes_per_step'] for r in rs))
  return summary


def main(argv):
  del argv
  print(json.dumps(_Run() if FLAGS.run else _Alternate()), flush=True)


if __name__ == '__main__':
  app.run(main)
