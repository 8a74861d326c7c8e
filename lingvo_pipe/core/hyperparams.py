"""Hierarchical hyper-parameters: `Params` and `InstantiableParams` (Lingvo's API)."""

from __future__ import annotations

import copy
import difflib
import enum
import re
from typing import Any, Iterator, List, Optional, Tuple

import tensorflow as tf

from lingvo_pipe.core import params_text

_NAME_RE = re.compile(r'^[a-z_][a-z0-9_]*$')


class _Param:
  """One defined parameter: its value, default and description."""

  def __init__(self, name: str, default: Any, description: str):
    self.name = name
    self.default = default
    self.value = default
    self.description = description

  def __deepcopy__(self, memo):
    dup = _Param(self.name, copy.deepcopy(self.default, memo), self.description)
    dup.value = copy.deepcopy(self.value, memo)
    return dup


def _TypeName(t: type) -> str:
  return t.__name__


def _CheckType(key: str, default: Any, value: Any) -> None:
  """Raises TypeError if `value` does not fit the type of `default`."""
  if default is None or value is None:
    return
  if isinstance(default, Params):
    ok = isinstance(value, Params)
  elif isinstance(default, type):
    ok = isinstance(value, type)
  elif isinstance(default, bool):
    ok = isinstance(value, bool)
  elif isinstance(default, int):
    ok = isinstance(value, int) and not isinstance(value, bool)
  elif isinstance(default, float):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
  elif isinstance(default, (list, tuple)):
    ok = isinstance(value, (list, tuple))
  elif isinstance(default, tf.DType):
    ok = isinstance(value, tf.DType)
  else:
    ok = isinstance(value, type(default))
  if not ok:
    members = ''
    if isinstance(default, enum.Enum):
      kind = type(default).__name__
      members = f' Its values: {", ".join(f"{kind}.{m.name}" for m in type(default))}.'
    raise TypeError(
        f'Param {key!r} expects a value of type {_TypeName(type(default))} '
        f'(default {default!r}) but was given {value!r} of type '
        f'{_TypeName(type(value))}.{members}')


