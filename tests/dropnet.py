"""Addresses that drop connection attempts, on this machine only, and a resolver that names them.

:class:`DropNet` makes a network namespace of its own (``ip netns add``, a name unique to this run) joined to this
one by a veth pair, and routes a /24 of the benchmarking range 198.18.0.0/15 (RFC 2544: never routed on the
Internet; one /24 chosen per run, one no other route here uses, so parallel runs in other worktrees do not collide)
to the namespace's end of the pair. Inside the namespace nothing is at those addresses and nothing forwards them
(``net.ipv4.ip_forward`` is 0 in a new namespace, and a ``blackhole`` route for the /24 is added as well): a packet
for them that arrives there is dropped, without an answer (no RST, no ICMP; Linux ``ip_route_input_slow``: a
destination that is not local, with forwarding off, is dropped, and a blackhole route on input is a martian). So
a connection attempt (a SYN) or a DNS query to one of them waits for ever, as one to a firewalled host does; and
nothing leaves this machine (the route points into the namespace, and the namespace has no other link). The
namespace is checked to drop before it is used (a connect to one address times out, rather than being refused or
unreachable), and deleted with the veth pair and its route on exit (one left by a run that was killed is deleted by
the next run).

Neither iptables nor nft is needed (the test machines have neither): the namespace's routing drops. It needs root
(``CAP_NET_ADMIN``), which the tests and CI have.

:func:`resolver_prefix` is the resolver of a process under test: a command prefix that runs it in a mount
namespace of its own (``unshare --mount``, private propagation: nothing is seen outside it) where ``/etc/hosts`` is
this machine's plus the names given (one name, several addresses: glibc's ``files`` source returns every line of a
name, in order) and ``/etc/resolv.conf`` names a nameserver that drops, so a name in no hosts line waits the
resolver's whole timeout. The process's own resolver (glibc ``getaddrinfo``) does the rest, unchanged.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import random
import secrets
import socket
import subprocess
import time
from pathlib import Path
from typing import Mapping, Optional, Sequence

#: The benchmarking range (RFC 2544): 198.18.0.0/24 ... 198.18.255.0/24 are the candidates of a run's /24, and
#: 198.19.<same>.0/30 its veth link.
_RANGE = ipaddress.ip_network("198.18.0.0/16")


def _ip(*args: str, netns: Optional[str] = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    command = ["ip", *(["-n", netns] if netns else []), *args]
    run = subprocess.run(command, capture_output=True, text=True, timeout=30)  # only "not hung"
    if check and run.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({run.returncode}): {run.stderr.strip()}")
    return run


#: The names of the namespaces these tests make: ``<PREFIX><pid>-<random>``.
PREFIX = "cogtest-drop-"


#: A namespace of a process that is gone is swept once it is this old (seconds): no run holds one this long, and a
#: run whose process this one cannot see (another PID namespace on the same network) keeps its own meanwhile.
STALE_S = 3600


def _sweep() -> None:
    """Delete the namespaces of runs that were killed before they could (a SIGKILL skips every cleanup): those whose
    process is gone, made over :data:`STALE_S` ago (``/run/netns/<name>``, the file ``ip netns add`` mounts it on).
    One whose pid is alive (its run, or a process that reused the pid) is left alone."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        pid = name[len(PREFIX):].split("-", 1)[0] if name.startswith(PREFIX) else ""
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        try:
            age_s = time.time() - Path(f"/run/netns/{name}").stat().st_mtime
        except OSError:
            continue
        if age_s > STALE_S:
            _ip("netns", "del", name, check=False)  # its veth pair and route go with it


