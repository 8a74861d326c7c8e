"""Fuzzes Params.FromText and the override parser with hypothesis: every
input either applies or raises the project's own error type (ParamsTextError,
UsageError), never anything else. `make test` tries 2,400 cases; the slow
variant (`make test-slow`) tries 12,000."""

import string

import hypothesis
from hypothesis import strategies as st
import pytest

from lingvo_pipe import model_registry
from lingvo_pipe.core import hyperparams
from trainer import experiment_params

_BASE = experiment_params.ExperimentParams(model_registry.GetExperiment('lm.StdlibBytesTiny'))
_KEYS = [line.partition(' : ')[0] for line in _BASE.ToText().splitlines()]
_NEAR_KEYS = st.sampled_from(_KEYS) | st.sampled_from(_KEYS).map(lambda k: k[:-1]) | st.text(
    string.ascii_lowercase + '._', max_size=20)
_LITERALS = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner) |
    st.dictionaries(st.text(max_size=4), inner, max_size=2), max_leaves=6).map(repr)
_CALLS = st.sampled_from([
    "dtype('float32')", "dtype('float33')", 'dtype(1)', "float('inf')", "float('x')",
    "enum('lingvo_pipe.base_experiment.OptimizerKind', 'ADAM')",
    "enum('lingvo_pipe.base_experiment.OptimizerKind', 'ADAMM')", 'enum(1, 2)',
    "cls('lingvo_pipe.tasks.lm.model.LanguageModelTask')", "cls('')", "cls('.x')",
    "cls('no_such_module.X')", 'cls(None)', "params(None, {'a': 1})", 'params(1, 2)',
    "params('lingvo_pipe.core.layers.containers.ResidualLayer', {'bodyy': 1})",
    "params('lingvo_pipe.core.layers.containers.ResidualLayer', [1])",
    '{[1]: 2}', '{{}: 1}', '[' * 300 + ']' * 300, '-' * 2000 + '1', '1' * 5000,
    '-True', '-"x"', 'x.y', 'f(a=1)', 'lambda: 0', '__import__("os")', '1 if 1 else 2',
    '(1,)', '{1, 2}', b'x'.decode(), '\x00', '\\', '"\\N{bad}"'])
_VALUES = _LITERALS | _CALLS | st.text(max_size=30)


def _Mutate(text: str, draw) -> str:
  """Inserts, deletes or replaces up to three characters of text."""
  chars = list(text)
  for _ in range(draw(st.integers(0, 3))):
    pos = draw(st.integers(0, len(chars)))
    op = draw(st.sampled_from(['insert', 'delete', 'replace']))
    char = draw(st.sampled_from(list(':;=\'"()[]{},.\\#\n\r\x85 ') + ['\u2028', 'a', '0']))
    if op == 'insert':
      chars.insert(pos, char)
    elif chars and pos < len(chars):
      chars[pos:pos + 1] = [] if op == 'delete' else [char]
  return ''.join(chars)


_TRIED = {'from_text': 0, 'override': 0}


def _FromTextOnce(text: str) -> None:
  _TRIED['from_text'] += 1
  try:
    _BASE.Copy().FromText(text)
  except hyperparams.ParamsTextError:
    pass


def _OverrideOnce(text: str) -> None:
  _TRIED['override'] += 1
  try:
    experiment_params.ApplyOverrides(_BASE.Copy(), text)
  except experiment_params.UsageError:
    pass


@st.composite
def _ParamsText(draw):
  lines = []
  for _ in range(draw(st.integers(1, 3))):
    lines.append(f'{draw(_NEAR_KEYS)} : {draw(_VALUES)}')
  return _Mutate('\n'.join(lines), draw)


@st.composite
def _OverrideText(draw):
  items = []
  for _ in range(draw(st.integers(1, 3))):
    items.append(f'{draw(_NEAR_KEYS)}={draw(_VALUES)}')
  return _Mutate(';'.join(items), draw)


def _Fuzz(once, strategy, examples: int) -> None:
  """Runs once(text) on `examples` texts drawn from strategy."""

  @hypothesis.settings(max_examples=examples, deadline=None, database=None,
                       suppress_health_check=list(hypothesis.HealthCheck))
  @hypothesis.given(strategy)
  def Case(text):
    once(text)

  Case()


def _Check(examples: int) -> None:
  _Fuzz(_FromTextOnce, _ParamsText(), examples)
  _Fuzz(_FromTextOnce, st.text(max_size=80), examples)
  _Fuzz(_OverrideOnce, _OverrideText(), examples)
  _Fuzz(_OverrideOnce, st.text(max_size=80), examples)


def test_fuzz_short():
  _TRIED.update(from_text=0, override=0)
  _Check(600)
  print(f'fuzz cases tried: {_TRIED}')
  assert sum(_TRIED.values()) >= 2400


@pytest.mark.slow  # make test runs test_fuzz_short (2,400 cases).
def test_fuzz_long():
  _TRIED.update(from_text=0, override=0)
  _Check(3000)
  print(f'fuzz cases tried: {_TRIED}')
  assert sum(_TRIED.values()) >= 12000


def test_errors_are_the_project_types():
  p = _BASE.Copy()
  with pytest.raises(hyperparams.ParamsTextKeyError, match='Line 1'):
    p.FromText('trainer.max_stepz : 3')
  with pytest.raises(hyperparams.ParamsTextTypeError, match='expects a value of type int'):
    p.FromText("trainer.max_steps : 'x'")
  with pytest.raises(hyperparams.ParamsTextError, match='not "key : value"'):
    p.FromText('trainer.max_steps 3')
  with pytest.raises(hyperparams.ParamsTextError, match=r'cannot decode'):
    p.FromText('trainer.max_steps : {[1]: 2}')


def test_unquoted_string_override_and_quoted_still_accepted():
  p = _BASE.Copy()
  experiment_params.ApplyOverrides(p, 'train.file_pattern=/data/*.txt; '
                                   "dev.file_pattern='/q;uoted/*.txt'; train.name=123")
  assert p.train.file_pattern == '/data/*.txt'
  assert p.dev.file_pattern == '/q;uoted/*.txt'
  assert p.train.name == '123'
  experiment_params.ApplyOverrides(p, 'train.file_pattern="/x y/*.txt"')
  assert p.train.file_pattern == '/x y/*.txt'
  with pytest.raises(experiment_params.UsageError, match='unterminated string'):
    experiment_params.ApplyOverrides(p, 'train.file_pattern="/data')
  with pytest.raises(experiment_params.UsageError, match=r'trainer.max_steps takes an int .*, '
                     'not abc'):
    experiment_params.ApplyOverrides(p, 'trainer.max_steps=abc')
