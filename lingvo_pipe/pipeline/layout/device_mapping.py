"""Which device each cell of each pipeline replica gets: CPU, GPU, TPU, workers.

A pipeline of K cells run as R replicas needs R*K cell places. Cell k of
replica r is place j = r*K + k, and place j is on devices[j //
consecutive_cells_per_device]: by default one cell per device, replicas one after the
other, so replica r takes devices r*K .. r*K + K-1. In a cluster the default
devices are device 0 of each worker task in task order (cells spread over
tasks in order); on one host, the process's logical devices. GPUs and TPU
cores are named by the same rule (GpuDevices), or by a TPU device
assignment (TpuDeviceAssignment, TpuPlaces).
"""

from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf

from lingvo_pipe.core import hyperparams
from lingvo_pipe.pipeline.layout import cluster
from lingvo_pipe.pipeline.layout.cluster import Device, DeviceType
from lingvo_pipe.pipeline.schedules import built_in
from lingvo_pipe.pipeline.schedules import schedule_text

Places = List[List[Device]]  # [replica][cell]


def DefaultDevices() -> List[Device]:
  """Device 0 of every worker task once connected to a cluster
  (tf.config.experimental_connect_to_cluster), in task order; else the
  local logical devices (cluster.LocalDevices)."""
  remote = [Device.Parse(d.name) for d in tf.config.list_logical_devices()
            if '/job:' in d.name and '/job:localhost' not in d.name]
  workers = sorted({d for d in remote if d.job == 'worker'},
                   key=lambda d: (d.task, d.device_type.value, d.index))
  if workers:
    first_of_task: Dict[int, Device] = {}
    for d in workers:
      first_of_task.setdefault(d.task, d)
    return [first_of_task[t] for t in sorted(first_of_task)]
  return cluster.LocalDevices()


def DevicesNeeded(params: Any) -> int:
  """The most devices any pipeline in these (nested) params asks for: its
  devices (a schedule's cells over its cells per device, or a schedule
  text's lines) times its replicas, over its consecutive cells per device
  (NumDevicesNeeded)."""
  found = 1
  if isinstance(params, hyperparams.Params):
    if 'num_partitions' in params and 'cell_tpl' in params:
      found = max(found, NumDevicesNeeded(_PipelineDevices(params), max(params.num_replicas, 1),
                                          params.consecutive_cells_per_device))
    for _, value in params.IterParams():
      found = max(found, DevicesNeeded(value))
  elif isinstance(params, (list, tuple)):
    for value in params:
      found = max(found, DevicesNeeded(value))
  return found


