"""A watchdog that ends the client when a worker stops answering mid-run.

A worker that dies fails the client's next step at once, but one that
hangs (stopped, swapping, cut off) makes a remote step wait without end
(about 60 s even with gRPC keepalive; docs/design.md, "Several machines").
While the trainer runs, this thread probes every worker task with a tiny op
every timeout_s / 4; a task that does not answer within timeout_s ends the
process with one line naming it and its address, and how to resume. So the
client never hangs longer than about 1.25 x timeout_s, however long its
steps are (the probe is independent of the step: a slow first step while
tracing is not a failure).
"""

import os
import sys
import threading
from typing import Callable, List, Optional

from trainer.cluster.cluster_spec import ClusterConfig
from trainer.cluster import cluster_client

# Exit status of a run ended by an unreachable worker (2 is a user error).
EXIT_WORKER_LOST = 3


def ExitWorkerLost(message: str) -> None:
  """Prints `message` as one 'error:' line and ends the process at once
  (from any thread; the step in flight is abandoned, finished checkpoints
  are complete)."""
  print(f'error: {message}', file=sys.stderr, flush=True)
  os._exit(EXIT_WORKER_LOST)  # pylint: disable=protected-access


class WorkerWatchdog:
  """A context: while inside, probes the workers in a daemon thread."""

  def __init__(self, config: ClusterConfig, timeout_s: float,
               resume_hint: Callable[[], str] = lambda: '',
               on_lost: Callable[[str], None] = ExitWorkerLost) -> None:
    """`resume_hint()` is appended to the message (e.g. the newest
    checkpoint); `on_lost(message)` is called once when a task does not
    answer."""
    if timeout_s <= 0:
      raise ValueError(f'The worker timeout must be > 0 s, got {timeout_s}; '
                       'e.g. --worker_timeout_s=20.')
    self._config = config
    self._timeout_s = timeout_s
    self._resume_hint = resume_hint
    self._on_lost = on_lost
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None

  def __enter__(self) -> 'WorkerWatchdog':
    self._thread = threading.Thread(target=self._Watch, daemon=True,
                                    name='worker_watchdog')
    self._thread.start()
    return self

  def __exit__(self, *exc_info) -> None:
    self._stop.set()

  def _Watch(self) -> None:
    while not self._stop.wait(self._timeout_s / 4):
      silent = cluster_client.Probe(self._config, self._timeout_s)
      if silent and not self._stop.is_set():
        # Once one task is gone, the others' probes fail too: name the
        # tasks that refuse connections, if any, else the silent ones.
        down = cluster_client.Refusing(self._config)
        self._on_lost(Message(self._config, down or silent, bool(down),
                              self._timeout_s, self._resume_hint()))
        return


def Message(config: ClusterConfig, tasks: List[int], down: bool,
            timeout_s: float, hint: str) -> str:
  """The one line for `tasks` that are down (refuse connections) or did
  not answer."""
  names = ', '.join(f'worker task {t} ({config.Address(t)})' for t in tasks)
  what = ('is down (connection refused)' if down else
          f'did not answer for {timeout_s:g} s (--worker_timeout_s)')
  return (f'{names} {what}; stopped training. Restart the worker(s), then '
          f'the client, to resume{hint}.')
