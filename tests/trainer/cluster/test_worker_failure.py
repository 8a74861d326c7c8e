"""A cluster run that loses a worker ends within a bound, says which, and
resumes after a restart; bad cluster input fails fast with one line.

Real `--mode=worker` processes on free loopback ports (tests/worker_cluster:
always killed, also when a test fails); the client is the trainer binary.
"""

import ipaddress
import re
import signal
import subprocess
import sys
import time

import pytest

from trainer.cluster import cluster_spec
from tests import fresh_process
from tests import worker_cluster

TINY = 'lm.StdlibBytesTiny'
# --worker_timeout_s of these tests; the watchdog's bound is 1.25x it,
# after the client has built its step.
TIMEOUT_S = 5
# The client must exit this long after the failure, at most (generous for a
# machine shared by several test runs).
BOUND_S = 30


def _Client(spec: str, logdir: str, *flags: str) -> subprocess.Popen:
  return subprocess.Popen(  # pylint: disable=consider-using-with
      [sys.executable, '-m', 'trainer.trainer', f'--model={TINY}', '--mode=train',
       f'--logdir={logdir}', f'--cluster_spec={spec}',
       f'--worker_timeout_s={TIMEOUT_S}',
       '--model_params_override=trainer.steps_per_loop=20', *flags],
      cwd=fresh_process.ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True, start_new_session=True,
      env={**fresh_process.os.environ, 'PYTHONPATH': str(fresh_process.ROOT),
           'TF_CPP_MIN_LOG_LEVEL': '3'})


def _WaitForStep(client: subprocess.Popen, step: int, timeout_s: float = 240) -> str:
  """Reads the client's stdout until a progress line at `step` or later."""
  assert client.stdout is not None
  deadline = time.monotonic() + timeout_s
  seen = ''
  while time.monotonic() < deadline:
    line = client.stdout.readline()
    if not line and client.poll() is not None:
      raise AssertionError(f'client exited early:\n{seen}\n{client.stderr.read()}')
    seen += line
    match = re.match(r'step\s+(\d+)/', line)
    if match and int(match.group(1)) >= step:
      return seen
  raise AssertionError(f'no step {step} in {timeout_s} s:\n{seen}')


def _OneErrorLine(stderr: str) -> str:
  assert 'Traceback' not in stderr, stderr[-3000:]
  lines = [l for l in stderr.splitlines() if l.startswith('error:')]
  assert len(lines) == 1, stderr[-3000:]
  return lines[0]


def _Kill(client: subprocess.Popen) -> None:
  if client.poll() is None:
    client.kill()
  client.communicate()


def test_hung_worker_ends_the_client_within_the_bound(tmp_path):
  """A stopped worker (SIGSTOP: it accepts connections but answers nothing)
  would hang the client's step forever; the watchdog ends the run."""
  with worker_cluster.Running(2) as cluster:
    client = _Client(cluster.spec, str(tmp_path), '--max_steps=100000000')
    try:
      _AssertClientPortSaid(_WaitForStep(client, 40))
      cluster.workers[1].Signal(signal.SIGSTOP)
      stopped = time.monotonic()
      code, _, err = fresh_process.Finish(client, BOUND_S + 30)
      elapsed = time.monotonic() - stopped
    finally:
      _Kill(client)
  assert code == 3, err[-3000:]
  line = _OneErrorLine(err)
  assert f'worker task 1 (localhost:{cluster.ports[1]}) did not answer for 5 s' in line
  assert 'ckpt-' in line  # where the run resumes
  assert elapsed < BOUND_S, elapsed


def _AssertClientPortSaid(output: str) -> None:
  """The client's line on connecting names the port that connecting opened
  in it (docs/several_machines.md#security), open on every interface."""
  match = re.search(r"connected to 2 worker task\(s\); this client's port (\d+) is open "
                    r'on every interface of this machine .* with no authentication', output)
  assert match, output
  listening = worker_cluster.ListeningAddresses(int(match.group(1)))
  assert listening and all(ipaddress.ip_address(a).is_unspecified for a in listening)


