"""The resolved plan of a pipeline: what runs where, computed once from its params.

A PipeliningLayer builds one Plan at construction: the number of cells, the
device of every (replica, cell), the schedule (a ScheduleKind or a text in
PyTorch's notation, schedule_text), and the remat policy. For a number of
micro-batches M it gives the schedule's actions (validated), the emission a
step uses, and the step's Program (program.Lower: what each action keeps,
recomputes and reduces, in the order emitted). The layer, the executors and
the trainer's inspection read it; nobody derives these again.
"""

import dataclasses
import functools
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from absl import logging

from lingvo_pipe.pipeline.layout import cluster
from lingvo_pipe.pipeline.layout import device_mapping
from lingvo_pipe.pipeline.layout.cell_compilation import CellCompilation
from lingvo_pipe.pipeline.lowering import loop_tables
from lingvo_pipe.pipeline.lowering import program
from lingvo_pipe.pipeline.lowering import remat
from lingvo_pipe.pipeline.schedules import actions
from lingvo_pipe.pipeline.schedules import built_in
from lingvo_pipe.pipeline.schedules import schedule as clock_tables
from lingvo_pipe.pipeline.schedules import schedule_text
from lingvo_pipe.pipeline.schedules import simulate
from lingvo_pipe.pipeline.schedules.built_in import ScheduleKind

ScheduleSpec = Union[ScheduleKind, str]  # a built-in kind, or a text

# From which M a built-in schedule trains as one loop per device when
# p.loop_min_micro_batches is None (the default): the M that
# benchmarks/schedule_bench's loop_default section chose, the smallest
# measured (32, 64, 128) from which the loop's step stays within 5% of the
# unrolled one (docs/schedules.md). Absent: never, the loop is slower even
# at M=128 (ZB-H1 1.068x, ZB-H2 1.127x, ZB-V 1.133x).
LOOP_FROM_M: Dict[ScheduleKind, int] = {
    ScheduleKind.GPIPE: 32, ScheduleKind.ONE_F_ONE_B: 64,
    ScheduleKind.INTERLEAVED: 128}


@dataclasses.dataclass(frozen=True)
class Plan:
  """What a pipeline runs where.

  Attributes:
    name: the pipeline's name, for messages.
    spec: p.schedule, a ScheduleKind or a schedule's text.
    num_cells: C, the cells.
    num_devices: K, the devices of one replica.
    cells_per_device: v.
    cell_devices: the device index (0..K-1) of each cell.
    replica_devices: [replica][cell] the device of each cell of each replica.
    policy: the RematPolicy.
    remat_last_micro_batch: p.remat_last_micro_batch.
    loop_min_micro_batches: train as a loop per device from this M (0:
      never); LoopFromM of the params.
  """
  name: str
  spec: ScheduleSpec
  num_cells: int
  num_devices: int
  cells_per_device: int
  cell_devices: Tuple[int, ...]
  replica_devices: Tuple[Tuple[cluster.Device, ...], ...]
  policy: remat.RematPolicy
  remat_last_micro_batch: bool
  loop_min_micro_batches: int = 0

  @property
  def num_replicas(self) -> int:
    return len(self.replica_devices)

  @property
  def schedule_name(self) -> str:
    """The ScheduleKind's name, or 'text' for a schedule_text."""
    return 'text' if isinstance(self.spec, str) else self.spec.name

  @property
  def devices(self) -> Tuple[cluster.Device, ...]:
    """Replica 0's device of each cell (where the variables live)."""
    return self.replica_devices[0]

  def DeviceNames(self) -> List[List[str]]:
    """[replica][device] the name of each replica's device k (0..K-1)."""
    return [[row[self.cell_devices.index(k)].name for k in range(self.num_devices)]
            for row in self.replica_devices]

  def Emission(self, num_micro: int) -> program.Emission:
    """How a step of M=num_micro, training or evaluation, is built in a
    graph (eagerly always unrolled: PipeliningLayer._Executor)."""
    return program.EmissionOf(self.loop_min_micro_batches, num_micro)

  def Program(self, num_micro: int, step: program.Step,
              emission: Optional[program.Emission] = None) -> program.Program:
    """The step's Program (program.Lower) of this plan's schedule for
    M=num_micro, its remat policy and replicas; by default in the emission
    a graph would use (Emission)."""
    return program.Lower(self.Actions(num_micro), self.policy, self.remat_last_micro_batch,
                         self.num_replicas, step, emission or self.Emission(num_micro))

  def Check(self, num_micro: int) -> None:
    """Raises what a training step of M=num_micro would, before one is
    built: Actions' errors, and where the step loops the loop's refusal
    of a text (loop_tables.CheckLoops: a boundary whose two cells order
    their micro-batches differently, a cell with both B and I backwards)."""
    schedule = self.Actions(num_micro)
    if self.Emission(num_micro) == program.Emission.LOOP:
      try:
        loop_tables.CheckLoops(schedule)
      except ValueError as e:
        raise ValueError(f'PipeliningLayer {self.name!r}: {e}') from None

  def UnitBubble(self, num_micro: int) -> float:
    """The idle share of the step with every action one clock long."""
    return simulate.Simulate(self.Actions(num_micro), simulate.UNIT_COSTS).bubble_fraction

  def ReplicaZero(self) -> 'Plan':
    """This plan with replica 0 alone (evaluation)."""
    return dataclasses.replace(self, replica_devices=self.replica_devices[:1])

  def Actions(self, num_micro: int) -> actions.Schedule:
    """The schedule's actions for M=num_micro micro-batches, validated.

    Raises:
      ValueError: naming the value and the fix, for an M the schedule
        cannot run, a text written for another M or other cells, or a
        schedule that cannot run (validate's message).
    """
    return _Actions(self.spec, self.num_devices, self.cells_per_device,
                    self.num_cells, num_micro, self.name)


