"""Tests Params: definition, access, type checks, copy, freeze and Instantiate."""

import enum

import pytest
import tensorflow as tf

from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import import_path
from lingvo_pipe.pipeline import gpipe
from lingvo_pipe.pipeline import pipelined_model
from lingvo_pipe.tasks.lm import layers as lm_layers


class _Color(enum.Enum):
  RED = 1
  BLUE = 2


class _Built:
  """A class that Instantiate() builds: records its params and kwargs."""

  def __init__(self, params, **kwargs):
    self.params = params
    self.kwargs = kwargs


def _Encoder():
  p = hyperparams.Params()
  p.Define('dim', 4, 'Model dimension.')
  p.Define('dropout', 0.1, 'Dropout rate.')
  return p


def _Model():
  p = hyperparams.Params()
  p.Define('name', 'model', 'Name.')
  p.Define('num_layers', 2, 'Number of layers.')
  p.Define('encoder', _Encoder(), 'Encoder params.')
  p.Define('layers', [_Encoder(), _Encoder()], 'Params in a list.')
  p.Define('optional', None, 'Anything; None by default.')
  return p


def test_define_and_attribute_access():
  p = _Model()
  assert p.num_layers == 2
  assert p.encoder.dim == 4
  p.num_layers = 6
  p.encoder.dim = 8
  assert (p.num_layers, p.encoder.dim) == (6, 8)
  assert p.GetDescription('encoder.dim') == 'Model dimension.'


@pytest.mark.parametrize('name', ['Dim', '1dim', 'dim-x', 'a.b', '', 'dïm'])
def test_define_rejects_bad_names(name):
  with pytest.raises(ValueError, match=r'is invalid: names must match'):
    hyperparams.Params().Define(name, 1, '')


def test_define_accepts_lower_case_names():
  p = hyperparams.Params()
  for name in ('a', '_private', 'x_2', 'dim_3d'):
    p.Define(name, 1, '')
  assert p.GetKeys() == ['_private', 'a', 'dim_3d', 'x_2']


def test_redefinition_raises():
  p = _Model()
  with pytest.raises(ValueError, match=r"Param 'num_layers' is already defined "
                     r'\(default 2\).*Set\(\)'):
    p.Define('num_layers', 3, 'again')


def test_set_returns_self_and_accepts_dotted_keys():
  p = _Model()
  assert p.Set(num_layers=3, **{'encoder.dim': 8, 'encoder.dropout': 0.0}) is p
  assert (p.num_layers, p.encoder.dim, p.encoder.dropout) == (3, 8, 0.0)
  assert p.Get('encoder.dim') == 8
  assert p.Get('num_layers') == 3


def test_set_dotted_key_through_a_non_params_value_raises():
  p = _Model()
  with pytest.raises(AttributeError, match=r"Key 'num_layers.dim': 'num_layers' "
                     r"is a int, not nested Params, so it has no 'dim'"):
    p.Set(**{'num_layers.dim': 1})


def test_unknown_key_suggests_and_lists_keys():
  p = _Model()
  expected = (r"Unknown param 'num_layer'\. Did you mean 'num_layers' or "
              r"'layers'\? Defined keys: encoder, layers, name, num_layers, "
              r'optional\.')
  with pytest.raises(AttributeError, match=expected):
    _ = p.num_layer
  with pytest.raises(AttributeError, match=expected):
    p.num_layer = 3
  with pytest.raises(AttributeError, match=expected):
    p.Set(num_layer=3)
  with pytest.raises(AttributeError, match=expected):
    p.Get('num_layer')


def test_unknown_nested_key_names_the_full_key_and_nested_keys():
  p = _Model()
  with pytest.raises(AttributeError, match=r"Unknown param 'encoder\.dimm'\. "
                     r"Did you mean 'dim'\? Defined keys: dim, dropout\."):
    p.Set(**{'encoder.dimm': 3})


def test_unknown_key_without_close_match_has_no_suggestion():
  with pytest.raises(AttributeError) as e:
    _ = _Model().zzz
  assert 'Did you mean' not in str(e.value)
  assert 'Defined keys: encoder, layers, name, num_layers, optional.' in str(
      e.value)


