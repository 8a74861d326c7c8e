"""The peer: one training step of Lingvo's GPipe (lingvo.core.gpipe) on CPU.

Run from the repository root with the peer venv (setup.sh):

  $PEER_VENV/bin/python -m benchmarks.lingvo_peer.bench --workload ffn \
      --layers 16 --dim 512 --hidden 2048 --batch 64 --partitions 4 \
      --micro_batches 4 --json

L Lingvo layers (TransformerFeedForwardLayer or TransformerLayer, pre-LN,
dropout 0) are split into K FeatureExtractionLayer cells of L/K layers and
wrapped in Lingvo's PipeliningLayer with M micro-batches. Cell i goes to
logical CPU:i through Lingvo's own cluster (cluster_factory.ForTestingWorker(
cpus=K, split_size=K)). A step is forward, tf.gradients and plain SGD in a
tf.compat.v1.Session, as Lingvo trains; loss = mean(output^2). --baseline
runs the same layers (same variable names) through gpipe.SeqLayer on CPU:0.

Pipelined runs also check equivalence: loss, gradient norm and every
gradient at the initial weights against the baseline graph built with the
same weight values. README.md in this directory defines every figure.
No Lingvo code is copied here; it imports the installed package.
"""

import argparse
import json
import os
import resource
import statistics
import sys
import time


def ParseArgs(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
  parser.add_argument('--workload', choices=['ffn', 'transformer'], default='ffn')
  parser.add_argument('--layers', type=int, default=16, help='L, total layers')
  parser.add_argument('--dim', type=int, default=512, help='d, model dim')
  parser.add_argument('--hidden', type=int, default=2048, help='h, FFN hidden')
  parser.add_argument('--batch', type=int, default=64, help='B, global batch')
  parser.add_argument('--seq', type=int, default=64, help='S (transformer only)')
  parser.add_argument('--heads', type=int, default=4, help='attention heads')
  parser.add_argument('--partitions', type=int, default=1,
                      help='K, cells = logical CPU devices')
  parser.add_argument('--micro_batches', type=int, default=1, help='M')
  parser.add_argument('--steps', type=int, default=10, help='timed steps')
  parser.add_argument('--warmup', type=int, default=3, help='untimed steps')
  parser.add_argument('--lr', type=float, default=1e-3, help='SGD learning rate')
  parser.add_argument('--seed', type=int, default=1234)
  parser.add_argument('--baseline', action='store_true',
                      help='no PipeliningLayer: the same layers in sequence on CPU:0')
  parser.add_argument('--no_check', action='store_true',
                      help='skip the pipelined-vs-baseline equivalence check')
  parser.add_argument('--intra_op', type=int, default=0,
                      help='intra_op_parallelism_threads (0: TF default)')
  parser.add_argument('--inter_op', type=int, default=0,
                      help='inter_op_parallelism_threads (0: TF default)')
  parser.add_argument('--json', action='store_true',
                      help='print one JSON object on stdout (logs go to stderr)')
  args = parser.parse_args(argv)
  if args.layers % args.partitions:
    parser.error('--layers must be divisible by --partitions')
  if args.baseline:
    args.micro_batches = 1
  return args


ARGS = ParseArgs()
NUM_DEVICES = max(ARGS.partitions, 1)

# Logical devices must exist before anything initializes TensorFlow's runtime,
# importing Lingvo included.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '1')
import tensorflow as tf  # noqa: E402  pylint: disable=g-import-not-at-top

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices('CPU')[0],
    [tf.config.LogicalDeviceConfiguration()] * NUM_DEVICES)

import numpy as np  # noqa: E402  pylint: disable=g-import-not-at-top
from absl import logging as absl_logging  # noqa: E402
from lingvo.core import cluster_factory  # noqa: E402
from lingvo.core import gpipe  # noqa: E402
from lingvo.core import layers_with_attention  # noqa: E402
from lingvo.core import py_utils  # noqa: E402

from benchmarks.lingvo_peer import placement  # noqa: E402

tf1 = tf.compat.v1
tf1.logging.set_verbosity(tf1.logging.WARN)
absl_logging.set_verbosity(absl_logging.WARNING)


def Log(*args) -> None:
  print(*args, file=sys.stderr if ARGS.json else sys.stdout, flush=True)


# Lingvo's PipeliningLayer needs sub-layers that map a tuple of tensors to a
# tuple of the same arity and have an FPropMeta (output shapes and FLOPs);
# the stock layers have neither. The subclasses add them; the math is Lingvo's.
class PipeFFN(layers_with_attention.TransformerFeedForwardLayer):
  """x[B, d] -> LN -> FFN(d->h->d) -> +x (pre-LN, residual dropout 0)."""

  def FProp(self, theta, inputs):  # pylint: disable=arguments-differ
    return super().FProp(theta, inputs, None)

  @classmethod
  def FPropMeta(cls, p, inputs):
    rows = inputs.num_elements() // inputs[-1]
    flops = 2 * 2 * rows * p.input_dim * p.hidden_dim
    return py_utils.NestedMap(flops=flops, out_shapes=(inputs,))


