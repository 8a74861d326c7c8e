"""Import paths of classes and enums, as the params text names them.

Params text written before a module moved names its old path
(`lingvo_pipe.core.gpipe` is now `lingvo_pipe.pipeline.gpipe`,
`lingvo_pipe.pipeline.remat` is `lingvo_pipe.pipeline.lowering.remat`);
`ImportByPath` reads those old paths too.
"""

import importlib
from typing import Any, Dict, Tuple

# Old module path -> the modules that now hold its names, searched in order.
MOVED_MODULES: Dict[str, Tuple[str, ...]] = {
    'lingvo_pipe.core.gpipe': ('lingvo_pipe.pipeline.gpipe',),
    'lingvo_pipe.core.cell_runner': ('lingvo_pipe.pipeline.cell.cell_runner',
                                     'lingvo_pipe.pipeline.lowering.remat'),
    # RematPolicy moved from cell_runner to remat after the layout.
    'lingvo_pipe.pipeline.cell_runner': ('lingvo_pipe.pipeline.cell.cell_runner',
                                         'lingvo_pipe.pipeline.lowering.remat'),
    'lingvo_pipe.core.cluster': ('lingvo_pipe.pipeline.layout.cluster',),
    'lingvo_pipe.core.deferred_grads': ('lingvo_pipe.pipeline.cell.deferred_grads',),
    'lingvo_pipe.core.micro_batch': ('lingvo_pipe.pipeline.layout.micro_batch',),
    'lingvo_pipe.core.partition': ('lingvo_pipe.pipeline.layout.partition',),
    'lingvo_pipe.core.planner': ('lingvo_pipe.planning.planner',),
    'lingvo_pipe.core.schedule': ('lingvo_pipe.pipeline.schedules.schedule',),
    'lingvo_pipe.core.gpipe_stacks': ('lingvo_pipe.pipeline.pipelined_model',
                                      'lingvo_pipe.tasks.lm.layers',
                                      'lingvo_pipe.tasks.image.layers'),
    'lingvo_pipe.core.gpipe_seq2seq': ('lingvo_pipe.tasks.mt.layers',),
    'lingvo_pipe.core.byte_lm_input': ('lingvo_pipe.tasks.lm.input_generator',),
    'lingvo_pipe.core.lm_task': ('lingvo_pipe.tasks.lm.model',),
    'lingvo_pipe.core.parallel_text_input': ('lingvo_pipe.tasks.mt.input_generator',),
    'lingvo_pipe.core.mt_task': ('lingvo_pipe.tasks.mt.model',),
    'lingvo_pipe.core.cifar_input': ('lingvo_pipe.tasks.image.input_generator',),
    'lingvo_pipe.core.image_task': ('lingvo_pipe.tasks.image.model',),
    'lingvo_pipe.core.amoebanet': ('lingvo_pipe.tasks.image.amoebanet',),
    'lingvo_pipe.core.timeline': ('lingvo_pipe.profiling.timeline',),
    'lingvo_pipe.core.trace_calls': ('lingvo_pipe.profiling.trace_calls',),
    'lingvo_pipe.core.gantt': ('lingvo_pipe.profiling.gantt',),
    # The pipeline package in folders: the modules of the enums params text names.
    'lingvo_pipe.pipeline.schedule': ('lingvo_pipe.pipeline.schedules.schedule',),
    'lingvo_pipe.pipeline.remat': ('lingvo_pipe.pipeline.lowering.remat',),
    'lingvo_pipe.pipeline.partition': ('lingvo_pipe.pipeline.layout.partition',),
    'lingvo_pipe.pipeline.cell_compilation': ('lingvo_pipe.pipeline.layout.cell_compilation',),
}


def ImportByPath(path: str) -> Any:
  """Imports 'package.module.Qual.Name' and returns the named object.

  Raises:
    ValueError: if no module defines it (naming where a moved module went).
  """
  parts = path.split('.')
  for split in range(len(parts) - 1, 0, -1):
    module_name = '.'.join(parts[:split])
    for candidate in MOVED_MODULES.get(module_name, (module_name,)):
      try:
        obj = importlib.import_module(candidate)
      except ImportError:
        continue
      try:
        for attr in parts[split:]:
          obj = getattr(obj, attr)
      except AttributeError:
        continue
      return obj
    if module_name in MOVED_MODULES:
      raise ValueError(f'Cannot import {path!r}: module {module_name} moved to '
                       f'{" / ".join(MOVED_MODULES[module_name])}, which do '
                       f'not define {".".join(parts[split:])}.')
  raise ValueError(f'Cannot import {path!r}: no module on the import path '
                   'defines it.')


def ObjectPath(obj: Any) -> str:
  """Returns the import path of a class or enum class."""
  return f'{obj.__module__}.{obj.__qualname__}'
