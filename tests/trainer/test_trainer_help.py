"""--help shows the trainer's own flags with their docs (issue 28, point 3),
through the console script as a user runs it."""

import pathlib

from tests.trainer import your_experiment


def test_help_lists_the_trainers_flags(tmp_path: pathlib.Path):
  result = your_experiment.RunTrainer(tmp_path, '--help')
  out = result.stdout
  for flag in ('--model:', '--import:', '--mode:', '--logdir:', '--model_params_override:',
               '--max_steps:', '--decode_prompt:', '--cluster_spec:'):
    assert flag in out, flag
  assert 'pkg.module.ClassName' in out and 'inspect_model' in out
  # Serving as a worker opens a port to anyone who reaches it; the help says so.
  text = ' '.join(out.split())
  assert 'on a port open to anyone who reaches it: docs/several_machines.md#security' in text
  assert 'authenticates and encrypts nothing' in text and '--trust_cluster_network:' in out
  assert '--helpfull' in out
  assert not result.stderr.strip(), result.stderr
