"""Restores the newest readable checkpoint, falling back past damaged ones.

tf.train.CheckpointManager writes each checkpoint whole before it records
it in the `checkpoint` state file (itself replaced atomically), so a
process killed mid-save leaves only unrecorded files. What it does not
handle is written here: leftover temporary files are removed, a damaged
or missing state file is rebuilt from the checkpoints on disk (never a
silent start from scratch over them), and a recorded checkpoint whose files
are truncated or garbled is set aside (renamed `*.damaged`) in favour of
the previous readable one. A readable checkpoint that does not match the
model (checkpoint_keys.CheckMatches) is not damaged: the run stops and
nothing is changed. Read-only restores (eval, decode, export, profile)
change nothing in the directory at all. Save writes one (the trainer's and
the converter's saves).
"""

import contextlib
import glob
import logging
import os
import re
import shutil
import time
from typing import Callable, Iterator, List, Optional, Tuple

import tensorflow as tf

from trainer.checkpointing import checkpoint_keys

STATE_FILE = 'checkpoint'
DAMAGED_SUFFIX = '.damaged'
_NUMBERED = re.compile(r'^(.*-(\d+))\.index$')


# No recorded checkpoint is readable, or the newest readable one does not
# match the model (checkpoint_keys.CheckpointMismatchError); one line.
CheckpointError = checkpoint_keys.CheckpointError


@contextlib.contextmanager
def _QuietTfLogger() -> Iterator[None]:
  """TensorFlow's Python logger at ERROR (its warnings about a bad state
  file would come on top of the one line the trainer prints)."""
  logger = tf.get_logger()
  level = logger.level
  logger.setLevel(logging.ERROR)
  try:
    yield
  finally:
    logger.setLevel(level)


class _SaverRetracing(logging.Filter):
  """Drops TensorFlow's retracing warning about its checkpoint saver."""

  def filter(self, record: logging.LogRecord) -> bool:
    return 'MultiDeviceSaver.save.<locals>.tf_function_save' not in record.getMessage()


def Save(manager: tf.train.CheckpointManager, step: int) -> str:
  """manager.save at `step`, returning its path. With variables on several
  worker tasks TensorFlow's saver traces a new function on every save, by
  its design; from the fifth save on it warned of its own retracing, which
  says nothing about the model, so the warning is dropped."""
  logger = tf.get_logger()
  quiet = _SaverRetracing()
  logger.addFilter(quiet)
  try:
    return manager.save(checkpoint_number=step)
  finally:
    logger.removeFilter(quiet)


def CleanLeftovers(directory: str) -> List[str]:
  """Removes what an interrupted save leaves: `<prefix>_temp` directories
  (sharded writes) with the files of `<prefix>` itself (a merge cut short),
  `checkpoint.tmp*` files (the state file's atomic write), and checkpoints
  newer than the newest the state file records (never recorded, so never
  known to be whole). Returns the names removed."""
  paths = glob.glob(os.path.join(directory, '*_temp*')) + glob.glob(
      os.path.join(directory, STATE_FILE + '.tmp*'))
  for temp in glob.glob(os.path.join(directory, '*_temp')):
    paths += _Files(temp[:-len('_temp')])
  state = _State(directory)
  if state is not None and state.model_checkpoint_path:
    newest = _Number(state.model_checkpoint_path)
    for prefix in OnDisk(directory):
      if newest is not None and (_Number(prefix) or 0) > newest:
        paths += _Files(prefix)
  removed = []
  for path in sorted(set(paths)):
    if not os.path.lexists(path):
      continue
    if os.path.isdir(path) and not os.path.islink(path):
      shutil.rmtree(path, ignore_errors=True)
    else:
      os.remove(path)
    removed.append(os.path.basename(path))
  return removed


def _Files(prefix: str) -> List[str]:
  """The files of checkpoint `prefix` (not those set aside as damaged)."""
  return [f for f in glob.glob(glob.escape(prefix) + '.*')
          if not f.endswith(DAMAGED_SUFFIX)]


def _Number(prefix: str) -> Optional[int]:
  match = re.search(r'-(\d+)$', prefix)
  return int(match.group(1)) if match else None


def OnDisk(directory: str) -> List[str]:
  """Prefixes of the numbered checkpoints with an index file, oldest first."""
  found: List[Tuple[int, str]] = []
  for path in glob.glob(os.path.join(glob.escape(directory), '*.index')):
    match = _NUMBERED.match(path)
    if match:
      found.append((int(match.group(2)), match.group(1)))
  return [prefix for _, prefix in sorted(found)]