def test_hasattr_and_contains():
  p = _Model()
  assert hasattr(p, 'encoder') and not hasattr(p, 'decoder')
  assert 'encoder.dim' in p
  assert 'encoder.width' not in p
  assert 'num_layers.dim' not in p


def test_delete():
  p = _Model()
  assert p.Delete('optional', 'encoder.dropout') is p
  assert p.GetKeys() == ['encoder', 'layers', 'name', 'num_layers']
  assert p.encoder.GetKeys() == ['dim']
  with pytest.raises(AttributeError, match=r"Unknown param 'optional'"):
    p.Delete('optional')


def test_get_keys_sorted_and_iter_params_in_definition_order():
  p = _Model()
  assert p.GetKeys() == ['encoder', 'layers', 'name', 'num_layers', 'optional']
  assert [k for k, _ in p.IterParams()] == [
      'name', 'num_layers', 'encoder', 'layers', 'optional']
  assert dict(p.IterParams())['num_layers'] == 2


def _Typed():
  p = hyperparams.Params()
  p.Define('count', 1, '')
  p.Define('rate', 0.5, '')
  p.Define('flag', False, '')
  p.Define('text', 'a', '')
  p.Define('items', [1], '')
  p.Define('dtype', tf.float32, '')
  p.Define('color', _Color.RED, '')
  p.Define('cls', _Built, '')
  p.Define('nested', _Encoder(), '')
  p.Define('anything', None, '')
  return p


@pytest.mark.parametrize('key,value,expected,given', [
    ('count', 2.5, 'int', 'float'),
    ('count', True, 'int', 'bool'),
    ('count', '3', 'int', 'str'),
    ('rate', 'high', 'float', 'str'),
    ('rate', False, 'float', 'bool'),
    ('flag', 1, 'bool', 'int'),
    ('text', 3, 'str', 'int'),
    ('items', 'ab', 'list', 'str'),
    ('dtype', 'float32', 'DType', 'str'),
    ('color', 1, '_Color', 'int'),
    ('cls', _Built(None), 'type', '_Built'),
    ('nested', {'dim': 1}, 'Params', 'dict'),
])
def test_set_type_mismatch_names_key_and_types(key, value, expected, given):
  p = _Typed()
  with pytest.raises(TypeError, match=rf"(?s)Param '{key}' expects a value of "
                     rf'type {expected} .* of type {given}\.'):
    p.Set(**{key: value})


def test_an_enum_mismatch_lists_the_enum_values():
  with pytest.raises(TypeError, match=r"given 'blue' of type str\. Its values: "
                     r'_Color\.RED, _Color\.BLUE\.$'):
    _Typed().Set(color='blue')


def test_set_accepts_compatible_types():
  p = _Typed()
  p.Set(rate=2, items=(1, 2), dtype=tf.bfloat16, color=_Color.BLUE,
        cls=hyperparams.Params, nested=None, anything='x')
  assert p.rate == 2 and isinstance(p.rate, int)
  assert p.items == (1, 2)
  assert p.dtype == tf.bfloat16
  assert p.color is _Color.BLUE
  p.anything = 3.5  # None default: no type check.
  p.anything = [1]
  p.nested = _Encoder().Set(dim=9)
  assert p.nested.dim == 9


def test_type_mismatch_on_dotted_key_names_the_full_key():
  p = _Model()
  with pytest.raises(TypeError, match=r"Param 'dim' expects a value of type int "
                     r".*of type str\. \(full key 'encoder\.dim'\)"):
    p.Set(**{'encoder.dim': 'wide'})


def test_copy_is_deep():
  p = _Model()
  q = p.Copy()
  q.encoder.dim = 16
  q.layers[0].dim = 32
  assert (q.encoder.dim, q.layers[0].dim) == (16, 32)
  assert p == _Model()


def test_copy_keeps_shared_nested_params_shared():
  p = _Model()
  shared = _Encoder()
  p.layers = [shared, shared]
  q = p.Copy()
  assert q.layers[0] is q.layers[1]
  assert q.layers[0] is not shared


