"""trainer.eval_interval_steps evaluates while training: at the end of the
first loop at or past each multiple of the interval, the dev loss on the
progress output and in TensorBoard, equal to --mode=eval's on the
checkpoint of that step; train_and_eval's closing evaluation is not run
twice at one step."""

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
              'trainer.eval_interval_steps=3; trainer.eval_steps=2')
  trained = _Run(logdir, '--mode=train', '--max_steps=6', interval)
  assert _Evals(trained) == ['eval at step 4', 'eval at step 6'], trained.stdout  # loops: 2, 4, 6
  _Run(logdir, '--mode=eval', '--model_params_override=trainer.eval_steps=2')
  losses = summaries.Scalars(str(logdir), 'eval')['loss']
  assert [s for s, _ in losses] == [4, 6, 6]
  np.testing.assert_allclose(losses[1][1], losses[2][1], rtol=1e-6)  # ckpt-6 both ways
  # A resume counts from its step (6 -> 8 passes no multiple of 3, 8 -> 9
  # does), and train_and_eval's closing evaluation is not run again at 9.
  resumed = _Run(logdir, '--mode=train_and_eval', '--max_steps=9', interval)
  assert _Evals(resumed) == ['eval at step 9'], resumed.stdout
