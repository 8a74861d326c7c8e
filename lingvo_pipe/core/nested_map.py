"""NestedMap: a dict with attribute access, the structure of theta and inputs."""

from __future__ import annotations

import re
from typing import Any, Callable, Iterator, List, Tuple

_KEY_RE = re.compile(r'^[A-Za-z_][A-Za-z0-9_]*$')


class NestedMap(dict):
  """A dict whose keys are identifiers, readable as attributes.

  Values may be NestedMaps, lists or tuples, so a NestedMap is a tree. It is a
  dict, so `tf.nest` treats it as a structure (keys in sorted order).
  """

  def __init__(self, *args: Any, **kwargs: Any) -> None:
    super().__init__(*args, **kwargs)
    for key in self:
      _CheckKey(key)

  def __setitem__(self, key: str, value: Any) -> None:
    _CheckKey(key)
    super().__setitem__(key, value)

  def update(self, *args: Any, **kwargs: Any) -> None:
    """dict.update that checks every key."""
    for key, value in dict(*args, **kwargs).items():
      self[key] = value

  def setdefault(self, key: str, default: Any = None) -> Any:
    """dict.setdefault that checks the key."""
    if key not in self:
      self[key] = default
    return self[key]

  def __getattr__(self, name: str) -> Any:
    try:
      return self[name]
    except KeyError:
      raise AttributeError(
          f'NestedMap has no key {name!r}; keys: {sorted(self.keys())}') from None

  def __setattr__(self, name: str, value: Any) -> None:
    self[name] = value

  def __delattr__(self, name: str) -> None:
    try:
      del self[name]
    except KeyError:
      raise AttributeError(f'NestedMap has no key {name!r}') from None

  def __dir__(self) -> List[str]:
    return list(self.keys()) + list(super().__dir__())

  def copy(self) -> 'NestedMap':
    """A shallow copy that stays a NestedMap."""
    return NestedMap(self)

  def DeepCopy(self) -> 'NestedMap':
    """Copies the structure; leaves are shared."""
    return self.Pack(self.Flatten())

  def FlattenItems(self) -> List[Tuple[str, Any]]:
    """Returns (dotted path, leaf) pairs in sorted-key order."""
    return list(_FlattenItems(self, ''))

  def Flatten(self) -> List[Any]:
    """Returns the leaves in sorted-key order (the order of tf.nest)."""
    return [v for _, v in self.FlattenItems()]

  def Pack(self, leaves: List[Any]) -> 'NestedMap':
    """Returns a NestedMap of this structure holding `leaves` in order.

    Raises:
      ValueError: if the number of leaves differs from this map's.
    """
    leaves = list(leaves)
    count = len(self.Flatten())
    if len(leaves) != count:
      raise ValueError(f'Pack got {len(leaves)} leaves for a structure of '
                       f'{count}.')
    it = iter(leaves)
    return _Pack(self, it)

  def Transform(self, fn: Callable[[Any], Any]) -> 'NestedMap':
    """Returns a NestedMap of the same structure with fn applied to leaves."""
    return self.Pack([fn(v) for v in self.Flatten()])

  def Filter(self, fn: Callable[[Any], bool]) -> 'NestedMap':
    """Returns the sub-tree of leaves for which fn(leaf) is true."""
    kept = _Filter(self, fn)
    return NestedMap() if kept is _DROPPED else kept

  def GetItem(self, dotted_key: str) -> Any:
    """Returns the value at 'a.b.c'."""
    value: Any = self
    for part in dotted_key.split('.'):
      value = value[int(part)] if isinstance(value, (list, tuple)) else value[part]
    return value

  def IsCompatible(self, other: 'NestedMap') -> bool:
    """True if both maps have the same structure (keys and nesting)."""
    return [k for k, _ in self.FlattenItems()] == [k for k, _ in other.FlattenItems()]


# Keys that would be shadowed by (or shadow) dict and NestedMap attributes.
_RESERVED = frozenset(dir(NestedMap))


def _CheckKey(key: Any) -> None:
  if not isinstance(key, str) or not _KEY_RE.match(key):
    raise ValueError(f'NestedMap key {key!r} is not a valid identifier.')
  if key in _RESERVED:
    raise ValueError(f'NestedMap key {key!r} is reserved (the name of a dict '
                     'or NestedMap attribute); choose another key.')


def _FlattenItems(value: Any, prefix: str) -> Iterator[Tuple[str, Any]]:
  if isinstance(value, dict):
    for key in sorted(value):
      yield from _FlattenItems(value[key], f'{prefix}{key}.')
  elif isinstance(value, (list, tuple)):
    for i, v in enumerate(value):
      yield from _FlattenItems(v, f'{prefix}{i}.')
  else:
    yield prefix[:-1], value


def _Pack(structure: Any, it: Iterator[Any]) -> Any:
  if isinstance(structure, dict):
    packed = NestedMap() if isinstance(structure, NestedMap) else {}
    for key in sorted(structure):
      packed[key] = _Pack(structure[key], it)
    return packed
  if isinstance(structure, (list, tuple)):
    return _Rebuild(structure, [_Pack(v, it) for v in structure])
  return next(it)


def _Rebuild(structure: Any, items: List[Any]) -> Any:
  """A list, tuple or namedtuple of the type of `structure` holding items."""
  if isinstance(structure, list):
    return items
  if hasattr(structure, '_fields'):
    return type(structure)(*items)
  return type(structure)(items)


# What _Filter returns for a sub-tree with nothing kept (None is a leaf value).
_DROPPED = object()


def _Filter(value: Any, fn: Callable[[Any], bool]) -> Any:
  """Returns the filtered sub-tree, or _DROPPED when nothing is kept."""
  if isinstance(value, dict):
    kept = NestedMap()
    for key in sorted(value):
      sub = _Filter(value[key], fn)
      if sub is not _DROPPED:
        kept[key] = sub
    return kept if kept else _DROPPED
  if isinstance(value, (list, tuple)):
    kept_list = [s for s in (_Filter(v, fn) for v in value) if s is not _DROPPED]
    if not kept_list:
      return _DROPPED
    if hasattr(value, '_fields') and len(kept_list) < len(value):
      return tuple(kept_list)  # A namedtuple missing fields is a plain tuple.
    return _Rebuild(value, kept_list)
  return value if fn(value) else _DROPPED
