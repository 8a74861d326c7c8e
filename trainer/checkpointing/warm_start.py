"""Warm start: part of a model loaded from other checkpoints by rules.

trainer.init_from_checkpoint_rules has the shape of Lingvo's
`train.init_from_checkpoint_rules`:

  {'/tmp/runs/small/checkpoints/ckpt-800': (
       [('stack/pipeline/(embedding/.*)', 'stack/pipeline/%s'),
        ('stack/pipeline/layer_([01])/(.*)', 'stack/pipeline/layer_%s/%s')],
       ['.*/b$'])}

For each checkpoint (a prefix, or a logdir or checkpoints directory: its
newest), each model variable path that `re.match`es a loading rule's regex
and no ignore regex is loaded from the checkpoint's variable named
`format % match.groups()` (the names `lingvo_pipe_checkpoint list` prints).
A variable matched by two rules, a source name missing from its checkpoint
or of another shape or dtype stops the run with one line before anything
is loaded. Optimizer slots and the global step start afresh. The trainer
applies the rules only when its logdir has no checkpoint yet.
"""

import os
import re
from typing import Any, Callable, Dict, List, Mapping, Tuple

import tensorflow as tf

from trainer.checkpointing import checkpoint_keys
from trainer.checkpointing import checkpoints

_SHOWN = 5


class WarmStartError(checkpoint_keys.CheckpointError):
  """The rules cannot be applied; one line naming the rule and the names."""


Rule = Tuple[str, str]


def CheckRules(rules: Any) -> Dict[str, Tuple[List[Rule], List[str]]]:
  """The rules in their canonical shape {path: ([(regex, format)], [ignore])}.

  A value may also be a bare list of (regex, format) pairs (no ignore rules).

  Raises:
    WarmStartError: for any other shape or a regex that does not compile.
  """
  example = ("{'/tmp/runs/a/checkpoints': ([('stack/(.*)', 'stack/%s')], [])}")
  if not isinstance(rules, dict):
    raise WarmStartError(f'trainer.init_from_checkpoint_rules must be a dict, got '
                         f'{rules!r}; e.g. {example}.')
  out = {}
  for path, value in rules.items():
    if isinstance(value, list):
      value = (value, [])
    ok = (isinstance(path, str) and path and isinstance(value, tuple) and
          len(value) == 2 and isinstance(value[0], (list, tuple)) and
          isinstance(value[1], (list, tuple)) and
          all(isinstance(r, (list, tuple)) and len(r) == 2 and
              all(isinstance(x, str) for x in r) for r in value[0]) and
          all(isinstance(x, str) for x in value[1]))
    if not ok:
      raise WarmStartError(
          f'trainer.init_from_checkpoint_rules[{path!r}] = {value!r} is not '
          '([(regex, format), ...], [ignore regex, ...]) with a checkpoint '
          f'path as key; e.g. {example}.')
    for regex in [r for r, _ in value[0]] + list(value[1]):
      try:
        re.compile(regex)
      except re.error as e:
        raise WarmStartError(f'trainer.init_from_checkpoint_rules[{path!r}]: regex '
                             f'{regex!r} does not compile ({e}); fix it.') from None
    out[path] = ([tuple(r) for r in value[0]], list(value[1]))
  return out


def ResolveCheckpoint(path: str) -> str:
  """The checkpoint prefix `path` names (checkpoints.Resolve).

  Raises:
    WarmStartError: if there is none.
  """
  prefix = checkpoints.Resolve(path)
  if prefix is None:
    raise WarmStartError(f'trainer.init_from_checkpoint_rules: no checkpoint at '
                         f'{path!r} (neither a prefix with a .index file nor a '
                         'directory holding one); fix the path.')
  return prefix


def Plan(variables: Mapping[str, tf.Variable], rules: Any
         ) -> List[Tuple[str, Rule, List[Tuple[str, str]]]]:
  """(checkpoint prefix, rule, [(model path, source key)]) per loading rule,
  checked against the checkpoints.

  Raises:
    WarmStartError: see the module docstring.
  """
  out = []
  matched_by: Dict[str, str] = {}
  for path, (load, ignore) in CheckRules(rules).items():
    prefix = ResolveCheckpoint(path)
    specs = checkpoint_keys.CheckpointSpecs(prefix)
    for regex, name_format in load:
      pairs = []
      for var_path, var in variables.items():
        match = re.match(regex, var_path)
        if not match or any(re.match(i, var_path) for i in ignore):
          continue
        where = f'rule ({regex!r}, {name_format!r}) of {path!r}'
        if var_path in matched_by:
          raise WarmStartError(f'trainer.init_from_checkpoint_rules: {var_path} '
                               f'matches both {matched_by[var_path]} and {where}; '
                               'make the regexes exclusive (or add an ignore rule).')
        matched_by[var_path] = where
        try:
          source = name_format % match.groups()
        except (TypeError, ValueError) as e:
          raise WarmStartError(f'trainer.init_from_checkpoint_rules: {where}: '
                               f'format {name_format!r} with groups {match.groups()} '
                               f'of {var_path}: {e}; use one %s per group.') from None
        key = checkpoint_keys.VariableKey(source)
        want = checkpoint_keys.Spec(tuple(var.shape.as_list()), var.dtype.base_dtype)
        if key not in specs:
          raise WarmStartError(
              f'Warm start: {where} maps {var_path} to {source}, which '
              f'{os.path.basename(prefix)} does not hold; list its names with '
              f'`lingvo_pipe_checkpoint list {prefix}` and fix the format.')
        if specs[key] != want:
          raise WarmStartError(
              f'Warm start: {where} maps {var_path} (model {want}) to {source} '
              f'(checkpoint {specs[key]}); the shapes or dtypes differ, so it '
              'cannot load: narrow the regex or add an ignore rule.')
        pairs.append((var_path, key))
      out.append((prefix, (regex, name_format), pairs))
  return out


def Apply(variables: Mapping[str, tf.Variable], rules: Any,
          log: Callable[[str], None]) -> None:
  """Loads the variables the rules select (all checked first: nothing is
  loaded if one fails); logs one line per rule and one for the variables
  left at their initial values.

  Raises:
    WarmStartError: see the module docstring.
  """
  plan = Plan(variables, rules)
  loaded = set()
  for prefix, (regex, name_format), pairs in plan:
    reader = tf.train.load_checkpoint(prefix)
    for var_path, key in pairs:
      variables[var_path].assign(reader.get_tensor(key))
      loaded.add(var_path)
    log(f'Warm start from {prefix}: rule ({regex!r}, {name_format!r}) loaded '
        f'{len(pairs)} variable(s).')
  rest = [p for p in variables if p not in loaded]
  shown = ', '.join(rest[:_SHOWN]) + (
      f' and {len(rest) - _SHOWN} more' if len(rest) > _SHOWN else '')
  log(f'Warm start: {len(loaded)} of {len(variables)} variables loaded; '
      f'{len(rest)} keep their initial values' + (f': {shown}.' if rest else '.'))
