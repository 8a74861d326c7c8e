"""Tests of device descriptions and cell placement."""

import pytest

from lingvo_pipe.pipeline import cluster
from lingvo_pipe.pipeline.cluster import Device, DeviceType


def test_parse_and_name_round_trip():
  d = Device.Parse('CPU:3')
  assert d == Device(DeviceType.CPU, 3)
  assert d.name == '/job:localhost/replica:0/task:0/device:CPU:3'
  assert Device.Parse(d.name) == d
  w = Device.Parse('/job:worker/replica:0/task:2/device:CPU:0')
  assert (w.job, w.task, w.index) == ('worker', 2, 0)
  assert Device.Parse(w.name) == w


def test_parse_rejects_incomplete_names():
  with pytest.raises(ValueError, match="needs a type and an index"):
    Device.Parse('/job:worker/task:1')


def test_local_devices_are_the_logical_cpus():
  devices = cluster.LocalDevices()
  assert [d.index for d in devices] == list(range(8))
  assert all(d.device_type == DeviceType.CPU and d.job is None for d in devices)


def test_place_cells():
  placed = cluster.PlaceCells(3)
  assert [d.index for d in placed] == [0, 1, 2]
  workers = cluster.WorkerDevices(2)
  assert cluster.PlaceCells(2, workers) == workers


def test_more_cells_than_devices():
  with pytest.raises(ValueError, match='9 cells need 9 devices but only 8'):
    cluster.PlaceCells(9)


def test_missing_device():
  with pytest.raises(ValueError, match='CPU:42.*does not exist'):
    cluster.PlaceCells(1, [Device.Parse('CPU:42')])


def test_zero_cells():
  with pytest.raises(ValueError, match='num_cells must be >= 1, got 0'):
    cluster.PlaceCells(0)
