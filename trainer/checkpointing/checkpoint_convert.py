"""Converts a checkpoint of an earlier version into today's format.

Earlier versions checkpointed the task module itself, so a variable's key
was its attribute path: CreateChild names, CreateChildren lists as
`attr/<index>` and dicts as `attr/<key>`, and a pipeline's cells as
`cell_<k>` (a SequentialLayer with the list `sub`):

  model/stack/pipeline/cell_1/sub/0/body/w/.ATTRIBUTES/VARIABLE_VALUE

Today a variable is keyed by its path in the logical model
(checkpoint_keys.py). The conversion builds the model from the params the
old run was trained with, finds each variable's old key (through the
pipeline's cell layout, CellLayerIndices, where cells are no longer
attributes), and writes the values, the optimizer slots, the optimizer's
other state and the global step as a new checkpoint in a new logdir. The
input position carries over when it restores, else it is dropped with a
logged line. The old checkpoint is only read.
"""

import os
from typing import Callable, Dict, List, Optional

from lingvo_pipe import model_registry
from lingvo_pipe.core import base_layer
from trainer.checkpointing import checkpoint_keys
from trainer.checkpointing import checkpoints
from trainer import experiment_params

_SHOWN = 3


class ConvertError(RuntimeError):
  """The conversion cannot be done; one line saying why and what to do."""


def OldPaths(layer: base_layer.BaseLayer, prefix: str = '') -> Dict[int, List[str]]:
  """{id(variable): its possible old paths} under `layer`: the attribute
  path, and inside a pipeline whose cells are views of its `layers` the
  cell path `cell_<k>/sub/<j>/...` of earlier versions."""
  out: Dict[int, List[str]] = {}
  for name, var in layer.vars.items():
    if not isinstance(var, dict) and not isinstance(var, list):
      out.setdefault(id(var), []).append(prefix + name)
  cell_of: Dict[int, str] = {}
  indices = getattr(layer, 'CellLayerIndices', None)
  if callable(indices):
    for k, run in enumerate(indices()):
      for j, i in enumerate(run):
        cell_of[i] = f'cell_{k}/sub/{j}/'
  for name, child in layer.Children():
    attr, _, index = name.partition('.')
    prefixes = [f'{prefix}{attr}/{index}/' if index else f'{prefix}{attr}/']
    if attr == 'layers' and index.isdigit() and int(index) in cell_of:
      prefixes.append(prefix + cell_of[int(index)])
    for child_prefix in prefixes:
      for key, paths in OldPaths(child, child_prefix).items():
        out.setdefault(key, []).extend(paths)
  return out


def _Params(model: str, params_file: Optional[str], overrides: str):
  try:
    experiment = model_registry.GetExperiment(model)
  except (LookupError, ValueError) as e:
    raise ConvertError(str(e)) from None
  params = experiment_params.ExperimentParams(experiment)
  if params_file:
    try:
      with open(params_file) as f:
        experiment_params.ApplyParamsFile(params, f.read(), params_file)
    except OSError as e:
      raise ConvertError(f'Cannot read the old run\'s params {params_file!r}: '
                         f'{e.strerror}; pass --model_params_file_override.') from None
  experiment_params.ApplyOverrides(params, overrides)
  return params


