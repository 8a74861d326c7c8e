"""Registers experiment classes and finds them by key or unique key suffix.

Key rule: '<module>.<ClassName>', where <module> is the class's module with
the experiments package prefix 'model_params.' removed. Class StdlibBytesGPipe
of module model_params.lm is 'lm.StdlibBytesGPipe'; a class of module
my_tests.exps (outside the package) is 'my_tests.exps.ClassName'.

Lookup: an exact key, or a dotted suffix of exactly one key ('StdlibBytesGPipe'
or 'lm.StdlibBytesGPipe'). Before an exact lookup the module the key names
under model_params/ is imported, if it exists; then, as in Lingvo's
registry, the module the key names as it stands ('my_tests.exps' for
'my_tests.exps.ClassName', found on sys.path), if the key is not registered
yet; before a suffix lookup every module under model_params/ is imported, so
that whether a suffix is unique does not depend on what happened to be
imported.

  @model_registry.RegisterExperiment
  class StdlibBytesGPipe(base_experiment.BaseExperiment):
    ...

  experiment = model_registry.GetExperiment('lm.StdlibBytesGPipe')
"""

import difflib
import importlib
import pkgutil
import types
from typing import Dict, List, Optional, Type, TypeVar

from lingvo_pipe import base_experiment

EXPERIMENTS_PACKAGE = 'model_params'

_ExperimentClass = TypeVar('_ExperimentClass',
                           bound=Type[base_experiment.BaseExperiment])


def ExperimentKey(cls: type,
                  package: Optional[str] = EXPERIMENTS_PACKAGE) -> str:
  """Returns the registry key of an experiment class (see the module doc).

  Args:
    cls: the class.
    package: the experiments package whose prefix is left out of the key
      (None: keep the full module path).
  """
  module = cls.__module__
  if package is not None:
    module = module.removeprefix(package + '.')
  return f'{module}.{cls.__name__}'


