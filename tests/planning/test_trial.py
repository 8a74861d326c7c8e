"""trial: a few training steps of each layout, as a trainer would run them."""

import functools
import json
import threading

import tensorflow as tf

from lingvo_pipe.core.layers import dropout
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.planning import trial
from tests import fresh_process


def test_each_step_draws_new_dropout_masks_as_in_training():
  """Step n draws the masks of step seed [n, 0] (a trainer's global step),
  not one constant mask for every step (Grappler folds the masks of a
  constant seed, so a trial would time and hold what training does not):
  the dropout-only pipeline's loss differs from step to step and repeats
  for a new runner."""
  layers = [dropout.DropoutLayer.Params().Set(name=f'drop{i}', keep_prob=0.5)
            for i in range(2)]
  p = gpipe.PipeliningLayer.Params().Set(name='pipe', layers=layers, num_partitions=2,
                                         num_micro_batches=2, input_shapes=[[4, 64]])
  x = [tf.ones([4, 64])]
  steps = trial.TrainingSteps(p, x)
  losses = [steps.run(1) for _ in range(3)]
  assert len(set(losses)) == 3, losses
  assert trial.TrainingSteps(p, x).run(2) == losses[1]


def test_the_next_trial_traces_while_one_warms_up_and_timed_steps_run_alone():
  """Trial 0's warm-up step (its first call) waits for trial 1's trace
  to start, which only a trace beside the warm-up lets happen; a trial's
  timed steps come after the next one's trace and before anything more is
  built or traced; each trial is built and traced once, in order."""
  log = []
  tracing = threading.Event()

  def Start(name):
    log.append(('build', name))
    calls = []

    def Trace():
      tracing.set()
      log.append(('trace', name))

    def Run(n):
      calls.append(n)
      if len(calls) == 1:
        if name == 0:
          assert tracing.wait(timeout=60), 'trial 1 was not traced during trial 0 warm-up'
      else:
        log.append(('timed', name))

    return trial.Steps(Trace, Run)

  results = trial.Timed([functools.partial(Start, i) for i in range(3)])
  assert len(results) == 3 and all(seconds >= 0 for seconds, _ in results)
  assert [e for e in log if e[0] == 'build'] == [('build', i) for i in range(3)]
  assert [e for e in log if e[0] == 'trace'] == [('trace', i) for i in range(3)]
  for i in range(3):
    timed = [at for at, e in enumerate(log) if e == ('timed', i)]
    others = [at for at, e in enumerate(log) if e[0] != 'timed']
    assert timed and timed == list(range(timed[0], timed[-1] + 1)), log  # nothing between
    if i < 2:
      assert log.index(('trace', i + 1)) < timed[0], log
    assert not [at for at in others if timed[0] < at < timed[-1]], log
  assert trial.Timed([]) == []


_PEAKS = '''
import json
import tensorflow as tf
from lingvo_pipe.core.layers import linear
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.planning import trial

# One layer each: with two, the order of their updates moves a peak by a
# gradient (4 MiB at 1024 wide).
def Pipeline(dim):
  layers = [linear.ProjectionLayer.Params().Set(name='p', input_dim=dim, output_dim=dim)]
  return gpipe.PipeliningLayer.Params().Set(name=f'pipe{dim}', layers=layers,
                                            num_partitions=1, input_shapes=[[8, dim]])

small, large = Pipeline(64), Pipeline(2048)
x = {64: [tf.ones([8, 64])], 2048: [tf.ones([8, 2048])]}
alone = [trial.Run([p], x[p.input_shapes[0][1]])[0][1] for p in (small, large)]
# The large one's 16 MiB of weights exist while the small one is timed.
together = [trial.Timed([lambda: trial.TrainingSteps(small, x[64]),
                         lambda: trial.TrainingSteps(large, x[2048])])[i][1] for i in (0, 1)]
print(json.dumps(dict(alone=alone, together=together)))
'''


def test_a_trials_peak_leaves_out_the_next_trial_built_beside_it():
  """Under the BFC allocator (a fresh process), a small pipeline's peak
  timed while a large one is built is its peak timed alone: the large
  one's weights (16 MiB) are not counted in it; nor is the small one's in
  the large one's peak."""
  out = fresh_process.RunPython('-c', _PEAKS, env={'TF_CPU_ALLOCATOR_USE_BFC': 'true'})
  peaks = json.loads(out.stdout.strip().splitlines()[-1])
  small, large = peaks['alone']
  assert small < (1 << 20) < (16 << 20) < large, peaks
  for alone, together in zip(peaks['alone'], peaks['together']):
    assert abs(together - alone) < (1 << 20) // 4, peaks
