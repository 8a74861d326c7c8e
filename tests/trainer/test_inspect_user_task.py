"""--mode=inspect_model on a task that builds its layers in its constructor
(issue 28, point 4): the built task's cells, one-line errors for bad
overrides, and a planner that weighs only the schedules the task trains."""

from tests.trainer import in_process
from tests.trainer import your_experiment

KEY = your_experiment.KEY


_DECLARATION = '  PIPELINE_SCHEDULES = tuple(ScheduleKind)  # FProp trains every schedule\n'


def test_inspect_model_reads_the_built_task(tmp_path):
  """The walk-through's task without its PIPELINE_SCHEDULES: the planner
  weighs fill-drain alone, the one schedule FProp trains by default."""
  module = your_experiment.WriteModule(tmp_path)
  text = module.read_text()
  assert _DECLARATION in text
  module.write_text(text.replace(_DECLARATION, ''))
  plan = your_experiment.RunTrainerInProcess(tmp_path, f'--model={KEY}',
                                              '--mode=inspect_model').stdout
  assert 'pipeline pipe: K=2 cells, M=4 micro-batches' in plan, plan
  assert 'proj0, proj1' in plan and 'proj2, proj3' in plan
  assert 'schedules weighed (the planner\'s that the model trains): GPIPE;' in plan
  assert 'ONE_F_ONE_B' not in plan.split('schedules weighed')[1].split(';', 1)[1]
  assert 'INTERLEAVED' not in plan


def test_bad_overrides_are_one_line_in_inspect_model(tmp_path):
  your_experiment.WriteModule(tmp_path)
  for override, message in (
      ('task.pipeline.num_micro_batches=3', 'num_micro_batches (3) must divide'),
      ('task.pipeline.num_partitions=0', 'num_partitions (0) must be >= 1'),
      ('task.num_layers=1', 'Cannot split 1 layers into 2 cells')):
    result = your_experiment.RunTrainerInProcess(
        tmp_path, f'--model={KEY}', '--mode=inspect_model',
        f'--model_params_override={override}', check=False)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_a_task_that_trains_every_schedule_gets_them_all_weighed():
  plan = in_process.Run('--model=lm.StdlibBytesTiny', '--mode=inspect_model').stdout
  assert ('schedules weighed (the planner\'s that the model trains): GPIPE, ONE_F_ONE_B, '
          'INTERLEAVED, ZB_H1, ZB_H2, ZB_V;') in plan
  assert ' ONE_F_ONE_B ' in plan
