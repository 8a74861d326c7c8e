"""The planner and inspect_model count activation and boundary bytes at the
compute dtype, parameter bytes at the variables' dtype."""

import tensorflow as tf

from lingvo_pipe import model_registry
from lingvo_pipe.core import base_params
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.planning import planner
from lingvo_pipe.pipeline.layout import cells as cells_lib
from lingvo_pipe.pipeline.lowering.remat import RematPolicy
from trainer import experiment_params
from trainer import inspection

from tests.pipeline import pipeline_models as models


def _FfnLayers(fprop_dtype):
  layers, shape = models.FfnLayers(dim=64)
  pipe = gpipe.PipeliningLayer.Params().Set(
      name='pipe', layers=layers, num_partitions=4, num_micro_batches=4,
      input_shapes=[shape], fprop_dtype=fprop_dtype)
  return base_params.WithInheritedBaseParams(pipe).layers, shape


def test_planner_counts_activations_at_compute_dtype():
  rows = {}
  for dtype in (None, tf.bfloat16):
    layers, shape = _FfnLayers(dtype)
    rows[dtype] = planner.Estimate(layers, [shape], 4, 4, RematPolicy.PER_CELL,
                                   optimizer_slots=2, gradients_held=False)
  f32, bf16 = rows[None], rows[tf.bfloat16]
  assert bf16.param_bytes == f32.param_bytes
  # A bfloat16 product is by a cast of the weight, so no weight gradient is
  # deferred: each weight keeps its gradient sum beside its two slots, and
  # an update's temporary (the cell's one layer, updated as its gradient is
  # made: beside the activations); in float32 the
  # projections (64 -> 128 -> 64) defer, their factors smaller.
  assert bf16.state_bytes == [4 * p for p in bf16.param_bytes]
  assert all(f < b for f, b in zip(f32.state_bytes, bf16.state_bytes))
  for a, b in zip(bf16.act_bytes, f32.act_bytes):
    assert a * 2 == b, (a, b)  # every tensor of these layers is bfloat16


def test_layers_inherit_the_compute_dtype_set_on_a_pipeline():
  layers, _ = _FfnLayers(tf.bfloat16)
  for lp in layers:
    assert lp.fprop_dtype == tf.bfloat16
    assert lp.body.sub[0].fprop_dtype == tf.bfloat16


def _CellActBytes(key):
  params = experiment_params.ExperimentParams(model_registry.GetExperiment(key))
  (_, pipe, _), = list(inspection.PipelinesInParams(
      base_params.WithInheritedBaseParams(params.task)))
  shapes = tuple(tf.TensorShape(s) for s in pipe.input_shapes)
  act = []
  for cell in cells_lib.CellParams(pipe):
    meta = cell.cls.FPropMeta(cell, *shapes)
    shapes = meta.out_shapes
    act.append(meta.act_bytes)
  return act, params, pipe


def test_inspect_model_counts_bfloat16_activations():
  f32, _, _ = _CellActBytes('lm.StdlibBytesGPipe')
  bf16, params, pipe = _CellActBytes('lm.StdlibBytesGPipeBf16')
  assert pipe.fprop_dtype == tf.bfloat16
  # Transformer cells: bfloat16 activations but float32 norm statistics,
  # attention softmax and loss (core/precision).
  for a, b in zip(bf16, f32):
    assert 0.4 * b < a < 0.75 * b, (a, b)
  text = inspection.ModelPlan(params.task)
  assert 'K=4' in text
