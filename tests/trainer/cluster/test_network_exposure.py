"""A cluster port opens beyond loopback only when the user says so, and
says what it lets in (docs/several_machines.md, "Security").

Real `--mode=worker` processes (tests/worker_cluster, always killed); what
they listen on is read from the kernel's socket tables, and whether a port
is open is probed with a TCP connection.
"""

import ipaddress
import time

from tests import worker_cluster
from trainer.cluster import network_exposure


def _BeyondLoopback() -> str:
  """An IPv4 address of this machine other than loopback, else 0.0.0.0
  (every address: not loopback either)."""
  ipv4 = [a for a in network_exposure.MachineAddresses() if ipaddress.ip_address(a).version == 4]
  return ipv4[0] if ipv4 else '0.0.0.0'


def test_tensorflow_still_listens_on_every_interface_and_the_worker_says_so():
  """The docs and the ready line rest on this: a worker whose spec names
  localhost listens on the wildcard address, reachable at every address of
  the machine. A TensorFlow upgrade that binds the named host fails here."""
  with worker_cluster.Running(1) as cluster:
    port = cluster.ports[0]
    ready = cluster.workers[0].Output().strip().splitlines()[-1]
    listening = worker_cluster.ListeningAddresses(port)
    others = network_exposure.MachineAddresses()
    reached = [a for a in others
               if ipaddress.ip_address(a).version == 4 and worker_cluster.Accepts(a, port)]
  assert listening and all(ipaddress.ip_address(a).is_unspecified for a in listening), (
      f'A worker of worker=localhost:{port} listens on {listening}, no longer on every '
      'interface: TensorFlow changed; update docs/several_machines.md#security and '
      'trainer/cluster/network_exposure.py.')
  assert reached == [a for a in others if ipaddress.ip_address(a).version == 4]
  assert f'ready at localhost:{port}' in ready
  assert (f'port {port} is open on every interface of this machine' in ready and
          'with no authentication' in ready and 'docs/several_machines.md#security' in ready)
  assert all(a in ready for a in others), (others, ready)


def test_a_worker_beyond_loopback_is_refused_before_its_port_opens(tmp_path):
  host, port = _BeyondLoopback(), worker_cluster.FreePorts(1)[0]
  worker = worker_cluster.Worker(f'worker={host}:{port}', 0, str(tmp_path))
  opened = False
  try:
    while worker.process.poll() is None:
      opened = opened or bool(worker_cluster.ListeningAddresses(port))
      time.sleep(0.05)
  finally:
    worker.Kill()
  output = worker.log_path.read_text()
  assert worker.process.returncode == 2, output
  assert not opened and not worker_cluster.Accepts('127.0.0.1', port)
  assert output.strip().splitlines() == [
      f'error: Worker task 0 would open a TensorFlow port that other machines reach '
      f'({host}:{port} is not a loopback address), and TensorFlow authenticates and '
      'encrypts nothing: whoever reaches it runs code in this process. On a private '
      "network or behind a firewall that admits only the cluster's machines, pass "
      '--trust_cluster_network; to stay on this machine, name localhost in --cluster_spec.']


def test_with_the_flag_a_worker_beyond_loopback_starts_and_says_so(tmp_path):
  host, port = _BeyondLoopback(), worker_cluster.FreePorts(1)[0]
  worker = worker_cluster.Worker(f'worker={host}:{port}', 0, str(tmp_path),
                                 flags=['--trust_cluster_network'])
  try:
    worker.WaitReady(time.monotonic() + worker_cluster.READY_TIMEOUT_S)
    ready = worker.Output().strip().splitlines()[-1]
    reached = worker_cluster.Accepts(host, port)
  finally:
    worker.Kill()
  assert reached
  assert f'ready at {host}:{port}' in ready
  assert f'port {port} is open on every interface' in ready
  assert '--trust_cluster_network was passed' in ready


def test_loopback_and_beyond():
  assert all(network_exposure.IsLoopback(h) for h in ('localhost', '127.0.0.1', '127.8.9.1',
                                                      '[::1]'))
  assert not any(network_exposure.IsLoopback(h) for h in ('192.0.2.1', '0.0.0.0', '[::]',
                                                          '[fd00::2]', 'no-such-host.invalid'))
  assert not any(ipaddress.ip_address(a).is_loopback for a in network_exposure.MachineAddresses())
