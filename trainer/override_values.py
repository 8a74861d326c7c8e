"""Override values as users type them, read by the type of the param's value.

`trainer.optimizer=sgd`, `remat=PER_LAYER`, `fprop_dtype=bfloat16` and
`remat_last_micro_batch=true` mean what they say: an enum param takes a
member name in any case (or its value), a dtype param a dtype name, a bool
true/false (yes/no, on/off, 1/0); the Params text forms (`enum('pkg.Kind',
'SGD')`, `dtype('bfloat16')`, `True`) are still accepted. A value that fits
none of them is refused with the values the param accepts.
"""

import enum
from typing import Any, List, Optional

import tensorflow as tf

from lingvo_pipe.core import params_text

# Dtype names a refusal suggests (tf.as_dtype accepts every dtype name).
COMMON_DTYPES = ('float32', 'bfloat16', 'float16', 'float64', 'int32', 'int64')
_TRUE = frozenset({'true', 'yes', 'on', '1'})
_FALSE = frozenset({'false', 'no', 'off', '0'})
# Text forms that are already Params text, passed through unchanged.
_LONG_FORMS = ('enum(', 'dtype(', 'cls(', 'params(', 'float(')


class OverrideValueError(ValueError):
  """A value the param cannot take; the message lists what it accepts."""


def _IsDtypeParam(key: str, current: Any) -> bool:
  """A dtype param: its value is a dtype, or None in a slot named *dtype
  (fprop_dtype=None means 'the variables' dtype')."""
  return isinstance(current, tf.DType) or (
      current is None and key.rsplit('.', 1)[-1].endswith('dtype'))


def _Bare(value_text: str) -> Optional[str]:
  """The word of a bare or quoted single word ('sgd', "'sgd'"), else None."""
  text = value_text.strip()
  if len(text) >= 2 and text[0] == text[-1] and text[0] in '\'"':
    text = text[1:-1]
  return text if text.replace('_', '').replace('-', '').isalnum() else None


def TypedText(key: str, current: Any, value_text: str) -> str:
  """The Params text form of value_text for a param whose value is current.

  Args:
    key: the dotted key (for messages and dtype slots).
    current: the param's value before the override (the experiment's).
    value_text: what the user typed after '='.

  Raises:
    OverrideValueError: for a word that is no member, dtype or bool, naming
      the accepted values.
  """
  if value_text.strip().startswith(_LONG_FORMS):
    return value_text
  word = _Bare(value_text)
  if isinstance(current, enum.Enum) and word is not None:
    return _EnumText(key, type(current), word)
  if _IsDtypeParam(key, current) and word is not None:
    if word.lower() == 'none':
      return 'None'
    try:
      return params_text.Encode(tf.as_dtype(word.lower()))
    except TypeError:
      raise OverrideValueError(
          f'{key} takes a dtype: one of {", ".join(COMMON_DTYPES)} (or any '
          f"TensorFlow dtype name, or dtype('...')), not {value_text!r}.") from None
  if isinstance(current, bool) and word is not None:
    if word.lower() in _TRUE:
      return 'True'
    if word.lower() in _FALSE:
      return 'False'
    raise OverrideValueError(f'{key} takes true or false (also yes/no, on/off, '
                             f'1/0, any case), not {value_text!r}.')
  return value_text


def _EnumText(key: str, kind: type, word: str) -> str:
  """The text form of the member of enum `kind` whose name (any case) or
  value is word."""
  members: List[enum.Enum] = list(kind)  # type: ignore[call-overload]
  for member in members:
    if word.upper() == member.name.upper() or word == str(member.value):
      return params_text.Encode(member)
  names = ', '.join(m.name for m in members)
  raise OverrideValueError(
      f'{key} takes one of {names} (any case) or '
      f"enum('{kind.__module__}.{kind.__qualname__}', 'NAME'), not {word!r}.")


def KindName(current: Any) -> str:
  """'an int', 'a float', 'a bool (true/false)', ... for a type refusal."""
  if isinstance(current, bool):
    return 'a bool (true/false)'
  if isinstance(current, int):
    return 'an int'
  if isinstance(current, float):
    return 'a number'
  if isinstance(current, str):
    return 'a string'
  if isinstance(current, (list, tuple)):
    return 'a list, e.g. [1, 2]'
  if isinstance(current, tf.DType):
    return f'a dtype ({", ".join(COMMON_DTYPES)})'
  if isinstance(current, enum.Enum):
    return 'one of ' + ', '.join(m.name for m in type(current))
  return f'a value of type {type(current).__name__}'
