"""Predicts each schedule's step time, bubble and memory with the simulator (nothing runs on a device).

  python -m benchmarks.schedule_sim --k=4 --m=8,16                    # JSON
  python -m benchmarks.schedule_sim --k=4 --m=8,16 --format=markdown  # docs table
  python -m benchmarks.schedule_sim --schedules=zb_h1 --k=3 --m=4 --format=table
  python -m benchmarks.schedule_sim --text=my_schedule.csv --format=table

Costs are a device's share of the layers: --forward (F), --backward_input
(I) and --backward_weight (W), B = I + W unless --backward is given. A
schedule with v cells per device (interleaved, ZB-V) gives each cell 1/v
of each cost, so every row describes the same model on the same devices.
--text simulates a schedule in the text form (schedule_text) with the
costs as given, per cell; so does --format=table (whole clocks, one per
cell's F), which prints the clock tables of the generators' docstrings.
"""

import json
import pathlib
from typing import Any, Dict, List, Optional, Sequence

from absl import app
from absl import flags

from lingvo_pipe.pipeline.schedules import actions
from lingvo_pipe.pipeline.schedules import built_in
from lingvo_pipe.pipeline.schedules import schedule_text
from lingvo_pipe.pipeline.schedules import simulate

FLAGS = flags.FLAGS
_NAMES = {'fill_drain': 'fill-drain (GPipe)', 'one_f_one_b': '1F1B',
          'interleaved': 'interleaved 1F1B', 'zb_h1': 'ZB-H1', 'zb_h2': 'ZB-H2',
          'zb_v': 'ZB-V'}


def _DefineFlags() -> None:
  """The program's flags, defined when it runs (tests import the module)."""
  flags.DEFINE_list('schedules', [k.value for k in built_in.ScheduleKind],
                    'Built-in schedules to simulate.')
  flags.DEFINE_integer('k', 4, 'Devices K.')
  flags.DEFINE_list('m', ['8', '16'], 'Micro-batches M, one row per value.')
  flags.DEFINE_integer('cells_per_device', 2, 'v of the interleaved schedule.')
  flags.DEFINE_float('forward', 1.0, 'F of a device\'s layers.')
  flags.DEFINE_float('backward_input', 1.0, 'I of a device\'s layers.')
  flags.DEFINE_float('backward_weight', 1.0, 'W of a device\'s layers.')
  flags.DEFINE_float('backward', None, 'B of a device\'s layers (default I + W).')
  flags.DEFINE_float('transfer', 0.0, 'Latency of a transfer between devices.')
  flags.DEFINE_string('text', None, 'A schedule in the text form to simulate '
                      'instead of the built-in ones.')
  flags.DEFINE_enum('format', 'json', ['json', 'markdown', 'table'],
                    'JSON rows, a markdown table, or each clock table.')


def DeviceCosts(cells_per_device: int, forward: float = 1.0,
                backward_input: float = 1.0, backward_weight: float = 1.0,
                backward: Optional[float] = None) -> simulate.Costs:
  """Per-cell costs when a device's layers, which take the given times, are
  split into `cells_per_device` equal cells."""
  v = float(cells_per_device)
  return simulate.Costs(forward=forward / v, backward_input=backward_input / v,
                        backward_weight=backward_weight / v,
                        backward=None if backward is None else backward / v)


def Row(name: str, schedule: actions.Schedule, costs: simulate.Costs,
        transfer: float = 0.0) -> Dict[str, object]:
  """The simulator's figures for one schedule, as JSON-ready values;
  `peak_held_devices` counts micro-batches of a whole device's layers."""
  sim = simulate.Simulate(schedule, costs, transfer)
  v = schedule.num_cells // schedule.num_devices
  return dict(schedule=name, k=schedule.num_devices, m=schedule.num_micro_batches,
              v=v, peak_held_devices=max(sim.peak_held) / v, **sim.Summary())


def Build(name: str, k: int, m: int, v: int = 2) -> actions.Schedule:
  """Built-in schedule `name`; `v` is used by the interleaved one only."""
  kind = built_in.ScheduleKind(name)
  return built_in.Build(kind, k, m, v if kind == built_in.ScheduleKind.INTERLEAVED else None)


def Rows(names: Sequence[str], k: int, ms: Sequence[int], v: int = 2,
         **costs: Any) -> List[Dict[str, object]]:
  """One row per (schedule, M), schedules in the order given."""
  rows = []
  for m in ms:
    for name in names:
      schedule = Build(name, k, m, v)
      cells = schedule.num_cells // schedule.num_devices
      rows.append(Row(name, schedule, DeviceCosts(cells, **costs)))
  return rows


def Markdown(rows: Sequence[Dict[str, object]]) -> str:
  """The table docs/schedules.md quotes."""
  lines = ['| schedule | K | M | v | step | bubble | bubble in each device\'s span '
           '| peak held (devices\' layers) |', '|---|---|---|---|---|---|---|---|']
  for r in rows:
    lines.append(f'| {_NAMES.get(str(r["schedule"]), r["schedule"])} | {r["k"]} '
                 f'| {r["m"]} | {r["v"]} | {r["step_time"]:g} '
                 f'| {r["bubble_fraction"]:.3f} | {r["span_bubble_fraction"]:.3f} '
                 f'| {r["peak_held_devices"]:g} |')
  return '\n'.join(lines)


def main(argv: Sequence[str]) -> None:
  del argv
  costs = dict(forward=FLAGS.forward, backward_input=FLAGS.backward_input,
               backward_weight=FLAGS.backward_weight, backward=FLAGS.backward)
  if FLAGS.format == 'table':  # whole clocks: the costs as given, per cell
    named = ([(FLAGS.text, schedule_text.Parse(pathlib.Path(FLAGS.text).read_text()))]
             if FLAGS.text else
             [(f'{name} M={m}', Build(name, FLAGS.k, int(m), FLAGS.cells_per_device))
              for m in FLAGS.m for name in FLAGS.schedules])
    for name, schedule in named:
      sim = simulate.Simulate(schedule, simulate.Costs(**costs), FLAGS.transfer)
      print(f'{name}\n{simulate.ClockTable(sim)}\n')
    return
  if FLAGS.text:
    rows = [Row(FLAGS.text, schedule_text.Parse(pathlib.Path(FLAGS.text).read_text()),
                simulate.Costs(**costs), FLAGS.transfer)]
  else:
    rows = Rows(FLAGS.schedules, FLAGS.k, [int(m) for m in FLAGS.m],
                FLAGS.cells_per_device, **costs)
  print(json.dumps(rows, indent=1) if FLAGS.format == 'json' else Markdown(rows))


if __name__ == '__main__':
  _DefineFlags()
  app.run(main)
