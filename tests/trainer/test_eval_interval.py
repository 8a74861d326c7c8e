"""trainer.eval_interval_steps evaluates while training: at the end of the
first loop at or past each multiple of the interval, the dev loss on the
progress output and in TensorBoard, equal to --mode=eval's on the
checkpoint of that step, and the best of them kept in logdir/best;
train_and_eval's closing evaluation is not run twice at one step."""

import os

import numpy as np

from tests.trainer import in_process
from tests.trainer import summaries

TINY = 'lm.StdlibBytesTiny'


def _Run(logdir, *flags):
  return in_process.Run(f'--model={TINY}', f'--logdir={logdir}', '--sample_bytes=0', *flags)


def _Evals(result):
  return [l.split(':')[0] for l in result.stdout.splitlines() if l.startswith('eval at')]


def test_training_evaluates_at_each_interval_as_eval_mode_does(tmp_path):
  logdir = tmp_path / 'run'
  interval = ('--model_params_override=trainer.steps_per_loop=2; '
              "trainer.eval_interval_steps=3; trainer.eval_steps=2; "
              "trainer.best_checkpoint_metric='loss'")
  trained = _Run(logdir, '--mode=train', '--max_steps=6', interval)
  assert _Evals(trained) == ['eval at step 4', 'eval at step 6'], trained.stdout  # loops: 2, 4, 6
  _Run(logdir, '--mode=eval', '--model_params_override=trainer.eval_steps=2')
  losses = summaries.Scalars(str(logdir), 'eval')['loss']
  assert [s for s, _ in losses] == [4, 6, 6]
  np.testing.assert_allclose(losses[1][1], losses[2][1], rtol=1e-6)  # ckpt-6 both ways
  # logdir/best holds the checkpoint of the lower eval loss, and is a logdir.
  best_step = min(losses[:2], key=lambda s_v: s_v[1])[0]
  assert (logdir / 'best' / 'best.txt').read_text().startswith(f'step {best_step}\n')
  from_best = _Run(logdir / 'best', '--mode=eval', '--model_params_override=trainer.eval_steps=2')
  assert f'eval at step {best_step}:' in from_best.stdout
  np.testing.assert_allclose(summaries.Scalars(str(logdir / 'best'), 'eval')['loss'][0][1],
                             dict(losses[:2])[best_step], rtol=1e-6)
  _Run(logdir / 'best', '--mode=export')
  assert os.listdir(logdir / 'best' / 'export') == [str(best_step)]
  # A resume counts from its step (6 -> 8 passes no multiple of 3, 8 -> 9
  # does), and train_and_eval's closing evaluation is not run again at 9.
  resumed = _Run(logdir, '--mode=train_and_eval', '--max_steps=9', interval)
  assert _Evals(resumed) == ['eval at step 9'], resumed.stdout