def test_freeze_blocks_every_mutation():
  p = _Model().Freeze()
  assert p.IsFrozen() and p.encoder.IsFrozen() and p.layers[1].IsFrozen()
  mutations = [
      lambda: setattr(p, 'num_layers', 3),
      lambda: p.Set(num_layers=3),
      lambda: p.Set(**{'encoder.dim': 3}),
      lambda: setattr(p.encoder, 'dim', 3),
      lambda: setattr(p.layers[1], 'dim', 3),
      lambda: p.Define('extra', 1, ''),
      lambda: p.Delete('optional'),
      lambda: p.encoder.Define('extra', 1, ''),
  ]
  for mutate in mutations:
    with pytest.raises(TypeError, match=r'Params are frozen; cannot change .*'
                       r'Use Copy\(\)'):
      mutate()
  assert p == _Model()


def test_copy_of_frozen_is_mutable_and_original_stays_frozen():
  p = _Model().Freeze()
  q = p.Copy()
  assert not q.IsFrozen() and not q.encoder.IsFrozen()
  assert not q.layers[0].IsFrozen()
  q.Set(**{'encoder.dim': 5})
  assert q.encoder.dim == 5
  assert p.IsFrozen() and p.encoder.IsFrozen() and p.layers[0].IsFrozen()


def test_equality():
  assert _Model() == _Model()
  assert _Model() != _Model().Set(**{'encoder.dim': 5})
  changed_in_list = _Model()
  changed_in_list.layers[1].dim = 5
  assert _Model() != changed_in_list
  assert _Model() != hyperparams.InstantiableParams(None)
  assert _Model() != 'model'
  assert _Model().__eq__('model') is NotImplemented


def test_str_is_readable():
  p = _Model()
  p.encoder.dim = 8
  text = str(p)
  assert text.splitlines()[:5] == [
      '{',
      "  name: 'model'",
      '  num_layers: 2',
      '  encoder: {',
      '    dim: 8',
  ]
  assert text.splitlines()[-1] == '}'
  assert repr(p) == text


def test_instantiate_builds_cls_with_params_and_kwargs():
  p = hyperparams.InstantiableParams(_Built)
  p.Define('dim', 3, '')
  obj = p.Instantiate(extra=7)
  assert isinstance(obj, _Built)
  assert obj.params is p
  assert obj.kwargs == {'extra': 7}


def test_instantiate_without_cls_raises():
  with pytest.raises(ValueError, match=r'params\.cls is None'):
    hyperparams.InstantiableParams().Instantiate()


def test_import_by_path_and_object_path():
  path = import_path.ObjectPath(hyperparams.InstantiableParams)
  assert path == 'lingvo_pipe.core.hyperparams.InstantiableParams'
  assert import_path.ImportByPath(path) is hyperparams.InstantiableParams
  with pytest.raises(ValueError, match=r"Cannot import 'lingvo_pipe\.core\.nope"):
    import_path.ImportByPath('lingvo_pipe.core.nope.Thing')
  with pytest.raises(ValueError, match=r'Cannot import'):
    import_path.ImportByPath('lingvo_pipe.core.hyperparams.NoSuchClass')


def test_import_by_path_reads_modules_from_before_the_layout():
  assert (import_path.ImportByPath('lingvo_pipe.core.gpipe.PipeliningLayer')
          is gpipe.PipeliningLayer)
  assert (import_path.ImportByPath('lingvo_pipe.core.gpipe_stacks.GPipeTransformerStack')
          is lm_layers.GPipeTransformerStack)
  assert (import_path.ImportByPath('lingvo_pipe.core.gpipe_stacks.CarryLayer')
          is pipelined_model.CarryLayer)
  with pytest.raises(ValueError, match=r'lingvo_pipe\.core\.gpipe moved to '
                     r'lingvo_pipe\.pipeline\.gpipe, which do not define Nope'):
    import_path.ImportByPath('lingvo_pipe.core.gpipe.Nope')


def test_params_text_from_before_the_layout_loads():
  p = hyperparams.Params()
  p.Define('pipe', None, '')
  p.Define('policy', None, '')
  p.FromText("pipe : params('lingvo_pipe.core.gpipe.PipeliningLayer', "
             "{'num_micro_batches': 4})\n"
             "policy : enum('lingvo_pipe.core.cell_runner.RematPolicy', 'PER_LAYER')\n")
  assert p.pipe.cls is gpipe.PipeliningLayer
  assert p.pipe.num_micro_batches == 4
  assert p.policy is gpipe.RematPolicy.PER_LAYER
