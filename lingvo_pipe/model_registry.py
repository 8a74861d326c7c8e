"""Registering experiment classes and finding them by key.

Keys are '<module under model_params>.<ClassName>' (class StdlibBytesGPipe in
model_params/lm.py is 'lm.StdlibBytesGPipe'); classes elsewhere are keyed by
their full module path. Any unique dotted suffix of a key finds it. Modules
under model_params/ are imported on demand.
"""

import difflib
import importlib
import pkgutil
from typing import Dict, List, Type

from lingvo_pipe import base_experiment

_PACKAGE = 'model_params'


def ExperimentKey(cls: type) -> str:
  module = cls.__module__
  prefix = _PACKAGE + '.'
  if module.startswith(prefix):
    module = module[len(prefix):]
  return f'{module}.{cls.__name__}'


class Registry:
  """A set of experiment classes by key."""

  def __init__(self) -> None:
    self._classes: Dict[str, type] = {}

  def Register(self, cls: Type[base_experiment.BaseExperiment]) -> type:
    """Registers cls; returns it (usable as a decorator).

    Raises:
      TypeError: if cls is not a BaseExperiment subclass.
      ValueError: if its key is taken by another class.
    """
    if not (isinstance(cls, type) and issubclass(cls, base_experiment.BaseExperiment)):
      raise TypeError(f'{cls!r} is not a subclass of BaseExperiment; only '
                      'experiment classes can be registered.')
    key = ExperimentKey(cls)
    other = self._classes.get(key)
    if other is not None and other is not cls:
      raise ValueError(f'Experiment key {key!r} is registered twice: '
                       f'{other.__module__}.{other.__qualname__} and '
                       f'{cls.__module__}.{cls.__qualname__}.')
    self._classes[key] = cls
    return cls

  def Keys(self) -> List[str]:
    return sorted(self._classes)

  def GetClass(self, key: str) -> type:
    """The class for a key or a unique dotted suffix of one.

    Raises:
      LookupError: for an unknown key (with suggestions) or an ambiguous one.
    """
    _ImportFor(key)
    matches = self._Matches(key)
    if not matches:  # a bare class name: its module is not known yet
      ImportAllExperiments()
      matches = self._Matches(key)
    if len(matches) == 1:
      return self._classes[matches[0]]
    if matches:
      raise LookupError(f'Experiment {key!r} is ambiguous: it matches '
                        f'{", ".join(sorted(matches))}; give more of the key.')
    keys = self.Keys()
    names = keys + [k.rsplit('.', 1)[-1] for k in keys]
    close = difflib.get_close_matches(key, names, n=3, cutoff=0.6)
    hint = f' Did you mean {" or ".join(repr(c) for c in close)}?' if close else ''
    raise LookupError(f'Unknown experiment {key!r}.{hint} Registered: '
                      f'{", ".join(keys) or "none"}.')

  def _Matches(self, key: str) -> List[str]:
    """Registered keys equal to key or ending in '.' + key."""
    if key in self._classes:
      return [key]
    return [k for k in self._classes if k.endswith('.' + key)]

  def GetExperiment(self, key: str) -> base_experiment.BaseExperiment:
    return self.GetClass(key)()


def _ImportFor(key: str) -> None:
  """Imports model_params/<first key component>.py if it exists."""
  first = key.split('.')[0]
  try:
    importlib.import_module(f'{_PACKAGE}.{first}')
  except ModuleNotFoundError as e:
    if e.name not in (_PACKAGE, f'{_PACKAGE}.{first}'):
      raise


def ImportAllExperiments() -> None:
  """Imports every module under model_params/ (so all are registered)."""
  package = importlib.import_module(_PACKAGE)
  for info in pkgutil.iter_modules(package.__path__):
    importlib.import_module(f'{_PACKAGE}.{info.name}')


_REGISTRY = Registry()
RegisterExperiment = _REGISTRY.Register
GetClass = _REGISTRY.GetClass
GetExperiment = _REGISTRY.GetExperiment
Keys = _REGISTRY.Keys
