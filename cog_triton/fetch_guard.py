"""Enforcing the fetch rules (:mod:`cog_triton.fetch_rules`) on the connections of a fetch.

* :class:`FetchGuard`: the rules applied to one fetch (a URL and its redirects, or one Hub call): checks each
  request's scheme and host, and each connection's address.
* :class:`GuardedBackend`: an httpcore network backend that resolves once, connects only to allowed addresses
  and checks the connected socket's peer address (``getpeername``) before anything is sent.
* :func:`guarded_transport`: an httpx transport on that backend, every request checked first (redirects are
  requests too), no proxy (through a proxy the peer would be the proxy).
* :func:`hub_guard`: huggingface_hub's shared httpx2 client on the same backend, for ``hf://`` downloads.

Split from :mod:`cog_triton.fetch_rules` so that the rules stay pure (addresses, names, lists) and this module
holds what touches httpx, httpcore and huggingface_hub.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import socket
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence, Union
from urllib.parse import urlsplit

from common.errors import FetchRefusedError
from cog_triton.fetch_rules import FetchRules, normalize_host

log = logging.getLogger(__name__)

Resolver = Callable[[str, int], Sequence[str]]


def resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to for a TCP connection, in the resolver's order, each once.

    Raises:
        OSError: it does not resolve (socket.gaierror).
    """
    seen: list[str] = []
    for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        address = str(sockaddr[0])
        if address not in seen:
            seen.append(address)
    return seen


@dataclass
class FetchGuard:
    """The rules applied to one fetch (one download and its redirects): what the transport and the network
    backend ask before each request and each connection.

    Args:
        rules: the rules.
        what: what is fetched, for messages ("adapters", "checkpoints").
        check_hosts: apply the host allow-list (URLs a caller gives; not the Hub's own hops).
        resolver: host, port -> addresses (:func:`resolve`; tests give their own).
        single_url: the fetch is one URL and its redirects (a refused later hop is named as the redirect); False
            for a client that makes several requests (the Hub's): a refusal names the request's URL.
    """

    rules: FetchRules
    what: str
    check_hosts: bool = True
    resolver: Resolver = resolve
    single_url: bool = True
    first_url: Optional[str] = field(default=None, init=False)
    first_host: Optional[str] = field(default=None, init=False)

    def check_request(self, url: str) -> None:
        """Before each request (the first and every redirect): its scheme and host.

        Raises:
            FetchRefusedError: naming the rule (and the redirect, for a later hop).
        """
        parts = urlsplit(url)
        if self.first_url is None:
            self.first_url, self.first_host = url, normalize_host(parts.hostname or "")
        refusal = self.rules.scheme_refusal(parts.scheme, self.what)
        if refusal is None and self.check_hosts:
            refusal = self.rules.host_refusal(parts.hostname or "", self.what)
        if refusal is not None:
            from cog_triton.weights.sources import redact_url  # noqa: PLC0415 - the weights package imports this one

            if not self.single_url:
                hop = f"{redact_url(url)}: "
            else:
                hop = "" if url == self.first_url else f"the redirect to {redact_url(url)}: "
            raise FetchRefusedError(hop + refusal)

    def check_address(self, host: str, address: str, dialled: Optional[str] = None) -> None:
        """Before a connection to ``address`` for ``host``, and on the connected socket's peer address (then
        ``dialled`` is the address the connection was made to).

        Raises:
            FetchRefusedError: naming the rule.
        """
        refusal = self.rules.address_refusal(address, host, self.what, dialled)
        if refusal is not None:
            later = self.single_url and self.first_host not in (None, normalize_host(host))
            hop = f"the redirect to {host}: " if later else ""
            raise FetchRefusedError(hop + refusal)


