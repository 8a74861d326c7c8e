"""inspect_model on a cluster: the worker and device of each cell and
replica, and the planner's table for one replica's share of the batch."""

import re

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.layers import linear
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.schedules import schedule
from trainer import inspection


class _EverySchedule:
  """A pipeline owner that trains every schedule (FPropWithLoss for all)."""
  PIPELINE_SCHEDULES = tuple(schedule.ScheduleKind)


def _Task(batch=32, **kwargs):
  layers = [linear.ProjectionLayer.Params().Set(name=f'p{i}', input_dim=64, output_dim=64)
            for i in range(4)]
  task = hyperparams.InstantiableParams(_EverySchedule)
  task.Define('pipeline', gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, num_partitions=2, num_micro_batches=4,
      input_shapes=[[batch, 64]], **kwargs), '')
  return task


def _ActMiB(text, k, m, remat):
  row = re.search(rf'^[* ] +{k} +1 +{m} {remat} +GPIPE +([\d.]+) +([\d.]+) +([\d.]+)', text,
                  re.M)
  return float(row.group(3))


def test_cells_and_replicas_on_worker_tasks():
  text = inspection.ModelPlan(_Task(num_replicas=2), cluster_tasks=4)
  assert 'K=2 cells, M=4 micro-batches, R=2 replicas' in text
  assert re.search(r'^  0 +/job:worker/replica:0/task:0/device:CPU:0 ', text, re.M)
  assert re.search(r'^  1 +/job:worker/replica:0/task:1/device:CPU:0 ', text, re.M)
  assert ('replica 1: cell 0 on /job:worker/replica:0/task:2/device:CPU:0, '
          'cell 1 on /job:worker/replica:0/task:3/device:CPU:0') in text
  assert 'for each of the 2 replicas: 1/2 of the batch' in text


def test_planner_sees_one_replicas_batch():
  one = inspection.ModelPlan(_Task(batch=16384), cluster_tasks=2)
  two = inspection.ModelPlan(_Task(batch=16384, num_replicas=2), cluster_tasks=4)
  assert _ActMiB(two, 2, 4, 'NONE') > 0
  assert abs(_ActMiB(two, 2, 4, 'NONE') - _ActMiB(one, 2, 4, 'NONE') / 2) <= 0.1
  assert ' ONE_F_ONE_B ' in one and ' ONE_F_ONE_B ' in two  # replicas run every schedule


def test_consecutive_cells_per_device_and_local_default():
  text = inspection.ModelPlan(_Task(num_replicas=2, consecutive_cells_per_device=2), cluster_tasks=2)
  assert re.search(r'^  1 +/job:worker/replica:0/task:0/device:CPU:0 ', text, re.M)
  assert 'replica 1: cell 0 on /job:worker/replica:0/task:1/device:CPU:0' in text
  local = inspection.ModelPlan(_Task(num_replicas=2))
  assert 'replica 1: cell 0 on /job:localhost/replica:0/task:0/device:CPU:2' in local


def test_trainer_binary_inspects_a_cluster_without_connecting():
  """No worker runs at these addresses: inspect_model only names them."""
  from tests import fresh_process  # pylint: disable=g-import-not-at-top
  plan = fresh_process.RunPython(
      '-m', 'trainer.trainer', '--model=lm.StdlibBytesTiny', '--mode=inspect_model',
      '--cluster_spec=worker=localhost:1,localhost:2,localhost:3,localhost:4',
      '--model_params_override=task.stack.pipeline.num_replicas=2').stdout
  assert 'K=2 cells, M=2 micro-batches, R=2 replicas' in plan
  assert re.search(r'^  1 +/job:worker/replica:0/task:1/device:CPU:0 ', plan, re.M)
  assert 'cell 1 on /job:worker/replica:0/task:3/device:CPU:0' in plan
