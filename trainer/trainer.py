"""The trainer binary: runs a registered experiment, or one of the user's.

  lingvo_pipe_trainer --model=lm.StdlibBytesGPipe --logdir=/tmp/lm \\
      --mode=train_and_eval
  lingvo_pipe_trainer --model=my_exps.MlpGPipe --mode=train   # ./my_exps.py

The modes are --mode's (its help names each). This file holds the flags and the table of
modes; each mode is a module of trainer/ that reads one RunContext (trainer/run_context.py).
User errors (unknown model, bad override, unwritable logdir, missing data) end the program
with one line on stderr and exit code 2, without a traceback. SIGTERM and SIGINT end training after the step under way with a checkpoint at that
step (exit code 128 + the signal); see docs/reliability.md.
"""

import dataclasses
import importlib
import os
import signal
import sys
import textwrap
from typing import Callable, Dict, List, TypeVar

# TensorFlow's C++ log lines stay off the terminal unless the user sets
# TF_CPP_MIN_LOG_LEVEL or passes --tf_cpp_logs (see _QuietCppLogs).
_USER_TF_CPP_MIN_LOG_LEVEL = os.environ.get('TF_CPP_MIN_LOG_LEVEL', '')
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
from absl import logging

from trainer import lingvo_flags  # pylint: disable=g-import-not-at-top
from trainer import quiet_logs  # pylint: disable=g-import-not-at-top

_ABSL_FLAGS = frozenset(flags.FLAGS)
_T = TypeVar('_T')

# Mode -> the module under trainer/ whose Run(ctx) handles it. Named, not
# imported here: modules that import TensorFlow load only after the C++ log
# filter is on (_QuietCppLogs).
MODES: Dict[str, str] = {
    'train': 'trainer.train_mode',
    'eval': 'trainer.train_mode',
    'train_and_eval': 'trainer.train_mode',
    'evaler': 'trainer.follow_mode',
    'decoder': 'trainer.follow_mode',
    'inspect_params': 'trainer.inspect_mode',
    'inspect_model': 'trainer.inspect_mode',
    'profile': 'trainer.profile_mode',
    'decode': 'trainer.decode_mode',
    'export': 'trainer.decode_mode',
    'worker': 'trainer.worker_mode',
    'tune': 'trainer.tune_mode',
}
# Modes that run without an experiment (--model is not read).
_WITHOUT_EXPERIMENT = frozenset({'worker'})

FLAGS = flags.FLAGS
flags.DEFINE_string('model', 'lm.StdlibBytesGPipe', 'Registered experiment key (any unique '
                    'dotted suffix works), or pkg.module.ClassName of an experiment in your '
                    'own module: pkg.module is imported from the working directory or PYTHONPATH.')
flags.DEFINE_multi_string('import', [], 'A module to import before looking up --model (its '
                          'experiments register themselves); repeatable. Found in the '
                          'working directory or on PYTHONPATH.')
flags.DEFINE_string('logdir', '', 'Checkpoints, summaries and params.txt go '
                    'here; default /tmp/lingvo_pipe/<model>.')
flags.DEFINE_enum('mode', 'train_and_eval', list(MODES),
                  'What to do: train, eval (the newest checkpoint), train_and_eval, evaler and '
                  "decoder (as Lingvo's jobs: each checkpoint in --logdir as it is written, until "
                  "--max_steps), inspect_params, inspect_model (cells, devices, costs, the planner's "
                  'table), profile (a timeline of one step, nothing trained), decode, export (a '
                  'SavedModel), worker (serve as task --task of --cluster_spec on a port open to '
                  'anyone who reaches it: docs/several_machines.md#security), tune (the fastest '
                  'layout within --memory_budget_mb, measured: docs/tuning.md).')
flags.DEFINE_string('model_params_override', '', 'Overrides such as '
                    "\"trainer.max_steps=100; task.stack.model_dim=64\" (items "
                    "separated by ';' or newlines; Lingvo's key : value works too).")
flags.DEFINE_string('model_params_file_override', '', 'A file of "key : value" '
                    'lines (the params.txt format) applied before '
                    '--model_params_override.')
flags.DEFINE_integer('max_steps', 0, "Stop at this global step (0: the experiment's "
                     'trainer.max_steps). The learning-rate schedule still follows '
                     'trainer.max_steps, so a run stopped early and resumed equals one run.')
flags.DEFINE_integer('seed', -1, 'Random seed (-1: the experiment\'s).')
flags.DEFINE_integer('num_logical_devices', 0, 'Logical CPU devices to create when there is '
                     "no accelerator (0: as many as the model's pipelines need, at least 1).")
flags.DEFINE_string('cluster_spec', '', 'The cells\' worker tasks, '
                    '"worker=host:port,host:port" (default: TF_CONFIG\'s '
                    'cluster, if set; empty: cells on local devices).')
flags.DEFINE_integer('task', -1, 'With --mode=worker: this worker\'s task '
                     'index (default: TF_CONFIG\'s task index).')
flags.DEFINE_integer('worker_threads', 0, 'With --mode=worker: intra-op '
                     'threads of the worker (0: TensorFlow\'s default).')