def _Overrides(more: str) -> str:
  return '--model_params_override=' + '; '.join(
      o for o in ('trainer.steps_per_loop=20', more) if o)


def _KillWorkerOneMidRun(cluster: worker_cluster.Cluster, logdir: str,
                         overrides: str = '') -> int:
  """Trains on `cluster` past step 60, kills worker task 1 and checks the
  client's end: status 3 within the bound, one line naming the task.
  Returns the step of the checkpoint the line names."""
  client = _Client(cluster.spec, logdir, '--max_steps=100000000', _Overrides(overrides))
  try:
    _WaitForStep(client, 60)
    cluster.Kill([1])
    killed = time.monotonic()
    code, _, err = fresh_process.Finish(client, BOUND_S + 30)
    elapsed = time.monotonic() - killed
  finally:
    _Kill(client)
  assert code == 3, err[-3000:]
  line = _OneErrorLine(err)
  assert f'worker task 1 (localhost:{cluster.ports[1]}) is down' in line, line
  assert elapsed < BOUND_S, elapsed
  saved = int(re.search(r'ckpt-(\d+)', line).group(1))
  assert saved >= 40  # step 60 was printed before its checkpoint was saved
  return saved


def _Resume(spec: str, logdir: str, saved: int, overrides: str = '') -> None:
  """Trains 40 steps more from the checkpoint at `saved`."""
  resumed = fresh_process.RunPython(
      '-m', 'trainer.trainer', f'--model={TINY}', '--mode=train',
      f'--logdir={logdir}', f'--cluster_spec={spec}',
      _Overrides(overrides), f'--max_steps={saved + 40}', timeout_s=300)
  assert f'at step {saved}' in resumed.stdout, resumed.stdout
  assert f'step {saved + 40:>6}/{saved + 40}' in resumed.stdout, resumed.stdout


@pytest.mark.slow  # make test covers the hung worker (the watchdog) instead
def test_killed_worker_ends_the_client_and_a_restart_resumes(tmp_path):
  with worker_cluster.Running(2) as cluster:
    saved = _KillWorkerOneMidRun(cluster, str(tmp_path))
    # Restart everything: both workers on their ports, then the client.
    cluster.Kill()
    cluster.Start()
    _Resume(cluster.spec, str(tmp_path), saved)


@pytest.mark.slow  # make test covers the hung worker (the watchdog) instead
def test_killed_replica_worker_and_a_resume_with_fewer_replicas(tmp_path):
  """R=2 x K=1 on two workers, the gradients all-reduced between them:
  killing one ends the client within the bound, naming it; the run resumes
  from the same checkpoint with R=1 on one worker, the same global batch."""
  one_cell = 'task.stack.pipeline.num_partitions=1'
  with worker_cluster.Running(2) as cluster:
    saved = _KillWorkerOneMidRun(cluster, str(tmp_path),
                                 f'{one_cell}; task.stack.pipeline.num_replicas=2')
  with worker_cluster.Running(1) as single:
    _Resume(single.spec, str(tmp_path), saved, one_cell)


def test_a_worker_started_twice_on_one_port_and_bad_worker_flags():
  with worker_cluster.Running(1) as cluster:
    twice = fresh_process.RunPython(
        '-m', 'trainer.trainer', '--mode=worker', '--task=0',
        f'--cluster_spec={cluster.spec}', check=False, timeout_s=120)
  assert twice.returncode == 2
  assert (f'Worker task 0 cannot listen on localhost:{cluster.ports[0]}: port '
          f'{cluster.ports[0]} is in use') in _OneErrorLine(twice.stderr)
  out_of_range = fresh_process.RunPython(
      '-m', 'trainer.trainer', '--mode=worker', '--task=2',
      '--cluster_spec=worker=localhost:1,localhost:2', check=False, timeout_s=120)
  assert out_of_range.returncode == 2
  assert ("Task index 2 is out of range: job 'worker' has 2 task(s) "
          '(localhost:1, localhost:2); use 0 to 1.') in _OneErrorLine(out_of_range.stderr)


