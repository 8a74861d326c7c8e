"""Tests the Params text format: every value kind round-trips, errors name lines."""

import enum
import math

import pytest
import tensorflow as tf

from lingvo_pipe.core import base_layer
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core.layers import containers
from lingvo_pipe.core.layers import transformer
from lingvo_pipe.core import params_text
from lingvo_pipe.core import weights


class _Mode(enum.Enum):
  TRAIN = 'train'
  EVAL = 'eval'


class _Outer:

  class Inner:
    """A nested class: its import path has a dotted qualname."""


class _Plain:
  """A class without Params(): text holds it as InstantiableParams(_Plain)."""


class _Proj(base_layer.BaseLayer):
  """A small test layer with a nested Params and an enum param."""

  @classmethod
  def Params(cls):
    p = super().Params()
    p.Define('dim', 4, 'Width.')
    p.Define('mode', _Mode.TRAIN, 'An enum.')
    p.Define('init', weights.WeightInit.Gaussian(0.5), 'Nested Params.')
    return p

  def __init__(self, params):
    super().__init__(params)
    self.CreateVariable('w', weights.WeightParams([self.params.dim] * 2))


STRINGS = [
    '', 'plain', "it's", 'say "hi"', 'both \' and "', 'a: b : c', 'x # not a comment',
    'line1\nline2', 'cr\rlf\r\n', 'tab\tend', 'back\\slash', 'unicode é ✓',
    'sep\u2028par\u2029', 'ctl\x1c\x1d\x1e\x85', '  padded  ', 'params(None, {})',
]


def _AllKinds():
  p = hyperparams.Params()
  p.Define('an_int', 0, '')
  p.Define('big_int', 0, '')
  p.Define('neg_int', 0, '')
  p.Define('a_float', 0.0, '')
  p.Define('tiny_float', 0.0, '')
  p.Define('neg_zero', 0.0, '')
  p.Define('pos_inf', 0.0, '')
  p.Define('neg_inf', 0.0, '')
  p.Define('a_bool', False, '')
  p.Define('a_none', 1, '')
  p.Define('a_list', [], '')
  p.Define('empty_tuple', (), '')
  p.Define('one_tuple', (), '')
  p.Define('a_tuple', (), '')
  p.Define('a_dict', {}, '')
  p.Define('a_dtype', tf.float32, '')
  p.Define('an_enum', _Mode.TRAIN, '')
  p.Define('lib_enum', weights.InitMethod.XAVIER, '')
  p.Define('a_class', None, '')
  p.Define('nested_class', None, '')
  p.Define('nested', weights.WeightInit.Xavier(), '')
  p.Define('params_list', [], '')
  p.Define('params_dict', {}, '')
  p.Define('plain_cls', None, '')
  for i in range(len(STRINGS)):
    p.Define(f'str_{i}', '', '')
  return p


def _AllKindsSet():
  p = _AllKinds()
  p.Set(an_int=7, big_int=2**70, neg_int=-3, a_float=0.1, tiny_float=-1.5e-300,
        neg_zero=-0.0, pos_inf=math.inf, neg_inf=-math.inf, a_bool=True,
        a_none=None, a_list=[1, 'two', [3.5, None], (4,)], empty_tuple=(),
        one_tuple=('x',), a_tuple=(1, (2, 3), []),
        a_dict={'k': [1, 2], 3: {'nested': True}}, a_dtype=tf.bfloat16,
        an_enum=_Mode.EVAL, lib_enum=weights.InitMethod.CONSTANT,
        a_class=containers.SequentialLayer, nested_class=_Outer.Inner,
        nested=weights.WeightInit.Gaussian(0.02),
        params_list=[weights.WeightInit.Uniform(2.0), _Proj.Params().Set(dim=9)],
        params_dict={'proj': _Proj.Params().Set(name='p', mode=_Mode.EVAL)},
        plain_cls=_PlainParams())
  p.Set(**{f'str_{i}': s for i, s in enumerate(STRINGS)})
  return p


def _PlainParams():
  p = hyperparams.InstantiableParams(_Plain)
  p.Define('size', 3, '')
  return p


def test_every_value_kind_round_trips():
  p = _AllKindsSet()
  text = p.ToText()
  q = _AllKinds().FromText(text)
  assert q == p
  assert q.ToText() == text
  # Types are kept, not only values.
  assert isinstance(q.an_int, int) and isinstance(q.a_float, float)
  assert isinstance(q.a_list[3], tuple) and isinstance(q.a_tuple[2], list)
  assert math.copysign(1.0, q.neg_zero) == -1.0
  assert q.a_dtype is tf.bfloat16 and q.an_enum is _Mode.EVAL
  assert q.a_class is containers.SequentialLayer
  assert q.nested_class is _Outer.Inner
  assert type(q.plain_cls) is hyperparams.InstantiableParams
  assert q.plain_cls.cls is _Plain and q.plain_cls.size == 3
  assert [q.Get(f'str_{i}') for i in range(len(STRINGS))] == STRINGS


