"""Overrides typed by the param's current value (issue 28, point 2): enum
members by name in any case, dtypes by name, bools as true/false, the long
forms still accepted; refusals list what the param takes; type errors quote
the experiment's value; splits with num_partitions 0 pass the range check."""

import pytest

from tests.trainer import in_process

TINY = 'lm.StdlibBytesTiny'


def _Params(overrides: str, check: bool = True):
  return in_process.Run(f'--model={TINY}', '--mode=inspect_params',
                        f'--model_params_override={overrides}', check=check)


def test_short_forms_set_enums_dtypes_and_bools():
  text = _Params('trainer.optimizer=sgd; trainer.lr_schedule=Warmup_Rsqrt; '
                 'task.stack.pipeline.remat=PER_LAYER; task.fprop_dtype=bfloat16; '
                 'task.dtype=float32; task.stack.pipeline.remat_last_micro_batch=true'
                 ).stdout
  for line in ("trainer.optimizer : enum('lingvo_pipe.base_experiment.OptimizerKind', 'SGD')",
               "trainer.lr_schedule : enum('lingvo_pipe.base_experiment.LrSchedule', "
               "'WARMUP_RSQRT')",
               "task.stack.pipeline.remat : enum('lingvo_pipe.pipeline.remat.RematPolicy', "
               "'PER_LAYER')",
               "task.fprop_dtype : dtype('bfloat16')",
               'task.stack.pipeline.remat_last_micro_batch : True'):
    assert line + '\n' in text, line


def test_long_forms_still_work():
  text = _Params("trainer.optimizer=enum('lingvo_pipe.base_experiment.OptimizerKind', "
                 "'MOMENTUM'); task.fprop_dtype=dtype('bfloat16'); "
                 'task.stack.pipeline.remat_last_micro_batch=True').stdout
  assert "'MOMENTUM')\n" in text and "task.fprop_dtype : dtype('bfloat16')\n" in text


def test_lingvos_key_colon_value_items_and_newlines():
  text = _Params("trainer.optimizer : sgd\ntask.fprop_dtype : bfloat16; "
                 "train.file_pattern : 'corpus/a=b:c*.txt'").stdout
  assert "trainer.optimizer : enum('lingvo_pipe.base_experiment.OptimizerKind', 'SGD')\n" in text
  assert "task.fprop_dtype : dtype('bfloat16')\n" in text
  assert "train.file_pattern : 'corpus/a=b:c*.txt'\n" in text


@pytest.mark.parametrize('override,message', [
    ('trainer.optimizer=sgdd',
     "trainer.optimizer takes one of SGD, MOMENTUM, ADAM, RMSPROP (any case)"),
    ('task.fprop_dtype=bfloat17', 'task.fprop_dtype takes a dtype: one of float32, bfloat16'),
    ('task.stack.pipeline.remat_last_micro_batch=maybe',
     'takes true or false (also yes/no, on/off, 1/0, any case)'),
    ('trainer.max_steps=1.5',
     "trainer.max_steps takes an int (the experiment's value: 8), not 1.5"),
    ('trainer.max_steps=0',
     "trainer.max_steps=0 must be at least 1 (the experiment's value: 8)"),
])
def test_refusals_name_what_the_param_takes(override, message):
  result = _Params(override, check=False)
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and message in lines[0], result.stderr


def test_splits_with_num_partitions_zero_pass():
  text = _Params('task.stack.pipeline.splits=[2]; task.stack.pipeline.num_partitions=0'
                 ).stdout
  assert 'task.stack.pipeline.num_partitions : 0\n' in text
  assert 'task.stack.pipeline.splits : [2]\n' in text


def test_splits_alone_take_the_place_of_the_experiments_num_partitions():
  """The tiny LM has 2 cells; 4 layers split at [1, 2, 3] make 4."""
  text = _Params('task.stack.pipeline.splits=[1, 2, 3]').stdout
  assert 'task.stack.pipeline.num_partitions : 0\n' in text
  plan = in_process.Run(
      f'--model={TINY}', '--mode=inspect_model',
      '--model_params_override=task.stack.pipeline.splits=[1, 2, 3]').stdout
  assert 'K=4 cells' in plan, plan
