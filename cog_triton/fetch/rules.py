"""Fetch rules: where a fetch that an API caller's input asks for may go (server-side request forgery).

``lora_weights`` (and ``cog train``'s ``checkpoint``) make the server download from a place the caller names.
Without rules any caller could make it send requests to whatever it can reach: the cloud instance metadata
service (169.254.169.254), every service on loopback or the private network, Triton's own ports. The rules,
:class:`FetchRules`, read from the ``COG_TRITON_FETCH_*`` settings:

* **Addresses**: only public unicast addresses. Refused: unspecified (``0.0.0.0/8``, ``::``), loopback
  (``127.0.0.0/8``, ``::1``), private (RFC 1918, ``fc00::/7``), shared (``100.64.0.0/10``), link-local
  (``169.254.0.0/16``, ``fe80::/10``), multicast, reserved and the special-purpose ranges of IANA's registries
  (documentation, benchmarking, protocol assignments); an IPv4 address inside IPv6 (IPv4-mapped
  ``::ffff:a.b.c.d``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``) is judged as the IPv4 address it carries.
  ``COG_TRITON_FETCH_ALLOW_NETWORKS`` lets listed networks through, ``COG_TRITON_FETCH_ALLOW_PRIVATE`` every
  address. The table is this module's own (:data:`SPECIAL_NETWORKS`), so the answer does not change with the
  Python version's ``ipaddress`` tables.
* **Schemes**: ``https://`` only; plain ``http://`` with ``COG_TRITON_FETCH_ALLOW_HTTP``.
* **Hosts**: with ``COG_TRITON_FETCH_ALLOW_HOSTS``, a URL the caller gives, and each redirect it leads to, must
  name a listed host (``*.example.com``: its subdomains).
* **Hub owners**: with ``COG_TRITON_FETCH_ALLOW_HF_OWNERS``, an ``hf://owner/repo`` reference must name a listed
  owner.

**Where they are checked** (:mod:`cog_triton.fetch.guard`). The address rule is checked on the address actually
connected to, by the network backend of the HTTP client (``GuardedBackend``, an httpcore network backend): it
resolves the host once, skips refused addresses, connects to an allowed one, and checks the connected socket's
peer address (``getpeername``) before it returns the connection, so before any byte of the request (or of TLS) is
sent. A name that resolves to a public address once and to a loopback one the next time (DNS rebinding) gets
nothing from this: every new connection is resolved and checked again. Redirects are followed by httpx; each hop
is a new request through ``GuardedTransport`` (scheme and host checked) and, for a new origin, a new connection
(address checked). Proxies (``HTTP(S)_PROXY``) are not used for these fetches: through a proxy the connected peer
would be the proxy, not the destination. ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` are honoured.

``hf://`` references are downloaded by huggingface_hub, whose HTTP client gets the same checks (``hub_guard``):
2.x's httpx2 and 1.x's httpx clients (``set_client_factory``) the same backend, 0.x's requests sessions
(``configure_http_backend``; the GPU image has it: TensorRT-LLM pins a transformers 4.x, which needs
huggingface_hub < 1.0) urllib3 connections that connect the same way. The Hub endpoint (``HF_ENDPOINT``, an
operator setting) and every redirect it answers with (its file CDN) are held to the address and scheme rules; the
host allow-list is for URLs a caller gives, not the Hub's own hops. Xet storage is switched off for these
downloads (``HF_HUB_DISABLE_XET``): hf_xet's own Rust client would connect where the checks cannot reach; the Hub
serves the same files over HTTP.

The weights of ``setup()`` (``COG_WEIGHTS``, ``COG_TRITON_WEIGHTS``) are the operator's, not an API caller's:
the rules do not apply to them (scripts/serve and the tests fetch them from 127.0.0.1).
"""

from __future__ import annotations

import ipaddress
import logging
import re
from dataclasses import dataclass
from typing import Any, Optional, Union

from cog_triton.fetch.redaction import UnparsableURL, parse_url

log = logging.getLogger(__name__)

IPAddress = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
IPNetwork = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

