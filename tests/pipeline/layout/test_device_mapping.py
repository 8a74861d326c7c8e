"""The device names that cells and replicas get: CPU, workers, GPUs, TPU cores."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.pipeline.layout import cluster
from lingvo_pipe.pipeline.layout import device_mapping
from lingvo_pipe.pipeline.layout.cluster import Device, DeviceType


def _Names(places):
  return [[d.name for d in row] for row in places]


def test_default_is_the_local_devices_without_a_cluster():
  assert device_mapping.DefaultDevices() == cluster.LocalDevices()
  places = device_mapping.PlaceReplicas(2, 3)
  assert [[d.index for d in row] for row in places] == [[0, 1], [2, 3], [4, 5]]


def test_worker_tasks_in_order_and_consecutive_cells_per_device():
  workers = cluster.WorkerDevices(4)
  places = device_mapping.PlaceReplicas(2, 2, workers, check_exists=False)
  assert _Names(places) == [
      ['/job:worker/replica:0/task:0/device:CPU:0', '/job:worker/replica:0/task:1/device:CPU:0'],
      ['/job:worker/replica:0/task:2/device:CPU:0', '/job:worker/replica:0/task:3/device:CPU:0']]
  packed = device_mapping.PlaceReplicas(4, 1, workers[:2], consecutive_cells_per_device=2)
  assert [d.task for d in packed[0]] == [0, 0, 1, 1]
  assert device_mapping.Flatten(packed)[2] == '/job:worker/replica:0/task:1/device:CPU:0'
  with pytest.raises(ValueError, match='4 cells need 4 devices but only 2'):
    device_mapping.PlaceReplicas(4, 1, workers[:2])


def test_gpus_of_one_host():
  gpus = device_mapping.GpuDevices(8)
  places = device_mapping.PlaceReplicas(4, 2, gpus, check_exists=False)
  assert _Names(places)[1] == [f'/job:localhost/replica:0/task:0/device:GPU:{i}'
                               for i in range(4, 8)]
  remote = device_mapping.GpuDevices(2, task=3, job='worker')
  assert [d.name for d in remote] == [
      '/job:worker/replica:0/task:3/device:GPU:0', '/job:worker/replica:0/task:3/device:GPU:1']
  with pytest.raises(ValueError, match='2 replicas x 4 cells at 1 per device need 8 devices but only 4'):
    device_mapping.PlaceReplicas(4, 2, device_mapping.GpuDevices(4), check_exists=False)


def _Topology(hosts: int = 1):
  """A TPU topology without a TPU: a 2x2 mesh of chips with 2 cores each
  per host (8 cores a host, as a v3-8), hosts stacked along y."""
  coords = [[[x, y + 2 * h, 0, c] for y in range(2) for x in range(2) for c in range(2)]
            for h in range(hosts)]
  return tf.tpu.experimental.Topology(mesh_shape=[2, 2 * hosts, 1, 2],
                                      device_coordinates=np.array(coords, np.int32))


def test_tpu_cores_of_a_device_assignment():
  assignment = device_mapping.TpuDeviceAssignment(_Topology(), num_cells=2, num_replicas=4)
  assert (assignment.num_replicas, assignment.num_cores_per_replica) == (4, 2)
  places = device_mapping.TpuPlaces(assignment)
  # Each replica's two cells on the two cores of one chip; TensorFlow
  # orders the replicas on a ring of chips (x, y) = (0, 0), (1, 0), (1, 1),
  # (0, 1), and a core's ordinal is its place in device_coordinates.
  assert _Names(places) == [
      [f'/job:worker/replica:0/task:0/device:TPU:{a}',
       f'/job:worker/replica:0/task:0/device:TPU:{a + 1}'] for a in (0, 2, 6, 4)]
  assert all(d.device_type == DeviceType.TPU for row in places for d in row)


def test_tpu_cells_across_chips_and_hosts():
  assignment = device_mapping.TpuDeviceAssignment(_Topology(hosts=2), num_cells=4,
                                                  num_replicas=4)
  places = device_mapping.TpuPlaces(assignment)
  assert len(places) == 4 and all(len(row) == 4 for row in places)
  flat = [d for row in places for d in row]
  assert len(set(flat)) == 16  # every core once
  assert {d.task for d in flat} == {0, 1}
  for row in places:  # a replica's cells stay on one host
    assert len({d.task for d in row}) == 1
  assert Device.Parse(flat[5].name) == flat[5]


def test_tpu_errors():
  with pytest.raises(ValueError, match='need 16 TPU cores but the topology'):
    device_mapping.TpuDeviceAssignment(_Topology(), num_cells=4, num_replicas=4)
  with pytest.raises(ValueError, match='3 cells do not fill whole chips of 2 cores'):
    device_mapping.TpuDeviceAssignment(_Topology(), num_cells=3)


def test_missing_local_device():
  with pytest.raises(ValueError, match='CPU:42.*does not exist'):
    device_mapping.PlaceReplicas(1, 2, [Device.Parse('CPU:0'), Device.Parse('CPU:42')])


def test_devices_needed_follow_the_schedule():
  """K from the schedule (ZB-V and interleaved put 2 cells on a device, a
  text has a line per device), times R, over consecutive cells; the most
  over nested pipelines."""
  from lingvo_pipe.pipeline import gpipe  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.pipeline.schedules.built_in import ScheduleKind  # pylint: disable=g-import-not-at-top

  def Pipe(**kwargs):
    return gpipe.PipeliningLayer.Params().Set(**dict(dict(name='p', num_partitions=4), **kwargs))

  assert device_mapping.DevicesNeeded(Pipe()) == 4
  assert device_mapping.DevicesNeeded(Pipe(schedule=ScheduleKind.ZB_V)) == 2
  assert device_mapping.DevicesNeeded(Pipe(schedule=ScheduleKind.INTERLEAVED,
                                           cells_per_device=2, num_replicas=3)) == 6
  assert device_mapping.DevicesNeeded(Pipe(schedule_text='0F0,0B0;1F0,1B0;2F0,2B0')) == 3
  assert device_mapping.DevicesNeeded(Pipe(num_replicas=2, consecutive_cells_per_device=4)) == 2
  assert device_mapping.DevicesNeeded([Pipe(), Pipe(num_partitions=6)]) == 6
