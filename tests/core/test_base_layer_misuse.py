"""Tests BaseLayer misuse: what the constructor and later code may not do, and the errors that say so."""

import numpy as np
import pytest
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core import weights

from tests.core.affine_layer import Affine as _Affine


def _Duplicate(first, second):
  """A misuse that creates two things named 'x': 'var', 'child' or 'children'."""

  def Create(layer):
    for kind in (first, second):
      if kind == 'var':
        layer.CreateVariable('x', weights.WeightParams([1]))
      elif kind == 'child':
        layer.CreateChild('x', _Affine.Params())
      else:
        layer.CreateChildren('x', [_Affine.Params()])

  return Create


def _Twins(layer):
  twin = _Affine.Params().Set(name='ffn')
  layer.CreateChild('a', twin)
  layer.CreateChild('b', twin)


def _Variable(name):
  return lambda layer: layer.CreateVariable(name, weights.WeightParams([1]))


def _Hide(make_value):
  return lambda layer: setattr(layer, 'hidden', make_value())


def _SubLayer():
  return _Affine.Params().Set(name='sub').Instantiate()


MISUSES = {
    'hide_layer': _Hide(_SubLayer),
    'hide_variable': _Hide(lambda: tf.Variable(1.0)),
    'hide_list': _Hide(lambda: [1, _SubLayer()]),
    'bad_child_name': lambda layer: layer.CreateChild('not valid',
                                                      _Affine.Params()),
    'child_without_cls': lambda layer: layer.CreateChild(
        'child', weights.WeightInit.Xavier()),
    'numbered_children': lambda layer: layer.CreateChildren(
        'heads', {'0': _Affine.Params(), '1': _Affine.Params()}),
    'twins': _Twins,
}
for _first in ('var', 'child', 'children'):
  for _second in ('var', 'child', 'children'):
    MISUSES[f'dup_{_first}_{_second}'] = _Duplicate(_first, _second)
for _name in ('FProp', 'theta', 'params', 'items', 'step_seed'):
  MISUSES[f'var_{_name}'] = _Variable(_name)


class _Misuse(base_layer.BaseLayer):
  """Commits one misuse (a key of MISUSES) in its constructor."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('case', '', 'A key of MISUSES.')
    return p

  def __init__(self, params):
    super().__init__(params)
    MISUSES[self.params.case](self)

  def MakeLate(self, what):
    if what == 'CreateVariable':
      self.CreateVariable('late', weights.WeightParams([1]))
    else:
      self.CreateChild('late', _Affine.Params())


def _BuildMisuse(case):
  return _Misuse.Params().Set(name='top', case=case).Instantiate()


@pytest.mark.parametrize('case,error,message', [
    *[(f'hide_{what}', AttributeError,
       r"_Misuse 'top': attribute 'hidden' holds a layer or variable that was "
       r'not made with CreateChild/CreateChildren/CreateVariable')
      for what in ('layer', 'variable', 'list')],
    *[(f'dup_{first}_{second}', ValueError,
       r"'top' already has a child or variable named 'x'")
      for first in ('var', 'child', 'children')
      for second in ('var', 'child', 'children')],
    ('bad_child_name', ValueError,
     r"Name 'not valid' in 'top' must be an identifier"),
    ('child_without_cls', TypeError,
     r"Child 'child' of 'top' needs layer Params \(with cls\), got Params"),
])
def test_misuse_in_constructor_raises(case, error, message):
  with pytest.raises(error, match=message):
    _BuildMisuse(case)


@pytest.mark.parametrize('name', ['FProp', 'theta', 'params', 'items',
                                  'step_seed'])
def test_names_of_existing_attributes_raise_value_error(name):
  with pytest.raises(ValueError, match=rf"'{name}'"):
    _BuildMisuse(f'var_{name}')


def test_children_dict_keys_are_checked_at_construction():
  with pytest.raises(ValueError, match=r"'0'"):
    _BuildMisuse('numbered_children')


def test_siblings_from_same_named_params_get_distinct_weights():
  layer = _BuildMisuse('twins')
  assert layer.a.w.name != layer.b.w.name
  assert not np.array_equal(layer.a.w.numpy(), layer.b.w.numpy())


@pytest.mark.parametrize('what', ['CreateVariable', 'CreateChild'])
def test_create_after_constructor_raises(what):
  layer = _BuildMisuse('twins')
  with pytest.raises(RuntimeError, match=rf"{what}\('late'\) called on 'top' "
                     r'after its constructor finished'):
    layer.MakeLate(what)


def test_construction_ends_after_nested_constructors():
  # RepeatLayer.__init__ calls SequentialLayer.__init__: construction must
  # end only when the outermost constructor returns.
  layer = containers.RepeatLayer.Params().Set(
      name='rep', body=_Affine.Params().Set(input_dim=2, output_dim=2),
      repeat=2).Instantiate()
  assert len(layer.sub) == 2
  with pytest.raises(RuntimeError, match=r'after its constructor finished'):
    layer.CreateVariable('late', weights.WeightParams([1]))


class _NoInit(base_layer.BaseLayer):

  def FProp(self, theta, x):
    return x


def test_create_after_constructor_raises_without_own_init():
  layer = _NoInit.Params().Set(name='n').Instantiate()
  with pytest.raises(RuntimeError, match=r'after its constructor finished'):
    layer.CreateVariable('late', weights.WeightParams([1]))


def test_assigning_layer_after_construction_raises():
  layer = _Affine.Params().Set(name='aff').Instantiate()
  with pytest.raises(AttributeError, match=r'not made with CreateChild'):
    layer.extra = _SubLayer()
  layer.note = 'plain values are fine'
  assert layer.note == 'plain values are fine'


@pytest.mark.parametrize('name,message', [
    ('', r"Affine params\.name is empty; set it, e\.g\. p\.name = 'affine'"),
    ('my layer', r"Layer name 'my layer' must be a Python identifier"),
    ('a/b', r"Layer name 'a/b' must be a Python identifier"),
    ('1st', r"Layer name '1st' must be a Python identifier"),
])
def test_bad_layer_names_raise(name, message):
  with pytest.raises(ValueError, match=message):
    _Affine.Params().Set(name=name).Instantiate()


def test_non_params_argument_raises():
  with pytest.raises(TypeError, match=r'Affine takes Params, got dict'):
    _Affine({'name': 'x'})
