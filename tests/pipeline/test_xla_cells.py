"""XLA-compiled cells: the compiled pipeline equals the uncompiled one.

Dropout masks are the same bits under both (core/layers/dropout.py). XLA
fuses and orders float32 sums differently from TensorFlow's kernels (Eigen
and oneDNN), so values agree to rounding: each tensor to rtol 1e-5 with an
absolute tolerance of 1e-5 of its largest magnitude (a value that nearly
cancels keeps the rounding of its summands), and at least 1e-6 as in
tests/transparency.py (a gradient that is zero in exact arithmetic, e.g.
of attention's key bias, is rounding noise on both sides).
"""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline.layout.cell_compilation import CellCompilation

from tests.pipeline import pipeline_models as models


RTOL = 1e-5


def _AssertClose(actual, expected, what):
  for a, e in zip(tf.nest.flatten(actual), tf.nest.flatten(expected)):
    a, e = tf.convert_to_tensor(a).numpy(), tf.convert_to_tensor(e).numpy()
    scale = float(np.max(np.abs(e))) if e.size else 0.0
    np.testing.assert_allclose(a, e, rtol=RTOL, atol=max(RTOL * scale, 1e-6),
                               err_msg=what)


def _Step(pipe, inputs, loss_fn=models.Loss):
  return models.TrainStep(pipe, 3, loss_fn)(*inputs)


def _CheckCompiledEqualsUncompiled(build, inputs, loss_fn=models.Loss):
  plain = build(CellCompilation.NONE)
  compiled = build(CellCompilation.XLA)
  for a, b in zip(plain.variables, compiled.variables):
    assert a.name == b.name
    b.assign(a)
  y0, loss0, grads0 = _Step(plain, inputs, loss_fn)
  y1, loss1, grads1 = _Step(compiled, inputs, loss_fn)
  _AssertClose(y1, y0, 'outputs')
  _AssertClose(loss1, loss0, 'loss')
  for v, g1, g0 in zip(list(plain.trainable_variables) + ['input'] * 9,
                       grads1, grads0):
    if g0 is None:
      assert g1 is None
      continue
    _AssertClose(g1, g0, f'gradient of {getattr(v, "name", v)}')


# XLA compiles each cell function on first use (tens of seconds here):
# make test runs one configuration of each stack, make test-slow the rest.
_SLOW = pytest.mark.slow


@pytest.mark.parametrize('k,m,remat', [
    (2, 4, gpipe.RematPolicy.PER_CELL),
    pytest.param(4, 1, gpipe.RematPolicy.PER_CELL, marks=_SLOW),
    pytest.param(2, 4, gpipe.RematPolicy.PER_LAYER, marks=_SLOW),
    pytest.param(2, 2, gpipe.RematPolicy.NONE, marks=_SLOW)])
def test_ffn_xla_cells_equal_uncompiled(k, m, remat):
  layers, shape = models.FfnLayers()
  x = tf.random.stateless_normal(shape, [4, 2])
  _CheckCompiledEqualsUncompiled(
      lambda jit: models.Pipeline(layers, shape, k, m, remat=remat,
                                  jit_compile=jit), [x])


@pytest.mark.parametrize('k,m', [(2, 1), pytest.param(4, 4, marks=_SLOW)])
def test_transformer_xla_cells_equal_uncompiled(k, m):
  _CheckCompiledEqualsUncompiled(
      lambda jit: models.TransformerStackPipeline(k, m, jit_compile=jit),
      list(models.TransformerInputs(2)), models.TokenLoss(models.TransformerLabels(2)))


def test_cell_functions_are_compiled_on_cell_devices():
  layers, shape = models.FfnLayers()
  pipe = models.Pipeline(layers, shape, 2, 4, jit_compile=CellCompilation.XLA,
                         devices=['CPU:3', 'CPU:6'])
  graph_def = models.TrainStep(pipe, 0).get_concrete_function(
      tf.TensorSpec(shape)).graph.as_graph_def()
  library = {f.signature.name: f for f in graph_def.library.function}
  compiled = {name for name, f in library.items()
              if f.attr['_XlaMustCompile'].b}
  kinds = {(n.split('cell_')[1][0], n.split('_')[-2]) for n in compiled
           if '_forward_' in n or '_gradient_' in n}
  assert kinds >= {('0', 'forward'), ('1', 'forward'), ('0', 'gradient'),
                   ('1', 'gradient')}, sorted(compiled)
  # Every call of a compiled function is on its cell's device.
  def Calls(nodes, device):
    for node in nodes:
      if 'f' in node.attr and node.attr['f'].func.name in library:
        here = node.device or device
        yield node.attr['f'].func.name, here
        yield from Calls(library[node.attr['f'].func.name].node_def, here)
  for fn, device in Calls(graph_def.node, ''):
    if fn in compiled:
      k = int(fn.split('cell_')[1][0])
      assert tf.DeviceSpec.from_string(device).device_index == (3, 6)[k], fn


def test_compilation_choice():
  from lingvo_pipe.pipeline.layout import cell_compilation
  assert cell_compilation.Compiles(CellCompilation.XLA, tf.float32)
  assert not cell_compilation.Compiles(CellCompilation.NONE, tf.bfloat16)
  # AUTO follows the measurement (docs/benchmarks/precision.md): XLA was
  # slower than TensorFlow's kernels for both dtypes on this CPU.
  assert not cell_compilation.Compiles(CellCompilation.AUTO, tf.float32)
  assert not cell_compilation.Compiles(CellCompilation.AUTO, tf.bfloat16)
  layers, shape = models.FfnLayers()
  with pytest.raises(TypeError, match='CellCompilation'):
    models.Pipeline(layers, shape, 2, 2, jit_compile=True)
