"""The trainer binary's --mode=profile, run in a subprocess on the tiny LM."""

import json

from tests import fresh_process


def test_profile_mode_writes_the_timeline(tmp_path):
  result = fresh_process.RunPython('-m', 'trainer.trainer', '--model=lm.StdlibBytesTiny',
                                   '--mode=profile', '--logdir=' + str(tmp_path))
  assert 'K=2 M=2 bubble: measured ' in result.stdout
  assert 'theoretical (K-1)/(M+K-1) = 0.333' in result.stdout
  with open(tmp_path / 'timeline.json') as f:
    spans = [e for e in json.load(f)['traceEvents'] if e['ph'] == 'X']
  assert {(e['tid'], e['args']['micro_batch']) for e in spans} == {
      (k, m) for k in range(2) for m in range(2)}
  assert {e['cat'] for e in spans} >= {'forward', 'backward'}
  with open(tmp_path / 'timeline.png', 'rb') as f:
    assert f.read(4) == b'\x89PNG'
