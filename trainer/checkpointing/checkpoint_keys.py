"""A model's checkpoint keys, and the strict comparison of a checkpoint with them.

The trainer checkpoints the model as `model=variable_paths.Nested(
variable_paths.VariablesByPath(task))`, so a variable at path
'stack/pipeline/layer_3/body/w' is stored under

  model/stack/pipeline/layer_3/body/w/.ATTRIBUTES/VARIABLE_VALUE

and its optimizer slot 'm' under

  model/stack/pipeline/layer_3/body/w/.OPTIMIZER_SLOT/optimizer/m/.ATTRIBUTES/VARIABLE_VALUE

A checkpoint restores only into a model with exactly its variables, shapes
and dtypes (and slots, unless they are reset): anything else stops the run
with one line, before any step, and leaves the checkpoint as it is.
Checkpoints of earlier versions keyed the model by its attribute path, with
the pipeline's cells in it ('stack/pipeline/cell_1/sub/0/...'); their list
indices (all-digit path parts, which a layer or variable name can never be)
tell them apart.
"""

import dataclasses
import os
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

import tensorflow as tf

MODEL_PREFIX = 'model/'
VALUE_SUFFIX = '/.ATTRIBUTES/VARIABLE_VALUE'
SLOT_INFIX = '/.OPTIMIZER_SLOT/optimizer/'
GLOBAL_STEP_KEY = 'global_step' + VALUE_SUFFIX
CONVERT_COMMAND = 'lingvo_pipe_checkpoint convert'
# Names shown per kind of difference in the one-line message.
_SHOWN = 3


class CheckpointError(RuntimeError):
  """A checkpoint cannot be restored; the message (one line) says which
  and what to do."""


class CheckpointMismatchError(CheckpointError):
  """The checkpoint is readable but holds other variables, shapes or dtypes
  than the model; it is not damaged and is left as it is."""


class OldFormatError(CheckpointMismatchError):
  """The checkpoint was written by an earlier version (cell-indexed names)."""


@dataclasses.dataclass(frozen=True)
class Spec:
  """A tensor's shape and dtype."""
  shape: Tuple[int, ...]
  dtype: tf.DType

  def __str__(self) -> str:
    return f'{self.dtype.name}{list(self.shape)}'


def VariableKey(path: str) -> str:
  return f'{MODEL_PREFIX}{path}{VALUE_SUFFIX}'


def SlotKey(path: str, slot: str) -> str:
  return f'{MODEL_PREFIX}{path}{SLOT_INFIX}{slot}{VALUE_SUFFIX}'


def ParseModelKey(key: str) -> Optional[Tuple[str, Optional[str]]]:
  """(variable path, slot name or None) of a `model/...` value key; None
  for any other key."""
  if not key.startswith(MODEL_PREFIX) or not key.endswith(VALUE_SUFFIX):
    return None
  inner = key[len(MODEL_PREFIX):-len(VALUE_SUFFIX)]
  if SLOT_INFIX in inner:
    path, slot = inner.split(SLOT_INFIX, 1)
    return path, slot
  if '/.' in inner:  # some other attribute of a tracked object
    return None
  return inner, None


def IsOldFormatPath(path: str) -> bool:
  """Whether a variable path is an object-graph path of an earlier version:
  a list index as one of its parts (layer and variable names are
  identifiers, so they never are all digits)."""
  return any(part.isdigit() for part in path.split('/'))


def ModelSpecs(variables: Mapping[str, tf.Variable],
               slot_names: Iterable[str]) -> Tuple[Dict[str, Spec], Dict[str, Spec]]:
  """The keys a checkpoint of this model holds: ({variable key: spec},
  {slot key: spec}); slots of the trainable variables only (the ones the
  optimizer updates)."""
  slot_names = list(slot_names)
  values, slots = {}, {}
  for path, var in variables.items():
    spec = Spec(tuple(var.shape.as_list()), var.dtype.base_dtype)
    values[VariableKey(path)] = spec
    if var.trainable:
      for slot in slot_names:
        slots[SlotKey(path, slot)] = spec
  return values, slots


def CheckpointSpecs(path: str) -> Dict[str, Spec]:
  """{key: spec} of every tensor in the checkpoint at prefix `path`."""
  reader = tf.train.load_checkpoint(path)
  dtypes = reader.get_variable_to_dtype_map()
  return {key: Spec(tuple(shape), dtypes[key])
          for key, shape in reader.get_variable_to_shape_map().items()}


@dataclasses.dataclass
class Differences:
  """How a checkpoint's keys of one kind differ from the model's."""
  missing: List[str]
  unexpected: List[str]
  reshaped: List[Tuple[str, Spec, Spec]]  # (key, checkpoint's, model's)

  def __bool__(self) -> bool:
    return bool(self.missing or self.unexpected or self.reshaped)


def Compare(checkpoint: Mapping[str, Spec], model: Mapping[str, Spec]) -> Differences:
  missing = [k for k in model if k not in checkpoint]
  unexpected = sorted(k for k in checkpoint if k not in model)
  reshaped = [(k, checkpoint[k], spec) for k, spec in model.items()
              if k in checkpoint and checkpoint[k] != spec]
  return Differences(missing, unexpected, reshaped)