def Resolve(path: str) -> Optional[str]:
  """The checkpoint prefix `path` names: the newest checkpoint of a
  checkpoints directory or of a logdir's `checkpoints` (the newest recorded
  one, or without a readable state file the highest-numbered on disk), or
  `path` itself if it is a prefix (has a .index file); None if none."""
  for directory in (path, os.path.join(path, 'checkpoints')):
    if os.path.isdir(directory):
      newest = tf.train.latest_checkpoint(directory)
      on_disk = OnDisk(directory)
      if newest or on_disk:
        return newest or on_disk[-1]
  if tf.io.gfile.exists(path + '.index'):
    return path
  return None


def _State(directory: str):
  with _QuietTfLogger():
    return tf.train.get_checkpoint_state(directory)


def Recorded(directory: str) -> List[str]:
  """The checkpoints the state file records as saved, oldest first (none
  without a readable state file): what a reader beside the trainer may read."""
  state = _State(directory)
  return list(state.all_model_checkpoint_paths) if state else []


def _WriteState(directory: str, paths: List[str], timestamps: Optional[List[float]],
                last_preserved: Optional[float]) -> None:
  tf.compat.v1.train.update_checkpoint_state(
      directory, paths[-1], all_model_checkpoint_paths=paths,
      all_model_checkpoint_timestamps=timestamps,
      last_preserved_timestamp=last_preserved)


def RepairState(directory: str, log: Callable[[str], None]) -> None:
  """Rebuilds the state file from the checkpoints on disk when it is
  missing or unreadable while checkpoints exist; a damaged one is kept as
  `checkpoint.damaged`."""
  if _State(directory) is not None:
    return
  on_disk = OnDisk(directory)
  if not on_disk:
    return
  state_path = os.path.join(directory, STATE_FILE)
  what = 'missing'
  if os.path.exists(state_path):
    os.replace(state_path, state_path + DAMAGED_SUFFIX)
    what = f'unreadable (kept as {STATE_FILE}{DAMAGED_SUFFIX})'
  now = time.time()
  _WriteState(directory, on_disk, [now] * len(on_disk), now)
  log(f'The checkpoint state file in {directory} was {what}; rebuilt it from the '
      f'{len(on_disk)} checkpoint(s) on disk, newest '
      f'{os.path.basename(on_disk[-1])}.')


def Problem(path: str) -> Optional[str]:
  """Why the checkpoint at prefix `path` cannot be read (None: readable).

  Reads every tensor, so the checksums of all of them are checked (the
  dataset iterator's variant state is checked when it is restored).
  """
  try:
    reader = tf.train.load_checkpoint(path)
    for key, dtype in reader.get_variable_to_dtype_map().items():
      if dtype != tf.variant:
        reader.get_tensor(key)
  except Exception as e:  # pylint: disable=broad-except
    # A damaged file fails in many ways (DataLossError, OpError, IndexError,
    # ValueError, ...); each is a reason to fall back, reported as such.
    return _Reason(e)
  return None


def _Reason(e: Exception) -> str:
  first = (str(e).strip().splitlines() or [''])[0]
  first = re.sub(r'^\{\{function_node [^}]*\}\}\s*', '', first)
  return f'{type(e).__name__}: {first[:160]}'


def _SetAside(path: str) -> None:
  """Renames the files of checkpoint prefix `path` to `*.damaged`."""
  for name in _Files(path):
    os.replace(name, name + DAMAGED_SUFFIX)


def _Recorded(directory: str, read_only: bool,
              log: Callable[[str], None]) -> Tuple[List[str], List[float], Optional[object]]:
  """(recorded checkpoint prefixes oldest first, their timestamps, the
  state); with read_only, a missing or unreadable state file is read past
  (the checkpoints on disk) instead of rebuilt."""
  if not read_only:
    removed = CleanLeftovers(directory)
    if removed:
      log(f'Removed leftovers of an interrupted save: {", ".join(removed)}.')
    RepairState(directory, log)
  state = _State(directory)
  if state is None:
    return (OnDisk(directory) if read_only else []), [], None
  paths = list(state.all_model_checkpoint_paths) or [state.model_checkpoint_path]
  if state.model_checkpoint_path not in paths:
    paths.append(state.model_checkpoint_path)
  return paths, list(state.all_model_checkpoint_timestamps), state


