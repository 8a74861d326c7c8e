"""lingvo_pipe_checkpoint: look into a checkpoint, convert an old one.

  lingvo_pipe_checkpoint list PATH
      The model's variables (path, shape, dtype, optimizer slots) and the
      global step of checkpoint PATH: a prefix (logdir/checkpoints/ckpt-8),
      a checkpoints directory or a logdir (their newest checkpoint).
  lingvo_pipe_checkpoint convert --model=MODEL OLD_LOGDIR NEW_LOGDIR
      Writes the newest checkpoint of OLD_LOGDIR, written by an earlier
      version (variables named by pipeline cell), in today's format to
      NEW_LOGDIR/checkpoints, with the params of OLD_LOGDIR/params.txt
      (trainer/checkpointing/checkpoint_convert.py). OLD_LOGDIR is only read.

Errors are one `error: ...` line on stderr and exit status 2.
"""

import argparse
import os
import sys
from typing import Dict, List, Optional, Sequence


def _Quiet() -> None:
  """Keeps TensorFlow's C++ start-up lines off the terminal (as the trainer
  does, trainer/quiet_logs.py), unless the user set TF_CPP_MIN_LOG_LEVEL."""
  from trainer import quiet_logs  # pylint: disable=g-import-not-at-top
  text = os.environ.get('TF_CPP_MIN_LOG_LEVEL', '')
  level = min(int(text), 3) if text.strip().isdigit() else 3
  os.environ['TF_CPP_MIN_LOG_LEVEL'] = str(level)
  quiet_logs.FilterCppLogs(level)


class UsageError(Exception):
  """Reported as one line, exit status 2."""


def ListLines(path: str) -> List[str]:
  """The lines `list PATH` prints.

  Raises:
    UsageError: if PATH names no readable checkpoint.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from trainer.checkpointing import checkpoint_keys  # pylint: disable=g-import-not-at-top
  from trainer.checkpointing import checkpoints  # pylint: disable=g-import-not-at-top
  prefix = checkpoints.Resolve(path)
  if prefix is None:
    raise UsageError(f'No checkpoint at {path!r}: give a checkpoint prefix '
                     '(logdir/checkpoints/ckpt-N), a checkpoints directory or a logdir.')
  try:
    specs = checkpoint_keys.CheckpointSpecs(prefix)
    reader = tf.train.load_checkpoint(prefix)
    step = (int(reader.get_tensor(checkpoint_keys.GLOBAL_STEP_KEY))
            if checkpoint_keys.GLOBAL_STEP_KEY in specs else None)
  except Exception as e:  # pylint: disable=broad-except
    # A damaged file fails in many ways; report it, do not trace back.
    raise UsageError(f'Cannot read checkpoint {prefix}: {type(e).__name__}: '
                     f'{(str(e).strip().splitlines() or [""])[0][:200]}') from None
  variables: Dict[str, checkpoint_keys.Spec] = {}
  slots: Dict[str, List[str]] = {}
  other = []
  for key in sorted(specs):
    parsed = checkpoint_keys.ParseModelKey(key)
    if parsed is None and key != '_CHECKPOINTABLE_OBJECT_GRAPH':
      other.append(_Other(key, specs[key]))
    elif parsed is None:
      continue
    elif parsed[1] is None:
      variables[parsed[0]] = specs[key]
    else:
      slots.setdefault(parsed[0], []).append(parsed[1])
  lines = [f'{prefix}  global step {step if step is not None else "(none)"}']
  old = checkpoint_keys.OldFormatPaths(specs)
  if old:
    lines.append(f'Written by an earlier version (variables named by pipeline '
                 f'cell, e.g. {old[0]}): convert it with '
                 f'`{checkpoint_keys.CONVERT_COMMAND} --model=MODEL OLD_LOGDIR NEW_LOGDIR`.')
  width = max([len(p) for p in variables] + [len('variable')])
  lines.append(f'{"variable":<{width}}  {"shape":<14} {"dtype":<9} slots')
  values = 0
  for var_path, spec in variables.items():
    count = 1
    for dim in spec.shape:
      count *= dim
    values += count
    lines.append(f'{var_path:<{width}}  {str(list(spec.shape)):<14} '
                 f'{spec.dtype.name:<9} {",".join(slots.get(var_path, [])) or "-"}')
  slot_names = sorted({s for names in slots.values() for s in names})
  lines.append(f'{len(variables)} variables, {values:,} values; optimizer slots: '
               f'{", ".join(slot_names) or "none"}')
  lines.append('other: ' + ', '.join(other))
  return lines


def _Other(key: str, spec) -> str:
  """'optimizer/beta1_power float32[]' for an entry outside the model."""
  from trainer.checkpointing import checkpoint_keys  # pylint: disable=g-import-not-at-top
  if key.endswith(checkpoint_keys.VALUE_SUFFIX):
    return f'{key[:-len(checkpoint_keys.VALUE_SUFFIX)]} {spec}'
  return f'{key.split("/.ATTRIBUTES/")[0]} (input position)' if 'ITERATOR' in key else key


def Parser() -> argparse.ArgumentParser:
  """The command line of lingvo_pipe_checkpoint."""
  parser = argparse.ArgumentParser(
      prog='lingvo_pipe_checkpoint', description=__doc__.split('\n')[0])
  commands = parser.add_subparsers(dest='command', required=True)
  listing = commands.add_parser('list', help='Variables, shapes, dtypes, slots and '
                                'the step of a checkpoint.')
  listing.add_argument('path', help='A checkpoint prefix, checkpoints directory or logdir.')
  convert = commands.add_parser('convert', help='Writes a checkpoint of an earlier '
                                'version in today\'s format into a new logdir.')
  convert.add_argument('old_logdir', help='The old run\'s logdir (only read).')
  convert.add_argument('new_logdir', help='A new directory for the converted checkpoint.')
  convert.add_argument('--model', required=True, help='The registered experiment the '
                       'old run trained (its --model).')
  convert.add_argument('--model_params_file_override', default=None,
                       help='Params file of the old run (default: OLD_LOGDIR/params.txt).')
  convert.add_argument('--model_params_override', default='',
                       help='Overrides of the old run, applied after the params file.')
  return parser


def Main(argv: Optional[Sequence[str]] = None) -> int:
  """The console script: parses argv, keeps TensorFlow's C++ start-up lines
  off stderr, and runs the command; returns the exit status."""
  args = Parser().parse_args(argv)
  _Quiet()
  return Execute(args)


def Execute(args: argparse.Namespace) -> int:
  """Runs the command of parsed `args` (Parser) without touching stderr's
  file descriptor, so a Python caller keeps its own; returns the exit
  status (2 after a UsageError's one line)."""
  try:
    if args.command == 'list':
      print('\n'.join(ListLines(args.path)))
    else:
      from trainer.checkpointing import checkpoint_convert  # pylint: disable=g-import-not-at-top
      try:
        checkpoint_convert.ConvertLogdir(
            args.model, args.old_logdir, args.new_logdir,
            args.model_params_file_override, args.model_params_override, print)
      except (checkpoint_convert.ConvertError, ValueError) as e:
        raise UsageError(str(e)) from None
  except UsageError as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  return 0


def Run() -> None:
  """Console-script entry point."""
  sys.exit(Main())


if __name__ == '__main__':
  Run()