class Params:
  """An ordered, typed, freezable set of named parameters.

  Parameters are declared with `Define(name, default, description)` and then
  read and written as attributes or with `Set`/`Get`, which accept dotted keys
  into nested `Params`.
  """

  def __init__(self) -> None:
    self.__dict__['_params'] = {}
    self.__dict__['_frozen'] = False

  # --- definition ---------------------------------------------------------

  def Define(self, name: str, default: Any, description: str) -> None:
    """Declares a new parameter `name` with a default and a description.

    Raises:
      ValueError: if the name is malformed or already defined.
      TypeError: if the params are frozen.
    """
    self._CheckMutable(name)
    if not isinstance(name, str) or not _NAME_RE.match(name):
      raise ValueError(
          f'Param name {name!r} is invalid: names must match '
          f'{_NAME_RE.pattern} (lower case, digits and underscores).')
    if name in self._params:
      raise ValueError(
          f'Param {name!r} is already defined (default '
          f'{self._params[name].default!r}); a subclass must not redefine an '
          f'inherited param: change its value with Set() instead.')
    self._params[name] = _Param(name, default, description)

  def Delete(self, *keys: str) -> 'Params':
    """Removes the given (possibly dotted) keys. Returns self."""
    for key in keys:
      owner, name = self._Resolve(key)
      owner._CheckMutable(key)
      del owner._params[name]
    return self

  # --- access -------------------------------------------------------------

  def __getattr__(self, name: str) -> Any:
    if name.startswith('__'):
      raise AttributeError(name)
    params = self.__dict__['_params']
    if name not in params:
      raise AttributeError(self._UnknownKeyMessage(name))
    return params[name].value

  def __setattr__(self, name: str, value: Any) -> None:
    self._CheckMutable(name)
    if name not in self._params:
      raise AttributeError(self._UnknownKeyMessage(name))
    _CheckType(name, self._params[name].default, value)
    self._params[name].value = value

  def __contains__(self, key: str) -> bool:
    try:
      self._Resolve(key)
    except AttributeError:
      return False
    return True

  def Get(self, key: str) -> Any:
    """Returns the value of a (possibly dotted) key such as 'encoder.dim'."""
    owner, name = self._Resolve(key)
    return getattr(owner, name)

  def Set(self, **kwargs: Any) -> 'Params':
    """Sets (possibly dotted) keys: `p.Set(dim=8, **{'enc.dim': 8})`."""
    for key, value in kwargs.items():
      owner, name = self._Resolve(key)
      try:
        setattr(owner, name, value)
      except TypeError as e:
        if owner is self:
          raise
        raise TypeError(f'{e} (full key {key!r})') from None
    return self

  def GetKeys(self) -> List[str]:
    """Returns the top-level keys, sorted."""
    return sorted(self._params)

  def IterParams(self) -> Iterator[Tuple[str, Any]]:
    """Yields (name, value) of the top-level params, in definition order."""
    for name, param in self._params.items():
      yield name, param.value

  def GetDescription(self, key: str) -> str:
    owner, name = self._Resolve(key)
    return owner._params[name].description

  # --- copy / freeze ------------------------------------------------------

  def Copy(self) -> 'Params':
    """Returns a deep, unfrozen copy."""
    dup = copy.deepcopy(self)
    dup._SetFrozen(False)
    return dup

  def Freeze(self) -> 'Params':
    """Makes these params (and nested ones) immutable. Returns self."""
    self._SetFrozen(True)
    return self

  def IsFrozen(self) -> bool:
    return self.__dict__['_frozen']

  def _SetFrozen(self, frozen: bool) -> None:
    self.__dict__['_frozen'] = frozen
    for _, value in self.IterParams():
      for nested in _NestedParams(value):
        nested._SetFrozen(frozen)

  def __deepcopy__(self, memo):
    dup = object.__new__(type(self))
    dup.__dict__.update(copy.deepcopy(self.__dict__, memo))
    return dup

  # --- text ---------------------------------------------------------------

  def ToText(self) -> str:
    """Returns 'key : value' lines; nested Params become dotted keys."""
    lines = []
    for key, value in self._FlatItems(''):
      lines.append(f'{key} : {params_text.Encode(value)}')
    return '\n'.join(lines) + '\n'

  def FromText(self, text: str) -> 'Params':
    """Sets the keys named in `text` (the format of ToText). Returns self.

    Every failure is a ParamsTextError (a ValueError) naming the line; an
    unknown key is also an AttributeError and a wrong type a TypeError.

    Raises:
      ParamsTextError: on a malformed line or value.
      ParamsTextKeyError: on an unknown key.
      ParamsTextTypeError: on a value of the wrong type, or frozen Params.
    """
    for lineno, line in enumerate(text.splitlines(), 1):
      line = line.strip()
      if not line or line.startswith('#'):
        continue
      key, sep, value_text = line.partition(':')
      if not sep:
        raise ParamsTextError(f'Line {lineno} of params text is not "key : value": '
                              f'{line!r}')
      where = f'Line {lineno} of params text ({line!r})'
      self.SetValueText(key.strip(), value_text.strip(), where=where)
    return self

  def SetValueText(self, key: str, value_text: str, where: str = '') -> 'Params':
    """Sets one (possibly dotted) key to the value `value_text` holds in the
    text format (e.g. "dtype('float32')"). Returns self.

    Raises:
      ParamsTextError: if the text is not a value; the message starts with
        `where` (default: the key).
      ParamsTextKeyError: on an unknown key.
      ParamsTextTypeError: on a value of the wrong type, or frozen Params.
    """
    where = where or f'Param {key!r}'
    if not key:
      raise ParamsTextError(f'{where}: the key is empty.')
    try:
      value = params_text.Decode(value_text, _ParamsFromText)
    except (ValueError, AttributeError, TypeError) as e:
      raise _TextError(e)(f'{where}: {e}') from None
    try:
      self.Set(**{key: value})
    except (ValueError, AttributeError, TypeError) as e:
      raise _TextError(e)(f'{where}: {e}') from None
    return self

  def _FlatItems(self, prefix: str) -> Iterator[Tuple[str, Any]]:
    """Yields the (dotted key, value) pairs of ToText.

    Nested Params become dotted keys only where fresh params hold Params of
    the same keys, so FromText can set them key by key; other Params (e.g. in
    a slot whose default is None) are written whole.
    """
    for name, param in self._params.items():
      if _HasSameKeys(param.default, param.value):
        yield from param.value._FlatItems(f'{prefix}{name}.')
      else:
        yield f'{prefix}{name}', param.value

  # --- comparisons and printing ------------------------------------------

  def __eq__(self, other: object) -> bool:
    if not isinstance(other, Params):
      return NotImplemented
    return (type(self) is type(other) and
            dict(self.IterParams()) == dict(other.IterParams()))

  def __ne__(self, other: object) -> bool:
    result = self.__eq__(other)
    return result if result is NotImplemented else not result

  __hash__ = None  # type: ignore[assignment]

  def __str__(self) -> str:
    return self._ToIndentedText(0)

  def __repr__(self) -> str:
    return str(self)

  def _ToIndentedText(self, indent: int) -> str:
    pad = '  ' * (indent + 1)
    lines = ['{']
    for name, value in self.IterParams():
      if isinstance(value, Params):
        lines.append(f'{pad}{name}: {value._ToIndentedText(indent + 1)}')
      else:
        lines.append(f'{pad}{name}: {params_text.Encode(value)}')
    lines.append('  ' * indent + '}')
    return '\n'.join(lines)

  # --- helpers -----------------------------------------------------------

  def _Resolve(self, key: str) -> Tuple['Params', str]:
    """Returns (owner params, last name) for a dotted key."""
    parts = key.split('.')
    owner = self
    for i, part in enumerate(parts[:-1]):
      value = getattr(owner, part)
      if not isinstance(value, Params):
        raise AttributeError(
            f'Key {key!r}: {".".join(parts[:i + 1])!r} is a '
            f'{type(value).__name__}, not nested Params, so it has no '
            f'{parts[i + 1]!r}.')
      owner = value
    if parts[-1] not in owner._params:
      raise AttributeError(owner._UnknownKeyMessage(parts[-1], full_key=key))
    return owner, parts[-1]

  def _UnknownKeyMessage(self, name: str, full_key: Optional[str] = None) -> str:
    keys = sorted(self.__dict__['_params'])
    close = difflib.get_close_matches(name, keys, n=3, cutoff=0.6)
    hint = f' Did you mean {" or ".join(repr(c) for c in close)}?' if close else ''
    what = f'{full_key!r}' if full_key and full_key != name else f'{name!r}'
    return f'Unknown param {what}.{hint} Defined keys: {", ".join(keys)}.'

  def _CheckMutable(self, name: str) -> None:
    if self.__dict__['_frozen']:
      raise TypeError(f'Params are frozen; cannot change {name!r}. '
                      'Use Copy() to get a mutable copy.')


