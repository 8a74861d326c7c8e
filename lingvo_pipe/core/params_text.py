"""The value grammar of the Params text format: encoding and safe decoding.

A value is a Python literal (None, bool, int, float, str, list, tuple, dict)
or one of these calls:

  dtype('float32')                       a tf.DType
  enum('pkg.mod.Policy', 'PER_CELL')     an enum member
  cls('pkg.mod.ClassName')               a class, by import path
  params('pkg.mod.Layer', {'dim': 8})    nested Params inside a list or dict
  float('inf'), float('nan')             non-finite floats

Decoding walks the syntax tree; nothing is evaluated.
"""

import ast
import enum
import math
from typing import Any, Callable, Dict, Iterator, Optional, Protocol, Tuple, runtime_checkable

import tensorflow as tf

from lingvo_pipe.core import import_path


@runtime_checkable
class ParamsLike(Protocol):
  """What the text form reads of a Params (hyperparams.Params)."""

  def IterParams(self) -> Iterator[Tuple[str, Any]]:
    ...


# Builds the Params of params('pkg.mod.Layer', {...}) from the class path
# (or None) and the decoded items.
MakeParams = Callable[[Optional[str], Dict[str, Any]], Any]


def Encode(value: Any) -> str:
  """Returns the text form of `value`.

  Raises:
    TypeError: for a value of a kind the format does not hold.
  """
  if value is None or isinstance(value, (bool, int, str)):
    return repr(value)
  if isinstance(value, float):
    return repr(value) if math.isfinite(value) else f"float('{value}')"
  if isinstance(value, tf.DType):
    return f"dtype('{value.name}')"
  if isinstance(value, enum.Enum):
    return f"enum('{import_path.ObjectPath(type(value))}', '{value.name}')"
  if isinstance(value, type):
    return f"cls('{import_path.ObjectPath(value)}')"
  if isinstance(value, ParamsLike):
    cls = dict(value.IterParams()).get('cls')
    cls_text = f"'{import_path.ObjectPath(cls)}'" if cls is not None else 'None'
    items = ', '.join(f'{k!r}: {Encode(v)}' for k, v in value.IterParams()
                      if k != 'cls')
    return f'params({cls_text}, {{{items}}})'
  if isinstance(value, list):
    return '[' + ', '.join(Encode(v) for v in value) + ']'
  if isinstance(value, tuple):
    inner = ', '.join(Encode(v) for v in value)
    return f'({inner},)' if len(value) == 1 else f'({inner})'
  if isinstance(value, dict):
    return '{' + ', '.join(f'{Encode(k)}: {Encode(v)}'
                           for k, v in value.items()) + '}'
  raise TypeError(f'Params text cannot hold {value!r} of type '
                  f'{type(value).__name__}; use a literal, a tf.DType, an enum '
                  'member, a class or Params.')


def Decode(text: str, make_params: MakeParams) -> Any:
  """Parses the text form of one value.

  Raises:
    ValueError: if the text is not a value of the grammar.
  """
  try:
    tree = ast.parse(text, mode='eval')
  except (SyntaxError, ValueError) as e:  # ValueError: e.g. a NUL, a huge int
    raise ValueError(f'cannot parse value {text!r}: {getattr(e, "msg", e)}') from None
  except (RecursionError, MemoryError):
    raise ValueError(f'cannot parse value {text[:40]!r}...: nested too deeply') from None
  try:
    return _Decode(tree.body, text, make_params)
  except RecursionError:
    raise ValueError(f'cannot decode value {text[:40]!r}...: nested too '
                     'deeply') from None
  except TypeError as e:  # e.g. a list as a dict key: unhashable
    raise ValueError(f'cannot decode value {text!r}: {e}') from None


def _Decode(node: ast.AST, text: str, make_params: MakeParams) -> Any:
  if isinstance(node, ast.Constant):
    return node.value
  if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
    operand = _Decode(node.operand, text, make_params)
    if isinstance(operand, (int, float)) and not isinstance(operand, bool):
      return -operand
  if isinstance(node, ast.List):
    return [_Decode(e, text, make_params) for e in node.elts]
  if isinstance(node, ast.Tuple):
    return tuple(_Decode(e, text, make_params) for e in node.elts)
  if isinstance(node, ast.Dict) and all(k is not None for k in node.keys):
    return {_Decode(k, text, make_params): _Decode(v, text, make_params)
            for k, v in zip(node.keys, node.values) if k is not None}
  if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and
      not node.keywords):
    args = [_Decode(a, text, make_params) for a in node.args]
    try:
      return _DecodeCall(node.func.id, args, make_params)
    except (TypeError, KeyError, AttributeError, ImportError) as e:
      raise ValueError(f'cannot decode {_Unparse(node)!r}: {e}') from None
  raise ValueError(f'unsupported value syntax in {text!r}: '
                   f'{_Unparse(node)!r}')


def _Unparse(node: ast.AST) -> str:
  """The source of node, or (nested too deeply to unparse) its start."""
  try:
    return ast.unparse(node)
  except RecursionError:
    return f'{type(node).__name__}(...)'


def ImportClass(path: str) -> type:
  """The class at import path `path` (its module imported).

  Raises:
    TypeError: if `path` names something other than a class (a function, a
      module's variable): the text names classes and enums only, so no text
      calls a function or reads a value of a module.
    ValueError, ImportError: if nothing is at `path`.
  """
  obj = import_path.ImportByPath(path)
  if not isinstance(obj, type):
    raise TypeError(f'{path} is a {type(obj).__name__}, not a class; the params '
                    'text names classes and enums only.')
  return obj


def _DecodeCall(fn: str, args: list, make_params: MakeParams) -> Any:
  """Builds the value of one call of the grammar, e.g. dtype('float32')."""
  if fn == 'dtype' and len(args) == 1:
    return tf.as_dtype(args[0])
  if fn == 'float' and len(args) == 1 and isinstance(args[0], str):
    return float(args[0])
  if fn == 'cls' and len(args) == 1:
    return ImportClass(args[0])
  if fn == 'enum' and len(args) == 2:
    enum_cls = ImportClass(args[0])
    if not issubclass(enum_cls, enum.Enum):
      raise TypeError(f'{args[0]} is a class but not an enum; enum() names an Enum class.')
    return enum_cls[args[1]]
  if fn == 'params' and len(args) == 2:
    return make_params(args[0], args[1])
  raise ValueError(f'unsupported call {fn}() with {len(args)} argument(s); '
                   'see the grammar in the params_text module docstring.')
