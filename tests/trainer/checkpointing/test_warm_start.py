"""Warm start by trainer.init_from_checkpoint_rules: the embedding and the
first two layers of a trained 2-layer model loaded into a 4-layer one; the
loaded tensors equal the source's, the rest equal a fresh model's initial
values; applied only to a logdir without a checkpoint; a missing source
name or another shape stops the binary with one line before any step."""

import shutil

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe import model_registry
from tests.trainer import in_process
from trainer.checkpointing import checkpoint_keys
from trainer import experiment_params
from trainer import loop
from trainer.checkpointing import warm_start

TINY = 'lm.StdlibBytesTiny'
# One cell in both models, so the paths agree whatever the partitioning;
# one micro-batch, the cheapest step to trace.
COMMON = ('trainer.steps_per_loop=2; task.stack.pipeline.num_partitions=1; '
          'task.stack.pipeline.num_micro_batches=1')
DEEP = COMMON + '; task.stack.num_layers=4'
# Lingvo's shape: {checkpoint: ([(regex, format)], [ignore regexes])}.
RULE = r'(.*/(?:embedding|layer_[01])/.*)'


def _Rules(source, rule=RULE, name_format='%s'):
  return f"trainer.init_from_checkpoint_rules={{{str(source)!r}: ([({rule!r}, {name_format!r})], [])}}"


def _Params(overrides):
  params = experiment_params.ExperimentParams(model_registry.GetExperiment(TINY))
  experiment_params.ApplyOverrides(params, overrides)
  return params


@pytest.fixture(scope='module')
def source(tmp_path_factory):
  """A trained 2-layer model's logdir (ckpt-2)."""
  logdir = tmp_path_factory.mktemp('source')
  loop.Trainer(_Params(COMMON), str(logdir), log=lambda _: None).Train(2)
  return logdir


def test_loaded_tensors_equal_the_source_and_the_rest_their_initial_values(source, tmp_path):
  lines = []
  trainer = loop.Trainer(_Params(f'{DEEP}; {_Rules(source)}'), str(tmp_path / 'deep'),
                         log=lines.append)
  assert trainer.Restore() is None
  fresh = loop.Trainer(_Params(DEEP), str(tmp_path / 'fresh'), log=lambda _: None)
  reader = tf.train.load_checkpoint(str(source / 'checkpoints'))
  loaded = [p for p in trainer.model_variables
            if '/embedding/' in p or '/layer_0/' in p or '/layer_1/' in p]
  assert len(loaded) == 1 + 2 * 16  # the embedding and 16 per Transformer layer
  for path, var in trainer.model_variables.items():
    if path in loaded:
      want = reader.get_tensor(checkpoint_keys.VariableKey(path))
      assert not np.array_equal(want, fresh.model_variables[path].numpy()), path  # trained
    else:
      want = fresh.model_variables[path].numpy()
    np.testing.assert_array_equal(var.numpy(), want, err_msg=path)
  assert lines[0].startswith(f'Warm start from {source}/checkpoints/ckpt-2: rule (')
  assert lines[0].endswith('loaded 33 variable(s).')
  assert lines[1].startswith('Warm start: 33 of 67 variables loaded; 34 keep their '
                             'initial values: stack/pipeline/'), lines


def test_trainer_binary_warm_starts_once(source, tmp_path):
  logdir = tmp_path / 'deep'
  args = [f'--model={TINY}', '--mode=train', f'--logdir={logdir}',
          f'--model_params_override={DEEP}; {_Rules(source)}']
  first = in_process.Run(*args, '--max_steps=2')
  assert 'loaded 33 variable(s).' in first.stdout and 'step      2/2' in first.stdout
  assert 'init_from_checkpoint_rules' in (logdir / 'params.txt').read_text()
  # The restart restores (the choice is Restore's, before any step) and
  # has nothing to train: no second trace of the deep model.
  second = in_process.Run(*args, '--max_steps=2')
  assert 'Restored' in second.stdout and 'Warm start' not in second.stdout
  assert 'Nothing to train: the checkpoint is at step 2' in second.stdout
  # params.txt holds the rules in a form the binary reads back.
  again = in_process.Run(f'--model={TINY}', '--mode=inspect_params',
                         f'--model_params_file_override={logdir / "params.txt"}')
  assert (f"trainer.init_from_checkpoint_rules : {{{str(source)!r}: ([({RULE!r}, '%s')], "
          '[])}\n') in again.stdout


@pytest.mark.parametrize('rule,name_format,overrides,message', [
    (r'(.*)/layer_3/(.*)', '%s/layer_9/%s', DEEP, 'which ckpt-2 does not hold'),
    (RULE, '%s', DEEP + '; task.stack.hidden_dim=64', 'the shapes or dtypes differ'),
])
def test_bad_rule_is_one_line_before_any_step(source, tmp_path, rule, name_format,
                                              overrides, message):
  result = in_process.Run(
      f'--model={TINY}', '--mode=train',
      f'--logdir={tmp_path / "deep"}', '--max_steps=2',
      f'--model_params_override={overrides}; {_Rules(source, rule, name_format)}',
      check=False)
  assert result.returncode == 2 and 'Traceback' not in result.stderr
  errors = [l for l in result.stderr.splitlines() if l.startswith('error:')]
  assert len(errors) == 1 and message in errors[0], result.stderr
  assert 'error: Warm start: rule (' in errors[0]
  assert 'step ' not in result.stdout


def test_malformed_rules_fail_even_when_a_checkpoint_exists(source, tmp_path):
  logdir = tmp_path / 'copy'
  shutil.copytree(source, logdir)
  trainer = loop.Trainer(_Params(f"{COMMON}; trainer.init_from_checkpoint_rules={{'a': 'b'}}"),
                         str(logdir), log=lambda _: None)
  with pytest.raises(warm_start.WarmStartError, match=r"init_from_checkpoint_rules\['a'\] = "
                     r"'b' is not \(\[\(regex, format\), \.\.\.\], \[ignore regex, \.\.\.\]\)"):
    trainer.Restore()
