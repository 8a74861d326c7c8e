"""Batch norm outside every PipeliningLayer is refused when the trainer
builds the task: only a pipeline applies its moving averages, so they
would keep their initial values and evaluation would use them."""

import pytest

from lingvo_pipe import model_registry
from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.layers import linear
from lingvo_pipe.core.layers import normalization
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline import pipelined_model
from trainer import experiment_params
from trainer import loop


class _NormThenPipeline(base_layer.BaseLayer):
  """A batch norm of its own, then a pipeline with a batch norm inside."""

  @classmethod
  def Params(cls) -> hyperparams.InstantiableParams:
    p = super().Params()
    p.Define('norm', normalization.BatchNormLayer.Params().Set(dim=4), '')
    p.Define('pipeline', gpipe.PipeliningLayer.Params().Set(layers=[
        linear.ProjectionLayer.Params().Set(name='proj', input_dim=4, output_dim=4),
        normalization.BatchNormLayer.Params().Set(name='bn', dim=4)], splits=[1]), '')
    return p

  def __init__(self, params: hyperparams.Params) -> None:
    super().__init__(params)
    self.CreateChild('norm', self.params.norm)
    self.CreateChild('pipeline', self.params.pipeline)


def test_only_batch_norms_outside_pipelines_are_listed():
  task = _NormThenPipeline.Params().Set(name='task').Instantiate()
  assert pipelined_model.UpdatesOutsidePipelines(task) == ['task/norm']
  assert pipelined_model.UpdatesOutsidePipelines(task.pipeline) == []


def test_the_trainer_refuses_a_task_with_batch_norm_outside_its_pipeline(tmp_path):
  params = experiment_params.ExperimentParams(model_registry.GetExperiment('lm.StdlibBytesTiny'))
  params.task = _NormThenPipeline.Params().Set(name='task')
  with pytest.raises(ValueError, match=r"\['task/norm'\] keep statistics updated in training .* "
                     r"Make them the pipeline's layers"):
    loop.Trainer(params, str(tmp_path), log=lambda _: None)
  assert not list(tmp_path.iterdir())
