"""One Params tree per run: an experiment's task, inputs and trainer settings,
with the command line's overrides applied."""

import re

from lingvo_pipe import base_experiment
from lingvo_pipe.core import hyperparams

_OVERRIDE = re.compile(r'^\s*([a-z_][a-z0-9_.]*)\s*=\s*(.+?)\s*$')


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


def ApplyOverrides(params: hyperparams.Params, overrides: str) -> None:
  """Applies "a.b=1; c.d='x'" (values in the Params text form).

  Raises:
    UsageError: for a malformed item, an unknown key or a wrong type.
  """
  for item in filter(str.strip, overrides.split(';')):
    match = _OVERRIDE.match(item)
    if not match:
      raise UsageError(f'Override {item.strip()!r} is not "key=value" (e.g. '
                       "trainer.max_steps=100; task.name='lm').")
    try:
      params.FromText(f'{match.group(1)} : {match.group(2)}')
    except (AttributeError, TypeError, ValueError) as e:
      raise UsageError(f'Override {item.strip()!r}: {e}') from None
