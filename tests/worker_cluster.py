"""Real `--mode=worker` processes on free loopback ports, for tests: started
with the trainer binary, waited for (bounded), always killed with their
process group."""

import contextlib
import ipaddress
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Iterator, List, Optional, Sequence

from tests import fresh_process

# How long a worker may take to print its ready line (TensorFlow's import).
READY_TIMEOUT_S = 120


def FreePorts(n: int) -> List[int]:
  """n distinct loopback ports that were free a moment ago."""
  sockets = []
  try:
    for _ in range(n):
      s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      s.bind(('localhost', 0))
      sockets.append(s)
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def Accepts(host: str, port: int) -> bool:
  """Whether a TCP connection to host:port is accepted now."""
  try:
    with socket.create_connection((host, port), timeout=2.0):
      return True
  except OSError:
    return False


def ListeningAddresses(port: int) -> List[str]:
  """The local addresses on which some process of this machine listens on
  TCP `port` (Linux: read from /proc/net/tcp and tcp6)."""
  found = []
  for table, width in (('/proc/net/tcp', 4), ('/proc/net/tcp6', 16)):
    with open(table) as f:
      for row in f.readlines()[1:]:
        local, state = row.split()[1], row.split()[3]
        address, hex_port = local.split(':')
        if state == '0A' and int(hex_port, 16) == port:  # 0A: LISTEN
          words = bytes.fromhex(address)
          # The kernel prints each 32-bit word in host (little-endian) order.
          raw = b''.join(words[i:i + 4][::-1] for i in range(0, width, 4))
          found.append(str(ipaddress.ip_address(raw)))
  return found


class Worker:
  """One worker process, its output in a file."""

  def __init__(self, spec: str, task: int, log_dir: str, threads: int = 0,
               flags: Sequence[str] = ()) -> None:
    self.task = task
    self.log_path = pathlib.Path(log_dir) / f'worker_{task}_{time.monotonic_ns()}.log'
    self._log = open(self.log_path, 'w')  # pylint: disable=consider-using-with
    env = dict(os.environ, PYTHONPATH=str(fresh_process.ROOT), TF_CPP_MIN_LOG_LEVEL='3')
    args = [sys.executable, '-m', 'trainer.trainer', '--mode=worker',
            f'--task={task}', f'--cluster_spec={spec}']
    if threads:
      args.append(f'--worker_threads={threads}')
    args += flags
    self.process = subprocess.Popen(  # pylint: disable=consider-using-with
        args, cwd=fresh_process.ROOT, env=env, stdout=self._log,
        stderr=subprocess.STDOUT, start_new_session=True)

  def Output(self) -> str:
    self._log.flush()
    return self.log_path.read_text()

  def WaitReady(self, deadline: float) -> None:
    while 'ready at' not in self.Output():
      if self.process.poll() is not None:
        raise AssertionError(f'worker {self.task} exited with '
                             f'{self.process.returncode}:\n{self.Output()[-3000:]}')
      if time.monotonic() > deadline:
        raise AssertionError(f'worker {self.task} not ready in time:\n'
                             f'{self.Output()[-3000:]}')
      time.sleep(0.2)

  def Signal(self, sig: int) -> None:
    """Sends `sig` to the worker's process group."""
    if self.process.poll() is None:
      os.killpg(self.process.pid, sig)

  def Kill(self) -> None:
    with contextlib.suppress(ProcessLookupError):
      self.Signal(signal.SIGCONT)
      self.Signal(signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
      self.process.wait(timeout=30)
    self._log.close()


class Cluster:
  """Worker processes of one cluster spec; start them with Start()."""

  def __init__(self, num_workers: int, log_dir: str, threads: int = 0) -> None:
    self.ports = FreePorts(num_workers)
    self.spec = 'worker=' + ','.join(f'localhost:{p}' for p in self.ports)
    self._log_dir = log_dir
    self._threads = threads
    self.workers: List[Optional[Worker]] = [None] * num_workers

  def Start(self, tasks: Optional[List[int]] = None) -> None:
    """Starts the given tasks (default all) and waits until they are ready."""
    tasks = list(range(len(self.ports))) if tasks is None else tasks
    for t in tasks:
      self.workers[t] = Worker(self.spec, t, self._log_dir, self._threads)
    deadline = time.monotonic() + READY_TIMEOUT_S
    for t in tasks:
      worker = self.workers[t]
      assert worker is not None
      worker.WaitReady(deadline)

  def Kill(self, tasks: Optional[List[int]] = None) -> None:
    for t in range(len(self.workers)) if tasks is None else tasks:
      worker = self.workers[t]
      if worker is not None:
        worker.Kill()
        self.workers[t] = None


@contextlib.contextmanager
def Running(num_workers: int, threads: int = 0,
            start: bool = True) -> Iterator[Cluster]:
  """A Cluster whose workers are started (unless start is False) and
  always killed on exit, also when the body fails."""
  with tempfile.TemporaryDirectory() as log_dir:
    cluster = Cluster(num_workers, log_dir, threads)
    try:
      if start:
        cluster.Start()
      yield cluster
    finally:
      cluster.Kill()