class PipeTransformer(layers_with_attention.TransformerLayer):
  """(x[S, B, d], paddings[S, B]) -> (TransformerLayer(x), paddings)."""

  def FProp(self, theta, vecs, paddings):  # pylint: disable=arguments-differ
    out, _ = super().FProp(theta, vecs, paddings)
    return out, paddings

  @classmethod
  def FPropMeta(cls, p, vecs, paddings):
    s, b, d = vecs[0], vecs[1], vecs[2]
    h = p.tr_fflayer_tpl.hidden_dim
    flops = 2 * s * b * (4 * d * d + 2 * s * d + 2 * d * h)
    return py_utils.NestedMap(flops=flops, out_shapes=(vecs, paddings))


def LayerParams(args):
  params = []
  for i in range(args.layers):
    if args.workload == 'ffn':
      p = PipeFFN.Params().Set(
          name=f'layer_{i:03d}', input_dim=args.dim, hidden_dim=args.hidden,
          residual_dropout_prob=0.0, relu_dropout_prob=0.0)
    else:
      p = PipeTransformer.Params().Set(name=f'layer_{i:03d}', source_dim=args.dim)
      p.tr_atten_tpl.num_attention_heads = args.heads
      p.tr_atten_tpl.residual_dropout_prob = 0.0
      p.tr_atten_tpl.atten_dropout_prob = 0.0
      p.tr_fflayer_tpl.hidden_dim = args.hidden
      p.tr_fflayer_tpl.residual_dropout_prob = 0.0
      p.tr_fflayer_tpl.relu_dropout_prob = 0.0
    p.random_seed = args.seed + i
    params.append(p)
  return params


def CellParams(args, num_cells: int):
  layers = LayerParams(args)
  per_cell = args.layers // num_cells
  return [gpipe.FeatureExtractionLayer.Params().Set(
      name=f'cell_{c}', sub=layers[c * per_cell:(c + 1) * per_cell])
          for c in range(num_cells)]


def Inputs(args):
  """(numpy inputs, batch_dim); Lingvo's Transformer layers are time-major."""
  rng = np.random.RandomState(args.seed)
  if args.workload == 'ffn':
    return (rng.standard_normal((args.batch, args.dim)).astype(np.float32),), 0
  x = rng.standard_normal((args.seq, args.batch, args.dim)).astype(np.float32)
  return (x, np.zeros((args.seq, args.batch), np.float32)), 1


def Build(args, pipelined: bool, num_devices: int) -> dict:
  """The model and its train op in the current default graph."""
  np_inputs, batch_dim = Inputs(args)
  inputs = tuple(tf.constant(a) for a in np_inputs)
  py_utils.GetOrCreateGlobalStepVar()
  cluster = cluster_factory.ForTestingWorker(
      cpus=num_devices, split_size=num_devices, do_eval=False)
  # Lingvo's assert_shape_match lives in the stubbed x_ops; its cluster
  # switches turn graph asserts and check-numerics off (in every mode alike).
  cluster.params.enable_asserts = False
  cluster.params.enable_check_numerics = False
  with cluster:
    if pipelined:
      p = gpipe.PipeliningLayer.Params().Set(
          name='model', cell_tpl=CellParams(args, args.partitions),
          num_micro_batches=args.micro_batches, batch_dim=batch_dim)
    else:
      # With a one-device cluster SeqLayer puts every cell on CPU:0.
      p = gpipe.SeqLayer.Params().Set(name='model',
                                      cell_tpl=CellParams(args, args.partitions))
    layer = p.Instantiate()
    out = layer.FPropDefaultTheta(*inputs)
    if isinstance(out, (tuple, list)):
      out = out[0]
    loss = tf.reduce_mean(tf.square(out))
    tvars = tf1.trainable_variables()
    grads = tf.gradients(loss, tvars)
    train_op = tf1.train.GradientDescentOptimizer(args.lr).apply_gradients(
        list(zip(grads, tvars)))
  return dict(loss=loss, grads=grads, grad_norm=tf.linalg.global_norm(grads),
              tvars=tvars, train_op=train_op, cluster=cluster)


def SessionConfig(args):
  config = tf1.ConfigProto(intra_op_parallelism_threads=args.intra_op,
                           inter_op_parallelism_threads=args.inter_op,
                           allow_soft_placement=False)
  config.device_count['CPU'] = NUM_DEVICES
  return config


def BfcPeakMb():
  """(allocator peak in MiB, None) with TF_CPU_ALLOCATOR_USE_BFC=true, else
  (None, why not)."""
  if os.environ.get('TF_CPU_ALLOCATOR_USE_BFC', '').lower() not in ('true', '1'):
    return None, 'TF_CPU_ALLOCATOR_USE_BFC not set'
  try:
    return tf.config.experimental.get_memory_info('CPU:0')['peak'] / 2**20, None
  except Exception as e:  # pylint: disable=broad-except
    return None, f'{type(e).__name__}: {str(e)[:200]}'


