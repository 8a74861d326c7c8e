"""keras_bench on a small Transformer stack: both pipelines and
train_on_batch run, the stacks hold the same number of weights, and the
ratios are those of the times reported."""

import statistics

import pytest

from benchmarks import keras_bench
from benchmarks import workloads


def test_compares_the_keras_stack_with_the_projects_and_train_on_batch():
  small = workloads.Workload('transformer', num_layers=2, dim=16, hidden=32, heads=2,
                             batch=4, seq=4)
  row = keras_bench.Compare(small, k=2, m=2, schedule='one_f_one_b', rounds=1)
  assert row['weights']['keras'] == row['weights']['project']
  keras_s, project_s = row['keras_pipeline_step_s'], row['project_pipeline_step_s']
  assert len(keras_s) == len(project_s) == 1 and min(keras_s + project_s) > 0
  assert row['keras_over_project_by_round'] == pytest.approx(
      [a / b for a, b in zip(keras_s, project_s)])
  assert row['speedup_over_train_on_batch'] == pytest.approx(
      row['keras_train_on_batch_step_s'] / statistics.median(keras_s))