def test_to_text_is_one_line_per_key():
  p = _AllKindsSet()
  lines = p.ToText().splitlines()
  keys = [line.split(' : ', 1)[0] for line in lines]
  assert len(lines) == len(keys) == len(set(keys))
  assert 'nested.method' in keys and 'nested.scale' in keys
  assert "a_dtype : dtype('bfloat16')" in lines
  assert "an_enum : enum('tests.core.test_params_text._Mode', 'EVAL')" in lines
  assert ("a_class : cls('lingvo_pipe.core.layers.containers.SequentialLayer')"
          in lines)
  assert "pos_inf : float('inf')" in lines
  assert "neg_inf : float('-inf')" in lines


def test_nan_round_trips():
  p = hyperparams.Params()
  p.Define('x', 0.0, '')
  p.x = math.nan
  assert p.ToText() == "x : float('nan')\n"
  q = hyperparams.Params()
  q.Define('x', 0.0, '')
  assert math.isnan(q.FromText(p.ToText()).x)


def test_from_text_sets_only_named_keys_and_skips_comments():
  p = _AllKinds()
  p.FromText('\n# a comment\n  an_int :  5  \n\nnested.scale : 3.0\n')
  expected = _AllKinds().Set(an_int=5, **{'nested.scale': 3.0})
  assert p == expected


def test_nested_params_in_a_none_default_slot_round_trip():
  p = containers.ResidualLayer.Params().Set(name='res')
  p.body = _Proj.Params().Set(name='proj', dim=3)
  q = containers.ResidualLayer.Params().FromText(p.ToText())
  assert q == p
  assert q.body.init.scale == 0.5


def test_nested_params_of_other_keys_round_trip():
  p = hyperparams.Params()
  p.Define('body', _Proj.Params(), '')
  p.body = containers.SequentialLayer.Params().Set(name='seq')
  q = hyperparams.Params()
  q.Define('body', _Proj.Params(), '')
  assert q.FromText(p.ToText()) == p


def _Stack():
  """A transformer-stack-like tree: Sequential of Repeat/Residual/Sequential."""
  block = containers.SequentialLayer.Params().Set(name='block', sub=[
      _Proj.Params().Set(name='ln', dim=8, mode=_Mode.EVAL),
      containers.ResidualLayer.Params().Set(
          name='ffn', body=_Proj.Params().Set(name='inner', dim=16)),
  ])
  repeat = containers.RepeatLayer.Params().Set(name='layers', body=block,
                                               repeat=3)
  return containers.SequentialLayer.Params().Set(
      name='stack', random_seed=11, dtype=tf.float64,
      params_init=weights.WeightInit.Uniform(0.1),
      sub=[_Proj.Params().Set(name='emb'), repeat,
           containers.ResidualLayer.Params().Set(
               name='out', body=_Proj.Params().Set(name='head'))])


def test_nested_stack_round_trips():
  p = _Stack()
  text = p.ToText()
  q = containers.SequentialLayer.Params().FromText(text)
  assert q == p
  assert q.sub[1].body.sub[1].body.dim == 16
  assert q.sub[1].body.sub[0].mode is _Mode.EVAL
  assert q.sub[1].cls is containers.RepeatLayer
  assert q.ToText() == text


def test_round_tripped_stack_builds_the_same_model():
  p = _Stack()
  q = containers.SequentialLayer.Params().FromText(p.ToText())
  a, b = p.Instantiate(), q.Instantiate()
  a_vars = a.vars.FlattenItems()
  b_vars = b.vars.FlattenItems()
  assert [k for k, _ in a_vars] == [k for k, _ in b_vars]
  assert len(a_vars) == 1 + 3 * 2 + 1  # emb, 3 x (ln, ffn.inner), out.head
  for (_, va), (_, vb) in zip(a_vars, b_vars):
    assert va.name == vb.name and va.dtype == tf.float64
    assert (va.numpy() == vb.numpy()).all()


