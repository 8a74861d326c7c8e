"""Tests NestedMap: attribute access, key checks, structure ops and tf.nest."""

import collections
import copy
import pickle

import pytest
import tensorflow as tf

from lingvo_pipe.core.nested_map import NestedMap

_Pair = collections.namedtuple('_Pair', ['first', 'second'])


def _Tree():
  """b before a on purpose: flattening sorts keys."""
  return NestedMap(
      b=NestedMap(y=2, x=1),
      a=[3, NestedMap(z=4), (5, 6)],
      c=_Pair(7, {'inner': 8}),
      d=None)


def test_attribute_access():
  m = NestedMap(a=1)
  m.b = 2
  m['c'] = 3
  assert (m.a, m['b'], m.c) == (1, 2, 3)
  del m.a
  assert dict(m) == {'b': 2, 'c': 3}
  with pytest.raises(AttributeError, match=r"NestedMap has no key 'a'; keys: "
                     r"\['b', 'c'\]"):
    _ = m.a
  with pytest.raises(AttributeError, match=r"NestedMap has no key 'a'"):
    del m.a
  assert 'b' in dir(m)


@pytest.mark.parametrize('key', ['1a', 'a-b', 'a.b', '', 3, None, ('a',)])
def test_invalid_identifiers_rejected(key):
  with pytest.raises(ValueError, match=r'is not a valid identifier'):
    NestedMap({key: 1})
  m = NestedMap()
  with pytest.raises(ValueError, match=r'is not a valid identifier'):
    m[key] = 1


@pytest.mark.parametrize('key', ['items', 'keys', 'get', 'pop', 'update',
                                 'copy', 'values', '__class__', 'Flatten',
                                 'Pack', 'Transform', 'Filter', 'GetItem',
                                 'DeepCopy', 'IsCompatible', 'FlattenItems'])
def test_attribute_names_rejected(key):
  with pytest.raises(ValueError, match=rf"NestedMap key '{key}' is reserved"):
    NestedMap({key: 1})
  m = NestedMap()
  with pytest.raises(ValueError, match=r'is reserved'):
    setattr(m, key, 1)


def test_every_way_of_adding_keys_is_checked():
  m = NestedMap()
  adders = [
      lambda: NestedMap(**{'1a': 1}),
      lambda: m.update({'1a': 1}),
      lambda: m.update([('1a', 1)]),
      lambda: m.update(items=1),
      lambda: m.setdefault('1a', 1),
  ]
  for add in adders:
    with pytest.raises(ValueError):
      add()
  assert not m
  m.update({'a': 1}, b=2)
  assert m.setdefault('a', 5) == 1 and m.setdefault('c', 3) == 3
  assert m == {'a': 1, 'b': 2, 'c': 3}


def test_flatten_items_sorted_and_matches_tf_nest():
  m = _Tree()
  assert m.FlattenItems() == [
      ('a.0', 3), ('a.1.z', 4), ('a.2.0', 5), ('a.2.1', 6), ('b.x', 1),
      ('b.y', 2), ('c.0', 7), ('c.1.inner', 8), ('d', None)]
  assert m.Flatten() == [3, 4, 5, 6, 1, 2, 7, 8, None]
  assert m.Flatten() == tf.nest.flatten(m)


def test_pack_keeps_structure_and_types():
  m = _Tree()
  packed = m.Pack([f'v{i}' for i in range(9)])
  assert packed == NestedMap(
      a=['v0', NestedMap(z='v1'), ('v2', 'v3')], b=NestedMap(x='v4', y='v5'),
      c=_Pair('v6', {'inner': 'v7'}), d='v8')
  assert type(packed) is NestedMap and type(packed.b) is NestedMap
  assert type(packed.a) is list and type(packed.a[1]) is NestedMap
  assert type(packed.a[2]) is tuple and type(packed.c) is _Pair
  assert type(packed.c.second) is dict
  assert packed == tf.nest.pack_sequence_as(m, [f'v{i}' for i in range(9)])


def test_pack_wrong_count_raises():
  with pytest.raises(ValueError, match=r'Pack got 8 leaves for a structure of 9'):
    _Tree().Pack(list(range(8)))


def test_transform():
  m = _Tree()
  doubled = m.Transform(lambda v: None if v is None else 2 * v)
  assert doubled.Flatten() == [6, 8, 10, 12, 2, 4, 14, 16, None]
  assert doubled.IsCompatible(m)
  assert m.Flatten() == [3, 4, 5, 6, 1, 2, 7, 8, None]  # Unchanged.


def test_filter():
  m = _Tree()
  odd = m.Filter(lambda v: v is not None and v % 2 == 1)
  assert odd == NestedMap(a=[3, (5,)], b=NestedMap(x=1), c=(7,))
  assert type(odd) is NestedMap and type(odd.b) is NestedMap
  everything = m.Filter(lambda v: True)
  assert everything == m and type(everything.c) is _Pair
  assert m.Filter(lambda v: False) == NestedMap()


def test_get_item():
  m = _Tree()
  assert m.GetItem('b.x') == 1
  assert m.GetItem('a.1.z') == 4
  assert m.GetItem('a.2.1') == 6
  assert m.GetItem('c.1.inner') == 8
  with pytest.raises(KeyError):
    m.GetItem('b.w')
  with pytest.raises(IndexError):
    m.GetItem('a.7')


def test_deep_copy_copies_structure_and_shares_leaves():
  leaf, other = object(), object()
  m = NestedMap(x=NestedMap(y=leaf), z=[leaf])
  dup = m.DeepCopy()
  assert dup == m
  assert dup.x is not m.x and dup.z is not m.z
  dup.x.y = other
  dup.z.append(other)
  assert m.x.y is leaf and m.z == [leaf]
  assert dup.z[0] is leaf


def test_copy_is_shallow_and_stays_a_nested_map():
  m = _Tree()
  dup = m.copy()
  assert type(dup) is NestedMap and dup == m and dup.b is m.b


def test_is_compatible():
  m = _Tree()
  assert m.IsCompatible(m.Transform(str))
  assert not m.IsCompatible(NestedMap(b=NestedMap(x=1, y=2)))
  assert not NestedMap(a=1).IsCompatible(NestedMap(b=1))
  assert not NestedMap(a=1).IsCompatible(NestedMap(a=[1]))
  assert not NestedMap(a=[1, 2]).IsCompatible(NestedMap(a=[1]))


def test_tf_nest_keeps_the_nested_map_type():
  m = NestedMap(w=tf.ones([2]), sub=NestedMap(v=tf.zeros([3])), lst=[tf.ones([1])])
  out = tf.nest.map_structure(lambda t: t + 1, m)
  assert type(out) is NestedMap and type(out.sub) is NestedMap
  assert out.sub.v.numpy().tolist() == [1.0, 1.0, 1.0]
  assert out.w.numpy().tolist() == [2.0, 2.0]
  tf.nest.assert_same_structure(m, out)


def test_tf_function_returns_nested_map():

  @tf.function
  def Double(m):
    return tf.nest.map_structure(lambda t: 2 * t, m)

  out = Double(NestedMap(a=tf.constant(1.0), b=NestedMap(c=tf.constant(2.0))))
  assert type(out) is NestedMap and type(out.b) is NestedMap
  assert (float(out.a), float(out.b.c)) == (2.0, 4.0)


def test_copy_module_and_pickle_keep_type_and_checks():
  m = _Tree()
  for dup in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
    assert dup == m and type(dup) is NestedMap and type(dup.b) is NestedMap
    with pytest.raises(ValueError):
      dup['1a'] = 1
