"""The cluster of TensorFlow worker tasks, read from a flag or from TF_CONFIG."""

import dataclasses
import json
import re
from typing import Dict, List, Mapping, Optional, Tuple

import tensorflow as tf

WORKER_JOB = 'worker'
_ADDRESS = re.compile(r'^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})$')
_JOB = re.compile(r'^[a-z][a-z0-9_]*$')


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
  """The jobs of a cluster and the host:port of each of their tasks.

  Attributes:
    jobs: job name -> the address of task 0, 1, ... in order.
  """
  jobs: Mapping[str, Tuple[str, ...]]

  def Tasks(self, job: str = WORKER_JOB) -> Tuple[str, ...]:
    """The addresses of `job`'s tasks, in task order.

    Raises:
      ValueError: if the cluster has no such job.
    """
    if job not in self.jobs:
      raise ValueError(f'The cluster has no job {job!r} (jobs: '
                       f'{sorted(self.jobs)}); name it, e.g. '
                       f'--cluster_spec={job}=localhost:2222,localhost:2223.')
    return self.jobs[job]

  def Address(self, task: int, job: str = WORKER_JOB) -> str:
    """The host:port of `task` of `job`.

    Raises:
      ValueError: for a task index out of range.
    """
    tasks = self.Tasks(job)
    if not 0 <= task < len(tasks):
      raise ValueError(f'Task index {task} is out of range: job {job!r} has '
                       f'{len(tasks)} task(s) ({", ".join(tasks)}); use 0 to '
                       f'{len(tasks) - 1}.')
    return tasks[task]

  def Port(self, task: int, job: str = WORKER_JOB) -> int:
    """The port of `task` of `job`."""
    return int(self.Address(task, job).rsplit(':', 1)[1])

  def ToClusterSpec(self) -> tf.train.ClusterSpec:
    return tf.train.ClusterSpec({job: list(tasks) for job, tasks in self.jobs.items()})

  def Flag(self) -> str:
    """The --cluster_spec text of this cluster."""
    return ';'.join(f'{job}={",".join(tasks)}' for job, tasks in self.jobs.items())


def Parse(text: str) -> ClusterConfig:
  """Parses 'worker=host:port,host:port' (jobs separated by ';').

  Raises:
    ValueError: naming the malformed part and the expected form.
  """
  jobs: Dict[str, Tuple[str, ...]] = {}
  example = 'e.g. --cluster_spec=worker=localhost:2222,localhost:2223'
  if not text.strip():
    raise ValueError(f'The cluster spec is empty; {example}.')
  for part in filter(str.strip, text.split(';')):
    job, sep, addresses = part.strip().partition('=')
    job = job.strip()
    if not sep or not _JOB.match(job):
      raise ValueError(f'Cluster spec part {part.strip()!r} is not '
                       f'job=host:port,...; {example}.')
    if job in jobs:
      raise ValueError(f'Job {job!r} appears twice in the cluster spec '
                       f'{text!r}; list all its tasks once, {example}.')
    jobs[job] = _Addresses(job, [a.strip() for a in addresses.split(',')], example)
  return _Checked(jobs, text)


def FromTfConfig(text: str) -> Tuple[ClusterConfig, Optional[int]]:
  """Parses a TF_CONFIG value: {"cluster": {"worker": [...]}, "task":
  {"type": "worker", "index": 0}}. Returns the cluster and the worker task
  index (None when TF_CONFIG names no task or another job's).

  Raises:
    ValueError: for malformed JSON or a cluster without tasks.
  """
  try:
    config = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f'TF_CONFIG is not JSON ({e.msg} at character {e.pos}); '
                     'expected {"cluster": {"worker": ["host:port", ...]}, '
                     '"task": {"type": "worker", "index": 0}}.') from None
  cluster = config.get('cluster') if isinstance(config, dict) else None
  if not isinstance(cluster, dict) or not cluster:
    raise ValueError('TF_CONFIG has no "cluster" object; expected '
                     '{"cluster": {"worker": ["host:port", ...]}}.')
  jobs = {}
  for job, addresses in cluster.items():
    if not isinstance(addresses, list) or not _JOB.match(str(job)):
      raise ValueError(f'TF_CONFIG cluster job {job!r} must map to a list of '
                       f'"host:port" strings, got {addresses!r}.')
    jobs[str(job)] = _Addresses(str(job), [str(a) for a in addresses],
                                'in TF_CONFIG')
  task = config.get('task') or {}
  index = task.get('index') if task.get('type', WORKER_JOB) == WORKER_JOB else None
  if index is not None and not isinstance(index, int):
    raise ValueError(f'TF_CONFIG task index {index!r} must be an integer.')
  return _Checked(jobs, text), index


def _Addresses(job: str, addresses: List[str], example: str) -> Tuple[str, ...]:
  if not addresses or addresses == ['']:
    raise ValueError(f'Job {job!r} of the cluster spec has no task; {example}.')
  for address in addresses:
    match = _ADDRESS.match(address)
    if not match or not 0 < int(match.group(2)) < 65536:
      raise ValueError(f'Cluster address {address!r} of job {job!r} is not '
                       f'host:port with a port in 1..65535; {example}.')
  if len(set(addresses)) != len(addresses):
    twice = sorted({a for a in addresses if addresses.count(a) > 1})
    raise ValueError(f'Job {job!r} lists {twice} more than once: two tasks '
                     'cannot share a port; give each task its own address.')
  return tuple(addresses)


def _Checked(jobs: Dict[str, Tuple[str, ...]], text: str) -> ClusterConfig:
  if WORKER_JOB not in jobs:
    raise ValueError(f'The cluster spec {text!r} has no {WORKER_JOB!r} job; '
                     f'the cells run on its tasks, e.g. '
                     f'{WORKER_JOB}=localhost:2222,localhost:2223.')
  return ClusterConfig(jobs)
