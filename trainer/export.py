"""--mode=export: a TensorFlow SavedModel of a task's inference function with
the newest checkpoint's weights, under logdir/export/<step>/.

Its `serving_default` signature is the task's ServingFunction (mt: source
byte ids in, translation ids and scores out; lm: byte ids in, next-byte
log-probabilities out). It takes any batch up to a maximum: when the task's
ServingSignature fixes the batch (its first dimension, the batch the
pipeline was built for), the exported function takes 1 to that many rows,
pads them to it inside, and cuts the outputs back; more rows fail with an
error naming the maximum. It loads with tf.saved_model.load in a process
that does not import lingvo_pipe. The ops' device placement (each pipeline cell on
its device) is cleared from the saved graphs unless keep_devices, so the
export runs on whatever devices the loader has.
"""

import os
import shutil
from typing import Callable, Dict, List, Optional

import tensorflow as tf

from lingvo_pipe.core import eval_mode
from lingvo_pipe.tasks import decoding
from tensorflow.core.protobuf import saved_model_pb2  # pylint: disable=g-direct-tensorflow-import

SAVED_MODEL_FILE = 'saved_model.pb'


def LatestCheckpoint(logdir: str) -> Optional[str]:
  """The newest checkpoint the trainer wrote in logdir, or None."""
  return tf.train.latest_checkpoint(os.path.join(logdir, 'checkpoints'))


def _ClearDevices(export_dir: str) -> int:
  """Clears the device of every node of the saved graph and its functions;
  returns how many were set."""
  path = os.path.join(export_dir, SAVED_MODEL_FILE)
  model = saved_model_pb2.SavedModel()
  with open(path, 'rb') as f:
    model.ParseFromString(f.read())
  cleared = 0
  for meta_graph in model.meta_graphs:
    graph = meta_graph.graph_def
    nodes = list(graph.node) + [n for fn in graph.library.function for n in fn.node_def]
    for node in nodes:
      if node.device:
        node.device = ''
        cleared += 1
  with open(path, 'wb') as f:
    f.write(model.SerializeToString())
  return cleared


def MaxBatch(specs: Dict[str, tf.TensorSpec]) -> Optional[int]:
  """The batch every input of specs fixes (their first dimension), or None
  if one leaves it open (the task pads itself).

  Raises:
    ValueError: if the inputs fix different batches.
  """
  sizes = {name: spec.shape[0] if spec.shape.rank else None for name, spec in specs.items()}
  if any(size is None for size in sizes.values()):
    return None
  if len(set(sizes.values())) > 1:
    raise ValueError(f'The serving inputs fix different batches {sizes}; give '
                     'them one batch size (or None) in ServingSignature.')
  return next(iter(sizes.values()), None)


def PaddedToBatch(fn: Callable[..., Dict[str, tf.Tensor]], names: List[str],
                  max_batch: int) -> Callable[..., Dict[str, tf.Tensor]]:
  """fn (of inputs of exactly max_batch rows) as a function of 1 to
  max_batch rows: pads each input to max_batch, cuts each output whose
  first dimension is max_batch back to the rows given, and refuses more
  rows with an InvalidArgumentError naming the maximum."""

  def Padded(*args: tf.Tensor) -> Dict[str, tf.Tensor]:
    n = tf.shape(args[0])[0]
    checks = [tf.debugging.assert_less_equal(
        tf.shape(x)[0], max_batch, message=(
            f'serving_default takes at most {max_batch} rows per call (the batch '
            f'the pipeline was built for); input {name} has more: split the '
            'batch.')) for name, x in zip(names, args)]
    checks += [tf.debugging.assert_equal(
        tf.shape(x)[0], n, message=f'input {name!r} has another number of rows '
        f'than {names[0]!r}.') for name, x in zip(names[1:], args[1:])]
    with tf.control_dependencies(checks):
      padded = [tf.ensure_shape(
          tf.pad(x, [[0, tf.maximum(max_batch - n, 0)]] + [[0, 0]] * (x.shape.rank - 1)),
          [max_batch] + x.shape[1:].as_list()) for x in args]
    out = fn(*padded)
    return {k: v[:n] if v.shape.rank and v.shape[0] == max_batch else v
            for k, v in out.items()}

  return Padded


def _ServingSpecs(specs: Dict[str, tf.TensorSpec], names: List[str],
                  max_batch: Optional[int]) -> List[tf.TensorSpec]:
  """The exported signature: the batch dimension left open when max_batch."""
  if max_batch is None:
    return [specs[n] for n in names]
  return [tf.TensorSpec([None] + specs[n].shape[1:].as_list(), specs[n].dtype, name=n)
          for n in names]


def Export(trainer_obj, keep_devices: bool = False) -> str:
  """Writes the SavedModel of trainer_obj's task (its weights as restored)
  to logdir/export/<global step>/ and returns that directory. An export of
  the same step is replaced only once the new one is complete.

  Raises:
    ValueError: if the task cannot export (no decoding.DecodingTask).
  """
  task = trainer_obj.task
  if not isinstance(task, decoding.DecodingTask):
    raise ValueError(f'Task {type(task).__name__} has no inference function to '
                     'export; it does not implement DecodingTask.')
  specs, _ = task.ServingSignature()
  names = list(specs)
  max_batch = MaxBatch(specs)

  def Serve(*args: tf.Tensor):
    with eval_mode.EvalMode():  # inference: no dropout, no custom gradients
      return task.ServingFunction(getattr(task, 'theta'), **dict(zip(names, args)))

  body = Serve if max_batch is None else PaddedToBatch(Serve, names, max_batch)
  serve = tf.function(body, input_signature=_ServingSpecs(specs, names, max_batch),
                      autograph=False)
  module = tf.Module()
  module.task = task
  module.serve = serve
  step = int(trainer_obj.global_step.numpy())
  final = os.path.join(trainer_obj.logdir, 'export', str(step))
  partial = final + '.partial'
  shutil.rmtree(partial, ignore_errors=True)
  tf.saved_model.save(module, partial,
                      signatures={'serving_default': serve.get_concrete_function()})
  if not keep_devices:
    _ClearDevices(partial)
  if os.path.exists(final):
    shutil.rmtree(final)
  os.rename(partial, final)
  return final