def _HasSameKeys(default: Any, value: Any) -> bool:
  return (isinstance(default, Params) and type(value) is type(default) and
          value.GetKeys() == default.GetKeys())


def _NestedParams(value: Any) -> Iterator[Params]:
  """Yields the Params found in value (itself, or inside lists/dicts)."""
  if isinstance(value, Params):
    yield value
  elif isinstance(value, (list, tuple)):
    for v in value:
      yield from _NestedParams(v)
  elif isinstance(value, dict):
    for v in value.values():
      yield from _NestedParams(v)


class ParamsTextError(ValueError):
  """Params text (a params file, an override) that cannot be applied."""


class ParamsTextKeyError(ParamsTextError, AttributeError):
  """Params text naming a key the Params do not define."""


class ParamsTextTypeError(ParamsTextError, TypeError):
  """Params text giving a key a value of the wrong type."""


def _TextError(cause: Exception) -> type:
  """The ParamsTextError class matching the kind of `cause`."""
  if isinstance(cause, AttributeError):
    return ParamsTextKeyError
  if isinstance(cause, TypeError):
    return ParamsTextTypeError
  return ParamsTextError


class InstantiableParams(Params):
  """Params that know which class they build: `Instantiate()`."""

  def __init__(self, cls: Optional[type] = None) -> None:
    super().__init__()
    self.Define('cls', cls, 'The class that Instantiate() builds from these params.')

  def Instantiate(self, **kwargs: Any) -> Any:
    """Builds `self.cls(self, **kwargs)`."""
    if self.cls is None:
      raise ValueError('Cannot Instantiate(): params.cls is None; set it to the '
                       'class to build.')
    return self.cls(self, **kwargs)


def _ParamsFromText(cls_path: Optional[str], items: dict) -> Params:
  """Returns cls.Params() set from `items`, or (for no class or a class
  without Params()) Params that define the keys of `items`."""
  if cls_path is None:
    p = Params()
  else:
    cls = params_text.ImportClass(cls_path)
    if hasattr(cls, 'Params'):
      return cls.Params().Set(**items)
    p = InstantiableParams(cls)
  for key, value in items.items():
    p.Define(key, value, '')
  return p


__all__ = ['Params', 'InstantiableParams', 'ParamsTextError',
           'ParamsTextKeyError', 'ParamsTextTypeError']
