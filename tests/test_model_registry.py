"""Tests of registering experiment classes and finding them by key."""

import importlib
import pathlib
import sys

import pytest

from lingvo_pipe import base_experiment
from lingvo_pipe import model_registry

# A package name nothing provides: lookups in a registry of it import nothing.
_ABSENT = 'zz_no_such_experiments_package'


def _Experiment(name, module):
  return type(name, (base_experiment.BaseExperiment,), {'__module__': module})


def _WritePackage(root, name, files):
  """Writes package `name` under root: {relative path: source} files and an
  empty __init__.py in every folder."""
  for relative, source in files.items():
    path = root / name / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    for folder in path.relative_to(root).parents[:-1]:
      (root / folder / '__init__.py').touch()


@pytest.fixture(name='tmp_packages')
def _TmpPackages(tmp_path, monkeypatch):
  """tmp_path on sys.path; the modules imported from it are forgotten after."""
  monkeypatch.syspath_prepend(str(tmp_path))
  names = {p.name for p in tmp_path.iterdir()}
  yield tmp_path
  names = {p.name for p in tmp_path.iterdir()} - names
  for module in [m for m in sys.modules if m.split('.')[0] in names]:
    del sys.modules[module]


_REGISTERING_MODULE = '''
from lingvo_pipe import base_experiment
from lingvo_pipe import model_registry

@model_registry.RegisterExperiment
class {name}(base_experiment.BaseExperiment):
  pass
'''


def test_key_is_module_under_the_package_and_class_name():
  key = model_registry.ExperimentKey
  assert key(_Experiment('Big', 'model_params.lm')) == 'lm.Big'
  assert key(_Experiment('Big', 'model_params.sub.lm')) == 'sub.lm.Big'
  assert key(_Experiment('Big', 'my.exps')) == 'my.exps.Big'
  assert key(_Experiment('Big', 'model_params')) == 'model_params.Big'
  assert key(_Experiment('Big', 'model_paramsx.lm')) == 'model_paramsx.lm.Big'
  assert key(_Experiment('Big', 'exps.lm'), package='exps') == 'lm.Big'
  assert key(_Experiment('Big', 'model_params.lm'), package=None) == (
      'model_params.lm.Big')

  class Local(base_experiment.BaseExperiment):
    pass

  assert key(Local) == f'{__name__}.Local'  # __name__, not __qualname__


def test_register_returns_the_class_and_finds_it_by_key_or_suffix():
  registry = model_registry.Registry(package=_ABSENT)
  cls = _Experiment('Small', f'{_ABSENT}.zz_a.b')
  assert registry.Register(cls) is cls
  assert registry.Register(cls) is cls  # the same class again is no clash
  assert registry.Keys() == ['zz_a.b.Small']
  for key in ['zz_a.b.Small', 'b.Small', 'Small']:
    assert registry.GetClass(key) is cls
  assert type(registry.GetExperiment('Small')) is cls
  with pytest.raises(LookupError, match="Unknown experiment 'mall'"):
    registry.GetClass('mall')  # a suffix is made of whole components


def test_exact_key_wins_over_a_longer_key_it_ends():
  registry = model_registry.Registry(package=None)
  short = registry.Register(_Experiment('Same', 'lm'))
  registry.Register(_Experiment('Same', 'other.lm'))
  assert registry.GetClass('lm.Same') is short


def test_register_rejects_what_is_not_an_experiment_class():
  registry = model_registry.Registry(package=None)
  with pytest.raises(TypeError, match=r'Cannot register builtins\.int: only '
                     r'subclasses of lingvo_pipe\.base_experiment\.'
                     r'BaseExperiment'):
    registry.Register(int)
  with pytest.raises(TypeError, match=r'Cannot register lingvo_pipe\.'
                     r'base_experiment\.BaseExperiment:'):
    registry.Register(base_experiment.BaseExperiment)
  with pytest.raises(TypeError, match='Cannot register <exps.Small object'):
    registry.Register(_Experiment('Small', 'exps')())
  assert registry.Keys() == []


def test_two_classes_with_one_key_are_rejected():
  registry = model_registry.Registry(package=_ABSENT)
  first = registry.Register(_Experiment('Dup', f'{_ABSENT}.zz_b'))
  with pytest.raises(ValueError, match=(
      rf"Experiment key 'zz_b.Dup' is registered twice: by {_ABSENT}\.zz_b\."
      rf'Dup and by {_ABSENT}\.zz_b\.Dup; rename one')):
    registry.Register(_Experiment('Dup', f'{_ABSENT}.zz_b'))
  assert registry.GetClass('zz_b.Dup') is first


def test_an_ambiguous_suffix_lists_the_keys_it_ends():
  registry = model_registry.Registry(package=None)
  one = registry.Register(_Experiment('Same', 'zz_one.lm'))
  registry.Register(_Experiment('Same', 'zz_two.lm'))
  registry.Register(_Experiment('Other', 'zz_one.lm'))
  for key in ['Same', 'lm.Same']:
    with pytest.raises(ValueError, match=rf"Experiment '{key}' is ambiguous: "
                       r'it matches zz_one\.lm\.Same, zz_two\.lm\.Same; give'):
      registry.GetClass(key)
  assert registry.GetClass('zz_one.lm.Same') is one


