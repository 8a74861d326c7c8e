"""Byte-level GPipe Transformer language models.

The default corpus is real text present on every machine: the .py files of
the running interpreter's standard library (1 file in 10 held out for eval).
Point `train.file_pattern` / `dev.file_pattern` at other text files to use
them instead.
"""

import tensorflow as tf

from lingvo_pipe import base_experiment
from lingvo_pipe.core import hyperparams
from lingvo_pipe import model_registry
from lingvo_pipe.pipeline.schedules import schedule
from lingvo_pipe.tasks.lm import input_generator as lm_input
from lingvo_pipe.tasks.lm import model as lm_model


@model_registry.RegisterExperiment
class StdlibBytesGPipe(base_experiment.BaseExperiment):
  """`make demo`: 4 cells on 4 devices, 8 micro-batches, a few minutes on
  2 CPU cores, held-out bits per byte below 2.5."""

  BATCH_SIZE = 32
  SEQ_LEN = 128
  NUM_CELLS = 4
  NUM_MICRO_BATCHES = 8

  def Task(self) -> hyperparams.Params:
    p = lm_model.LanguageModelTask.Params().Set(name='lm')
    p.stack.Set(vocab_size=256, model_dim=128, num_heads=4, hidden_dim=512,
                num_layers=4, batch_size=self.BATCH_SIZE, seq_len=self.SEQ_LEN,
                residual_keep_prob=1.0)
    p.stack.pipeline.Set(num_partitions=self.NUM_CELLS,
                         num_micro_batches=self.NUM_MICRO_BATCHES)
    return p

  def Train(self) -> hyperparams.Params:
    return lm_input.ByteLmInput.Params().Set(
        split='train', batch_size=self.BATCH_SIZE, seq_len=self.SEQ_LEN)

  def Dev(self) -> hyperparams.Params:
    return self.Train().Set(split='eval')

  def Trainer(self) -> hyperparams.Params:
    return base_experiment.TrainerParams().Set(
        max_steps=1200, steps_per_loop=100, learning_rate=3e-3,
        optimizer=base_experiment.OptimizerKind.ADAM,
        lr_schedule=base_experiment.LrSchedule.COSINE, warmup_steps=100,
        clip_gradient_norm_to_value=1.0, eval_steps=20)


@model_registry.RegisterExperiment
class StdlibBytesOneFOneB(StdlibBytesGPipe):
  """The demo's model and data with the 1F1B schedule (PipeDream-flush):
  each micro-batch's loss and backward start as soon as its forward leaves
  the last cell, so cell k keeps at most 4-k micro-batches, not 8."""

  def Task(self) -> hyperparams.Params:
    p = super().Task()
    p.stack.pipeline.schedule = schedule.ScheduleKind.ONE_F_ONE_B
    return p


@model_registry.RegisterExperiment
class StdlibBytesTiny(StdlibBytesGPipe):
  """A seconds-long smoke test: 2 cells, 2 micro-batches, a tiny model."""

  BATCH_SIZE = 4
  SEQ_LEN = 16
  NUM_CELLS = 2
  NUM_MICRO_BATCHES = 2

  def Task(self) -> hyperparams.Params:
    p = super().Task()
    p.stack.Set(model_dim=16, num_heads=2, hidden_dim=32, num_layers=2,
                residual_keep_prob=0.9)
    return p

  def Train(self) -> hyperparams.Params:
    return super().Train().Set(max_bytes=200_000)

  def Trainer(self) -> hyperparams.Params:
    return super().Trainer().Set(max_steps=8, steps_per_loop=4, eval_steps=2,
                                 warmup_steps=2)


@model_registry.RegisterExperiment
class StdlibBytesGPipeBf16(StdlibBytesGPipe):
  """The demo with bfloat16 compute: activations and the tensors between
  cells in bfloat16, float32 master weights, optimizer slots and
  checkpoints; the loss, softmax and norms in float32 (core/precision)."""

  def Task(self) -> hyperparams.Params:
    return super().Task().Set(fprop_dtype=tf.bfloat16)


@model_registry.RegisterExperiment
class StdlibBytesTinyBf16(StdlibBytesTiny):
  """The smoke test with bfloat16 compute (as StdlibBytesGPipeBf16)."""

  def Task(self) -> hyperparams.Params:
    return super().Task().Set(fprop_dtype=tf.bfloat16)