class DropNet:
    """``count`` addresses (:attr:`addresses`) in a /24 (:attr:`network`) whose connection attempts are dropped,
    and :attr:`nameserver`, an address of the same /24 for a resolver that never answers. See the module docstring.

    ``with DropNet() as net: ...``; the namespace, the veth pair and the route are removed on exit (and by
    :meth:`close`, idempotent).
    """

    def __init__(self, count: int = 8) -> None:
        tag = secrets.token_hex(4)
        self.netns = f"{PREFIX}{os.getpid()}-{tag}"  # the pid: a run killed before its exit is swept by the next one
        self._outer, self._inner = f"cd{tag}a", f"cd{tag}b"  # interface names: at most 15 characters
        self.count = count
        self.network: Optional[ipaddress.IPv4Network] = None
        self.addresses: list[str] = []
        self.nameserver = ""
        self._made = False

    def __enter__(self) -> "DropNet":
        try:
            self._make()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _make(self) -> None:
        _sweep()
        _ip("netns", "add", self.netns)
        self._made = True
        _ip("link", "add", self._outer, "type", "veth", "peer", "name", self._inner)
        _ip("link", "set", self._inner, "netns", self.netns)
        _ip("link", "set", "lo", "up", netns=self.netns)
        _ip("link", "set", self._inner, "up", netns=self.netns)
        _ip("link", "set", self._outer, "up")
        used = _ip("-4", "route", "show").stdout + _ip("-4", "addr", "show").stdout
        candidates = list(range(256))
        random.shuffle(candidates)
        for third in candidates:
            network = ipaddress.ip_network(f"198.18.{third}.0/24")
            link = f"198.19.{third}"
            if f"198.18.{third}." in used or f"{link}." in used:
                continue
            if _ip("addr", "add", f"{link}.1/30", "dev", self._outer, check=False).returncode != 0:
                continue  # another run took it meanwhile
            _ip("addr", "add", f"{link}.2/30", "dev", self._inner, netns=self.netns)
            if _ip("route", "add", str(network), "via", f"{link}.2", "dev", self._outer, check=False).returncode:
                _ip("addr", "del", f"{link}.1/30", "dev", self._outer, check=False)
                continue
            _ip("route", "add", "blackhole", str(network), netns=self.netns)
            self.network = network
            hosts = list(network.hosts())
            self.addresses = [str(hosts[9 + i]) for i in range(self.count)]  # 198.18.x.10, .11, ...
            self.nameserver = str(hosts[52])  # 198.18.x.53
            break
        else:
            raise RuntimeError("no free /24 in 198.18.0.0/16 for the drop network")
        self._check_drops()

    def _check_drops(self) -> None:
        """A connect to the first address must time out: refused or unreachable would not be a drop."""
        probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        probe.settimeout(0.3)
        try:
            code = probe.connect_ex((self.addresses[0], 80))
        finally:
            probe.close()
        if code not in (errno.EAGAIN, errno.EINPROGRESS, errno.ETIMEDOUT):
            raise RuntimeError(f"a connection to {self.addresses[0]} in the namespace {self.netns} was answered "
                               f"({os.strerror(code) if code else 'connected'}): it must be dropped")

    def close(self) -> None:
        if self._made:
            _ip("netns", "del", self.netns, check=False)  # its veth end goes, and with it the pair and the route
            self._made = False
        _ip("link", "del", self._outer, check=False)


def resolver_prefix(folder: Path, names: Mapping[str, Sequence[str]], nameserver: str,
                    timeout_s: int = 30) -> list[str]:
    """A command prefix (``[*prefix, program, *args]``) that runs a program with this machine's ``/etc/hosts``
    plus ``names`` (name -> its addresses, in order) and a ``/etc/resolv.conf`` naming only ``nameserver`` (one
    attempt of ``timeout_s``, glibc's most), in a mount namespace of its own; the files are written in ``folder``.
    See the module docstring."""
    folder.mkdir(parents=True, exist_ok=True)
    hosts, resolv = folder / "hosts", folder / "resolv.conf"
    lines = [f"{address} {name}" for name, addresses in names.items() for address in addresses]
    hosts.write_text(Path("/etc/hosts").read_text() + "\n" + "\n".join(lines) + "\n")
    resolv.write_text(f"nameserver {nameserver}\noptions timeout:{timeout_s} attempts:1\n")
    script = 'mount --bind "$1" /etc/hosts && mount --bind "$2" /etc/resolv.conf && shift 2 && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", str(hosts),
            str(resolv)]


__all__ = ("PREFIX", "DropNet", "resolver_prefix")
