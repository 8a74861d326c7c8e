"""loop_state: what each device's loop carries, the slots its iterations
write, and one iteration's write, for 1F1B at K=2, M=3 (loss inside)."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.pipeline.lowering import loop_tables
from lingvo_pipe.pipeline.lowering import program
from lingvo_pipe.pipeline.lowering.loop_tables import F, X
from lingvo_pipe.pipeline.lowering.remat import RematPolicy
from lingvo_pipe.pipeline.schedules import schedule
from lingvo_pipe.pipeline.step.loop import loop_state

M = 3
X_SPEC, H_SPEC, Y_SPEC = (tf.TensorSpec([2, 4]), tf.TensorSpec([2, 5]), tf.TensorSpec([2, 6]))


@pytest.fixture(scope='module', name='tables')
def _Tables():
  step = program.Lower(schedule.Actions(schedule.ScheduleKind.ONE_F_ONE_B, 2, M),
                       RematPolicy.PER_CELL, False, 1, program.Step.LOSS_INSIDE,
                       program.Emission.LOOP)
  return loop_tables.Build(step)


SPECS = loop_state.Specs(ins=[[X_SPEC], [H_SPEC]], outs=[[H_SPEC], [Y_SPEC]],
                         updates=[[], [tf.TensorSpec([])]], factors=[[], []],
                         weight_sums=[[], []], loss=tf.TensorSpec([]))


def _Size(arrays):
  return [int(a.size()) for a in arrays]


def test_each_device_carries_its_cells_arrays_a_spare_slot_each(tables):
  """Cell 0 keeps no inputs (they are the step's) and its input
  gradients for all M; the last cell its inputs and loss gradients in
  rings, and its outputs for all M."""
  first = loop_state.Initial(SPECS, tables, [0])
  assert first['ins'] == [[]] and _Size(first['d_inputs']) == [M + 1]
  last = loop_state.Initial(SPECS, tables, [1])
  assert _Size(last['ins'][0]) == [tables.input_rings[1] + 1]
  assert _Size(last['dys']) == [tables.loss_gradients + 1]
  assert _Size(last['outs']) == [M + 1]
  assert float(last['loss'][0]) == 0.0 and 'd_inputs' not in last
  assert 0 < tables.input_rings[1] <= M and 0 < tables.loss_gradients <= M


def test_an_array_is_written_at_its_action_slot_else_at_the_spare_one(tables):
  d = tables.DeviceOf(1)
  table = tables.devices[d]
  slots = loop_state.WriteSlots(SPECS, tables, table)
  depth = tables.input_rings[1]
  expected = np.full([len(table.branches)], depth)
  for m in range(M):
    if (F, 1, m) in table.positions:
      expected[table.positions[(F, 1, m)]] = m % depth
  np.testing.assert_array_equal(slots['ins'][0], expected)
  first = loop_state.WriteSlots(SPECS, tables, tables.devices[tables.DeviceOf(0)])
  assert sorted(first['d_inputs'][0][first['d_inputs'][0] < M]) == list(range(M))
  # A B's factors wait for the products after the loop: all M slots.
  assert tables.factor_rings[0] == M
  np.testing.assert_array_equal(first['factors'][0], first['d_inputs'][0])
  x_positions = [tables.devices[tables.DeviceOf(0)].positions[(X, 0, m)] for m in range(M)]
  assert list(first['factors'][0][x_positions]) == list(range(M))


def test_an_iteration_writes_its_pieces_and_adds_its_sums(tables):
  """The last cell's F of micro-batch 1: its outputs at their slot, its
  loss and statistics added; an idle device's pieces (Idle) pass the
  state on."""
  cells = [1]
  state = loop_state.Initial(SPECS, tables, cells)
  table = tables.devices[tables.DeviceOf(1)]
  slots = {k: [tf.constant(s) for s in v]
           for k, v in loop_state.WriteSlots(SPECS, tables, table).items()}
  i = table.positions[(F, 1, 1)]
  pieces = loop_state.Idle(SPECS, cells, state)
  assert float(pieces[0]['sums'][0]) == 0.0 and pieces[0]['outs'][0].shape == [0, 6]
  pieces[0].update(outs=[tf.fill([2, 6], 7.0)], loss=[tf.constant(2.5)],
                   sums=[tf.constant(1.0)])
  flat = loop_state.Flatten(pieces)
  assert loop_state.Unflatten(flat, pieces) == pieces
  written = loop_state.Written(tf.constant(i), pieces, state, slots)
  assert float(written['loss'][0]) == 2.5 and float(written['sums'][0][0]) == 1.0
  np.testing.assert_array_equal(written['outs'][0].read(1), np.full([2, 6], 7.0))
