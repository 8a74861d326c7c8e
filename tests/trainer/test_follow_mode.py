"""--mode=evaler and --mode=decoder beside a training run: three real
processes. The evaler evaluates every checkpoint the trainer writes, once,
under another layout, equal to --mode=eval on the same checkpoint; the
decoder decodes each once into its own file; both end by themselves after
the final one and write nothing into checkpoints/; a checkpoint removed
before it is read is skipped with one line."""

import os
import subprocess
import sys
import time

import numpy as np

from lingvo_pipe import model_registry
from tests import fresh_process
from tests.trainer import in_process
from tests.trainer import summaries
from trainer import follow_mode
from trainer import experiment_params
from trainer import loop

TINY = 'lm.StdlibBytesTiny'
OVERRIDES = 'trainer.steps_per_loop=2; trainer.eval_steps=2'
ONE_CELL = '; task.stack.pipeline.num_partitions=1; task.stack.pipeline.num_micro_batches=1'


def _Start(logdir, mode, overrides):
  return subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, '-m', 'trainer.trainer', f'--model={TINY}', f'--mode={mode}',
       f'--logdir={logdir}', '--max_steps=8', f'--model_params_override={overrides}'],
      cwd=fresh_process.ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
      env=dict(os.environ, PYTHONPATH=str(fresh_process.ROOT), TF_CPP_MIN_LOG_LEVEL='3'))


def _Wait(process, timeout_s=300):
  status, out, err = fresh_process.Finish(process, timeout_s)
  assert status == 0, f'{out[-2000:]}\n{err[-3000:]}'
  return out, time.monotonic()


def test_an_evaler_and_a_decoder_beside_the_trainer_take_each_checkpoint_once(tmp_path):
  logdir = tmp_path / 'run'
  # First: they wait for the trainer.
  evaler = _Start(logdir, 'evaler', OVERRIDES + ONE_CELL)
  decoder = _Start(logdir, 'decoder', OVERRIDES + '; trainer.decode_steps=1')
  trainer = _Start(logdir, 'train', OVERRIDES)
  try:
    _, trained_at = _Wait(trainer)
    out, ended_at = _Wait(evaler)
    decoded, _ = _Wait(decoder)
  finally:
    for process in (trainer, evaler, decoder):
      if process.poll() is None:
        process.kill()
  evals = [l.split(':')[0] for l in out.splitlines() if l.startswith('eval at')]
  assert evals == [f'eval at step {s}' for s in (2, 4, 6, 8)], out
  assert ended_at - trained_at < 30  # the final checkpoint's evaluation, one poll
  decodes = [l.split(':')[0] for l in decoded.splitlines() if l.startswith('decode at')]
  assert decodes == [f'decode at step {s}' for s in (2, 4, 6, 8)], decoded
  assert sorted(p.name for p in logdir.glob('decode_*.txt')) == [
      f'decode_{s}.txt' for s in (2, 4, 6, 8)]
  assert sorted(os.listdir(logdir / 'checkpoints')) == ['checkpoint'] + sorted(
      f'ckpt-{s}.{e}' for s in (2, 4, 6, 8) for e in ('data-00000-of-00001', 'index'))
  in_process.Run(f'--model={TINY}', f'--logdir={logdir}', '--mode=eval',
                 f'--model_params_override={OVERRIDES}')
  at_eight = [v for s, v in summaries.Scalars(str(logdir), 'eval')['loss'] if s == 8]
  assert len(at_eight) == 2
  np.testing.assert_allclose(at_eight[0], at_eight[1], rtol=1e-5)  # K=1 M=1 and K=2 M=2


def test_a_checkpoint_removed_before_it_is_read_is_skipped_with_one_line(tmp_path):
  params = experiment_params.ExperimentParams(model_registry.GetExperiment(TINY))
  lines = []
  trainer = loop.Trainer(params, str(tmp_path), log=lines.append)
  gone = str(tmp_path / 'checkpoints' / 'ckpt-3')
  assert not follow_mode._Restore(trainer, trainer.checkpoint, gone)  # pylint: disable=protected-access
  assert lines == ['Skipped ckpt-3: the trainer removed it (trainer.max_checkpoints_to_keep) '
                   'before it was read.']
