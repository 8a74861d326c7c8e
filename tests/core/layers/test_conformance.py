"""Every layer class in lingvo_pipe conforms (as Sonnet's module conformance
tests ask of its modules): it builds, FPropMeta predicts the shapes FProp
returns in eval and in training, its params survive text, and a checkpoint
of one instance restores into a second built from the same params.

The classes are found by walking lingvo_pipe's modules; their examples are
in layer_examples.py.
"""

import importlib
import inspect
import pkgutil
from typing import Any, Dict, List

import numpy as np
import pytest
import tensorflow as tf

import lingvo_pipe
from lingvo_pipe.core import base_layer
from lingvo_pipe.core import eval_mode
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.layers import linear

from tests.core.layers import layer_examples
from tests.core.layers.layer_examples import EXAMPLES, EXEMPT


def _Name(cls: type) -> str:
  return f'{cls.__module__}.{cls.__qualname__}'


def _LayerClasses() -> List[type]:
  """Every BaseLayer subclass defined in a module of lingvo_pipe."""
  found = set()
  for info in pkgutil.walk_packages(lingvo_pipe.__path__, 'lingvo_pipe.'):
    module = importlib.import_module(info.name)
    for value in vars(module).values():
      if (inspect.isclass(value) and issubclass(value, base_layer.BaseLayer) and
          value.__module__ == module.__name__):
        found.add(value)
  return sorted(found, key=_Name)


LAYER_CLASSES = _LayerClasses()


def _Cases(meta: bool = False) -> List[Any]:
  """pytest params of the examples; for the FPropMeta check, without the
  exempt ones."""
  cases = []
  for cls, examples in EXAMPLES.items():
    for i, example in enumerate(examples):
      if meta and example.meta_exempt:
        continue
      cases.append(pytest.param(example, id=cls.__name__ + (f'-{i}' if i else '')))
  return cases


def _Tensors(inputs: Any) -> Any:
  """The example's inputs (layer_examples.In leaves) as tensors."""
  leaves = tf.nest.flatten(inputs)
  tensors = []
  for seed, spec in enumerate(leaves):
    if spec.vocab:
      tensors.append(tf.random.stateless_uniform(spec.shape, [seed, 1], 0, spec.vocab,
                                                 tf.int32))
    elif spec.zeros:
      tensors.append(tf.zeros(spec.shape))
    else:
      tensors.append(tf.random.stateless_normal(spec.shape, [seed, 0]))
  return tf.nest.pack_sequence_as(inputs, tensors)


def _Values(layer: base_layer.BaseLayer) -> Dict[str, np.ndarray]:
  values = {v.name: v.numpy() for v in layer.variables}
  assert len(values) == len(layer.variables), 'two variables share a name'
  return values


def test_every_layer_class_has_an_example_or_an_exemption():
  assert len(LAYER_CLASSES) > len(EXEMPT)  # the walk found the layers
  missing = [_Name(c) for c in LAYER_CLASSES if c not in EXAMPLES and c not in EXEMPT]
  assert not missing, (
      f'Layer classes without a conformance example: {missing}. Add params and '
      f'inputs for each to EXAMPLES in {layer_examples.__file__} (or, for an '
      'abstract base, the reason to EXEMPT).')
  listed = [*EXAMPLES, *EXEMPT]
  stale = [_Name(c) for c in listed if c not in LAYER_CLASSES]
  assert not stale, f'EXAMPLES or EXEMPT list classes that lingvo_pipe lacks: {stale}.'
  assert not set(EXAMPLES) & set(EXEMPT)
  for cls, examples in EXAMPLES.items():
    assert examples and all(e.params.cls is cls for e in examples), _Name(cls)


def test_a_class_without_an_example_is_named_with_where_to_add_it(monkeypatch):
  monkeypatch.delitem(EXAMPLES, linear.ProjectionLayer)
  with pytest.raises(AssertionError, match=r'linear\.ProjectionLayer(.|\n)*layer_examples\.py'):
    test_every_layer_class_has_an_example_or_an_exemption()


@pytest.mark.parametrize('example', _Cases())
def test_builds_with_its_params_and_variables_under_its_path(example):
  layer = example.params.Instantiate()
  assert type(layer) is example.params.cls
  assert layer.params.name == example.params.name and layer.params.IsFrozen()
  outside = [v.name for v in layer.variables if not v.name.startswith(layer.path + '/')]
  assert not outside, outside


@pytest.mark.parametrize('is_eval', [True, False], ids=['eval', 'train'])
@pytest.mark.parametrize('example', _Cases(meta=True))
def test_fprop_meta_predicts_the_output_shapes(example, is_eval):
  p = example.params
  shapes = tf.nest.map_structure(lambda spec: tf.TensorShape(spec.shape), example.inputs)
  predicted = p.cls.FPropMeta(p, *shapes).out_shapes
  layer = p.Instantiate()
  with eval_mode.EvalMode(is_eval):
    outputs = containers.AsTuple(layer.FProp(layer.theta, *_Tensors(example.inputs)))
  tf.nest.assert_same_structure(predicted, outputs)
  assert [tf.TensorShape(s) for s in tf.nest.flatten(predicted)] == [
      y.shape for y in tf.nest.flatten(outputs)]


@pytest.mark.parametrize('example', _Cases())
def test_params_text_round_trip(example):
  p = example.params
  assert p.cls.Params().FromText(p.ToText()) == p


@pytest.mark.parametrize('example', _Cases())
def test_checkpoint_restores_into_a_second_instance(example, tmp_path):
  p = example.params
  saved = p.Instantiate()
  for i, v in enumerate(saved.variables):  # away from the initial values
    v.assign(v * tf.random.stateless_uniform(v.shape, [i, 0], 0.5, 1.5, v.dtype) +
             tf.random.stateless_uniform(v.shape, [i, 1], -0.1, 0.1, v.dtype))
  path = tf.train.Checkpoint(layer=saved).write(str(tmp_path / 'ckpt'))
  restored = p.Instantiate()
  initial = _Values(restored)
  tf.train.Checkpoint(layer=restored).read(path).assert_consumed()
  want, got = _Values(saved), _Values(restored)
  assert sorted(got) == sorted(want)
  for name, value in want.items():
    assert not np.array_equal(initial[name], value), name
    np.testing.assert_array_equal(got[name], value, err_msg=name)
  inputs = _Tensors(example.inputs)
  with eval_mode.EvalMode():
    expected = saved.FProp(saved.theta, *inputs)
    actual = restored.FProp(restored.theta, *inputs)
  tf.nest.assert_same_structure(actual, expected)
  for a, e in zip(tf.nest.flatten(actual), tf.nest.flatten(expected)):
    np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=1e-6)
