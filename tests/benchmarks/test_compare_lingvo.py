"""compare_lingvo runs the peer harness that ships in benchmarks/lingvo_peer/:
its commands name only files of the repository and the peer venv, and a
missing venv is built with the in-repo setup script (no TensorFlow, no peer
venv, no processes)."""

import pathlib
import subprocess

import pytest

from benchmarks import compare_lingvo
from benchmarks import runner

VENV = pathlib.Path('/opt/peer-venv')


def _Commands(**overrides):
  kwargs = dict(configs=['ffn:4:16', 'transformer:4:8'], baselines=['ffn'], steps=2,
                warmup=1, remat='per_cell', peer_check=False)
  kwargs.update(overrides)
  return compare_lingvo.Commands(VENV, **kwargs)


def test_peer_commands_run_the_in_repo_harness():
  _, peer, _ = _Commands()
  assert sorted(peer) == ['ffn_K4_M16', 'ffn_baseline', 'transformer_K4_M8']
  module_file = runner.REPO_ROOT.joinpath(*compare_lingvo.PEER_MODULE.split('.'))
  assert module_file.with_suffix('.py').is_file()
  for cmd in peer.values():
    assert cmd.cwd == str(runner.REPO_ROOT)
    assert cmd.argv[:3] == (str(VENV / 'bin' / 'python'), '-m', compare_lingvo.PEER_MODULE)
    assert dict(cmd.env) == {'TF_CPU_ALLOCATOR_USE_BFC': 'true'}
    assert cmd.Text().startswith('TF_CPU_ALLOCATOR_USE_BFC=true /opt/peer-venv/bin/python '
                                 '-m benchmarks.lingvo_peer.bench --workload ')
    assert '..' not in cmd.Text()


def test_peer_and_ours_run_the_same_configuration():
  ours, peer, configs = _Commands(peer_check=True)
  k4m16 = peer['ffn_K4_M16'].argv
  assert k4m16[k4m16.index('--partitions') + 1] == '4'
  assert k4m16[k4m16.index('--micro_batches') + 1] == '16'
  assert '--no_check' not in k4m16
  assert '--baseline' in peer['ffn_baseline'].argv
  assert {'--k=4', '--m=16', '--remat=per_cell'} <= set(ours['ffn_K4_M16'].argv)
  assert configs['ffn_baseline'] == dict(workload='ffn', k=1, m=1, baseline=True,
                                         remat='none')
  assert '--no_check' in _Commands()[1]['ffn_K4_M16'].argv


@pytest.mark.parametrize('text, message', [
    ('ffn:4', 'must look like workload:K:M'),
    ('ffn:four:4', 'must look like workload:K:M'),
    ('transformer-act:4:4', 'has no peer counterpart'),
])
def test_parse_config_rejects(text, message):
  with pytest.raises(ValueError, match=message):
    compare_lingvo.ParseConfig(text)


def test_setup_script_is_in_the_repository_and_parses():
  script = compare_lingvo.SETUP_SCRIPT
  assert script.is_relative_to(runner.REPO_ROOT) and script.is_file()
  subprocess.run(['bash', '-n', str(script)], check=True)


def test_missing_venv_is_built_by_the_setup_script(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(compare_lingvo.subprocess, 'run',
                      lambda argv, env, check: calls.append((argv, env['PEER_VENV'])))
  compare_lingvo.EnsurePeerVenv(tmp_path)
  assert calls == [(['bash', str(compare_lingvo.SETUP_SCRIPT)], str(tmp_path))]
  (tmp_path / 'bin').mkdir()
  (tmp_path / 'bin' / 'python').touch()
  compare_lingvo.EnsurePeerVenv(tmp_path)
  assert len(calls) == 1
