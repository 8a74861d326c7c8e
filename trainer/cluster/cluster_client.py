"""The trainer as a cluster's client: first contact and liveness probes."""

import socket
import threading
import time
from typing import Dict, List, Optional

import tensorflow as tf

from lingvo_pipe.pipeline.layout import cluster
from trainer.cluster.cluster_spec import ClusterConfig


# The client's own job, as TensorFlow names it when it adds it itself.
CLIENT_JOB = 'localhost'


class WorkerUnreachableError(RuntimeError):
  """A worker task does not answer; the message names it and its address."""


def _Accepts(address: str, timeout_s: float) -> bool:
  host, port = address.rsplit(':', 1)
  try:
    with socket.create_connection((host.strip('[]'), int(port)), timeout=timeout_s):
      return True
  except OSError:
    return False


def _FreePort() -> int:
  """A port that was free a moment ago (as TensorFlow picks the client's)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('', 0))
    return s.getsockname()[1]


def Refusing(config: ClusterConfig) -> List[int]:
  """The worker tasks whose address accepts no connection now."""
  return [t for t, a in enumerate(config.Tasks()) if not _Accepts(a, 1.0)]


def WaitForWorkers(config: ClusterConfig, timeout_s: float,
                   poll_s: float = 0.5) -> None:
  """Waits until every worker's address accepts connections.

  Raises:
    WorkerUnreachableError: naming the tasks that did not come up within
      timeout_s, and how to start them.
  """
  deadline = time.monotonic() + timeout_s
  while True:
    missing = Refusing(config)
    if not missing:
      return
    if time.monotonic() >= deadline:
      raise WorkerUnreachableError(
          f'{_Names(config, missing)} did not come up within {timeout_s:g} s '
          f'(no server accepts connections there); start each with '
          f'`lingvo_pipe_trainer --mode=worker --task=T '
          f'--cluster_spec={config.Flag()}`, or fix --cluster_spec.')
    time.sleep(poll_s)


def Probe(config: ClusterConfig, timeout_s: float) -> List[int]:
  """Runs a tiny op on device 0 of every worker task at once; returns the
  tasks that did not answer within timeout_s (or failed). Safe to call
  while another thread runs a step on the workers."""
  answered: Dict[int, bool] = {}

  def Ask(task: int) -> None:
    try:
      with tf.device(cluster.Device(cluster.DeviceType.CPU, 0, 'worker', task).name):
        value = tf.constant(task) + 1
      answered[task] = int(value.numpy()) == task + 1
    except (tf.errors.OpError, RuntimeError):
      answered[task] = False

  threads = [threading.Thread(target=Ask, args=(t,), daemon=True)
             for t in range(len(config.Tasks()))]
  for thread in threads:
    thread.start()
  deadline = time.monotonic() + timeout_s
  for thread in threads:
    thread.join(max(deadline - time.monotonic(), 0.0))
  return [t for t in range(len(threads)) if not answered.get(t, False)]


def Connect(config: ClusterConfig, timeout_s: float) -> int:
  """Waits for the workers, connects this process to the cluster
  (tf.config.experimental_connect_to_cluster) and checks that every task
  runs an op within timeout_s.

  Returns:
    The port of the server that connecting starts in this process (job
    CLIENT_JOB; TensorFlow's eager client serves one, on every interface).

  Raises:
    WorkerUnreachableError: naming the tasks that did not come up or answer.
  """
  WaitForWorkers(config, timeout_s)
  port = _FreePort()
  spec = config.ToClusterSpec().as_dict()
  spec[CLIENT_JOB] = [f'localhost:{port}']
  tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(spec), job_name=CLIENT_JOB)
  silent = Probe(config, timeout_s)
  if silent:
    raise WorkerUnreachableError(
        f'{_Names(config, silent)} accepted a connection but ran no op within '
        f'{timeout_s:g} s; is it a TensorFlow worker of this cluster '
        f'(--mode=worker --cluster_spec={config.Flag()})?')
  return port


def Diagnose(config: ClusterConfig, timeout_s: float) -> Optional[str]:
  """Which tasks are down or do not answer, as a sentence; None if all
  answer."""
  down = Refusing(config)
  if down:
    return f'{_Names(config, down)} is down (connection refused)'
  silent = Probe(config, timeout_s)
  if silent:
    return f'{_Names(config, silent)} does not answer within {timeout_s:g} s'
  return None


def _Names(config: ClusterConfig, tasks: List[int]) -> str:
  return ', '.join(f'worker task {t} ({config.Address(t)})' for t in tasks)
