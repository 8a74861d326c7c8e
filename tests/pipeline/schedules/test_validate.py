"""The validator: each refusal names the first broken action in one line, and why."""

import pytest

from lingvo_pipe.pipeline.schedules import actions
from lingvo_pipe.pipeline.schedules import schedule_text
from lingvo_pipe.pipeline.schedules import validate


def _Refusal(text, **kwargs):
  with pytest.raises(ValueError) as info:
    validate.Validate(schedule_text.Parse(text, **kwargs))
  message = str(info.value)
  assert '\n' not in message
  return message


def test_accepts_a_schedule_that_can_run():
  validate.Validate(schedule_text.Parse('0F0,0F1,0I0,0W0,0B1\n'))
  validate.Validate(actions.WithReduce(schedule_text.Parse(
      '0F0,0F1,0I0,0I1,0W0,0W1\n1F0,1I0,1F1,1I1,1W0,1W1\n')))


def test_a_w_before_its_i():
  assert _Refusal('0F0,0W0,0I0\n') == (
      'device 0 position 1: 0W0: runs before its I 0I0 (device 0 position 2); '
      'a W needs its I first.')


def test_a_w_without_its_i():
  assert _Refusal('0F0,0W0,0F1,0B1\n') == (
      'device 0 position 1: 0W0: has no 0I0: a W needs its I before it.')


def test_a_missing_backward():
  assert _Refusal('0F0,0F1,0B0\n1F0,1F1,1B0,1B1\n') == (
      'device 0 position 1: 0F1: has no backward: add 0B1, or 0I1 and 0W1.')


def test_an_i_without_its_w():
  assert _Refusal('0F0,0I0\n') == 'device 0 position 1: 0I0: has no W: add 0W0 after it.'


def test_a_backward_before_its_forward():
  assert _Refusal('0B0,0F0\n') == (
      'device 0 position 0: 0B0: runs before its forward 0F0 (device 0 position 1).')


def test_a_forward_before_its_input_exists():
  """Cells 0 and 1 on device 0 (v=2, K=1): cell 1's forward comes first."""
  assert _Refusal('1F0,0F0,1B0,0B0\n') == (
      'device 0 position 0: 1F0: can never run: it waits for 0F0 (device 0 '
      'position 1), behind 1F0 itself (device 0 position 0); device 0 produces '
      'an input of it only after it: reorder so that every input comes first.')


def test_a_forward_before_its_input_exists_on_another_device():
  assert _Refusal('2F0,0F0,2B0,0B0\n1F0,1B0\n') == (
      'device 0 position 0: 2F0: can never run: it waits for 1F0 (device 1 '
      'position 0), which waits for 0F0 (device 0 position 1), behind 2F0 itself '
      '(device 0 position 0); the devices wait on each other (deadlock): '
      'reorder so that every input comes first.')


def test_an_action_on_a_cell_of_another_device():
  assert _Refusal('0F0,0B0,1B0\n1F0\n', cell_devices=[0, 1]) == (
      'device 0 position 2: 1B0: cell 1 is on device 1, not on device 0; run it there.')


def test_a_deadlock():
  """Device 0 runs 1F1B's order, device 1 fill-drain's: 0B0 waits for 1B0,
  which waits behind 1F1, which waits for 0F1, behind 0B0."""
  assert _Refusal('0F0,0B0,0F1,0B1\n1F0,1F1,1B0,1B1\n') == (
      'device 0 position 1: 0B0: can never run: it waits for 1B0 (device 1 '
      'position 2), behind 1F1 (device 1 position 1), which waits for 0F1 '
      '(device 0 position 2), behind 0B0 itself (device 0 position 1); the '
      'devices wait on each other (deadlock): reorder so that every input '
      'comes first.')


@pytest.mark.parametrize('text,kwargs,expected', [
    ('0F0,0F0,0B0\n', {}, 'device 0 position 1: 0F0: runs twice (first at device 0 position 0)'),
    ('0F0,0B0,0I0\n', {}, 'device 0 position 2: 0I0: cell 0 micro-batch 0 has both B and a split'),
    ('0F0,0REDUCE_GRAD,0B0\n', {}, 'device 0 position 1: 0REDUCE_GRAD: runs before 0B0'),
    ('0F0,0B0,0F2,0B2\n', {}, 'cell 0 micro-batch 1 is missing: no device runs 0F1'),
    ('0F0,0B0\n', {'num_micro_batches': 2}, 'cell 0 micro-batch 1 is missing'),
    ('0F0,0B0,0F1,0B1\n', {'num_micro_batches': 1},
     'device 0 position 2: 0F1: micro-batch 1 does not exist'),
    ('0F0,0B0,1F0,1B0\n', {'cell_devices': [0]}, 'device 0 position 2: 1F0: cell 1 does not exist'),
    ('0F0,0B0\n', {'cell_devices': [3]},
     'cell 0 is placed on device 3, but the schedule has devices 0..0'),
])
def test_other_refusals(text, kwargs, expected):
  assert _Refusal(text, **kwargs).startswith(expected)