@pytest.mark.parametrize('spec,flags,message', [
    ('worker=localhost', [], "Cluster address 'localhost' of job 'worker' is not host:port"),
    ('worker=localhost:{0}', [],
     'The model needs 2 devices (cells x replicas / consecutive_cells_per_device) but '
     '--cluster_spec has 1 worker task(s)'),
    # Nobody listens there: a worker that never came up, or a client spec
    # that does not match the workers' addresses.
    ('worker=localhost:{0},localhost:{1}', ['--worker_timeout_s=2'],
     'worker task 0 (localhost:{0}), worker task 1 (localhost:{1}) did not come '
     'up within 2 s'),
])
def test_bad_cluster_input_fails_fast_with_one_line(spec, flags, message, tmp_path):
  ports = worker_cluster.FreePorts(2)
  start = time.monotonic()
  result = fresh_process.RunPython(
      '-m', 'trainer.trainer', f'--model={TINY}', '--mode=train',
      f'--logdir={tmp_path}', f'--cluster_spec={spec.format(*ports)}', *flags,
      check=False, timeout_s=120)
  assert result.returncode == 2, result.stderr[-3000:]
  assert message.format(*ports) in _OneErrorLine(result.stderr)
  assert time.monotonic() - start < 60
  assert not (tmp_path / 'checkpoints').exists()


@pytest.mark.parametrize('text,message', [
    ('', 'The cluster spec is empty'),
    ('worker:localhost:1', "is not job=host:port"),
    ('worker=localhost:0', 'with a port in 1..65535'),
    ('worker=localhost:1,localhost:1', 'lists [\'localhost:1\'] more than once'),
    ('ps=localhost:1', "has no 'worker' job"),
    ('worker=localhost:1;worker=localhost:2', "appears twice"),
])
def test_malformed_specs(text, message):
  with pytest.raises(ValueError) as e:
    cluster_spec.Parse(text)
  assert message in str(e.value)


def test_tf_config():
  config, task = cluster_spec.FromTfConfig(
      '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}}')
  assert config.Tasks() == ('a:1', 'b:2') and task == 1
  assert config.Flag() == 'worker=a:1,b:2'
  assert cluster_spec.Parse(config.Flag()) == config
  with pytest.raises(ValueError, match='TF_CONFIG is not JSON'):
    cluster_spec.FromTfConfig('{cluster')
  with pytest.raises(ValueError, match='must map to a list'):
    cluster_spec.FromTfConfig('{"cluster": {"worker": "a:1"}}')


def test_worker_task_from_tf_config_or_flag():
  from trainer.cluster import cluster_run  # pylint: disable=g-import-not-at-top
  two = '{"cluster": {"worker": ["localhost:1", "localhost:2"]}}'
  with pytest.raises(ValueError, match=r'needs --task=T.*2 task\(s\): 0 to 1'):
    cluster_run.RunWorker('', -1, {'TF_CONFIG': two})
  with pytest.raises(ValueError, match='Task index 5 is out of range'):
    cluster_run.RunWorker('', -1, {'TF_CONFIG': two[:-1] + ', "task": {"index": 5}}'})
  with pytest.raises(ValueError, match='--mode=worker needs the cluster'):
    cluster_run.RunWorker('', 0, {})
  assert cluster_run.ClusterFromFlags('', {}) is None
  assert cluster_run.ClusterFromFlags('worker=a:1', {'TF_CONFIG': two}).Tasks() == ('a:1',)
  assert cluster_run.ClusterFromFlags('', {'TF_CONFIG': two}).Tasks() == ('localhost:1', 'localhost:2')
