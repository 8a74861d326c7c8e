"""docs/from_lingvo.md cannot rot: every name of this project in its tables
(modules' classes and functions, trainer params, trainer flags and modes)
exists, and every Lingvo trainer flag it lists is either one of this
trainer's or one it refuses naming what to pass instead."""

import importlib
import pkgutil
import re
from typing import Dict, List, Tuple

import lingvo_pipe
from lingvo_pipe import base_experiment
from lingvo_pipe import model_registry
from tests import fresh_process
from trainer import lingvo_flags
from trainer import trainer as trainer_main

DOC = fresh_process.ROOT / 'docs' / 'from_lingvo.md'
_CODE = re.compile(r'`([^`]+)`')
_NAME = re.compile(r'^@?([a-z_]+(\.\w+)+)')


def _Rows() -> List[Tuple[str, str]]:
  """(Lingvo cell, here cell) of each table row but the headers."""
  rows = []
  for line in DOC.read_text().splitlines():
    cells = [c.strip() for c in line.strip().strip('|').split('|')]
    if line.startswith('|') and len(cells) == 2 and cells != ['Lingvo', 'here'] and (
        not set(cells[0]) <= set('-')):
      rows.append((cells[0], cells[1]))
  assert len(rows) > 30, rows
  return rows


def _Modules() -> Dict[str, List[str]]:
  """Last component of each module of lingvo_pipe -> the modules so named."""
  out: Dict[str, List[str]] = {}
  for info in pkgutil.walk_packages(lingvo_pipe.__path__, 'lingvo_pipe.'):
    out.setdefault(info.name.rsplit('.', 1)[-1], []).append(info.name)
  return out


def _Resolves(dotted: str, modules: Dict[str, List[str]]) -> bool:
  """Whether `dotted` names a trainer param, a registered experiment or
  an attribute of a module of lingvo_pipe."""
  first, *attrs = dotted.split('.')
  if first == 'trainer':
    return attrs[0] in base_experiment.TrainerParams()
  try:
    model_registry.GetClass(dotted)
    return True
  except (LookupError, ValueError):
    pass
  for module in modules.get(first, []):
    obj = importlib.import_module(module)
    try:
      for attr in attrs:
        obj = getattr(obj, attr)
    except AttributeError:
      continue
    return True
  return False


def _Flags(cell: str) -> List[Tuple[str, str]]:
  return [(m.group(1), m.group(2) or '') for m in re.finditer(r'--(\w+)(?:=([\w,:.]+))?', cell)]


def test_every_name_of_this_project_exists():
  modules = _Modules()
  names = [m.group(1) for _, here in _Rows() for code in _CODE.findall(here)
           for m in [_NAME.match(code)] if m and m.group(1).split('.')[0] in
           set(modules) | {'trainer'}]
  assert len(names) > 20, names
  missing = [n for n in names if not _Resolves(n, modules)]
  assert not missing, missing


def test_every_flag_and_mode_of_this_trainer_exists():
  own = set(trainer_main.FLAGS)
  for _, here in _Rows():
    for name, value in _Flags(here):
      assert name in own, name
      if name == 'mode':
        assert value in trainer_main.MODES, value


def test_each_lingvo_flag_is_this_trainers_or_refused_with_what_to_pass():
  own = set(trainer_main.FLAGS)
  flags = [flag for lingvo, _ in _Rows() for flag in _Flags(lingvo)]
  assert len(flags) > 10, flags
  for name, value in flags:
    taken = name in own and (name != 'mode' or value in trainer_main.MODES)
    arg = f'--{name}={value}' if value else f'--{name}'
    assert taken or lingvo_flags.Refusal([arg]), arg