class GuardedBackend:
    """An httpcore (or httpcore2) network backend that connects only to allowed addresses.

    ``connect_tcp`` resolves the host once (the guard's resolver), tries the allowed addresses in order (connecting
    to the address itself, so no second resolution can answer differently), and checks the connected socket's
    peer address (``server_addr``, ``getpeername()``) before returning: nothing is sent before that. Unix sockets
    are refused. Interface: httpcore 1.0's ``NetworkBackend`` (``httpcore/_backends/base.py``), the same in
    httpcore2 2.16.

    Args:
        core: the httpcore module (``httpcore`` for httpx, ``httpcore2`` for huggingface_hub's httpx2).
        guard: the fetch's guard, or a function returning the current one (the Hub client: per call).
        inner: the backend that makes the connection (default ``core.SyncBackend()``; tests give their own).
    """

    def __init__(self, core: ModuleType, guard: Union[FetchGuard, Callable[[], FetchGuard]],
                 inner: Any = None) -> None:
        self._core = core
        self._guard = (lambda: guard) if isinstance(guard, FetchGuard) else guard
        self._inner = inner if inner is not None else core.SyncBackend()

    def connect_tcp(self, host: str, port: int, timeout: Optional[float] = None,
                    local_address: Optional[str] = None, socket_options: Optional[Iterable[Any]] = None) -> Any:
        guard = self._guard()
        try:
            addresses = guard.resolver(host, port)
        except OSError as exc:
            raise self._core.ConnectError(f"cannot resolve {host}: {exc}") from exc
        refused: Optional[FetchRefusedError] = None
        failed: Optional[Exception] = None
        for address in addresses:
            try:
                guard.check_address(host, address)
            except FetchRefusedError as exc:
                refused = refused or exc
                continue
            try:
                stream = self._inner.connect_tcp(address, port, timeout=timeout, local_address=local_address,
                                                 socket_options=socket_options)
            except (self._core.ConnectError, self._core.ConnectTimeout) as exc:
                failed = exc
                continue
            peer = stream.get_extra_info("server_addr")
            try:
                guard.check_address(host, str(peer[0]), dialled=address)
            except FetchRefusedError:
                stream.close()
                raise
            return stream
        if failed is not None:
            raise failed
        if refused is not None:
            raise refused
        raise self._core.ConnectError(f"{host} resolves to no address")

    def connect_unix_socket(self, path: str, timeout: Optional[float] = None,
                            socket_options: Optional[Iterable[Any]] = None) -> Any:
        raise FetchRefusedError(f"a Unix socket ({path}) is refused for {self._guard().what}")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _guarded_transport_class(httpx_module: ModuleType, core: ModuleType) -> type:
    class GuardedTransport(httpx_module.HTTPTransport):  # type: ignore[name-defined,misc]
        """httpx's HTTP transport on a :class:`GuardedBackend`, each request's scheme and host checked first.

        httpx's ``HTTPTransport`` keeps its httpcore connection pool in ``_pool`` and sends every request through
        it (httpx 0.28.1 ``httpx/_transports/default.py``; httpx2 2.16.2 the same); this transport replaces
        that pool with one whose network backend is guarded. No proxy is mounted.
        """

        def __init__(self, guard: Union[FetchGuard, Callable[[], FetchGuard]], *, keepalive: bool = True,
                     inner: Any = None) -> None:
            super().__init__(trust_env=False)
            self._current = (lambda: guard) if isinstance(guard, FetchGuard) else guard
            self._pool = core.ConnectionPool(
                ssl_context=httpx_module.create_ssl_context(trust_env=True),  # SSL_CERT_FILE / SSL_CERT_DIR
                max_connections=100,
                max_keepalive_connections=20 if keepalive else 0,
                keepalive_expiry=5.0,
                network_backend=GuardedBackend(core, self._current, inner),
            )

        def handle_request(self, request: Any) -> Any:
            self._current().check_request(str(request.url))
            return super().handle_request(request)

    return GuardedTransport


_transport_classes: dict[str, type] = {}


def _transport_class(flavor: str) -> type:
    if flavor not in _transport_classes:
        if flavor == "httpx":
            import httpcore  # noqa: PLC0415
            import httpx  # noqa: PLC0415

            _transport_classes[flavor] = _guarded_transport_class(httpx, httpcore)
        else:
            import httpcore2  # noqa: PLC0415
            import httpx2  # noqa: PLC0415

            _transport_classes[flavor] = _guarded_transport_class(httpx2, httpcore2)
    return _transport_classes[flavor]


def guarded_transport(guard: FetchGuard, inner: Any = None) -> Any:
    """An ``httpx.HTTPTransport`` that holds every request and connection of one fetch to ``guard``'s rules
    (for ``httpx.Client(transport=..., trust_env=False)``); ``inner``: the connecting backend (tests)."""
    return _transport_class("httpx")(guard, inner=inner)


# ---------------------------------------------------------------------------------------------- huggingface_hub
_HUB_GUARD: contextvars.ContextVar[Optional[FetchGuard]] = contextvars.ContextVar("cog_triton_hub_guard",
                                                                                   default=None)
_hub_lock = threading.Lock()
_hub_installed = False


def _current_hub_guard() -> FetchGuard:
    """The guard of the Hub call running in this thread; outside :func:`hub_guard`, the default rules."""
    guard = _HUB_GUARD.get()
    if guard is None:
        guard = FetchGuard(FetchRules(), what="Hub downloads", check_hosts=False, single_url=False)
    return guard


def _hub_client() -> Any:
    """huggingface_hub's shared client (its ``default_client_factory``'s settings), on a guarded transport that
    opens a new connection for every request (so each request's guard checks the address it connects to)."""
    import httpx2  # noqa: PLC0415

    transport = _transport_class("httpx2")(_current_hub_guard, keepalive=False)
    return httpx2.Client(transport=transport, trust_env=False, follow_redirects=True, timeout=None)


def install_hub_guard() -> None:
    """Make this process's huggingface_hub client the guarded one and switch Xet storage off (once)."""
    global _hub_installed
    with _hub_lock:
        if _hub_installed:
            return
        import huggingface_hub  # noqa: PLC0415
        from huggingface_hub import constants  # noqa: PLC0415

        constants.HF_HUB_DISABLE_XET = True  # read per call by huggingface_hub.utils._runtime.is_xet_available
        huggingface_hub.set_client_factory(_hub_client)
        _hub_installed = True
        log.info("huggingface_hub downloads follow the fetch rules (Xet storage off: files come over HTTP)")


@contextlib.contextmanager
def hub_guard(rules: FetchRules, what: str = "adapters") -> Iterator[FetchGuard]:
    """Run huggingface_hub calls of this thread under ``rules`` (installing the guarded client first): the Hub
    endpoint and its redirects are held to the address and scheme rules."""
    install_hub_guard()
    guard = FetchGuard(rules, what=what, check_hosts=False, single_url=False)
    token = _HUB_GUARD.set(guard)
    try:
        yield guard
    finally:
        _HUB_GUARD.reset(token)


__all__ = (
    "FetchGuard",
    "GuardedBackend",
    "guarded_transport",
    "hub_guard",
    "install_hub_guard",
    "resolve",
)
