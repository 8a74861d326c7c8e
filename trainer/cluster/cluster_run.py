"""The trainer on a cluster: the cluster from the flags, worker mode, and
steps under the worker watchdog."""

import contextlib
from typing import Iterator, Mapping, Optional

import tensorflow as tf

from trainer.cluster import cluster_spec
from trainer.cluster.cluster_spec import ClusterConfig
from trainer.cluster import cluster_client
from trainer.cluster import worker
from trainer.cluster import worker_watchdog


def ClusterFromFlags(spec_flag: str, environ: Mapping[str, str]
                     ) -> Optional[ClusterConfig]:
  """The cluster of --cluster_spec, else of TF_CONFIG; None if neither.

  Raises:
    ValueError: for a malformed spec or TF_CONFIG.
  """
  if spec_flag:
    return cluster_spec.Parse(spec_flag)
  if environ.get('TF_CONFIG'):
    return cluster_spec.FromTfConfig(environ['TF_CONFIG'])[0]
  return None


def RunWorker(spec_flag: str, task: int, environ: Mapping[str, str],
              threads: int = 0, trusted: bool = False) -> None:
  """--mode=worker: serves task `task` (or TF_CONFIG's) until killed;
  beyond loopback only if `trusted` (--trust_cluster_network).

  Raises:
    ValueError: without a cluster or task, for a task out of range, an
      untrusted address beyond loopback, or a port in use.
  """
  config = ClusterFromFlags(spec_flag, environ)
  if config is None:
    raise ValueError('--mode=worker needs the cluster: --cluster_spec='
                     'worker=host:port,host:port (or TF_CONFIG).')
  if task < 0 and environ.get('TF_CONFIG') and not spec_flag:
    from_config = cluster_spec.FromTfConfig(environ['TF_CONFIG'])[1]
    task = -1 if from_config is None else from_config
  if task < 0:
    raise ValueError(f'--mode=worker needs --task=T, this worker\'s index in '
                     f'--cluster_spec ({len(config.Tasks())} task(s): '
                     f'0 to {len(config.Tasks()) - 1}).')
  worker.Serve(config, task, threads, trusted)


@contextlib.contextmanager
def Supervised(trainer_obj, config: ClusterConfig,
               timeout_s: float) -> Iterator[None]:
  """Runs the body (training or evaluation steps) with the worker watchdog
  on; a step that fails because a worker is gone ends the run as the
  watchdog does: one line naming the task, exit status
  worker_watchdog.EXIT_WORKER_LOST."""

  def ResumeHint() -> str:
    newest = trainer_obj.manager.latest_checkpoint
    return f' from {newest}' if newest else ' (no checkpoint was written yet)'

  with worker_watchdog.WorkerWatchdog(config, timeout_s, ResumeHint):
    try:
      yield
    except (tf.errors.UnavailableError, tf.errors.AbortedError,
            tf.errors.CancelledError, tf.errors.InternalError) as e:
      cause = cluster_client.Diagnose(config, min(timeout_s, 5.0))
      first = (e.message or type(e).__name__).strip().splitlines()[0][:200]
      worker_watchdog.ExitWorkerLost(
          f'{cause or "a worker failed"}: the step failed with '
          f'{type(e).__name__} ({first}); stopped. Restart the worker(s), '
          f'then the client, to resume{ResumeHint()}.')