def RestoreNewestReadable(checkpoint: tf.train.Checkpoint, directory: str,
                          log: Callable[[str], None],
                          check: Optional[Callable[[str], tf.train.Checkpoint]] = None,
                          read_only: bool = False) -> Optional[str]:
  """Restores the newest readable recorded checkpoint in `directory`.

  Damaged newer ones are reported (one line each), set aside and dropped
  from the state file, so later saves and restarts do not meet them again.

  Args:
    checkpoint: what to restore into; every object it holds must be in the
      checkpoint (optimizer slots are restored when they are created).
    directory: the checkpoint directory.
    log: prints one line.
    check: called with the prefix of the readable candidate before it is
      restored; returns what to restore it into (instead of `checkpoint`),
      or raises checkpoint_keys.CheckpointMismatchError if it does not fit
      the model (that stops the restore: no fallback, no change).
    read_only: change nothing in `directory` (no leftovers removed, no state
      file rebuilt, damaged checkpoints only skipped): eval, decode, export
      and profile.

  Returns:
    The restored checkpoint's prefix, or None if `directory` holds none.

  Raises:
    CheckpointError: if checkpoints are recorded but none is readable
      (nothing is renamed then), or the newest readable one does not match
      the model (CheckpointMismatchError; nothing is renamed either).
  """
  if not os.path.isdir(directory):
    return None
  paths, timestamps, state = _Recorded(directory, read_only, log)
  if not paths:
    return None
  damaged: List[Tuple[str, str]] = []
  for index in range(len(paths) - 1, -1, -1):
    path = paths[index]
    reason = Problem(path)
    if reason is None:
      reason = _Restore(checkpoint if check is None else check(path), path)
    if reason is not None:
      damaged.append((path, reason))
      log(f'Checkpoint {os.path.basename(path)} is damaged ({reason}); '
          'falling back to the previous one.')
      continue
    if damaged and read_only:
      log(f'Fell back to {os.path.basename(path)}; left '
          f'{", ".join(os.path.basename(b) for b, _ in damaged)} untouched '
          '(this mode changes no checkpoint; the next training run sets them aside).')
    elif damaged:
      for bad, _ in damaged:
        _SetAside(bad)
      kept = paths[:index + 1]
      _WriteState(directory, kept,
                  timestamps[:index + 1] if len(timestamps) == len(paths) else None,
                  getattr(state, 'last_preserved_timestamp', None) or None)
      log(f'Fell back to {os.path.basename(path)}; set aside '
          f'{", ".join(os.path.basename(b) for b, _ in damaged)} as *{DAMAGED_SUFFIX}.')
    return path
  raise CheckpointError(
      f'No readable checkpoint in {directory}: ' +
      '; '.join(f'{os.path.basename(p)} ({r})' for p, r in damaged) +
      '. Move the directory away (or pick another --logdir) to start from scratch.')


def _Restore(checkpoint: tf.train.Checkpoint, path: str) -> Optional[str]:
  """Restores `path` into `checkpoint`; returns why that failed (damage,
  e.g. of the iterator's state, which is read only here), or None.

  Raises:
    CheckpointMismatchError: if an object of `checkpoint` is not in it.
  """
  try:
    status = checkpoint.restore(path)
  except Exception as e:  # pylint: disable=broad-except
    return _Reason(e)
  try:
    status.assert_existing_objects_matched()
  except AssertionError as e:
    status.expect_partial()  # the refusal says it all; no warnings at exit
    names = re.findall(r"<tf\.Variable '([^']+)'", str(e))
    missing = f'no value for {", ".join(sorted(names))}' if names else _Reason(e)
    raise checkpoint_keys.CheckpointMismatchError(
        f'Checkpoint {checkpoint_keys.DisplayName(path)} lacks part of '
        f'the training state ({missing}); it is intact and was not changed. '
        'Run with the trainer params it was trained with (e.g. the same '
        'trainer.loss_scaling).') from None
  # The model's variables were checked key by key (`check`) and all matched
  # above. Optimizer slots are created before the first step's trace and
  # restored then; modes that never train (eval) would otherwise warn about
  # them at exit.
  status.expect_partial()
  return None


# In the logdir: the step of the checkpoint whose optimizer slots
# trainer.reset_optimizer_state discarded. Checkpoints after it hold the
# new slots, so a restarted run keeps them.
OPTIMIZER_RESET_FILE = 'optimizer_reset_step.txt'


def ResetsOptimizer(path: str, logdir: str) -> bool:
  """Whether trainer.reset_optimizer_state still applies to checkpoint
  `path`: no reset yet, or none saved since (the run was stopped first)."""
  try:
    with open(os.path.join(logdir, OPTIMIZER_RESET_FILE)) as f:
      done = int(f.read().split()[0])
  except (OSError, ValueError, IndexError):
    return True
  return (_Number(path) or 0) <= done


def RecordOptimizerReset(path: str, logdir: str) -> None:
  """Notes that the slots of checkpoint `path` were reset (ResetsOptimizer)."""
  target = os.path.join(logdir, OPTIMIZER_RESET_FILE)
  with open(target + '.tmp', 'w') as f:
    f.write(f'{_Number(path) or 0}\n')
  os.replace(target + '.tmp', target)
