"""Overrides typed by the param's current value (issue 28, point 2): enum
members by name in any case, dtypes by name, bools as true/false, the long
forms still accepted; refusals list what the param takes; type errors quote
the experiment's value; splits with num_partitions 0 pass the range check;
a params file is read as an override is."""

import pytest

from lingvo_pipe import model_registry
from tests.trainer import in_process
from trainer import experiment_params

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
               "task.stack.pipeline.remat : enum('lingvo_pipe.pipeline.lowering.remat.RematPolicy', "
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
    # Text that is no value at all is refused in the same form.
    ('task.stack.pipeline.num_micro_batches=eight',
     "task.stack.pipeline.num_micro_batches takes an int (the experiment's value: 2), not "
     'eight.'),
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


def test_a_params_file_takes_what_an_override_takes(tmp_path):
  """One parser for files and overrides: a Lingvo user's file with short
  forms, comments and '=' lines."""
  path = tmp_path / 'mine.txt'
  path.write_text('# my settings\ntask.stack.pipeline.schedule : ZB_H1\n'
                  'task.stack.pipeline.num_micro_batches : 4\ntask.fprop_dtype = bfloat16\n')
  text = in_process.Run(f'--model={TINY}', '--mode=inspect_params',
                        f'--model_params_file_override={path}').stdout
  assert ("task.stack.pipeline.schedule : "
          "enum('lingvo_pipe.pipeline.schedules.built_in.ScheduleKind', 'ZB_H1')\n") in text
  assert "task.fprop_dtype : dtype('bfloat16')\n" in text


def test_every_experiments_params_text_reads_back_as_a_file():
  """params.txt, read back as --model_params_file_override, is the params
  that wrote it, for every registered experiment."""
  model_registry.ImportAllExperiments()
  for key in model_registry.Keys():
    params = experiment_params.ExperimentParams(model_registry.GetExperiment(key))
    fresh = experiment_params.ExperimentParams(model_registry.GetExperiment(key))
    fresh.trainer.Set(max_steps=params.trainer.max_steps + 1)  # for the file to set back
    experiment_params.ApplyParamsFile(fresh, params.ToText(), 'params.txt')
    assert fresh == params, key
