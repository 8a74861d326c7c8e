"""Checkpoints of variables on several worker tasks save without
TensorFlow's retracing warning (its saver traces a new function on every
such save, which warned from the fifth save on)."""

from tests import fresh_process
from tests import worker_cluster

_SAVES = """
import sys, tempfile
import tensorflow as tf
from trainer.cluster import cluster_spec
from trainer.checkpointing import checkpoints
from trainer.cluster import cluster_client
cluster_client.Connect(cluster_spec.Parse(sys.argv[1]), 60)
variables = []
for task in range(2):
  with tf.device(f'/job:worker/replica:0/task:{task}/device:CPU:0'):
    variables.append(tf.Variable(tf.fill([4], float(task))))
manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=variables), tempfile.mkdtemp(),
                                     max_to_keep=2)
for step in range(8):
  checkpoints.Save(manager, step)
print(manager.latest_checkpoint)
"""


def test_eight_saves_across_worker_tasks_print_no_retracing_warning():
  with worker_cluster.Running(2) as cluster:
    result = fresh_process.RunPython('-c', _SAVES, cluster.spec, timeout_s=300)
  assert result.stdout.strip().endswith('ckpt-7'), result.stdout
  assert 'retracing' not in result.stderr, result.stderr[-2000:]
