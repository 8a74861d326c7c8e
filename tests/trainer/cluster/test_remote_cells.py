"""Cells on real worker processes train as they do on local devices.

Two (four for replicas) `--mode=worker` processes on free loopback ports
(tests/worker_cluster, always killed, also when a test fails) serve the cells of
lm.StdlibBytesTiny (make test's two tests share one pair); a client
(tests/trainer/remote_train_program), a process of each test's own, trains it
three steps on them, and the same program trains it on local logical
devices. Losses and final weights agree to rtol 1e-5, and the traced step
puts each cell's forward, backward (its recomputation) and every op of
their bodies, the kept forwards, each variable, its optimizer slots and its
update on the cell's worker task.
"""

import collections
import json
import pathlib

import numpy as np
import pytest

from tests import fresh_process
from tests import transparency
from tests import worker_cluster


def _Train(out: pathlib.Path, *flags: str) -> dict:
  out.mkdir()
  fresh_process.RunPython('-m', 'tests.trainer.remote_train_program',
                          f'--out={out}', *flags, timeout_s=300)
  report = json.loads((out / 'report.json').read_text())
  with np.load(out / 'weights.npz') as weights:
    report['weights'] = dict(weights)
  return report


def _AssertSameTraining(actual: dict, expected: dict) -> None:
  transparency.AssertClose(actual['losses'], expected['losses'], 'losses')
  assert sorted(actual['weights']) == sorted(expected['weights'])
  for name, value in expected['weights'].items():
    transparency.AssertClose(actual['weights'][name], value, name)


def _Task(device: str) -> int:
  assert device.startswith('/job:worker/replica:0/task:'), device
  return int(device.split('/task:')[1].split('/')[0])


def _AssertOnWorkers(report: dict, task_of_cell: list, slots: int = 2) -> None:
  """Every cell call and body op on its cell's task (task_of_cell[k]: the
  tasks of cell k's replicas, replica 0's first); variables, their replica
  copies, slots, updates and kept ops on the workers."""
  kinds = collections.defaultdict(set)
  for cell, kind, device in report['calls']:
    kinds[int(cell)].add(kind)
    assert _Task(device) in task_of_cell[int(cell)], (cell, kind, device)
  assert all(kinds[k] == {'forward', 'backward', 'body'}
             for k in range(len(task_of_cell))), kinds
  for name, device in report['variable_devices'].items():
    tasks = sorted(task_of_cell[report['cell_of_variable'][name]])
    assert _Task(device) == tasks[0], name
    assert [_Task(d) for d in report['copy_devices'].get(name, [])] == tasks[1:], name
    assert report['slot_devices'][name] == [device] * slots, name
  updates = collections.Counter(_Task(d) for _, d, _ in report['updates'])
  variables = collections.Counter(
      _Task(d) for d in list(report['variable_devices'].values()) +
      [d for copies in report['copy_devices'].values() for d in copies])
  assert updates == variables  # each variable and copy updated where it lives
  # The outer tape (the trainer's) adds one Shape op under the kept scope
  # without a device: shape metadata, not a cell's computation.
  kept = [(op, d) for op, d in report['kept'] if not op.startswith('gradient_tape/')]
  assert kept and all(_Task(d) in set().union(*task_of_cell) for _, d in kept)


@pytest.fixture(name='two_workers', scope='module')
def _TwoWorkers():
  """Two workers for the module's tests: started once (each is a TensorFlow
  import), each test's client connecting to them afresh."""
  with worker_cluster.Running(2) as cluster:
    yield cluster


def test_cells_on_workers_train_as_on_local_devices(tmp_path, two_workers):
  remote = _Train(tmp_path / 'remote', f'--cluster_spec={two_workers.spec}')
  assert remote['cell_devices'] == [[
      f'/job:worker/replica:0/task:{t}/device:CPU:0' for t in (0, 1)]]
  _AssertOnWorkers(remote, [{0}, {1}])
  local = _Train(tmp_path / 'local')
  assert local['cell_devices'][0][1].endswith('CPU:1')
  _AssertSameTraining(remote, local)


# Momentum, not Adam: the gradients of the replicas are added in another
# order than one pipeline's, and Adam scales a weight's rounding noise (the
# key biases, whose true gradient is 0) up to a step of the learning rate.
_MOMENTUM = "trainer.optimizer=enum('lingvo_pipe.base_experiment.OptimizerKind', 'MOMENTUM')"


