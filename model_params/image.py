"""AmoebaNet-D with GPipe on CIFAR-10-format images.

Set train.file_pattern to CIFAR-10 binary files (data_batch_*.bin) and
dev.file_pattern to test_batch.bin; by default both are generated images,
so the experiment runs without data.
"""

from lingvo_pipe import base_experiment
from lingvo_pipe.core import hyperparams
from lingvo_pipe import model_registry
from lingvo_pipe.tasks.image import amoebanet
from lingvo_pipe.tasks.image import input_generator as image_input
from lingvo_pipe.tasks.image import model as image_model


@model_registry.RegisterExperiment
class AmoebaNetDCifarGPipe(base_experiment.BaseExperiment):
  """AmoebaNet-D(N=1, F=32) on 4 cells with 4 micro-batches."""

  BATCH_SIZE = 32
  NUM_NORMAL_CELLS = 1
  NUM_FILTERS = 32
  NUM_CELLS = 4
  NUM_MICRO_BATCHES = 4

  def Task(self) -> hyperparams.Params:
    p = image_model.ImageClassificationTask.Params().Set(name='image')
    p.classifier.Set(
        layers=amoebanet.AmoebaNetDLayers(self.NUM_NORMAL_CELLS, self.NUM_FILTERS, 10),
        num_classes=10, input_shape=[self.BATCH_SIZE, 32, 32, 3], label_smoothing=0.1)
    p.classifier.pipeline.Set(num_partitions=self.NUM_CELLS,
                              num_micro_batches=self.NUM_MICRO_BATCHES)
    return p

  def Train(self) -> hyperparams.Params:
    return image_input.CifarInput.Params().Set(batch_size=self.BATCH_SIZE)

  def Dev(self) -> hyperparams.Params:
    return self.Train().Set(split='eval')

  def Trainer(self) -> hyperparams.Params:
    return base_experiment.TrainerParams().Set(
        max_steps=1000, steps_per_loop=50, learning_rate=2e-3,
        optimizer=base_experiment.OptimizerKind.ADAM,
        lr_schedule=base_experiment.LrSchedule.COSINE, warmup_steps=50,
        clip_gradient_norm_to_value=5.0, eval_steps=8)
