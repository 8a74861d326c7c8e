"""--mode=export: a TensorFlow SavedModel of a task's inference function with
the newest checkpoint's weights, under logdir/export/<step>/.

Its `serving_default` signature is the task's ServingFunction (mt: source
byte ids in, translation ids and scores out; lm: byte ids in, next-byte
log-probabilities out). It loads with tf.saved_model.load in a process that
does not import lingvo_pipe. The ops' device placement (each pipeline cell on
its device) is cleared from the saved graphs unless keep_devices, so the
export runs on whatever devices the loader has.
"""

import os
import shutil
from typing import Optional

import tensorflow as tf

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

  def Serve(*args: tf.Tensor):
    return task.ServingFunction(getattr(task, 'theta'), **dict(zip(names, args)))

  serve = tf.function(Serve, input_signature=[specs[n] for n in names], autograph=False)
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
