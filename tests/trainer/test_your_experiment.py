"""docs/your_experiment.md cannot rot (issue 28, point 10): its module is
written to an empty directory and every command and script after "Run it"
runs there, in order, as the page says: the first command through the
console script, as a user runs it, the others by the trainer in the test
process (each a TensorFlow import less), the script in a process of its
own."""

import re
import shlex
import sys

from tests.trainer import your_experiment


def test_the_walk_through_runs_as_written(tmp_path):
  your_experiment.WriteModule(tmp_path)
  _, blocks = your_experiment.Blocks()
  assert [language for language, _ in blocks] == ['sh'] * 6 + ['python']
  ran = []
  for language, code in blocks:
    if language == 'python':
      (tmp_path / 'snippet.py').write_text(code)
      result = your_experiment.RunCommand(tmp_path, [sys.executable, 'snippet.py'])
      ran.append(result.stdout)
      continue
    for line in code.strip().splitlines():
      command = shlex.split(line)
      assert command[0] == 'lingvo_pipe_trainer', line
      run = your_experiment.RunTrainerInProcess if ran else your_experiment.RunTrainer
      ran.append(run(tmp_path, *command[1:]).stdout)
  text = '\n'.join(ran)
  assert 'pipeline pipe: K=2 cells, M=4 micro-batches' in text
  for schedule in ('ONE_F_ONE_B', 'ZB_H1'):  # the labels reach the loss under each
    assert f'M=4 micro-batches, schedule {schedule}' in text
  losses = re.findall(r'step +20/20 +loss (\S+)', text)  # the two short runs: equal
  assert len(losses) == 2 and losses[0] == losses[1], losses
  assert 'eval at step 200: accuracy' in text
  assert 'bubble: measured' in text
  assert 'decode at step 200: 320 examples' in text
  assert 'tf.Tensor(' in ran[-1] and 'shape=(3,)' in ran[-1], ran[-1]
  assert sorted(p.name for p in (tmp_path / 'mlp').glob('decode_*.txt')) == [
      'decode_200.txt', 'decode_200_prompt.txt']
