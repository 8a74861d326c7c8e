"""The built-in schedules by name: one enum, one function that builds any of them."""

import enum
from typing import Optional

from lingvo_pipe.pipeline.schedules import actions
from lingvo_pipe.pipeline.schedules import fill_drain
from lingvo_pipe.pipeline.schedules import interleaved
from lingvo_pipe.pipeline.schedules import one_f_one_b
from lingvo_pipe.pipeline.schedules import zero_bubble


class ScheduleKind(enum.Enum):
  """A built-in schedule (PipeliningLayer's p.schedule); the value is its
  name on command lines."""
  GPIPE = 'fill_drain'  # GPipe, fill-drain: every forward, then every backward
  FILL_DRAIN = 'fill_drain'  # the same member under its descriptive name
  ONE_F_ONE_B = 'one_f_one_b'  # PipeDream-flush
  INTERLEAVED = 'interleaved'  # Megatron's interleaved 1F1B, v cells a device
  ZB_H1 = 'zb_h1'  # zero bubble, 1F1B's memory
  ZB_H2 = 'zb_h2'  # zero bubble, twice 1F1B's memory
  ZB_V = 'zb_v'  # zero bubble, two cells a device in a V

  @classmethod
  def _missing_(cls, value):
    return cls.GPIPE if value == 'gpipe' else None


def CellsPerDevice(kind: ScheduleKind, cells_per_device: Optional[int] = None) -> int:
  """v of `kind`: ZB_V's is 2, INTERLEAVED's is given, the others' 1.

  Raises:
    ValueError: if `cells_per_device` is given and `kind` cannot run it.
  """
  fixed = {ScheduleKind.ZB_V: 2, ScheduleKind.INTERLEAVED: None}.get(kind, 1)
  if fixed is None:
    if cells_per_device is None or cells_per_device == 1:
      raise ValueError(f'the interleaved schedule needs cells_per_device (v, cells on '
                       f'each device) of 2 or more, got {cells_per_device} (v=1 is '
                       'ONE_F_ONE_B); e.g. cells_per_device=2 with num_partitions=2*K.')
    return cells_per_device
  if cells_per_device not in (None, fixed):
    raise ValueError(f'{kind.name} runs {fixed} cell(s) per device, got '
                     f'cells_per_device={cells_per_device}; leave it unset or '
                     'use INTERLEAVED for another v.')
  return fixed


def CellsPerDeviceParam(kind: ScheduleKind, cells_per_device: int) -> int:
  """v of `kind` for a PipeliningLayer's p.cells_per_device, whose default
  1 leaves a schedule its own v (ZB_V's 2); raises as CellsPerDevice."""
  given = cells_per_device != 1 or kind == ScheduleKind.INTERLEAVED
  return CellsPerDevice(kind, cells_per_device if given else None)


def Build(kind: ScheduleKind, num_devices: int, num_micro_batches: int,
          cells_per_device: Optional[int] = None) -> actions.Schedule:
  """The actions of built-in schedule `kind` for K=num_devices devices, M
  micro-batches and (INTERLEAVED only) v=cells_per_device.

  Raises:
    ValueError: for sizes the schedule cannot run (see CellsPerDevice and
      actions.CheckSizes).
  """
  if not isinstance(kind, ScheduleKind):
    raise TypeError(f'kind must be a ScheduleKind, got {kind!r}; one of '
                    f'{[k.value for k in ScheduleKind]}.')
  v = CellsPerDevice(kind, cells_per_device)
  if kind == ScheduleKind.FILL_DRAIN:
    return fill_drain.FillDrain(num_devices, num_micro_batches)
  if kind == ScheduleKind.ONE_F_ONE_B:
    return one_f_one_b.OneFOneB(num_devices, num_micro_batches)
  if kind == ScheduleKind.INTERLEAVED:
    return interleaved.Interleaved(num_devices, num_micro_batches, v)
  if kind == ScheduleKind.ZB_H1:
    return zero_bubble.ZeroBubbleH1(num_devices, num_micro_batches)
  if kind == ScheduleKind.ZB_H2:
    return zero_bubble.ZeroBubbleH2(num_devices, num_micro_batches)
  return zero_bubble.ZeroBubbleV(num_devices, num_micro_batches)