def CheckMatches(path: str, variables: Mapping[str, tf.Variable],
                 slot_names: Iterable[str], reset_slots: bool) -> None:
  """Raises unless the checkpoint at prefix `path` holds exactly the
  model's variables (and their optimizer slots, unless `reset_slots`),
  with their shapes and dtypes.

  Raises:
    OldFormatError: for a checkpoint of an earlier version.
    CheckpointMismatchError: naming the counts and the first missing,
      unexpected and reshaped names, and what to do.
  """
  in_checkpoint = CheckpointSpecs(path)
  values, slots = ModelSpecs(variables, slot_names)
  ckpt_values: Dict[str, Spec] = {}
  ckpt_slots: Dict[str, Spec] = {}
  for key, spec in in_checkpoint.items():
    parsed = ParseModelKey(key)
    if parsed is not None:
      (ckpt_values if parsed[1] is None else ckpt_slots)[key] = spec
  name = DisplayName(path)
  old = OldFormatPaths(ckpt_values)
  if old:
    raise OldFormatError(
        f'Checkpoint {name} was written by an earlier version: its variables are '
        f'named by pipeline cell (e.g. {old[0]}), and would load into the wrong '
        f'layers or not at all. It was not changed. Convert it into a new logdir '
        f'with: {CONVERT_COMMAND} --model=MODEL {LogdirOf(path)} NEW_LOGDIR (MODEL: '
        'the --model it was trained with; the params come from its params.txt), '
        'then run with --logdir=NEW_LOGDIR.')
  model_diff = Compare(ckpt_values, values)
  slot_diff = Differences([], [], []) if reset_slots else Compare(ckpt_slots, slots)
  if not model_diff and not slot_diff:
    return
  # Slots follow their variables: while variables differ, only they are named.
  if model_diff:
    what = 'variables: ' + _Describe(model_diff, len(values))
    params_txt = os.path.join(LogdirOf(path), 'params.txt')
    hint = ''
    if os.path.exists(params_txt):
      trained_as = _TrainedTask(params_txt)
      hint = (f' (--model_params_file_override={params_txt}' +
              (f', with a --model whose task is {trained_as}' if trained_as else '') + ')')
    fix = ('Run with the params it was trained with' + hint +
           ', pick another --logdir to train this model from scratch, or start '
           'one from this checkpoint with trainer.init_from_checkpoint_rules')
  else:
    what = 'optimizer slots: ' + _Describe(slot_diff, len(slots))
    fix = ('Run with the optimizer it was trained with (trainer.optimizer), or '
           'set trainer.reset_optimizer_state=True to restore the model and '
           'start the optimizer slots afresh')
  raise CheckpointMismatchError(
      f'Checkpoint {name} does not match the model ({what}). '
      f'The checkpoint is intact and was not changed. {fix}.')


def _TrainedTask(params_txt: str) -> str:
  """The task class a params.txt names (task.cls); '' if it names none or
  cannot be read."""
  try:
    with open(params_txt) as f:
      for line in f:
        if line.startswith('task.cls :'):
          return line.split(':', 1)[1].strip().removeprefix("cls('").removesuffix("')")
  except OSError:
    pass
  return ''


def _Describe(diff: Differences, total: int) -> str:
  """'2 of 36 missing (a, b), 1 unexpected (c), 1 reshaped (d: ... vs ...)'."""
  out = []
  if diff.missing:
    out.append(f'{len(diff.missing)} of {total} missing from it '
               f'({_Names([k for k in diff.missing])})')
  if diff.unexpected:
    out.append(f'{len(diff.unexpected)} unexpected, not in the model '
               f'({_Names(diff.unexpected)})')
  if diff.reshaped:
    shown = ', '.join(f'{ShortName(k)}: checkpoint {c}, model {m}'
                      for k, c, m in diff.reshaped[:_SHOWN])
    more = ', ...' if len(diff.reshaped) > _SHOWN else ''
    out.append(f'{len(diff.reshaped)} with another shape or dtype ({shown}{more})')
  return ', '.join(out)


def _Names(keys: List[str]) -> str:
  shown = ', '.join(ShortName(k) for k in keys[:_SHOWN])
  return shown + (', ...' if len(keys) > _SHOWN else '')


def ShortName(key: str) -> str:
  """'stack/w' for a model value key, 'stack/w (slot m)' for a slot key,
  else the key itself."""
  parsed = ParseModelKey(key)
  if parsed is None:
    return key
  path, slot = parsed
  return path if slot is None else f'{path} (slot {slot})'


def DisplayName(path: str) -> str:
  """'ckpt-8 in logdir/checkpoints' for checkpoint prefix `path`."""
  return f'{os.path.basename(path)} in {os.path.dirname(path) or "."}'


def LogdirOf(path: str) -> str:
  """The trainer's logdir of a checkpoint prefix (logdir/checkpoints/ckpt-N)."""
  directory = os.path.dirname(os.path.abspath(path))
  if os.path.basename(directory) == 'checkpoints':
    return os.path.dirname(directory)
  return directory


def SlotNamesOf(optimizer_factory: Callable[[], Any]) -> List[str]:
  """The slot names an optimizer creates per variable, found by letting
  one from `optimizer_factory()` update a throwaway variable (slots are
  created lazily, at the first update)."""
  probe = tf.Variable([0.0], name='slot_probe')
  optimizer = optimizer_factory()
  optimizer.apply_gradients([(tf.zeros([1]), probe)])
  return sorted(optimizer.get_slot_names())


def OldFormatPaths(keys: Iterable[str]) -> List[str]:
  """The model variable paths among `keys` that are of an earlier version."""
  out = []
  for key in keys:
    parsed = ParseModelKey(key)
    if parsed and parsed[1] is None and IsOldFormatPath(parsed[0]):
      out.append(parsed[0])
  return out