class Registry:
  """Experiment classes by key, with modules of a package imported on demand.

  The module-level functions (RegisterExperiment, GetClass, ...) use one
  default Registry of the 'model_params' package; tests and other packages of
  experiments can make their own.

  Args:
    package: the experiments package: left out of keys, its modules imported
      on demand (None: full module paths, nothing imported).
  """

  def __init__(self, package: Optional[str] = EXPERIMENTS_PACKAGE) -> None:
    self._package = package
    self._classes: Dict[str, Type[base_experiment.BaseExperiment]] = {}

  def Register(self, cls: _ExperimentClass) -> _ExperimentClass:
    """Registers an experiment class under its key; returns it (a decorator).

    Raises:
      TypeError: if cls is not a subclass of BaseExperiment.
      ValueError: if another class has the same key.
    """
    base = base_experiment.BaseExperiment
    if not (isinstance(cls, type) and issubclass(cls, base) and
            cls is not base):
      name = _ClassPath(cls) if isinstance(cls, type) else repr(cls)
      raise TypeError(f'Cannot register {name}: only subclasses of '
                      f'{_ClassPath(base)} can be registered.')
    key = ExperimentKey(cls, self._package)
    other = self._classes.get(key)
    if other is not None and other is not cls:
      raise ValueError(f'Experiment key {key!r} is registered twice: by '
                       f'{_ClassPath(other)} and by {_ClassPath(cls)}; rename '
                       'one of the classes.')
    self._classes[key] = cls
    return cls

  def Keys(self) -> List[str]:
    """Returns the registered keys, sorted (ImportAll() first to list all)."""
    return sorted(self._classes)

  def GetClass(self, key: str) -> Type[base_experiment.BaseExperiment]:
    """Returns the class of an exact key or of a unique dotted key suffix.

    Raises:
      ValueError: if the suffix ends more than one key (they are listed).
      LookupError: if no key matches (with close keys and all keys).
    """
    self._ImportModuleOf(key)
    own_module = ''
    if key not in self._classes:
      own_module = self._ImportOwnModuleOf(key)
    if key in self._classes:
      return self._classes[key]
    self.ImportAll()
    matches = [k for k in self.Keys() if k.endswith('.' + key)]
    if len(matches) == 1:
      return self._classes[matches[0]]
    if matches:
      raise ValueError(f'Experiment {key!r} is ambiguous: it matches '
                       f'{", ".join(matches)}; give one of these keys.')
    close = self._CloseKeys(key)
    hint = f' Did you mean {" or ".join(map(repr, close))}?' if close else ''
    if own_module and not close:
      hint += (f' No module {own_module!r} to import on the path (the working '
               'directory, PYTHONPATH); run from the directory that holds it '
               'or add it to PYTHONPATH.')
    if '.' not in key and not close:
      hint += (f' An experiment of your own module is named with it: '
               f'--model=your_module.{key} (your_module.py in the working directory '
               f'or on PYTHONPATH), or --import=your_module --model={key}.')
    raise LookupError(f'Unknown experiment {key!r}.{hint} Registered: '
                      f'{", ".join(self.Keys()) or "none"}.')

  def GetExperiment(self, key: str) -> base_experiment.BaseExperiment:
    """Returns an instance of GetClass(key) (same errors)."""
    return self.GetClass(key)()

  def ImportAll(self) -> None:
    """Imports every module of the package (and its subpackages), so that
    all their experiments are registered."""
    package = self._ImportIfPresent(self._package) if self._package else None
    if package is None:
      return
    for info in pkgutil.walk_packages(package.__path__, f'{self._package}.'):
      importlib.import_module(info.name)

  def _ImportModuleOf(self, key: str) -> None:
    """Imports the package's module named by key minus its class name."""
    parts = key.split('.')
    if self._package and len(parts) > 1 and all(
        p.isidentifier() for p in parts):
      self._ImportIfPresent('.'.join([self._package] + parts[:-1]))

  def _ImportOwnModuleOf(self, key: str) -> str:
    """Imports the module named by key minus its class name, outside the
    package ('my_exps' for 'my_exps.MlpGPipe'), if it exists; returns the
    name of that module if it does not ('' if it does or key names none)."""
    parts = key.split('.')
    if len(parts) > 1 and all(p.isidentifier() for p in parts):
      module = '.'.join(parts[:-1])
      if self._ImportIfPresent(module) is None:
        return module
    return ''

  def _CloseKeys(self, key: str) -> List[str]:
    """Keys whose last components (as many as key has) resemble key."""
    depth = key.count('.') + 1
    by_tail: Dict[str, List[str]] = {}
    for k in self.Keys():
      by_tail.setdefault('.'.join(k.split('.')[-depth:]), []).append(k)
    close = difflib.get_close_matches(key, list(by_tail), n=3, cutoff=0.6)
    return [k for tail in close for k in by_tail[tail]]

  @staticmethod
  def _ImportIfPresent(module: str) -> Optional[types.ModuleType]:
    """Imports and returns module, or None if it or a parent does not exist.

    An import error from inside an existing module propagates.
    """
    try:
      return importlib.import_module(module)
    except ModuleNotFoundError as e:
      if e.name is None or not (module == e.name or
                                module.startswith(e.name + '.')):
        raise
      return None


def _ClassPath(cls: type) -> str:
  return f'{cls.__module__}.{cls.__qualname__}'


_DEFAULT_REGISTRY = Registry()


def RegisterExperiment(cls: _ExperimentClass) -> _ExperimentClass:
  """Class decorator: registers cls in the default registry (see Registry)."""
  return _DEFAULT_REGISTRY.Register(cls)


def GetClass(key: str) -> Type[base_experiment.BaseExperiment]:
  """The default registry's Registry.GetClass."""
  return _DEFAULT_REGISTRY.GetClass(key)


def GetExperiment(key: str) -> base_experiment.BaseExperiment:
  """The default registry's Registry.GetExperiment."""
  return _DEFAULT_REGISTRY.GetExperiment(key)


def Keys() -> List[str]:
  """The default registry's Registry.Keys."""
  return _DEFAULT_REGISTRY.Keys()


def ImportAllExperiments() -> None:
  """Imports every module under model_params/ (to list all with Keys())."""
  _DEFAULT_REGISTRY.ImportAll()
