"""GPipe Transformer translation models over byte-level parallel text.

The default data is a generated translation-like task (reverse the
sentence), so it runs without files; set train/dev source_file_pattern and
target_file_pattern to line-aligned parallel text to use real data.
"""

import tensorflow as tf

from lingvo_pipe import base_experiment
from lingvo_pipe.core import hyperparams
from lingvo_pipe import model_registry
from lingvo_pipe.tasks.mt import input_generator as mt_input
from lingvo_pipe.tasks.mt import model as mt_model


@model_registry.RegisterExperiment
class ReverseBytesGPipe(base_experiment.BaseExperiment):
  """Encoder-decoder on 4 cells with 4 micro-batches."""

  BATCH_SIZE = 32
  LENGTH = 24
  NUM_CELLS = 4
  NUM_MICRO_BATCHES = 4

  def Task(self) -> hyperparams.Params:
    p = mt_model.TranslationTask.Params().Set(name='mt')
    p.model.Set(vocab_size=256, model_dim=64, num_heads=4, hidden_dim=256,
                num_encoder_layers=2, num_decoder_layers=2,
                batch_size=self.BATCH_SIZE, src_len=self.LENGTH, tgt_len=self.LENGTH,
                label_smoothing=0.1)
    p.model.pipeline.Set(num_partitions=self.NUM_CELLS,
                         num_micro_batches=self.NUM_MICRO_BATCHES)
    return p

  def Train(self) -> hyperparams.Params:
    return mt_input.ParallelTextInput.Params().Set(
        batch_size=self.BATCH_SIZE, src_len=self.LENGTH, tgt_len=self.LENGTH)

  def Dev(self) -> hyperparams.Params:
    return self.Train().Set(split='eval')

  def Trainer(self) -> hyperparams.Params:
    return base_experiment.TrainerParams().Set(
        max_steps=2000, steps_per_loop=100, learning_rate=2e-3,
        lr_schedule=base_experiment.LrSchedule.WARMUP_RSQRT, warmup_steps=200,
        clip_gradient_norm_to_value=1.0, eval_steps=10)


@model_registry.RegisterExperiment
class ReverseBytesGPipeBf16(ReverseBytesGPipe):
  """ReverseBytesGPipe with bfloat16 compute: activations and the tensors
  between cells in bfloat16, float32 master weights, optimizer slots and
  checkpoints; the loss, softmax and norms in float32 (core/precision)."""

  def Task(self) -> hyperparams.Params:
    return super().Task().Set(fprop_dtype=tf.bfloat16)