PRIVATE_SETTING = "COG_TRITON_FETCH_ALLOW_PRIVATE"
NETWORKS_SETTING = "COG_TRITON_FETCH_ALLOW_NETWORKS"
HTTP_SETTING = "COG_TRITON_FETCH_ALLOW_HTTP"
HOSTS_SETTING = "COG_TRITON_FETCH_ALLOW_HOSTS"
HF_OWNERS_SETTING = "COG_TRITON_FETCH_ALLOW_HF_OWNERS"

_UNSPECIFIED = "an unspecified address (it reaches this machine)"
_LOOPBACK = "a loopback address"
_PRIVATE = "a private address"
_SHARED = "a shared (carrier-grade NAT) address"
_LINK_LOCAL = "a link-local address"
_MULTICAST = "a multicast address"
_RESERVED = "a reserved address"
_SPECIAL = "a special-purpose address"

#: Non-public ranges and what they are, the first match naming an address (IANA IPv4 and IPv6 Special-Purpose
#: Address Registries, RFC 6890, plus multicast and the reserved blocks). IPv6 outside 2000::/3 is reserved.
SPECIAL_NETWORKS: tuple[tuple[IPNetwork, str], ...] = tuple(
    (ipaddress.ip_network(net), name)
    for net, name in (
        ("0.0.0.0/8", _UNSPECIFIED),
        ("10.0.0.0/8", _PRIVATE),
        ("100.64.0.0/10", _SHARED),
        ("127.0.0.0/8", _LOOPBACK),
        ("169.254.0.0/16", _LINK_LOCAL),
        ("172.16.0.0/12", _PRIVATE),
        ("192.0.0.0/24", _SPECIAL),  # IETF protocol assignments
        ("192.0.2.0/24", _SPECIAL),  # documentation (TEST-NET-1)
        ("192.88.99.0/24", _SPECIAL),  # 6to4 relay anycast
        ("192.168.0.0/16", _PRIVATE),
        ("198.18.0.0/15", _SPECIAL),  # benchmarking
        ("198.51.100.0/24", _SPECIAL),  # documentation (TEST-NET-2)
        ("203.0.113.0/24", _SPECIAL),  # documentation (TEST-NET-3)
        ("224.0.0.0/4", _MULTICAST),
        ("240.0.0.0/4", _RESERVED),  # and 255.255.255.255, the broadcast address
        ("::/128", _UNSPECIFIED),
        ("::1/128", _LOOPBACK),
        ("64:ff9b:1::/48", _PRIVATE),  # local-use IPv4/IPv6 translation
        ("100::/64", _SPECIAL),  # discard-only
        ("2001::/23", _SPECIAL),  # IETF protocol assignments (Teredo included)
        ("2001:db8::/32", _SPECIAL),  # documentation
        ("3fff::/20", _SPECIAL),  # documentation
        ("fc00::/7", _PRIVATE),  # unique local
        ("fe80::/10", _LINK_LOCAL),
        ("fec0::/10", _PRIVATE),  # site-local (deprecated)
        ("ff00::/8", _MULTICAST),
    )
)
_GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
#: Cloud instance metadata services (AWS, GCP, Azure: 169.254.169.254; AWS over IPv6; Alibaba), for the message.
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254",
                                                                 "100.100.100.200"))


def parse_address(text: str) -> IPAddress:
    """``text`` as an IP address (an IPv6 zone ``%eth0`` dropped).

    Raises:
        ValueError: not an IP address.
    """
    return ipaddress.ip_address(text.split("%", 1)[0])