def _ConfigureDevices(params) -> None:
  """Logical CPU devices for the pipelines, as the trainer makes them."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from lingvo_pipe.pipeline.layout import device_mapping  # pylint: disable=g-import-not-at-top
  if tf.config.list_physical_devices('GPU') or tf.config.list_physical_devices('TPU'):
    return
  wanted = max(device_mapping.DevicesNeeded(params.task), params.trainer.num_logical_devices, 1)
  cpu = tf.config.list_physical_devices('CPU')[0]
  try:
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * wanted)
  except RuntimeError:  # already initialized (e.g. in a test process): keep them
    pass


def ConvertLogdir(model: str, old_logdir: str, new_logdir: str,
                  params_file: Optional[str], overrides: str,
                  log: Callable[[str], None]) -> str:
  """Writes the newest checkpoint of `old_logdir` in today's format as
  checkpoints/ckpt-<step> in `new_logdir`, and the params as params.txt
  there; returns the new checkpoint's prefix.

  Raises:
    ConvertError: if `new_logdir` holds files, there is no old checkpoint,
      or the model built from the params does not fit it.
  """
  if os.path.abspath(old_logdir) == os.path.abspath(new_logdir):
    raise ConvertError(f'NEW_LOGDIR {new_logdir!r} is OLD_LOGDIR; pick a new '
                       'directory (the old checkpoint is never overwritten).')
  if os.path.exists(new_logdir) and os.listdir(new_logdir):
    raise ConvertError(f'NEW_LOGDIR {new_logdir!r} is not empty; pick a new '
                       'directory (nothing is overwritten).')
  old = checkpoints.Resolve(old_logdir)
  if old is None:
    raise ConvertError(f'No checkpoint in {old_logdir!r}: give the old run\'s logdir, '
                       'its checkpoints directory or a checkpoint prefix.')
  specs = checkpoint_keys.CheckpointSpecs(old)
  if not checkpoint_keys.OldFormatPaths(specs):
    raise ConvertError(f'{old} is already in the current format (no variable path of '
                       'an earlier version): nothing to convert; train, evaluate or '
                       'decode on its logdir as it is.')
  if params_file is None:
    candidate = os.path.join(checkpoint_keys.LogdirOf(old), 'params.txt')
    params_file = candidate if os.path.exists(candidate) else None
  params = _Params(model, params_file, overrides)
  log(f'Params: {model}' + (f' with {params_file}' if params_file else '') +
      (f' and {overrides!r}' if overrides else '') + '.')
  _ConfigureDevices(params)
  return _Convert(params, old, specs, new_logdir, log)


def _Convert(params, old: str, specs: Dict[str, checkpoint_keys.Spec], new_logdir: str,
             log: Callable[[str], None]) -> str:
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from trainer import loop  # pylint: disable=g-import-not-at-top
  trainer = loop.Trainer(params, new_logdir, log=log)
  reader = tf.train.load_checkpoint(old)
  # The optimizer's slots and other state exist once it has updated; a
  # zero update creates them, and every value is overwritten below.
  trainer.optimizer.apply_gradients(
      [(tf.zeros_like(v), v) for v in trainer.variables])
  slot_names = sorted(trainer.optimizer.get_slot_names())
  assignments = _Assignments(trainer, slot_names, specs, os.path.basename(old))
  for key, target in assignments:
    target.assign(reader.get_tensor(key))
  _RestoreTheRest(trainer, old, log)
  prefix = checkpoints.Save(trainer.manager, int(trainer.global_step.numpy()))
  with open(os.path.join(new_logdir, 'params.txt'), 'w') as f:
    f.write(params.ToText())
  checkpoint_keys.CheckMatches(prefix, trainer.model_variables, slot_names, False)
  log(f'Converted {os.path.basename(old)} ({len(trainer.model_variables)} variables, '
      f'{len(assignments) - len(trainer.model_variables)} optimizer slots, step '
      f'{int(trainer.global_step.numpy())}) to {prefix}. Train on with '
      f'--logdir={new_logdir}.')
  return prefix


def _Assignments(trainer, slot_names: List[str], specs: Dict[str, checkpoint_keys.Spec],
                 name: str) -> List[tuple]:
  """(old key, variable or slot to assign it to) for every model variable
  and slot; every old model key is used exactly once.

  Raises:
    ConvertError: naming what is missing, reshaped or left over.
  """
  old_paths = OldPaths(trainer.task)
  missing: List[str] = []
  reshaped: List[str] = []
  out = []
  for path, var in trainer.model_variables.items():
    candidates = [p for p in old_paths.get(id(var), [])
                  if checkpoint_keys.VariableKey(p) in specs]
    if not candidates:
      missing.append(path)
      continue
    targets = [(checkpoint_keys.VariableKey(candidates[0]), var)]
    if var.trainable:
      targets += [(checkpoint_keys.SlotKey(candidates[0], s),
                   trainer.optimizer.get_slot(var, s)) for s in slot_names]
    for key, target in targets:
      want = checkpoint_keys.Spec(tuple(target.shape.as_list()), target.dtype.base_dtype)
      if key not in specs:
        missing.append(checkpoint_keys.ShortName(key))
      elif specs[key] != want:
        reshaped.append(f'{checkpoint_keys.ShortName(key)}: checkpoint {specs[key]}, '
                        f'model {want}')
      else:
        out.append((key, target))
  used = {key for key, _ in out}
  unused = [checkpoint_keys.ShortName(k) for k in sorted(specs)
            if checkpoint_keys.ParseModelKey(k) and k not in used]
  problems = [_Listed(what, names) for what, names in (
      ('missing from it', missing), ('with another shape', reshaped),
      ('not in the model', unused)) if names]
  if problems:
    raise ConvertError(f'The model of these params does not fit {name}: '
                       f'{"; ".join(problems)}. Give the --model and params the old '
                       'run was trained with.')
  return out


def _Listed(what: str, names: List[str]) -> str:
  more = ', ...' if len(names) > _SHOWN else ''
  return f'{len(names)} {what} ({", ".join(names[:_SHOWN])}{more})'


def _RestoreTheRest(trainer, old: str, log: Callable[[str], None]) -> None:
  """The global step, the optimizer's own variables (e.g. Adam's beta
  powers), the loss scale and, if it restores, the input position."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  state = dict(optimizer=trainer.optimizer, global_step=trainer.global_step)
  if trainer.loss_scale is not None:
    state['loss_scale'] = trainer.loss_scale
  status = tf.train.Checkpoint(**state).restore(old)
  try:
    status.assert_existing_objects_matched()
  except AssertionError as e:
    raise ConvertError(f'{os.path.basename(old)} lacks part of the training state '
                       f'({str(e).splitlines()[0][:160]}); give the trainer params '
                       'the old run was trained with.') from None
  status.expect_partial()  # the slots, assigned by key instead
  try:
    tf.train.Checkpoint(train_iterator=trainer.train_iterator).restore(old).expect_partial()
  except Exception as e:  # pylint: disable=broad-except
    log(f'The input position was not carried over ({type(e).__name__}); the '
        'converted run reads its input from the start.')