def FromParams(p: Any, num_cells: int,
               devices: Optional[Sequence[cluster.Device]] = None,
               check_devices: bool = True) -> Plan:
  """The Plan of PipeliningLayer params `p` for `num_cells` cells on
  `devices` (None: device_mapping.DefaultDevices); with check_devices
  local devices must exist in this process. A schedule_text fixes M, so it
  takes num_micro_batches, not micro_batch_size (with replicas, evaluation's
  M of the whole batch would differ from training's)."""
  if p.schedule_text and p.micro_batch_size:
    raise ValueError(f'PipeliningLayer {p.name!r}: schedule_text names its micro-batches, '
                     f'so it fixes M; set num_micro_batches to its M instead of '
                     f'micro_batch_size ({p.micro_batch_size}).')
  loop_from = LoopFromM(p)
  if loop_from and p.remat == remat.RematPolicy.NONE:
    logging.warning(
        'PipeliningLayer %r: remat NONE in a loop step (loop_min_micro_batches=%d) keeps '
        "only the last cell's forwards and recomputes every other, as PER_CELL does "
        '(pipeline/lowering/program.py); set loop_min_micro_batches=0 to keep them all.',
        p.name, loop_from)
  return Make(p.name, p.schedule_text or p.schedule, num_cells, p.cells_per_device,
              p.num_replicas, devices, p.consecutive_cells_per_device, p.remat,
              p.remat_last_micro_batch, loop_from, check_devices)


def LoopFromM(p: Any) -> int:
  """From which M PipeliningLayer params `p` train as a loop per device:
  p.loop_min_micro_batches, or for None LOOP_FROM_M's M where it was
  measured (a built-in schedule, per-cell remat, cells not compiled), else
  0, never: under RematPolicy.NONE the loop would recompute what the
  unrolled step keeps, and a text may order a boundary's micro-batches in
  a way the loop refuses (loop_tables)."""
  given = p.loop_min_micro_batches
  if given is not None:
    if not isinstance(given, int) or isinstance(given, bool) or given < 0:
      raise ValueError(f'PipeliningLayer {p.name!r}: loop_min_micro_batches={given!r}; '
                       'give None (loop from the M measured for the schedule), 0 '
                       '(never loop) or the M from which to loop.')
    return given
  if (p.schedule_text or p.remat != remat.RematPolicy.PER_CELL or
      p.jit_compile != CellCompilation.NONE):
    return 0
  return LOOP_FROM_M.get(p.schedule, 0)


