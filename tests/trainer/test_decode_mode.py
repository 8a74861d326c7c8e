"""--mode=decode as a user meets it (issue 28, point 5): bounded by default
on an endless dev input, a progress line, a clean Ctrl-C, and output files
that never overwrite each other."""

import os
import re
import signal
import subprocess
import time

from tests.trainer import your_experiment

KEY = your_experiment.KEY


def _Trained(tmp_path):
  your_experiment.WriteModule(tmp_path)
  your_experiment.RunTrainerInProcess(tmp_path, f'--model={KEY}', '--logdir=run',
                                      '--mode=train', '--model_params_override=trainer.max_steps=50')
  return tmp_path / 'run'


def test_decode_is_bounded_shows_progress_and_never_overwrites(tmp_path):
  logdir = _Trained(tmp_path)
  outputs = []
  for flags in ([], [], ['--decode_prompt=' + ','.join(['1'] * 16)]):
    result = your_experiment.RunTrainerInProcess(tmp_path, f'--model={KEY}', '--logdir=run',
                                                 '--mode=decode', *flags)
    lines = result.stdout.splitlines()
    assert any(line.startswith('decode: batch 1') for line in lines), result.stdout
    # The last line says how many it showed and where all of them are.
    outputs.append(re.search(r'(?:shown above, all|and) in (\S+)\)$', lines[-1]).group(1))
    assert ('examples' in lines[-1] and
            ('3 shown above, all in' in lines[-1] or 'all shown above, and in' in lines[-1]))
  assert [os.path.basename(p) for p in outputs] == [
      'decode_50.txt', 'decode_50-1.txt', 'decode_50_prompt.txt']
  assert len((logdir / 'decode_50.txt').read_text().splitlines()) == 320  # 10 x 32
  assert (logdir / 'decode_50-1.txt').read_text() == (logdir / 'decode_50.txt').read_text()
  assert len((logdir / 'decode_50_prompt.txt').read_text().splitlines()) == 1


def test_ctrl_c_ends_a_decode_cleanly(tmp_path):
  logdir = _Trained(tmp_path)
  command = [str(your_experiment.TRAINER), f'--model={KEY}', '--logdir=run',
             '--mode=decode', '--model_params_override=trainer.decode_steps=0']
  process = subprocess.Popen(command, cwd=tmp_path, env=your_experiment.Env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    assert process.stdout is not None
    for line in process.stdout:  # the whole endless split: wait for progress
      if line.startswith('decode: batch 1 (the whole split)'):
        break
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
  finally:
    if process.poll() is None:
      process.kill()
  assert process.returncode == 128 + signal.SIGINT, stderr
  assert 'Traceback' not in stderr and 'KeyboardInterrupt' not in stderr, stderr
  assert 'Stopped by SIGINT; wrote the ' in stdout, stdout
  written = (logdir / 'decode_50.txt').read_text().splitlines()
  assert written and len(written) % 32 == 0
