"""Checks a run's params before any work: sizes, steps and rates in range.

The trainer calls CheckRunParams after the overrides and before it writes
anything, so a bad value ends the run with one line naming the key, the
value and the fix, and nothing in the logdir is touched.
"""

import math
import re
from typing import Any, Iterator, List, Optional, Tuple

from lingvo_pipe.core import hyperparams

# Ranges by the last part of a key. Integers: sizes and counts >= 1;
# intervals, offsets and axes >= 0 (checked first: micro_batch_size=0 is
# 'auto', num_partitions=0 leaves K to splits or cell_tpl, which the
# PipeliningLayer checks are given).
_POSITIVE_INT = re.compile(
    r'^(.*batch_size|.*_dim|dim|.*_len|vocab_size|num_heads|num_.*layers|'
    r'num_micro_batches|num_classes|image_size|max_bytes|'
    r'eval_every|max_steps|steps_per_loop|eval_steps|max_checkpoints_to_keep|'
    r'num_synthetic)$')
_NON_NEGATIVE_INT = re.compile(
    r'^(save_interval_steps|warmup_steps|num_logical_devices|batch_dim|'
    r'micro_batch_size|num_partitions|max_decode_len|decode_steps|decode_interval_steps|'
    r'eval_interval_steps|top_k|loop_min_micro_batches)$')
_NON_NEGATIVE_FLOAT = re.compile(
    r'^(keep_checkpoint_every_n_hours|clip_gradient_norm_to_value)$')
_POSITIVE_FLOAT = re.compile(r'^(learning_rate)$')
_UNIT_INTERVAL = re.compile(r'^(momentum|label_smoothing)$')  # [0, 1)
_KEEP_PROB = re.compile(r'^(.*keep_prob)$')  # (0, 1]


class ParamRangeError(ValueError):
  """A param value out of its range; the message names key, value and fix."""


def _Leaves(params: hyperparams.Params, prefix: str) -> Iterator[Tuple[str, Any]]:
  """(dotted key, value) of every non-Params value, nested Params (also in
  lists, tuples and dicts) included."""
  for name, value in params.IterParams():
    yield from _Values(f'{prefix}{name}', value)


def _Values(key: str, value: Any) -> Iterator[Tuple[str, Any]]:
  if isinstance(value, hyperparams.Params):
    yield from _Leaves(value, key + '.')
  elif isinstance(value, (list, tuple)):
    for i, v in enumerate(value):
      yield from _Values(f'{key}[{i}]', v)
  elif isinstance(value, dict):
    for k, v in value.items():
      yield from _Values(f'{key}[{k!r}]', v)
  else:
    yield key, value


def _Problem(key: str, value: Any) -> str:
  """Why value is out of range for key ('' if it is fine)."""
  name = re.sub(r'\[.*\]$', '', key).rsplit('.', 1)[-1]
  is_int = isinstance(value, int) and not isinstance(value, bool)
  is_number = is_int or isinstance(value, float)
  if isinstance(value, float) and not math.isfinite(value) and (
      _POSITIVE_FLOAT.match(name) or _NON_NEGATIVE_FLOAT.match(name) or
      _UNIT_INTERVAL.match(name) or _KEEP_PROB.match(name)):
    return f'{key}={value} is not finite; give a finite number'
  if _NON_NEGATIVE_INT.match(name):
    return f'{key}={value} must be 0 or more' if is_int and value < 0 else ''
  if is_int and _POSITIVE_INT.match(name) and value < 1:
    return f'{key}={value} must be at least 1'
  if is_number and _NON_NEGATIVE_FLOAT.match(name) and value < 0:
    return f'{key}={value} must be 0 or more (0: off)'
  if is_number and _POSITIVE_FLOAT.match(name) and value <= 0:
    return f'{key}={value} must be more than 0'
  if is_number and _UNIT_INTERVAL.match(name) and not 0 <= value < 1:
    return f'{key}={value} must be in [0, 1)'
  if is_number and _KEEP_PROB.match(name) and not 0 < value <= 1:
    return f'{key}={value} must be in (0, 1]'
  return ''


def _KeyedProblems(params: hyperparams.Params) -> List[Tuple[str, str]]:
  """(key, sentence) of every out-of-range value of the params tree."""
  return [(k, p) for k, p in ((k, _Problem(k, v)) for k, v in _Leaves(params, '')) if p]


def RangeProblems(params: hyperparams.Params) -> List[str]:
  """Every out-of-range value of the params tree, one sentence each."""
  return [p for _, p in _KeyedProblems(params)]


def _ExperimentNote(key: str, value: Any, experiment: Optional[hyperparams.Params]) -> str:
  """' (the experiment's value: X)' when an override changed key's value."""
  if experiment is None:
    return ''
  original = dict(_Leaves(experiment, '')).get(key, value)
  if original is value or original == value:
    return " (the experiment's own value)"
  return f" (the experiment's value: {original!r})"


def CheckRunParams(params: hyperparams.Params, max_steps_flag: int,
                   experiment: Optional[hyperparams.Params] = None) -> None:
  """Raises ParamRangeError naming the first bad value and the fix.

  Args:
    params: the run's params (task, train, dev, test, trainer).
    max_steps_flag: the --max_steps flag (0: the experiment's max_steps).
    experiment: the same params before the overrides, to quote the
      experiment's value of the bad key (None: not quoted).
  """
  if max_steps_flag < 0:
    raise ParamRangeError(f'--max_steps={max_steps_flag} must be 0 (the '
                          "experiment's trainer.max_steps) or a positive step.")
  problems = _KeyedProblems(params)
  if problems:
    key, problem = problems[0]
    note = _ExperimentNote(key, dict(_Leaves(params, ''))[key], experiment)
    more = f' (and {len(problems) - 1} more)' if len(problems) > 1 else ''
    raise ParamRangeError(f'{problem}{note}{more}; fix it with '
                          '--model_params_override.')
