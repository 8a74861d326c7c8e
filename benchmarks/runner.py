"""Runs benchmark programs in fresh processes, alternating between configs.

Every run is one process that prints one JSON object as its last stdout
line. Repeats are interleaved (a, b, a, b, ...) so that a slow phase of a
shared machine hits every configuration alike.
"""

import dataclasses
import json
import os
import pathlib
import platform
import shlex
import socket
import statistics
import subprocess
import sys
from typing import Callable, Dict, List, Optional, Sequence

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Command:
  """One benchmark invocation: argv, working directory and extra env."""
  argv: tuple
  cwd: str
  env: tuple = ()  # (name, value) pairs added to os.environ

  def Text(self) -> str:
    """The command as a shell line to run from the repository root (paths
    inside the repository relative to it, PYTHONPATH left out)."""
    cwd = os.path.relpath(self.cwd, REPO_ROOT)
    prefix = '' if cwd == '.' else f'cd {shlex.quote(cwd)} && '
    env = ''.join(f'{k}={shlex.quote(v)} ' for k, v in self.env if k != 'PYTHONPATH')
    root = str(REPO_ROOT) + os.sep
    argv = [a[len(root):] if a.startswith(root) else a for a in self.argv]
    return prefix + env + shlex.join(argv)


def OursCommand(args: Sequence[str], steps: int, warmup: int,
                python: str = sys.executable) -> Command:
  """pipeline_bench with `args` (e.g. ['--workload=ffn', '--k=4'])."""
  return Command(argv=(python, '-m', 'benchmarks.pipeline_bench', *args,
                       f'--steps={steps}', f'--warmup={warmup}'),
                 cwd=str(REPO_ROOT),
                 env=(('TF_CPU_ALLOCATOR_USE_BFC', 'true'),
                      ('PYTHONPATH', str(REPO_ROOT))))


def FreePorts(n: int) -> List[int]:
  """n distinct loopback ports that were free a moment ago (for worker
  processes a benchmark starts)."""
  socks = [socket.socket() for _ in range(n)]
  for s in socks:
    s.bind(('localhost', 0))
  ports = [s.getsockname()[1] for s in socks]
  for s in socks:
    s.close()
  return ports


def ParseLastJson(stdout: str) -> dict:
  """The last stdout line that is a JSON object.

  Raises:
    ValueError: if there is none.
  """
  for line in reversed(stdout.strip().splitlines()):
    line = line.strip()
    if line.startswith('{'):
      return json.loads(line)
  raise ValueError(f'no JSON object on stdout; last output: {stdout[-300:]!r}')


def Execute(cmd: Command, timeout_s: float) -> dict:
  """Runs one command; returns its JSON, or {'error': ...} if it failed."""
  env = dict(os.environ, **dict(cmd.env))
  try:
    proc = subprocess.run(list(cmd.argv), cwd=cmd.cwd, env=env, text=True,
                          capture_output=True, timeout=timeout_s, check=False)
  except subprocess.TimeoutExpired:
    return {'error': f'timeout after {timeout_s:.0f} s'}
  if proc.returncode:
    tail = proc.stderr.strip().splitlines()[-3:]
    return {'error': f'exit {proc.returncode}: ' + ' | '.join(tail)}
  try:
    return ParseLastJson(proc.stdout)
  except ValueError as e:
    return {'error': str(e)}


def Alternate(commands: Dict[str, Command], repeats: int, timeout_s: float,
              log: Callable[[str], None] = print,
              execute: Callable[[Command, float], dict] = Execute
              ) -> Dict[str, List[dict]]:
  """Runs every command `repeats` times, round robin over the commands.

  Returns:
    name -> list of per-run JSON objects (failed runs hold 'error').
  """
  if repeats < 1:
    raise ValueError(f'repeats ({repeats}) must be >= 1.')
  runs = {name: [] for name in commands}
  for r in range(repeats):
    for name, cmd in commands.items():
      result = execute(cmd, timeout_s)
      runs[name].append(result)
      status = result.get('error') or f"{result.get('step_s_median', 0):.3f} s/step"
      log(f'[{r + 1}/{repeats}] {name}: {status}')
  return runs


def Median(runs: List[dict], key: str) -> Optional[float]:
  """Median of `key` over the runs that have it (None if none do)."""
  values = [r[key] for r in runs if r.get(key) is not None and 'error' not in r]
  return statistics.median(values) if values else None


def Ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
  """a / b, or None when either is missing or b is 0."""
  if a is None or not b:
    return None
  return a / b


def Fmt(value: Optional[float], spec: str = '.3f', suffix: str = '') -> str:
  """A table cell: the formatted value, or a dash when missing."""
  return '–' if value is None else f'{value:{spec}}{suffix}'


def MarkdownTable(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
  """A GitHub-flavoured markdown table.

  Raises:
    ValueError: if a row's width differs from the header's.
  """
  for row in rows:
    if len(row) != len(headers):
      raise ValueError(f'row {list(row)} has {len(row)} cells, the header has '
                       f'{len(headers)}.')
  lines = ['| ' + ' | '.join(headers) + ' |',
           '|' + '---|' * len(headers)]
  lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
  return '\n'.join(lines)


def MachineInfo() -> Dict[str, str]:
  """CPU model, core count, memory, Python and TensorFlow versions."""
  model = 'unknown'
  cpuinfo = pathlib.Path('/proc/cpuinfo')
  if cpuinfo.exists():
    for line in cpuinfo.read_text().splitlines():
      if line.startswith('model name'):
        model = line.split(':', 1)[1].strip()
        break
  mem = 'unknown'
  meminfo = pathlib.Path('/proc/meminfo')
  if meminfo.exists():
    kb = int(meminfo.read_text().split('MemTotal:')[1].split()[0])
    mem = f'{kb / 2**20:.1f} GiB'
  tf_version = subprocess.run(
      [sys.executable, '-c', 'import tensorflow as tf; print(tf.__version__)'],
      capture_output=True, text=True, check=False,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')).stdout.strip() or 'unknown'
  return {'cpu': model, 'nproc': str(os.cpu_count()), 'memory': mem,
          'python': platform.python_version(), 'tensorflow': tf_version}
