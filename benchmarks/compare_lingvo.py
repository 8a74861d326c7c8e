"""Compares lingvo_pipe with Lingvo's GPipe (the peer harness) run by run.

For every configuration it runs our pipeline_bench and the peer's
benchmarks/lingvo_peer/bench.py in fresh processes, alternating (ours, peer,
ours, peer, ...), then writes the raw JSON and a markdown table of medians
and ours/peer ratios with the targets marked PASS/FAIL. Builds the peer venv
with benchmarks/lingvo_peer/setup.sh if it is missing.

  python -m benchmarks.compare_lingvo                        # default configs
  python -m benchmarks.compare_lingvo --configs=ffn:4:4 --repeats=1 --steps=2
"""

import json
import os
import pathlib
import subprocess
import sys
from typing import Dict, List, Tuple

from absl import app
from absl import flags

from benchmarks import analysis
from benchmarks import runner

FLAGS = flags.FLAGS
flags.DEFINE_list('configs', ['ffn:4:4', 'ffn:4:16', 'transformer:4:4', 'transformer:4:8'],
                  'workload:K:M of each pipelined configuration.')
flags.DEFINE_list('baselines', [], 'Workloads whose unpipelined baselines are '
                  'compared too, e.g. ffn,transformer.')
flags.DEFINE_integer('repeats', 3, 'Fresh-process runs per configuration and side.')
flags.DEFINE_integer('steps', 10, 'Measured steps per run.')
flags.DEFINE_integer('warmup', 3, 'Warm-up steps per run.')
flags.DEFINE_string('remat', 'per_cell', 'Our remat policy (Lingvo recomputes per cell).')
flags.DEFINE_string('peer_venv', os.environ.get('PEER_VENV', '/tmp/lingvo-peer-venv'),
                    'The peer venv; built with benchmarks/lingvo_peer/setup.sh '
                    'if it has no bin/python.')
flags.DEFINE_bool('peer_check', False, 'Let the peer run its equivalence check '
                  '(off: --no_check, as in the peer\'s BFC table; saves time).')
flags.DEFINE_float('timeout_s', 600, 'Per-run timeout.')
flags.DEFINE_string('out_dir', str(runner.REPO_ROOT / 'docs' / 'benchmarks'),
                    'Where compare_lingvo.json and compare_lingvo.md go.')

PEER_MODULE = 'benchmarks.lingvo_peer.bench'
SETUP_SCRIPT = runner.REPO_ROOT / 'benchmarks' / 'lingvo_peer' / 'setup.sh'
# Workload arguments of the peer (benchmarks/lingvo_peer/run_all.sh's FFN, TR).
PEER_WORKLOAD_ARGS = {
    'ffn': ('--workload', 'ffn', '--layers', '16', '--dim', '512', '--hidden', '2048',
            '--batch', '64'),
    'transformer': ('--workload', 'transformer', '--layers', '8', '--dim', '256',
                    '--heads', '4', '--hidden', '1024', '--batch', '16', '--seq', '64'),
}


def ParseConfig(text: str) -> Tuple[str, int, int]:
  """'ffn:4:16' -> ('ffn', 4, 16).

  Raises:
    ValueError: for a malformed spec or a workload the peer lacks.
  """
  parts = text.split(':')
  if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
    raise ValueError(f'config {text!r} must look like workload:K:M, e.g. ffn:4:16.')
  if parts[0] not in PEER_WORKLOAD_ARGS:
    raise ValueError(f'workload {parts[0]!r} has no peer counterpart; use one of '
                     f'{sorted(PEER_WORKLOAD_ARGS)}.')
  return parts[0], int(parts[1]), int(parts[2])


def EnsurePeerVenv(venv: pathlib.Path) -> None:
  """Runs benchmarks/lingvo_peer/setup.sh when the venv has no python."""
  if (venv / 'bin' / 'python').exists():
    return
  print(f'Building the peer venv at {venv} (about 1 min, 2.4 GB)...', flush=True)
  subprocess.run(['bash', str(SETUP_SCRIPT)], env=dict(os.environ, PEER_VENV=str(venv)),
                 check=True)


