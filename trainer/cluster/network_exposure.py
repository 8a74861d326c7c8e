"""What a cluster port of this process lets in, said before and when it opens.

TensorFlow's gRPC server, which a worker (`tf.distribute.Server`) and a
client of a cluster (`tf.config.experimental_connect_to_cluster`) both
start, listens on every interface of the machine whatever host the cluster
spec names, and authenticates and encrypts nothing: whoever reaches the
port runs graph ops in the process (docs/several_machines.md, "Security").
TensorFlow's Python API offers no way to bind one address or to require
credentials, so the trainer starts such a port beyond loopback only when
the user passes TRUST_FLAG, and says what is open when it opens.
"""

import fcntl
import ipaddress
import socket
import struct
from typing import Iterable, List

TRUST_FLAG = '--trust_cluster_network'
_SIOCGIFADDR = 0x8915  # Linux: an interface's IPv4 address
_IF_INET6 = '/proc/net/if_inet6'  # Linux: every interface's IPv6 addresses


class UntrustedNetworkError(ValueError):
  """A cluster address beyond loopback without TRUST_FLAG; one line."""


def IsLoopback(host: str) -> bool:
  """Whether every address `host` resolves to is a loopback address
  (False for a host that does not resolve)."""
  try:
    infos = socket.getaddrinfo(host.strip('[]'), None, proto=socket.IPPROTO_TCP)
  except (socket.gaierror, UnicodeError):
    return False
  return all(ipaddress.ip_address(str(info[4][0]).split('%')[0]).is_loopback
             for info in infos)


def MachineAddresses() -> List[str]:
  """The addresses of this machine's interfaces other than loopback: on
  Linux each interface's IPv4 and IPv6 addresses, elsewhere those of the
  host name."""
  found = _LinuxIpv4() + _LinuxIpv6()
  if not found:
    try:
      found = [str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None)]
    except socket.gaierror:
      found = []
  return [a for a in dict.fromkeys(found)
          if not ipaddress.ip_address(a.split('%')[0]).is_loopback]


def CheckTrusted(addresses: Iterable[str], role: str, trusted: bool) -> None:
  """Refuses, before any port opens, a cluster whose addresses reach beyond
  loopback unless the user passed TRUST_FLAG.

  Args:
    addresses: host:port of the cluster's tasks that `role` serves or joins.
    role: who would open the port, for the message ('worker task 0').
    trusted: whether TRUST_FLAG was passed.

  Raises:
    UntrustedNetworkError: naming the addresses, the risk and both fixes.
  """
  beyond = [a for a in addresses if not IsLoopback(a.rsplit(':', 1)[0])]
  if beyond and not trusted:
    what = 'is not a loopback address' if len(beyond) == 1 else 'are not loopback addresses'
    raise UntrustedNetworkError(
        f'{role} would open a TensorFlow port that other machines reach '
        f'({", ".join(beyond)} {what}), and TensorFlow authenticates and '
        'encrypts nothing: whoever reaches it runs code in this process. On a '
        "private network or behind a firewall that admits only the cluster's "
        f'machines, pass {TRUST_FLAG}; to stay on this machine, name localhost '
        'in --cluster_spec.')


def OpenPortNote(port: int, trusted: bool) -> str:
  """The clause a ready or connected line ends with: the port is open on
  every interface, unauthenticated, and how to close it."""
  others = MachineAddresses()
  reach = (f'also at {", ".join(others)}' if others
           else 'no address but loopback at present')
  why = f'{TRUST_FLAG} was passed' if trusted else 'TensorFlow binds them all'
  return (f'port {port} is open on every interface of this machine ({reach}; '
          f'{why}) with no authentication: firewall port {port} from machines '
          'outside the cluster, or keep it on a private network '
          '(docs/several_machines.md#security)')


def _LinuxIpv4() -> List[str]:
  found = []
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    for _, name in socket.if_nameindex():
      try:
        request = struct.pack('256s', name.encode()[:15])
        found.append(socket.inet_ntoa(fcntl.ioctl(s.fileno(), _SIOCGIFADDR, request)[20:24]))
      except OSError:  # no IPv4 address, or not Linux
        continue
  return found


def _LinuxIpv6() -> List[str]:
  try:
    with open(_IF_INET6) as f:
      hexes = [line.split()[0] for line in f if line.strip()]
  except OSError:
    return []
  return [str(ipaddress.IPv6Address(bytes.fromhex(h))) for h in hexes]
