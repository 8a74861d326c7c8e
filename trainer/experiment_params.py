"""One Params tree per run: an experiment's task, inputs and trainer settings,
with the command line's overrides applied."""

import re
from typing import Iterator, List

from lingvo_pipe import base_experiment
from lingvo_pipe.core import hyperparams
from lingvo_pipe.core import params_text
from trainer import override_values

# key=value, or Lingvo's key : value (its params text form).
_OVERRIDE = re.compile(r'^\s*([a-z_][a-z0-9_.]*)\s*[=:]\s*(.+?)\s*$', re.DOTALL)
_QUOTES = ('"', "'")


class UsageError(ValueError):
  """A mistake on the command line or in an override; printed as one line."""


def ExperimentParams(experiment: base_experiment.BaseExperiment) -> hyperparams.Params:
  """Params with children task, train, dev, test and trainer."""
  p = hyperparams.Params()
  p.Define('task', experiment.Task(), 'The model (a layer returning metrics).')
  p.Define('train', experiment.Train(), 'Training input.')
  p.Define('dev', experiment.Dev(), 'Eval input.')
  p.Define('test', experiment.Test(), 'Test input.')
  p.Define('trainer', experiment.Trainer(), 'Training settings.')
  return p


def SplitOverrides(overrides: str) -> Iterator[str]:
  """Yields the non-blank items of "a=1; b='x;y'": split at each ';' or
  newline (as Lingvo's overrides) outside quotes (a backslash escapes the
  next character inside quotes)."""
  item: List[str] = []
  quote, escaped = '', False
  for char in overrides:
    if escaped:
      escaped = False
    elif quote and char == '\\':
      escaped = True
    elif quote:
      quote = '' if char == quote else quote
    elif char in _QUOTES:
      quote = char
    elif char in ';\n':
      if ''.join(item).strip():
        yield ''.join(item)
      item = []
      continue
    item.append(char)
  if ''.join(item).strip():
    yield ''.join(item)


def ApplyOverrides(params: hyperparams.Params, overrides: str) -> None:
  """Applies "a.b=1; c.d='x'" (values in the Params text form), or
  Lingvo's "a.b : 1; c.d : 'x'".

  A value is read by the type of the param's current value: a string param
  also takes its value unquoted, as users type it (train.file_pattern=
  /data/*.txt; quoted text is read as a literal); an enum param a member
  name in any case, a dtype param a dtype name, a bool true or false
  (override_values.py).

  Giving a pipeline `splits` gives it its cells: the experiment's
  `num_partitions` beside them then steps aside (set to 0, "K from the
  splits") unless the same overrides set it too, so `pipeline.splits=[3]`
  alone works as the PipeliningLayer documents.

  Raises:
    UsageError: for a malformed item, an unknown key or a wrong type.
  """
  keys = []
  for item in SplitOverrides(overrides):
    match = _OVERRIDE.match(item)
    if not match:
      raise UsageError(f'Override {item.strip()!r} is not "key=value" or "key : value" '
                       "(e.g. trainer.max_steps=100; task.name='lm').")
    key, value_text = match.group(1), match.group(2)
    keys.append(key)
    try:
      current = params.Get(key)
    except AttributeError as e:
      raise UsageError(f'Override {item.strip()!r}: {e}') from None
    where = f'Override {item.strip()!r}'
    if isinstance(current, str) and not _ReadsAsString(value_text):
      value_text = repr(value_text)
    try:
      value_text = override_values.TypedText(key, current, value_text)
    except override_values.OverrideValueError as e:
      raise UsageError(f'{where}: {e}') from None
    try:
      params.SetValueText(key, value_text, where=where)
    except hyperparams.ParamsTextError as e:
      # A value of the wrong type, or text that is no value at all
      # ('eight' for an int): one form, naming what the param takes.
      wrong_type = isinstance(e, hyperparams.ParamsTextTypeError) or isinstance(
          current, (bool, int, float, list, tuple))
      if params.IsFrozen() or not wrong_type:
        raise UsageError(str(e)) from None
      raise UsageError(
          f'{where}: {key} takes {override_values.KindName(current)} (the '
          f"experiment's value: {params_text.Encode(current)}), not "
          f'{value_text}.') from None
  _LetSplitsDecideK(params, keys)


def ApplyParamsFile(params: hyperparams.Params, text: str, name: str) -> None:
  """Applies a params file (params.txt's "key : value" lines, '#' comments)
  as one --model_params_override of its lines, so a file takes every form
  an override takes (ZB_H1 for an enum param, bfloat16 for a dtype).

  Raises:
    UsageError: naming the file, for a malformed line, unknown key or wrong
      type.
  """
  lines = [l for l in text.splitlines() if not l.strip().startswith('#')]
  try:
    ApplyOverrides(params, '\n'.join(lines))
  except UsageError as e:
    raise UsageError(f'{name}: {e}') from None


def _LetSplitsDecideK(params: hyperparams.Params, keys: List[str]) -> None:
  """Sets num_partitions to 0 beside each overridden, non-empty splits whose
  num_partitions no override set."""
  for key in keys:
    parent, _, name = key.rpartition('.')
    sibling = f'{parent}.num_partitions' if parent else 'num_partitions'
    if name != 'splits' or sibling in keys or not params.Get(key):
      continue
    try:
      if params.Get(sibling):
        params.Set(**{sibling: 0})
    except AttributeError:
      continue  # a splits param of something other than a pipeline


def _ReadsAsString(value_text: str) -> bool:
  """Whether the text is a quoted string (or malformed quoted text, which
  then fails as such) rather than bare text meant as the string itself."""
  if value_text.startswith(_QUOTES):
    return True
  try:
    return isinstance(params_text.Decode(value_text, lambda *_: None), str)
  except (ValueError, TypeError, AttributeError):
    return False
