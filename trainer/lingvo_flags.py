"""Lingvo's trainer flags that this trainer does not take, each with what to
pass instead: a Lingvo command line gets one line naming the replacement,
not absl's "unknown flag"."""

from typing import Dict, List, Optional, Tuple

_PLACEMENT = ("cells are placed by the pipeline's params (num_partitions, devices) "
              'on local devices, or on the workers of --cluster_spec: drop it')
_NO_TPU = 'TPUs are not supported, ' + _PLACEMENT
_TRAIN = 'pass --mode=train (or train_and_eval, which also evaluates)'
_INSPECT = 'pass --mode=inspect_params (its dev and test entries are the eval inputs)'

# Lingvo flag -> what to do instead.
_INSTEAD: Dict[str, str] = {
    'run_locally': 'a run is local unless --cluster_spec names worker tasks: drop it',
    'job': ("one process runs what Lingvo's jobs did: --mode=train for the trainer, "
            'evaler for an evaler beside it (eval: the newest checkpoint once), decoder '
            'for a decoder beside it (decode: once), train_and_eval for trainer and '
            'evaler in one; a worker '
            'task of --cluster_spec is --mode=worker'),
    'tpu': _NO_TPU,
    'worker_gpus': _PLACEMENT,
    'worker_tpus': _NO_TPU,
    'worker_split_size': _PLACEMENT,
    'worker_replicas': ("data-parallel replicas are the pipeline's num_replicas, e.g. "
                        "--model_params_override='task.stack.pipeline.num_replicas=2' "
                        '(--mode=inspect_params lists where the pipeline is)'),
    'ps_gpus': 'variables live on their cells\' devices, no parameter server: drop it',
    'controller_gpus': _PLACEMENT,
    'evaler_gpus': _PLACEMENT,
    'decoder_gpus': _PLACEMENT,
    'saver_max_to_keep': ("--model_params_override='trainer.max_checkpoints_to_keep=N' "
                          '(the experiment\'s trainer params)'),
}

# Lingvo's --mode values -> this trainer's.
_MODES: Dict[str, str] = {
    'sync': _TRAIN,
    'async': _TRAIN,
    'shell': 'pass --mode=inspect_params or --mode=inspect_model',
    'inspect_evaler': _INSPECT,
    'inspect_decoder': _INSPECT,
    'write_inference_graph': "pass --mode=export (a SavedModel of the task's inference function)",
}


def _Flags(argv: List[str]) -> List[Tuple[str, Optional[str]]]:
  """(name, value or None) of each flag in `argv`, '--a=b', '-a b' or '--a'."""
  out = []
  for i, arg in enumerate(argv):
    if not arg.startswith('-') or arg in ('-', '--'):
      continue
    name, eq, value = arg.lstrip('-').partition('=')
    if not eq:
      following = argv[i + 1] if i + 1 < len(argv) else None
      value = following if following is not None and not following.startswith('-') else ''
    out.append((name, value if eq or value else None))
  return out


def Refusal(argv: List[str]) -> Optional[str]:
  """The error line naming every flag of Lingvo's trainer in `argv`
  (program name excluded) that this one does not take, and what to pass
  instead; None if there is none."""
  found = []
  for name, value in _Flags(argv):
    if name in _INSTEAD:
      found.append(f'--{name}: {_INSTEAD[name]}')
    elif name == 'mode' and value in _MODES:
      found.append(f'--mode={value}: {_MODES[value]}')
  if not found:
    return None
  return "Lingvo's trainer flags, which this trainer does not take: " + '; '.join(found) + '.'