flags.DEFINE_bool('trust_cluster_network', False, 'Let a worker, or a client of its cluster, '
                  "open TensorFlow's port where --cluster_spec names addresses beyond "
                  'loopback. That port listens on every interface and authenticates and '
                  'encrypts nothing: whoever reaches it runs code in the process. Pass it '
                  'only on a private network or behind a firewall that admits only the '
                  "cluster's machines (docs/several_machines.md#security).")
flags.DEFINE_float('worker_timeout_s', 20.0, 'With a cluster: end the run with an error '
                   'naming the worker when one does not answer for this long (checked all '
                   'along the run, whatever the step time), and wait this long for the '
                   'workers to come up.')
flags.DEFINE_bool('tf_cpp_logs', False, "Show TensorFlow's C++ log lines (INFO and up). Without "
                  'it only FATAL ones show, or those at and above TF_CPP_MIN_LOG_LEVEL if set.')
flags.DEFINE_integer('planner_budget_mb', 1024, "inspect_model: each device's memory, MiB.")
flags.DEFINE_integer('memory_budget_mb', 0, "tune: memory of each device in MiB (0: the host's).")
flags.DEFINE_integer('sample_bytes', 200, 'After train_and_eval of a language model, print '
                     'a sample of this many bytes (0: none).')
flags.DEFINE_string('decode_prompt', '', 'In --mode=decode, decode this text (one example per '
                    'line: a sentence to translate, a prompt to continue), not the dev split.')
flags.DEFINE_bool('export_keep_devices', False, "In --mode=export, keep each pipeline cell's "
                  'device placement in the SavedModel (default: cleared, so it runs on '
                  'whatever devices the loader has).')

_OWN_FLAGS = [name for name in FLAGS if name not in _ABSL_FLAGS]
_HELP_ARGS = frozenset({'--help', '-help', '-h', '-?', '--helpshort', '-helpshort'})


def _QuietCppLogs() -> None:
  """Filters TensorFlow's C++ log lines below the level the user chose
  (--tf_cpp_logs: all; else TF_CPP_MIN_LOG_LEVEL if set; else FATAL only)."""
  level = 3
  if FLAGS.tf_cpp_logs:
    level = 0
  elif _USER_TF_CPP_MIN_LOG_LEVEL.strip().isdigit():
    level = min(int(_USER_TF_CPP_MIN_LOG_LEVEL), 3)
  os.environ['TF_CPP_MIN_LOG_LEVEL'] = str(level)
  quiet_logs.FilterCppLogs(level)


def _Options(options_cls: Callable[..., _T]) -> _T:
  """The flags as run_context.Options (the class passed in: see Main)."""
  names = [f.name for f in dataclasses.fields(options_cls)]  # type: ignore[arg-type]
  values = {n: FLAGS[n].value for n in names if n != 'imports'}
  return options_cls(imports=tuple(FLAGS['import'].value or ()), **values)


def Main(argv: List[str]) -> None:
  """Filters TensorFlow's C++ log lines, then runs Execute (its status)."""
  del argv
  _QuietCppLogs()
  if FLAGS.mode == 'tune':  # the allocator's peaks (tune_mode); before TensorFlow starts
    os.environ.setdefault('TF_CPU_ALLOCATOR_USE_BFC', 'true')
  logging.set_verbosity(logging.WARNING)
  status = Execute()
  if status:
    sys.exit(status)


def Execute() -> int:
  """Builds the run context from the parsed flags once and hands it to the
  mode's module; returns the exit status (2 after a UserError's one line).
  Imports run_context only now: Main's filter must catch TensorFlow's start-up lines."""
  from trainer import run_context  # pylint: disable=g-import-not-at-top
  ctx = None
  try:
    ctx = run_context.Build(_Options(run_context.Options),
                            FLAGS.mode not in _WITHOUT_EXPERIMENT)
    importlib.import_module(MODES[FLAGS.mode]).Run(ctx)
  except run_context.UserError as e:
    if ctx is not None:
      ctx.RemoveUnusedLogdir()
    print(f'error: {e}', file=sys.stderr)
    return 2
  except KeyboardInterrupt:
    # Ctrl-C outside the parts that stop gracefully (training, decoding):
    # while starting up, nothing is half-written that a traceback explains.
    print(f'Interrupted (SIGINT) during --mode={FLAGS.mode}.', file=sys.stderr)
    return 128 + signal.SIGINT
  return 0


def Usage() -> str:
  """--help: this program's doc and its own flags (absl's: --helpfull)."""
  lines = [__doc__.strip(), '', 'Flags:']
  for name in _OWN_FLAGS:
    flag = FLAGS[name]
    default = '' if flag.default in (None, '', []) else f' (default: {flag.default_as_str})'
    text = ' '.join(f'{flag.help}{default}'.split())  # absl's additions rewrapped
    lines.append(textwrap.fill(f'  --{name}: {text}', width=78,
                               subsequent_indent='      '))
  lines.append('\nabsl\'s own flags (logging, flagfile): --helpfull.')
  return '\n'.join(lines)


def Run() -> None:
  """Console-script entry point."""
  if _HELP_ARGS.intersection(sys.argv[1:]):
    print(Usage())
    sys.exit(0)
  refusal = lingvo_flags.Refusal(sys.argv[1:])
  if refusal:
    print(f'error: {refusal}', file=sys.stderr)
    sys.exit(2)
  app.run(Main)


if __name__ == '__main__':
  Run()