def _PipelineDevices(p: hyperparams.Params) -> int:
  """K of PipeliningLayer params, before any partition."""
  if p.schedule_text:
    try:
      return schedule_text.Parse(p.schedule_text).num_devices
    except ValueError as e:
      raise ValueError(f'PipeliningLayer {p.name!r}: the schedule text (schedule_text) '
                       f'does not parse: {e}') from None
  splits = len(p.splits) + 1 if p.splits else 0
  cells = max(p.num_partitions, len(p.cell_tpl), splits, 1)
  try:
    v = built_in.CellsPerDeviceParam(p.schedule, p.cells_per_device)
  except (TypeError, ValueError):
    v = 1  # the pipeline's build says what is wrong
  return max(cells // max(v, 1), 1)


def NumDevicesNeeded(num_cells: int, num_replicas: int, consecutive_cells_per_device: int) -> int:
  """Devices that R replicas of K cells take, consecutive_cells_per_device (0: 1) each."""
  per = consecutive_cells_per_device or 1
  return -(-num_cells * num_replicas // per)


def PlaceReplicas(num_cells: int, num_replicas: int = 1,
                  devices: Optional[Sequence[Device]] = None,
                  consecutive_cells_per_device: int = 0,
                  check_exists: bool = True) -> Places:
  """The device of cell k of replica r, as places[r][k].

  Args:
    num_cells: K.
    num_replicas: R.
    devices: the devices to fill, in order; None: DefaultDevices().
    consecutive_cells_per_device: consecutive cell places per device (0: one).
    check_exists: verify that local devices exist in this process.

  Raises:
    ValueError: for R or K below 1, a negative consecutive_cells_per_device, or fewer
      devices than the places need (naming both counts and the fixes).
  """
  if num_cells < 1 or num_replicas < 1:
    raise ValueError(f'num_cells ({num_cells}) and num_replicas '
                     f'({num_replicas}) must be >= 1.')
  if consecutive_cells_per_device < 0:
    raise ValueError(f'consecutive_cells_per_device must be >= 0, got {consecutive_cells_per_device}.')
  devices = list(devices) if devices is not None else DefaultDevices()
  needed = NumDevicesNeeded(num_cells, num_replicas, consecutive_cells_per_device)
  if len(devices) < needed:
    per = consecutive_cells_per_device or 1
    what = (f'{num_cells} cells' if num_replicas == 1 and per == 1 else
            f'{num_replicas} replicas x {num_cells} cells at {per} per device')
    raise ValueError(
        f'{what} need {needed} devices but only {len(devices)} are given '
        f'({[d.name for d in devices]}); add devices (several logical ones '
        'on one CPU or GPU: tf.config.set_logical_device_configuration, before '
        'TensorFlow starts) or worker tasks, lower num_replicas or the number '
        'of cells, or raise consecutive_cells_per_device.')
  per = consecutive_cells_per_device or 1
  flat = [devices[j // per] for j in range(num_cells * num_replicas)]
  if check_exists:
    cluster.CheckLocalDevicesExist(flat)
  return [flat[r * num_cells:(r + 1) * num_cells] for r in range(num_replicas)]


def GpuDevices(num_gpus: int, task: int = 0,
               job: Optional[str] = None) -> List[Device]:
  """GPU 0 .. num_gpus-1 of one host (of `task` of `job` in a cluster), to
  give PlaceReplicas; e.g. 2 replicas x 4 cells on 8 GPUs."""
  if num_gpus < 1:
    raise ValueError(f'num_gpus must be >= 1, got {num_gpus}.')
  return [Device(DeviceType.GPU, i, job, task) for i in range(num_gpus)]


def TpuDeviceAssignment(topology: tf.tpu.experimental.Topology,
                        num_cells: int, num_replicas: int = 1
                        ) -> tf.tpu.experimental.DeviceAssignment:
  """A TPU device assignment with R replicas of K logical cores: cell k of
  replica r is logical core k of replica r (TensorFlow's
  DeviceAssignment.build over the topology, e.g. the one
  tf.tpu.experimental.initialize_tpu_system returns).

  Raises:
    ValueError: if the topology has fewer cores than R*K.
  """
  total = int(np.prod(topology.mesh_shape))
  if num_cells * num_replicas > total:
    raise ValueError(f'{num_replicas} replica(s) x {num_cells} cells need '
                     f'{num_cells * num_replicas} TPU cores but the topology '
                     f'(mesh {list(topology.mesh_shape)}) has {total}; lower '
                     'num_replicas or the number of cells.')
  per_chip = int(topology.mesh_shape[-1])
  if num_cells <= per_chip:
    shape = [1, 1, 1, num_cells]
  elif num_cells % per_chip == 0:
    shape = _ChipBlock(num_cells // per_chip, topology.mesh_shape[:3]) + [per_chip]
  else:
    raise ValueError(f'{num_cells} cells do not fill whole chips of '
                     f'{per_chip} cores each; use a multiple of {per_chip} '
                     f'cells, or at most {per_chip}.')
  return tf.tpu.experimental.DeviceAssignment.build(
      topology, computation_shape=shape, num_replicas=num_replicas)


def _ChipBlock(num_chips: int, mesh: Sequence[int]) -> List[int]:
  """The most compact [x, y, z] block of num_chips chips that fits the
  chip mesh (one replica's cells on neighbouring chips)."""
  blocks = [[x, y, z] for x in range(1, int(mesh[0]) + 1)
            for y in range(1, int(mesh[1]) + 1) for z in range(1, int(mesh[2]) + 1)
            if x * y * z == num_chips]
  if not blocks:
    raise ValueError(f'No block of {num_chips} chips fits the TPU chip mesh '
                     f'{list(mesh)}; use fewer cells.')
  return min(blocks, key=lambda b: (max(b), b))


def TpuPlaces(assignment: tf.tpu.experimental.DeviceAssignment,
              job: Optional[str] = 'worker') -> Places:
  """places[r][k]: the TPU core of logical core k of replica r, with its
  host task, as Devices (names such as '/job:worker/replica:0/task:0/
  device:TPU:3'), to give a PipeliningLayer as p.devices."""
  places = []
  for r in range(assignment.num_replicas):
    row = []
    for k in range(assignment.num_cores_per_replica):
      spec = tf.DeviceSpec.from_string(assignment.tpu_device(
          replica=r, logical_core=k, job=job))
      row.append(Device(DeviceType.TPU, spec.device_index, spec.job,
                        spec.task or 0))
    places.append(row)
  return places


def Flatten(places: Places) -> List[str]:
  """Device names replica after replica: the p.devices of these places."""
  return [d.name for row in places for d in row]
