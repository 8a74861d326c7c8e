"""The text form: PyTorch's action notation in and out, round trips of every built-in schedule."""

import pytest

from lingvo_pipe.pipeline.schedules import actions
from lingvo_pipe.pipeline.schedules import built_in
from lingvo_pipe.pipeline.schedules import schedule_text
from lingvo_pipe.pipeline.schedules import validate

ScheduleKind = built_in.ScheduleKind


def test_format_writes_one_csv_line_per_device():
  assert schedule_text.Format(built_in.Build(ScheduleKind.ONE_F_ONE_B, 2, 2)) == (
      '0F0,0F1,0B0,0B1\n'
      '1F0,1B0,1F1,1B1\n')


def test_parse_action():
  assert schedule_text.ParseAction('12I3') == actions.InputGrad(12, 3)
  assert schedule_text.ParseAction(' 0W0 ') == actions.WeightGrad(0, 0)
  assert schedule_text.ParseAction('2B3') == actions.Backward(2, 3)
  assert schedule_text.ParseAction('1REDUCE_GRAD') == actions.Reduce(1)
  assert str(actions.Reduce(1)) == '1REDUCE_GRAD'


@pytest.mark.parametrize('kind,k,m,v', [
    (kind, k, m, v) for kind in ScheduleKind for k in (1, 2, 4) for m in (1, 3, 8)
    for v in ((2, 3) if kind == ScheduleKind.INTERLEAVED else (None,))])
def test_every_built_in_schedule_round_trips(kind, k, m, v):
  s = built_in.Build(kind, k, m, v)
  assert schedule_text.Parse(schedule_text.Format(s)) == s
  with_reduce = actions.WithReduce(s)
  assert schedule_text.Parse(schedule_text.Format(with_reduce)) == with_reduce


def test_pytorch_csv_with_idle_fields_parses_as_the_built_in_1f1b():
  """PyTorch's pipeline_order dumps idle steps as empty CSV fields."""
  text = ('0F0,0F1,0F2,,,0B0,0F3,0B1,,0B2,,0B3\n'
          ',1F0,1F1,,1B0,1F2,1B1,1F3,1B2,,1B3\n'
          ',,2F0,2B0,2F1,2B1,2F2,2B2,2F3,2B3\n')
  assert schedule_text.Parse(text) == built_in.Build(ScheduleKind.ONE_F_ONE_B, 3, 4)


def test_a_hand_written_zb_h1_equals_the_built_in_one():
  text = """# ZB-H1, K=3, M=4, written by hand: device d defers its first d W's.
0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3
1F0 1F1 1I0 1F2 1I1 1W0 1F3 1I2 1W1 1I3 1W2 1W3
2F0 2I0 2F1 2I1 2F2 2I2 2W0 2F3 2I3 2W1 2W2 2W3

"""
  parsed = schedule_text.Parse(text)
  validate.Validate(parsed)
  assert parsed == built_in.Build(ScheduleKind.ZB_H1, 3, 4)


def test_a_hand_written_zb_v_places_cells_in_a_v():
  parsed = schedule_text.Parse(
      '0F0,0F1,3F0,3I0,3W0,3F1,3I1,3W1,0I0,0W0,0I1,0W1\n'
      '1F0,2F0,1F1,2F1,2I0,2W0,1I0,1W0,2I1,2W1,1I1,1W1\n')
  assert parsed.cell_devices == (0, 1, 1, 0)
  assert parsed == built_in.Build(ScheduleKind.ZB_V, 2, 2)


@pytest.mark.parametrize('text,match', [
    ('0F0,0X0\n', r"line 1 \(device 0\): '0X0' is not an action: write <cell><kind>"),
    ('0F0\n0SEND_F0\n',
     r"line 2 \(device 1\): '0SEND_F0' is not an action \(SEND_F is added by the executor"),
    ('0F\n', r"'0F' has no micro-batch: write e.g. 0F0"),
    ('0REDUCE_GRAD3\n', r'write 0REDUCE_GRAD'),
    ('F0\n', r"'F0' is not an action"),
    ('\n# nothing\n', r'The text holds no action'),
    ('1F0,1B0\n', r'cells \[0\] have no action'),
])
def test_bad_text_raises_naming_the_line_and_token(text, match):
  with pytest.raises(ValueError, match=match):
    schedule_text.Parse(text)