# make test covers R=1 on workers (above) and R=2 on local devices
# (tests/pipeline/test_conformance.py) instead.
@pytest.mark.slow
def test_replicas_on_workers_equal_one_local_pipeline(tmp_path):
  """R=2 x K=2 over four workers (replica r's cell k on task 2r + k,
  M=2 each) against R=1, M=4 on local devices: the same micro-batches of
  the same global batches, so the same losses and weights."""
  with worker_cluster.Running(4) as cluster:
    remote = _Train(tmp_path / 'remote', f'--cluster_spec={cluster.spec}',
                    f'--override=task.stack.pipeline.num_replicas=2; {_MOMENTUM}')
  assert remote['cell_devices'] == [
      [f'/job:worker/replica:0/task:{t}/device:CPU:0' for t in row]
      for row in ((0, 1), (2, 3))]
  # Replica 1's calls, its copies of the variables and their updates run
  # on tasks 2 and 3.
  _AssertOnWorkers(remote, [{0, 2}, {1, 3}], slots=1)
  local = _Train(tmp_path / 'local',
                 f'--override=task.stack.pipeline.num_micro_batches=4; {_MOMENTUM}')
  _AssertSameTraining(remote, local)


def test_replicas_all_reduce_across_worker_processes(tmp_path, two_workers):
  """R=2 x K=1 on two workers, each replica's copy of the model on its
  own task and the gradients all-reduced between the processes, against
  R=1, M=4 on one local device."""
  one_cell = 'task.stack.pipeline.num_partitions=1'
  remote = _Train(tmp_path / 'remote', f'--cluster_spec={two_workers.spec}',
                  f'--override={one_cell}; task.stack.pipeline.num_replicas=2; '
                  f'{_MOMENTUM}')
  assert remote['cell_devices'] == [[f'/job:worker/replica:0/task:{t}/device:CPU:0']
                                    for t in (0, 1)]
  collectives = collections.Counter(_Task(d) for d in remote['collectives'])
  assert collectives == {0: 1, 1: 1}
  _AssertOnWorkers(remote, [{0, 1}], slots=1)
  local = _Train(tmp_path / 'local', f'--override={one_cell}; '
                 f'task.stack.pipeline.num_micro_batches=4; {_MOMENTUM}')
  _AssertSameTraining(remote, local)


_SCHEDULE = "task.stack.pipeline.schedule=enum('lingvo_pipe.pipeline.schedules.schedule.ScheduleKind', '{}')"
# Per schedule: the overrides of a pipeline on two devices per replica.
_TWO_DEVICES = {
    'ONE_F_ONE_B': '',
    'ZB_H1': '',
    'ZB_H2': '',
    'INTERLEAVED': ('task.stack.pipeline.num_partitions=4; '
                    'task.stack.pipeline.cells_per_device=2'),
    'ZB_V': 'task.stack.pipeline.num_partitions=4',
}


# make test runs replicas on workers with fill-drain above and every
# schedule with replicas on local devices (tests/pipeline/test_data_parallel.py).
@pytest.mark.slow
@pytest.mark.parametrize('kind', sorted(_TWO_DEVICES))
@pytest.mark.parametrize('loop', [0, 2])
def test_replicas_on_workers_with_every_schedule(tmp_path, kind, loop):
  """R=2 on four workers (two devices per replica) with `kind`, unrolled or
  as a loop, against R=1, M=4 of the same schedule on local devices."""
  pipeline = '; '.join(o for o in (
      _SCHEDULE.format(kind), _TWO_DEVICES[kind],
      f'task.stack.pipeline.loop_min_micro_batches={loop}', _MOMENTUM) if o)
  with worker_cluster.Running(4) as cluster:
    remote = _Train(tmp_path / 'remote', f'--cluster_spec={cluster.spec}',
                    f'--override=task.stack.pipeline.num_replicas=2; {pipeline}')
  assert collections.Counter(_Task(d) for d in remote['collectives']).keys() == {0, 1, 2, 3}
  local = _Train(tmp_path / 'local',
                 f'--override=task.stack.pipeline.num_micro_batches=4; {pipeline}')
  _AssertSameTraining(remote, local)
