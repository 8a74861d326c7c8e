"""Which devices exist and which pipeline cell goes where, as structured values."""

import dataclasses
import enum
from typing import List, Optional, Sequence

import tensorflow as tf


class DeviceType(enum.Enum):
  CPU = 'CPU'
  GPU = 'GPU'
  TPU = 'TPU'


@dataclasses.dataclass(frozen=True)
class Device:
  """One device: local (job None) or on a task of a TensorFlow cluster job."""
  device_type: DeviceType
  index: int
  job: Optional[str] = None
  task: int = 0

  @property
  def name(self) -> str:
    """The full TensorFlow device name, for tf.device()."""
    prefix = (f'/job:{self.job}/replica:0/task:{self.task}'
              if self.job else '/job:localhost/replica:0/task:0')
    return f'{prefix}/device:{self.device_type.value}:{self.index}'

  @classmethod
  def Parse(cls, name: str) -> 'Device':
    """Parses 'CPU:1', '/device:GPU:0' or '/job:worker/task:1/device:CPU:0'.

    Raises:
      ValueError: for a name without a device type and index.
    """
    spec = tf.DeviceSpec.from_string(name)
    if spec.device_type is None or spec.device_index is None:
      raise ValueError(f'Device name {name!r} needs a type and an index, e.g. '
                       "'CPU:1' or '/job:worker/task:0/device:CPU:0'.")
    try:
      device_type = DeviceType(spec.device_type.upper())
    except ValueError:
      raise ValueError(f'Device {name!r} has unknown type {spec.device_type!r}; '
                       f'use one of {[t.value for t in DeviceType]}.') from None
    job = None if spec.job in (None, 'localhost') else spec.job
    return cls(device_type, spec.device_index, job, spec.task or 0)


def LocalDevices(device_type: Optional[DeviceType] = None) -> List[Device]:
  """The logical devices of this process: accelerators if any, else CPUs."""
  types = [device_type] if device_type else [DeviceType.TPU, DeviceType.GPU,
                                             DeviceType.CPU]
  for t in types:
    found = tf.config.list_logical_devices(t.value)
    if found:
      return [Device.Parse(d.name) for d in found]
  return []


def WorkerDevices(num_tasks: int, job: str = 'worker',
                  device_type: DeviceType = DeviceType.CPU) -> List[Device]:
  """Device 0 of each task of a cluster job, one cell per task."""
  return [Device(device_type, 0, job, t) for t in range(num_tasks)]


def CheckLocalDevicesExist(devices: Sequence[Device]) -> None:
  """Raises ValueError naming a local device (job None) that this process
  does not have; devices of cluster jobs are not checked here."""
  known = {Device.Parse(d.name) for d in tf.config.list_logical_devices()}
  for d in devices:
    if d.job is None and d not in known:
      raise ValueError(f'Device {d.name!r} does not exist in this process; '
                       f'existing devices: {sorted(k.name for k in known)}.')
