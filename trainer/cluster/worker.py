"""`--mode=worker`: one task of a TensorFlow cluster, serving a client's cells."""

import os
import socket
from typing import Callable

import tensorflow as tf

from trainer.cluster import cluster_spec
from trainer.cluster.cluster_spec import ClusterConfig
from trainer.cluster import network_exposure


class WorkerStartError(ValueError):
  """The worker cannot serve (bad task index, port in use); one line."""


def CheckPortFree(config: ClusterConfig, task: int) -> None:
  """Raises WorkerStartError if the port of `task` is taken on this host
  (by another worker started on it, or any other program)."""
  address = config.Address(task)
  port = config.Port(task)
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    # As gRPC does: a port whose old connections linger in TIME_WAIT (a
    # worker just restarted) is free; one with a listener is not.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      s.bind(('', port))
    except OSError as e:
      raise WorkerStartError(
          f'Worker task {task} cannot listen on {address}: port {port} is in '
          f'use ({e.strerror}); is a worker already running on it? Stop it or '
          'give this task another port in --cluster_spec.') from None


def ServerConfig(threads: int) -> tf.compat.v1.ConfigProto:
  """The worker's session config: `threads` intra-op threads (0: as many
  as TensorFlow picks) and at least two inter-op threads, so that the
  client's liveness probe is answered while a cell runs."""
  return tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads,
                                  inter_op_parallelism_threads=max(threads, 2)
                                  if threads else 0)


def StartServer(config: ClusterConfig, task: int, threads: int = 0,
                trusted: bool = False) -> tf.distribute.Server:
  """Starts the tf.distribute.Server of worker `task`; beyond loopback
  only if `trusted` (network_exposure.TRUST_FLAG).

  Raises:
    ValueError: for a task index out of range.
    network_exposure.UntrustedNetworkError: beyond loopback, not trusted.
    WorkerStartError: if its port is in use.
  """
  network_exposure.CheckTrusted([config.Address(task)], f'Worker task {task}', trusted)
  CheckPortFree(config, task)
  try:
    return tf.distribute.Server(config.ToClusterSpec(),
                                job_name=cluster_spec.WORKER_JOB,
                                task_index=task, config=ServerConfig(threads),
                                start=True)
  except tf.errors.OpError as e:
    raise WorkerStartError(
        f'Worker task {task} could not start its server on '
        f'{config.Address(task)}: {e.message}; is the port in use?') from None


def _Print(line: str) -> None:
  print(line, flush=True)


def Serve(config: ClusterConfig, task: int, threads: int = 0, trusted: bool = False,
          log: Callable[[str], None] = _Print) -> None:
  """Starts worker `task`, says in one line that it is ready, where, and
  what its port lets in, and serves until the process is stopped."""
  server = StartServer(config, task, threads, trusted)
  log(f'worker task {task} of {len(config.Tasks())} ready at '
      f'{config.Address(task)} (pid {os.getpid()}, server {server.target}); '
      f'waiting for a client; {network_exposure.OpenPortNote(config.Port(task), trusted)}')
  server.join()