def _TransformerStack():
  layer = transformer.TransformerEncoderLayer.Params().Set(
      input_dim=8, num_heads=2, atten_hidden_dim=8, hidden_dim=16,
      residual_keep_prob=0.9, causal=True)
  return containers.SequentialLayer.Params().Set(
      name='encoder', random_seed=3,
      sub=[layer.Copy().Set(name=f'layer_{i}', ln_epsilon=eps)
           for i, eps in enumerate([1e-5, 2e-5, 3e-5])])


def test_transformer_stack_round_trips():
  p = _TransformerStack()
  text = p.ToText()
  q = containers.SequentialLayer.Params().FromText(text)
  assert q == p
  assert [s.ln_epsilon for s in q.sub] == [1e-5, 2e-5, 3e-5]
  assert q.sub[2].activation is p.sub[2].activation
  assert all(s.causal for s in q.sub)
  assert q.ToText() == text
  a, b = p.Instantiate(), q.Instantiate()
  for (ka, va), (kb, vb) in zip(a.vars.FlattenItems(), b.vars.FlattenItems()):
    assert ka == kb and va.name == vb.name
    assert (va.numpy() == vb.numpy()).all()


@pytest.mark.parametrize('text,message', [
    ('an_int 5', r'Line 2 of params text is not "key : value": \'an_int 5\''),
    ('an_int : 5 6', r"Line 2 of params text \('an_int : 5 6'\): cannot parse "
     r'value'),
    ('an_int : [1,', r'Line 2 .*cannot parse value'),
    ("an_int : __import__('os')", r'Line 2 .*unsupported call __import__\(\)'),
    ('an_int : x.y', r'Line 2 .*unsupported value syntax'),
    ('an_int : 1 + 2', r'Line 2 .*unsupported value syntax'),
    ("an_int : -'a'", r'Line 2 .*unsupported value syntax'),
    ("a_dtype : dtype('float33')", r'Line 2 .*cannot decode "dtype\(\'float33'),
    ("an_enum : enum('tests.core.test_params_text._Mode', 'TEST')",
     r"Line 2 .*cannot decode .*'TEST'"),
    ("a_class : cls('lingvo_pipe.no_such.Thing')",
     r"Line 2 .*Cannot import 'lingvo_pipe\.no_such\.Thing'"),
    ("a_class : cls(3)", r'Line 2 .*cannot decode'),
    # The text names classes and enums only: no function to call, no
    # module variable to read (docs/security.md).
    ("a_class : cls('os.system')",
     r"Line 2 .*os\.system is a builtin_function_or_method, not a class"),
    ("an_enum : enum('os.environ', 'HOME')", r'Line 2 .*os\.environ is a _Environ, not a class'),
    ("an_enum : enum('lingvo_pipe.core.layers.containers.SequentialLayer', 'X')",
     r'Line 2 .*SequentialLayer is a class but not an enum'),
    ("params_list : [params('os.system', {})]", r'Line 2 .*os\.system is a .*, not a class'),
    ("params_list : [params(None, 3)]", r'Line 2 .*cannot decode'),
    ("params_list : [params('lingvo_pipe.core.layers.containers.ResidualLayer',"
     " {'bodyy': None})]", r"Line 2 .*Unknown param 'bodyy'"),
])
def test_from_text_value_errors_name_the_line(text, message):
  with pytest.raises(ValueError, match=message):
    _AllKinds().FromText('an_int : 1\n' + text)


def test_from_text_unknown_key_names_the_line():
  with pytest.raises(AttributeError, match=r"Line 3 of params text "
                     r"\('nested\.scal : 1\.0'\): Unknown param 'nested\.scal'\. "
                     r"Did you mean 'scale'\?"):
    _AllKinds().FromText('an_int : 1\n\nnested.scal : 1.0\n')


def test_from_text_type_error_names_the_line():
  with pytest.raises(TypeError, match=r'Line 1 of params text \("an_int : \'x\'"\)'
                     r": Param 'an_int' expects a value of type int"):
    _AllKinds().FromText("an_int : 'x'")


def test_from_text_into_frozen_params_raises():
  with pytest.raises(TypeError, match=r'Line 1 .*Params are frozen'):
    _AllKinds().Freeze().FromText('an_int : 2')


def test_encode_rejects_unsupported_values():
  for value in ({1, 2}, b'bytes', object(), lambda x: x):
    with pytest.raises(TypeError, match=r'Params text cannot hold'):
      params_text.Encode(value)


def test_decode_does_not_evaluate():
  for text in ("__import__('os').system('true')", 'open("f")', '[x for x in y]',
               'lambda: 1', "getattr(1, 'real')"):
    with pytest.raises(ValueError):
      params_text.Decode(text, hyperparams._ParamsFromText)