def test_an_unknown_key_suggests_close_keys_and_lists_all():
  registry = model_registry.Registry(package=None)
  # A bare class name with nothing close: how to name one of your own.
  with pytest.raises(LookupError, match=r"^Unknown experiment 'Any'\. An experiment of your "
                     r'own module is named with it: --model=your_module\.Any \(your_module\.py '
                     r'in the working directory or on PYTHONPATH\), or --import=your_module '
                     r'--model=Any\. Registered: none\.$'):
    registry.GetClass('Any')
  registry.Register(_Experiment('StdlibBytes', 'zz_lm'))
  registry.Register(_Experiment('StdlibBytesTiny', 'zz_lm'))
  registry.Register(_Experiment('Convnet', 'zz_image'))
  all_keys = r'Registered: zz_image\.Convnet, zz_lm\.StdlibBytes, ' \
             r'zz_lm\.StdlibBytesTiny\.$'
  with pytest.raises(LookupError, match=(
      r"^Unknown experiment 'StdlibByts'\. Did you mean 'zz_lm\.StdlibBytes' "
      rf"or 'zz_lm\.StdlibBytesTiny'\? {all_keys}")):
    registry.GetClass('StdlibByts')
  with pytest.raises(LookupError, match=(  # compared on as many components
      r"^Unknown experiment 'zz_lm\.StdlibBytesTyny'\. Did you mean "
      rf"'zz_lm\.StdlibBytesTiny' or 'zz_lm\.StdlibBytes'\? {all_keys}")):
    registry.GetClass('zz_lm.StdlibBytesTyny')
  with pytest.raises(LookupError, match=rf"^Unknown experiment 'Xyz'\. An experiment of "
                     rf'your own module .* {all_keys}'):
    registry.GetClass('Xyz')


def test_package_modules_are_imported_on_demand(tmp_packages, monkeypatch):
  package = 'zz_registry_test_exps'
  _WritePackage(tmp_packages, package, {
      'lm.py': _REGISTERING_MODULE.format(name='Lazy'),
      'sub/deep.py': _REGISTERING_MODULE.format(name='Deep'),
      'zz_last.py': _REGISTERING_MODULE.format(name='Last'),
  })
  monkeypatch.setattr(model_registry, '_DEFAULT_REGISTRY',
                      model_registry.Registry(package=package))
  assert model_registry.Keys() == []

  lazy = model_registry.GetClass('lm.Lazy')  # imports just package.lm
  assert model_registry.ExperimentKey(lazy, package) == 'lm.Lazy'
  assert model_registry.Keys() == ['lm.Lazy']
  assert f'{package}.sub.deep' not in sys.modules

  deep = model_registry.GetExperiment('sub.deep.Deep')  # nested module
  assert type(deep).__module__ == f'{package}.sub.deep'
  assert model_registry.Keys() == ['lm.Lazy', 'sub.deep.Deep']

  assert model_registry.GetClass('Last').__name__ == 'Last'  # imports all
  assert model_registry.Keys() == ['lm.Lazy', 'sub.deep.Deep', 'zz_last.Last']


def test_a_key_naming_a_module_outside_the_package_imports_it(tmp_packages,
                                                             monkeypatch):
  """Lingvo's habit: --model=my_exps.Mlp imports my_exps on a miss."""
  package = 'zz_registry_test_own'
  _WritePackage(tmp_packages, package, {'a.py': _REGISTERING_MODULE.format(name='A')})
  _WritePackage(tmp_packages, 'zz_own_exps', {
      'mlp.py': _REGISTERING_MODULE.format(name='Mlp')})
  monkeypatch.setattr(model_registry, '_DEFAULT_REGISTRY',
                      model_registry.Registry(package=package))
  mlp = model_registry.GetClass('zz_own_exps.mlp.Mlp')
  assert mlp.__module__ == 'zz_own_exps.mlp'
  assert model_registry.Keys() == ['zz_own_exps.mlp.Mlp']
  with pytest.raises(LookupError, match="No module 'zz_nowhere' to import"):
    model_registry.GetClass('zz_nowhere.Mlp')


def test_import_all_experiments_registers_every_module(tmp_packages,
                                                       monkeypatch):
  package = 'zz_registry_test_all'
  _WritePackage(tmp_packages, package, {
      'a.py': _REGISTERING_MODULE.format(name='A'),
      'b/c.py': _REGISTERING_MODULE.format(name='C'),
  })
  monkeypatch.setattr(model_registry, '_DEFAULT_REGISTRY',
                      model_registry.Registry(package=package))
  model_registry.ImportAllExperiments()
  assert model_registry.Keys() == ['a.A', 'b.c.C']


def test_an_import_error_inside_an_experiment_module_propagates(tmp_packages):
  package = 'zz_registry_test_broken'
  _WritePackage(tmp_packages, package, {
      'broken.py': 'import zz_registry_test_missing_dependency\n'})
  registry = model_registry.Registry(package=package)
  with pytest.raises(ModuleNotFoundError,
                     match='zz_registry_test_missing_dependency'):
    registry.GetClass('broken.Model')
  with pytest.raises(ModuleNotFoundError,
                     match='zz_registry_test_missing_dependency'):
    registry.ImportAll()


def test_the_default_registry_holds_every_model_params_module():
  model_registry.ImportAllExperiments()
  package = importlib.import_module(model_registry.EXPERIMENTS_PACKAGE)
  root = pathlib.Path(package.__file__).parent
  modules = {'.'.join((package.__name__,) + p.relative_to(root).with_suffix(
      '').parts) for p in root.rglob('*.py') if p.name != '__init__.py'}
  assert modules, f'no experiment modules found in {root}'
  assert modules <= set(sys.modules)
  for key in model_registry.Keys():
    cls = model_registry.GetClass(key)
    assert cls.__module__ in modules
    assert model_registry.ExperimentKey(cls) == key
