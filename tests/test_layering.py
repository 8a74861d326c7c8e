"""The package layout is the architecture: imports point down only.

Layers, lowest first: core (params, layers) <- pipeline <- profiling <-
planning <- tasks <- experiments (base_experiment, model_registry, model_params) <-
trainer. A module may import its own layer and those below it, and no
modules import each other in a circle. Inside pipeline/ the folders are
fenced alike (PIPELINE_FOLDERS), and the schedules and their lowering
import no TensorFlow.
"""

import pathlib
from typing import Dict, List, Set

from tests import test_build_file as build

LAYERS = [
    ('lingvo_pipe.core',),
    ('lingvo_pipe.pipeline',),
    ('lingvo_pipe.profiling',),
    ('lingvo_pipe.planning',),
    ('lingvo_pipe.tasks',),
    ('lingvo_pipe.base_experiment', 'lingvo_pipe.model_registry', 'model_params'),
    ('trainer',),
]


# pipeline/'s folders, lowest first; its top-level modules (the layer and
# the pipelined model) above them all.
PIPELINE_FOLDERS = [
    ('lingvo_pipe.pipeline.schedules',),  # schedules as data: generators, text, simulator
    ('lingvo_pipe.pipeline.lowering',),  # what a step of a schedule runs (program)
    ('lingvo_pipe.pipeline.layout',),  # cells, devices, micro-batches, the plan
    ('lingvo_pipe.pipeline.cell',),  # one cell on its device
    ('lingvo_pipe.pipeline.replicas',),  # data parallelism
    ('lingvo_pipe.pipeline.step',),  # the step's emissions (step/loop/ among them)
    ('lingvo_pipe.pipeline',),
]
TF_FREE = ('lingvo_pipe.pipeline.schedules', 'lingvo_pipe.pipeline.lowering')


def _Layer(module: str, layers=LAYERS) -> int:
  for i, prefixes in enumerate(layers):
    if any(module == p or module.startswith(p + '.') for p in prefixes):
      return i
  raise ValueError(f'{module} belongs to no layer of {layers}; add it there.')


def _LibraryModules() -> Dict[str, List[str]]:
  """Module name -> the first-party modules it imports."""
  graph = {}
  for path in build.PythonFiles():
    if not path.startswith(('lingvo_pipe/', 'model_params/', 'trainer/')):
      continue
    parts = list(pathlib.PurePath(path).with_suffix('').parts)
    if parts[-1] == '__init__':
      parts.pop()
    graph['.'.join(parts)] = sorted(
        m for m in set(build.Imports(path))
        if m.split('.')[0] in ('lingvo_pipe', 'model_params', 'trainer') and
        m.count('.') > 0)
  return graph


def test_imports_point_down():
  upward = [f'{module} (layer {_Layer(module)}) imports {dep} (layer {_Layer(dep)})'
            for module, deps in _LibraryModules().items()
            if module.count('.') > 0 for dep in deps
            if _Layer(dep) > _Layer(module)]
  assert not upward, '\n'.join(upward)


def test_pipeline_folders_import_down():
  """schedules <- lowering <- layout <- cell <- replicas <- step <- gpipe."""
  def Folder(module):
    return _Layer(module, PIPELINE_FOLDERS)

  pipeline = {m: deps for m, deps in _LibraryModules().items()
              if m.startswith('lingvo_pipe.pipeline.')}
  upward = [f'{module} ({PIPELINE_FOLDERS[Folder(module)][0]}) imports {dep} '
            f'({PIPELINE_FOLDERS[Folder(dep)][0]})'
            for module, deps in pipeline.items() for dep in deps
            if dep.startswith('lingvo_pipe.pipeline.') and Folder(dep) > Folder(module)]
  assert not upward, '\n'.join(upward)


def test_schedules_and_their_lowering_need_no_tensorflow():
  heavy = [path for path in build.PythonFiles()
           if path.startswith(tuple(p.replace('.', '/') + '/' for p in TF_FREE))
           and any(m.split('.')[0] == 'tensorflow' for m in build.Imports(path))]
  assert not heavy, heavy


def test_no_import_cycles():
  graph = _LibraryModules()
  cycles: List[List[str]] = []
  done: Set[str] = set()

  def Visit(module: str, path: List[str]) -> None:
    if module in path:
      cycles.append(path[path.index(module):] + [module])
      return
    if module in done or module not in graph:
      return
    for dep in graph[module]:
      Visit(dep, path + [module])
    done.add(module)

  for module in graph:
    Visit(module, [])
  assert not cycles, '\n'.join(' -> '.join(c) for c in cycles)


def test_every_library_module_has_a_layer():
  for module in _LibraryModules():
    if module.count('.') > 0:
      _Layer(module)