def CheckAgainstBaseline(args, ref: dict) -> dict:
  """The baseline graph at the weights of `ref`: differences of loss,
  gradient norm and gradients."""
  graph = tf.Graph()
  with graph.as_default():
    tf1.set_random_seed(args.seed)
    model = Build(args, pipelined=False, num_devices=1)
    by_name = {v.op.name: v for v in tf1.global_variables()}
    missing = set(ref['weights']) - set(by_name)
    if missing:
      raise RuntimeError(f'baseline lacks variables: {sorted(missing)[:5]}')
    assigns = [by_name[n].assign(value) for n, value in ref['weights'].items()]
    with tf1.Session(graph=graph, config=SessionConfig(args)) as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run(assigns)
      loss, norm, grads = sess.run([model['loss'], model['grad_norm'], model['grads']])
      names = [v.op.name for v in model['tvars']]
  grad_diff = max((float(np.max(np.abs(g - ref['grads'][n])))
                   for n, g in zip(names, grads)), default=0.0)
  return dict(baseline_loss=float(loss), baseline_grad_norm=float(norm),
              max_abs_diff_loss=abs(float(loss) - ref['loss']),
              max_abs_diff_grad_norm=abs(float(norm) - ref['grad_norm']),
              max_abs_diff_grad_elem=grad_diff)


def Main(args) -> dict:
  pipelined = not args.baseline
  transformer = args.workload == 'transformer'
  res = dict(workload=args.workload, mode='pipelined' if pipelined else 'baseline',
             L=args.layers, d=args.dim, h=args.hidden, B=args.batch,
             S=args.seq if transformer else None,
             heads=args.heads if transformer else None, K=args.partitions,
             M=args.micro_batches, steps=args.steps, warmup=args.warmup,
             tf_version=tf.__version__)
  graph = tf.Graph()
  with graph.as_default():
    tf1.set_random_seed(args.seed)
    start = time.perf_counter()
    model = Build(args, pipelined, NUM_DEVICES if pipelined else 1)
    res['graph_build_s'] = time.perf_counter() - start
    res.update(placement.GraphStats(graph.as_graph_def()))
    if pipelined:
      res['cell_devices'] = [model['cluster'].WorkerDeviceInModelSplit(i)
                             for i in range(args.partitions)]
    res['num_params'] = int(sum(np.prod(v.shape.as_list()) for v in model['tvars']))
    init = tf1.global_variables_initializer()
  graph.finalize()

  sess = tf1.Session(graph=graph, config=SessionConfig(args))
  res['session_devices'] = [d.name.rsplit('/', 1)[-1] for d in sess.list_devices()]
  sess.run(init)

  ref = None
  if pipelined and not args.no_check:
    weights = sess.run({v.op.name: v for v in model['tvars']})
    loss0, norm0, grads0 = sess.run([model['loss'], model['grad_norm'], model['grads']])
    ref = dict(weights=weights, loss=float(loss0), grad_norm=float(norm0),
               grads={v.op.name: g for v, g in zip(model['tvars'], grads0)})
    res['loss_at_init'] = float(loss0)
    res['grad_norm_at_init'] = float(norm0)

  # The first step includes Grappler and function instantiation.
  start = time.perf_counter()
  sess.run(model['train_op'])
  res['first_step_s'] = time.perf_counter() - start
  for _ in range(max(args.warmup - 1, 0)):
    sess.run(model['train_op'])

  # One traced step after warm-up: where and when the ops ran.
  run_metadata = tf1.RunMetadata()
  start = time.perf_counter()
  sess.run(model['train_op'],
           options=tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE,
                                  output_partition_graphs=True),
           run_metadata=run_metadata)
  res['traced_step_s'] = time.perf_counter() - start
  res['ops_per_device'], res['while_loops_ms'] = placement.RuntimePlacement(run_metadata)
  res['matmul_ops_per_device'] = placement.StaticMatMulPlacement(
      run_metadata.partition_graphs, graph.as_graph_def().library)

  times = []
  for _ in range(args.steps):
    start = time.perf_counter()
    sess.run(model['train_op'])
    times.append(time.perf_counter() - start)
  res['step_s_median'] = statistics.median(times)
  res['step_s_min'] = min(times)
  res['step_s_all'] = [round(t, 5) for t in times]
  res['final_loss'] = float(sess.run(model['loss']))
  res['peak_rss_mb'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
  res['bfc_peak_mb'], res['bfc_note'] = BfcPeakMb()
  sess.close()
  if ref is not None:
    res.update(CheckAgainstBaseline(args, ref))
  return res


if __name__ == '__main__':
  result = Main(ARGS)
  if ARGS.json:
    print(json.dumps(result))
  else:
    for key, value in result.items():
      if key != 'step_s_all':
        Log(f'{key:<24} {value}')