def Make(name: str, spec: ScheduleSpec, num_cells: int, cells_per_device: int,
         num_replicas: int, devices: Optional[Sequence[cluster.Device]],
         consecutive_cells_per_device: int, policy: remat.RematPolicy,
         remat_last_micro_batch: bool, loop_min_micro_batches: int = 0,
         check_devices: bool = True) -> Plan:
  """The Plan of a pipeline's params (PipeliningLayer's p.schedule,
  cells_per_device, num_replicas, devices, consecutive_cells_per_device,
  remat, remat_last_micro_batch, loop_min_micro_batches) for `num_cells`
  cells.

  Raises:
    TypeError: for a schedule that is neither a ScheduleKind nor a text.
    ValueError: naming the value and the fix, for cells that do not make
      the schedule's devices, or too few devices.
  """
  if isinstance(spec, ScheduleKind):
    v = _CellsPerDevice(name, spec, cells_per_device)
    if num_cells % v:
      raise ValueError(f'PipeliningLayer {name!r}: {num_cells} cells do not '
                       f'make cells_per_device={v} cells on each device ({spec.name}); set '
                       f'num_partitions to a multiple of {v} (K*v cells).')
    num_devices = num_cells // v
    if v > 1 and num_devices == 1:
      raise ValueError(f'PipeliningLayer {name!r}: {spec.name} puts {v} cells on each '
                       f'device, so {num_cells} cells are one device, no pipeline: '
                       f'num_partitions counts cells; set it to {2 * v} for 2 devices.')
    cell_devices = built_in.Build(spec, num_devices, 2 * num_devices, v).cell_devices
  elif isinstance(spec, str):
    parsed = _Parse(name, spec)
    num_devices, cell_devices = parsed.num_devices, parsed.cell_devices
    v = -(-num_cells // num_devices)
    if parsed.num_cells != num_cells:
      raise ValueError(f'PipeliningLayer {name!r}: the schedule text names '
                       f'{parsed.num_cells} cells but the pipeline has '
                       f'{num_cells}; write the text for {num_cells} cells or '
                       f'set num_partitions={parsed.num_cells}.')
  else:
    raise TypeError(f'PipeliningLayer {name!r}: schedule must be a '
                    f'ScheduleKind or the text of a schedule, got {spec!r}; '
                    f'one of {[k.name for k in ScheduleKind]}.')
  places = device_mapping.PlaceReplicas(num_devices, num_replicas, devices,
                                        consecutive_cells_per_device, check_devices)
  replica_devices = tuple(tuple(row[d] for d in cell_devices) for row in places)
  return Plan(name, spec, num_cells, num_devices, v, tuple(cell_devices),
              replica_devices, policy, remat_last_micro_batch, loop_min_micro_batches)


def _CellsPerDevice(name: str, kind: ScheduleKind, cells_per_device: int) -> int:
  if cells_per_device < 1:
    raise ValueError(f'PipeliningLayer {name!r}: cells_per_device must be >= 1, '
                     f'got {cells_per_device}.')
  try:
    return built_in.CellsPerDeviceParam(kind, cells_per_device)
  except ValueError as e:
    raise ValueError(f'PipeliningLayer {name!r}: {e}') from None


def _Parse(name: str, text: str, num_micro: Optional[int] = None) -> actions.Schedule:
  try:
    return schedule_text.Parse(text, num_micro_batches=num_micro)
  except ValueError as e:
    raise ValueError(f'PipeliningLayer {name!r}: the schedule text does not '
                     f'parse: {e}') from None


@functools.lru_cache(maxsize=64)
def _Actions(spec: ScheduleSpec, num_devices: int, cells_per_device: int,
             num_cells: int, num_micro: int, name: str) -> actions.Schedule:
  if isinstance(spec, str):
    schedule = _Parse(name, spec)
    if schedule.num_micro_batches != num_micro:
      raise ValueError(
          f'PipeliningLayer {name!r}: the schedule text runs '
          f'{schedule.num_micro_batches} micro-batches but the step has '
          f'M={num_micro}; set num_micro_batches={schedule.num_micro_batches} '
          'or write the text for this M.')
  else:
    try:
      schedule = clock_tables.Actions(spec, num_devices, num_micro, cells_per_device)
    except ValueError as e:
      raise ValueError(f'PipeliningLayer {name!r}: {e}') from None
  try:
    simulate.Simulate(schedule)  # validates
  except ValueError as e:
    raise ValueError(f'PipeliningLayer {name!r}: the schedule cannot run: {e}') from None
  return schedule
