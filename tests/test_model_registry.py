"""Tests of registering experiments and finding them by key."""

import sys

import pytest

from lingvo_pipe import base_experiment
from lingvo_pipe import model_registry


def _Experiment(name, module):
  return type(name, (base_experiment.BaseExperiment,), {'__module__': module})


def test_keys_strip_the_model_params_package():
  assert model_registry.ExperimentKey(_Experiment('Big', 'model_params.lm')) == 'lm.Big'
  assert model_registry.ExperimentKey(_Experiment('Big', 'my.exps')) == 'my.exps.Big'


def test_register_and_find_by_key_or_suffix():
  registry = model_registry.Registry()
  cls = registry.Register(_Experiment('Small', 'model_params.zz_test_a'))
  assert registry.Keys() == ['zz_test_a.Small']
  assert registry.GetClass('zz_test_a.Small') is cls
  assert registry.GetClass('Small') is cls
  assert isinstance(registry.GetExperiment('Small'), cls)


def test_register_rejects_non_experiments_and_duplicates():
  registry = model_registry.Registry()
  with pytest.raises(TypeError, match='not a subclass of BaseExperiment'):
    registry.Register(int)
  registry.Register(_Experiment('Dup', 'model_params.zz_test_b'))
  with pytest.raises(ValueError, match="'zz_test_b.Dup' is registered twice"):
    registry.Register(_Experiment('Dup', 'model_params.zz_test_b'))


def test_ambiguous_suffix():
  registry = model_registry.Registry()
  registry.Register(_Experiment('Same', 'model_params.zz_one'))
  registry.Register(_Experiment('Same', 'model_params.zz_two'))
  with pytest.raises(LookupError, match='ambiguous.*zz_one.Same, zz_two.Same'):
    registry.GetClass('Same')


def test_unknown_key_suggests_and_lists():
  registry = model_registry.Registry()
  registry.Register(_Experiment('StdlibBytes', 'model_params.zz_lm'))
  with pytest.raises(LookupError, match=r"Unknown experiment 'StdlibByts'\. Did you mean "
                     r"'StdlibBytes'.*Registered: zz_lm.StdlibBytes\."):
    registry.GetClass('StdlibByts')


def test_modules_are_imported_on_demand(tmp_path, monkeypatch):
  package = tmp_path / 'model_params'
  package.mkdir()
  (package / '__init__.py').write_text('')
  (package / 'zz_ondemand.py').write_text(
      'from lingvo_pipe import base_experiment, model_registry\n'
      '@model_registry.RegisterExperiment\n'
      'class Lazy(base_experiment.BaseExperiment):\n  pass\n')
  monkeypatch.syspath_prepend(str(tmp_path))
  for name in [m for m in sys.modules if m == 'model_params' or m.startswith('model_params.')]:
    monkeypatch.delitem(sys.modules, name)
  assert model_registry.GetClass('zz_ondemand.Lazy').__name__ == 'Lazy'


def test_the_shipped_experiments_are_registered():
  model_registry.ImportAllExperiments()
  assert {'lm.StdlibBytesGPipe', 'lm.StdlibBytesTiny'} <= set(model_registry.Keys())


def test_trainer_params_round_trip_through_text():
  p = base_experiment.TrainerParams()
  p.Set(optimizer=base_experiment.OptimizerKind.RMSPROP, learning_rate=0.5)
  assert base_experiment.TrainerParams().FromText(p.ToText()) == p