def Commands(venv: pathlib.Path, configs: List[str], baselines: List[str], steps: int,
             warmup: int, remat: str, peer_check: bool
             ) -> Tuple[Dict[str, runner.Command], Dict[str, runner.Command], Dict[str, dict]]:
  """(ours, peer, config) per configuration name, e.g. 'ffn_K4_M16'.

  Args:
    venv: the peer venv, whose python runs the peer.
    configs: 'workload:K:M' of each pipelined configuration.
    baselines: workloads whose unpipelined baselines are compared too.
    steps, warmup: measured and warm-up steps per run.
    remat: our remat policy.
    peer_check: let the peer run its equivalence check.
  """
  peer_py = str(venv / 'bin' / 'python')
  specs = [(w, k, m, False) for w, k, m in map(ParseConfig, configs)]
  specs += [(w, 1, 1, True) for w in baselines]
  ours, peer, named = {}, {}, {}
  for workload, k, m, baseline in specs:
    if workload not in PEER_WORKLOAD_ARGS:
      raise ValueError(f'baseline workload {workload!r} has no peer counterpart.')
    name = f'{workload}_baseline' if baseline else f'{workload}_K{k}_M{m}'
    args = [f'--workload={workload}']
    peer_args = list(PEER_WORKLOAD_ARGS[workload])
    if baseline:
      args.append('--baseline')
      peer_args.append('--baseline')
    else:
      args += [f'--k={k}', f'--m={m}', f'--remat={remat}']
      peer_args += ['--partitions', str(k), '--micro_batches', str(m)]
      if not peer_check:
        peer_args.append('--no_check')
    ours[name] = runner.OursCommand(args, steps, warmup)
    # From the repository root, so that `-m` finds the harness's package.
    peer[name] = runner.Command(
        argv=(peer_py, '-m', PEER_MODULE, *peer_args, '--steps', str(steps),
              '--warmup', str(warmup), '--json'),
        cwd=str(runner.REPO_ROOT), env=(('TF_CPU_ALLOCATOR_USE_BFC', 'true'),))
    named[name] = dict(workload=workload, k=k, m=m, baseline=baseline,
                       remat='none' if baseline else remat)
  return ours, peer, named


def Section(commands: Dict[str, runner.Command], configs: Dict[str, dict],
            runs: Dict[str, List[dict]]) -> Dict[str, dict]:
  return {name: dict(config=configs[name], command=commands[name].Text(),
                     runs=runs[name]) for name in commands}


def main(argv):
  del argv
  venv = pathlib.Path(FLAGS.peer_venv).absolute()
  EnsurePeerVenv(venv)
  ours, peer, configs = Commands(venv, FLAGS.configs, FLAGS.baselines, FLAGS.steps,
                                 FLAGS.warmup, FLAGS.remat, FLAGS.peer_check)
  interleaved = {}
  for name in ours:
    interleaved[f'ours {name}'] = ours[name]
    interleaved[f'peer {name}'] = peer[name]
  runs = runner.Alternate(interleaved, FLAGS.repeats, FLAGS.timeout_s,
                          log=lambda s: print(s, file=sys.stderr, flush=True))
  result = dict(
      repeats=FLAGS.repeats, steps=FLAGS.steps, warmup=FLAGS.warmup,
      ours=Section(ours, configs, {n: runs[f'ours {n}'] for n in ours}),
      peer=Section(peer, configs, {n: runs[f'peer {n}'] for n in peer}))
  out = pathlib.Path(FLAGS.out_dir)
  out.mkdir(parents=True, exist_ok=True)
  (out / 'compare_lingvo.json').write_text(json.dumps(result, indent=1))
  markdown = analysis.RenderComparisonSection(result)
  (out / 'compare_lingvo.md').write_text(markdown + '\n')
  print(markdown)


if __name__ == '__main__':
  app.run(main)