def embedded_ipv4(address: IPAddress) -> Optional[ipaddress.IPv4Address]:
    """The IPv4 address an IPv6 address carries and reaches (IPv4-mapped, NAT64 well-known prefix, 6to4), if any."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


def address_problem(address: Union[str, IPAddress]) -> Optional[str]:
    """None for a public unicast address; else what it is, e.g. ``"a loopback address"``.

    An IPv6 address carrying an IPv4 one (:func:`embedded_ipv4`) is what that IPv4 address is, e.g.
    ``::ffff:127.0.0.1`` is "an IPv4-mapped form of 127.0.0.1, a loopback address".

    Raises:
        ValueError: ``address`` is not an IP address.
    """
    ip = parse_address(address) if isinstance(address, str) else address
    inner = embedded_ipv4(ip)
    if inner is not None:
        problem = address_problem(inner)
        return None if problem is None else f"a form of {inner}, {problem}"
    for network, name in SPECIAL_NETWORKS:
        if ip.version == network.version and ip in network:
            if ip in METADATA_ADDRESSES:
                return f"{name} (the cloud instance metadata service)"
            return name
    if isinstance(ip, ipaddress.IPv6Address) and ip not in _GLOBAL_UNICAST_V6:
        return _RESERVED
    return None


def _split(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


_HOST_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
_OWNER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def normalize_host(host: str) -> str:
    """``host`` lowercased, without a trailing dot or IPv6 brackets; an IP address in its compressed form."""
    text = host.strip().lower().rstrip(".")
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return str(parse_address(text))
    except ValueError:
        return text


def parse_hosts(text: str) -> tuple[str, ...]:
    """A comma-separated host allow-list: names, IP addresses, ``*.example.com`` (its subdomains).

    Raises:
        ValueError: an entry is none of these (the message names it).
    """
    hosts = []
    for entry in _split(text):
        host = normalize_host(entry)
        name = host[2:] if host.startswith("*.") else host
        try:
            parse_address(name)
            if host.startswith("*."):
                raise ValueError(f"{entry!r}: '*.' goes before a domain name, not an IP address")
        except ValueError as exc:
            if "goes before" in str(exc):
                raise
            if not all(_HOST_LABEL.match(label) for label in name.split(".")):
                raise ValueError(f"{entry!r} is not a host name, an IP address or *.domain") from None
        hosts.append(host)
    return tuple(hosts)


def parse_networks(text: str) -> tuple[IPNetwork, ...]:
    """A comma-separated list of networks (CIDR; a bare address is a /32 or /128).

    Raises:
        ValueError: an entry is not a network (the message names it).
    """
    networks = []
    for entry in _split(text):
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"{entry!r} is not a network (CIDR such as 10.1.2.0/24 or fd00:1::/64)") from None
    return tuple(networks)


def parse_owners(text: str) -> tuple[str, ...]:
    """A comma-separated list of Hugging Face Hub owners (users or organizations), lowercased.

    Raises:
        ValueError: an entry is not an owner name.
    """
    owners = []
    for entry in _split(text):
        if not _OWNER.match(entry):
            raise ValueError(f"{entry!r} is not a Hugging Face Hub user or organization name")
        owners.append(entry.lower())
    return tuple(owners)


@dataclass(frozen=True)
class FetchRules:
    """Where fetches asked for by inputs may go (see the module docstring). The default refuses all but https://
    to public addresses; picklable (it travels to the stream processes).

    Attributes:
        allow_private: every address is allowed (COG_TRITON_FETCH_ALLOW_PRIVATE).
        allow_networks: non-public networks allowed all the same (COG_TRITON_FETCH_ALLOW_NETWORKS).
        allow_http: plain http:// is allowed (COG_TRITON_FETCH_ALLOW_HTTP).
        allow_hosts: the hosts URLs may name, each redirect included; empty: any (COG_TRITON_FETCH_ALLOW_HOSTS).
        allow_hf_owners: the Hub owners hf:// may name, lowercase; empty: any (COG_TRITON_FETCH_ALLOW_HF_OWNERS).
    """

    allow_private: bool = False
    allow_networks: tuple[IPNetwork, ...] = ()
    allow_http: bool = False
    allow_hosts: tuple[str, ...] = ()
    allow_hf_owners: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: Any) -> "FetchRules":
        """The rules of a :class:`cog_triton.settings.Settings` (its ``fetch`` group, validated there)."""
        return cls(
            allow_private=settings.fetch.allow_private,
            allow_networks=parse_networks(settings.fetch.allow_networks),
            allow_http=settings.fetch.allow_http,
            allow_hosts=parse_hosts(settings.fetch.allow_hosts),
            allow_hf_owners=parse_owners(settings.fetch.allow_hf_owners),
        )

    @classmethod
    def open(cls) -> "FetchRules":
        """Every address and http:// allowed, no allow-lists (tests of other things fetch from 127.0.0.1)."""
        return cls(allow_private=True, allow_http=True)

    # ------------------------------------------------------------------ the checks (None: allowed)
    def address_refusal(self, address: Union[str, IPAddress], host: str, what: str,
                        dialled: Optional[str] = None) -> Optional[str]:
        """Why a connection to ``address`` (for ``host``) is refused, or None.

        The message shows the address when ``host`` is that address; for a name it says what the name resolves
        to without the address (callers must not learn the internal network's addresses), which is logged.
        ``dialled``: the address dialled, when ``address`` is the peer a connection reached instead.
        """
        if self.allow_private:
            return None
        ip = parse_address(address) if isinstance(address, str) else address
        problem = address_problem(ip)
        if problem is None:
            return None
        candidates = [a for a in (ip, embedded_ipv4(ip)) if a is not None]
        if any(a.version == net.version and a in net for net in self.allow_networks for a in candidates):
            return None
        if dialled is not None and parse_address(dialled) != ip:
            log.warning("fetch rules: the connection to %s (%s) reached %s, %s: refused", host, dialled, ip, problem)
            subject = f"the connection to {host} reached {problem}"
        elif normalize_host(host) == str(ip):
            subject = f"{ip} is {problem}"
        else:
            log.warning("fetch rules: %s resolves to %s, %s: refused", host, ip, problem)
            subject = f"{host} resolves to {problem}"
        return (f"{subject}; {what} are fetched only from public addresses (set {PRIVATE_SETTING}=true to allow "
                f"private networks, or list the networks allowed in {NETWORKS_SETTING})")

    def scheme_refusal(self, scheme: str, what: str) -> Optional[str]:
        """Why a request with ``scheme`` is refused (http:// unless allowed; anything but http(s)), or None."""
        scheme = scheme.lower()
        if scheme == "https" or (scheme == "http" and self.allow_http):
            return None
        if scheme == "http":
            return (f"plain http:// is refused; {what} are fetched only over https:// (set {HTTP_SETTING}=true to "
                    "allow http://)")
        return f"the scheme {scheme}:// is refused; {what} are fetched only over https://"

    def host_refusal(self, host: str, what: str) -> Optional[str]:
        """Why ``host`` is refused by the host allow-list, or None (also when there is none)."""
        if not self.allow_hosts:
            return None
        name = normalize_host(host)
        for allowed in self.allow_hosts:
            if name == allowed or (allowed.startswith("*.") and name.endswith(allowed[1:])):
                return None
        return (f"the host {name} is not on the list of hosts {what} are fetched from "
                f"({HOSTS_SETTING}={','.join(self.allow_hosts)})")

    def url_refusal(self, url: str, what: str, *, hosts: bool = True) -> Optional[str]:
        """Why ``url`` is refused without connecting (a URL the HTTP client cannot parse, the scheme, the host
        allow-list when ``hosts``, an IP-literal host's address), or None. The URL is split by the parser of the
        HTTP client that will fetch it (:func:`cog_triton.fetch.redaction.parse_url`), so the host judged here is the
        host connected to. A host name's addresses are checked when connecting (:mod:`cog_triton.fetch.guard`)."""
        try:
            parsed = parse_url(url)
        except UnparsableURL as exc:
            return exc.refusal("the value")
        host = parsed.raw_host.decode("ascii")  # an IDNA name as it is resolved (xn--...)
        refusal = self.scheme_refusal(parsed.scheme, what)
        if refusal is None and hosts:
            refusal = self.host_refusal(host, what)
        if refusal is None:
            try:
                address = parse_address(host)
            except ValueError:
                return None
            refusal = self.address_refusal(address, host, what)
        return refusal

    def hf_owner_refusal(self, repo_id: str, what: str) -> Optional[str]:
        """Why the Hub repository ``repo_id`` (``owner/name``) is refused by the owner allow-list, or None."""
        if not self.allow_hf_owners:
            return None
        owner = repo_id.split("/", 1)[0]
        if owner.lower() in self.allow_hf_owners:
            return None
        return (f"the Hub owner {owner!r} is not on the list of owners {what} are fetched from "
                f"({HF_OWNERS_SETTING}={','.join(self.allow_hf_owners)})")


__all__ = (
    "FetchRules",
    "METADATA_ADDRESSES",
    "SPECIAL_NETWORKS",
    "address_problem",
    "embedded_ipv4",
    "normalize_host",
    "parse_address",
    "parse_hosts",
    "parse_networks",
    "parse_owners",
)
