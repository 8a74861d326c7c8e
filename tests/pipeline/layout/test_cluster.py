"""Tests of device descriptions and cell placement."""

import pytest

from lingvo_pipe.pipeline.layout import cluster
from lingvo_pipe.pipeline.layout.cluster import Device, DeviceType


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
