"""Enforcing the fetch rules (:mod:`cog_triton.fetch.rules`) on the connections of a fetch.

* :class:`FetchGuard`: the rules applied to one fetch (a URL and its redirects, or one Hub call): checks each
  request's scheme and host, and each connection's address.
* :class:`GuardedBackend`: an httpcore network backend that resolves once, connects only to allowed addresses
  and checks the connected socket's peer address (``getpeername``) before anything is sent.
* :func:`guarded_transport`: an httpx transport on that backend, every request checked first (redirects are
  requests too), no proxy (through a proxy the peer would be the proxy).
* :func:`guarded_requests_session`: the same for requests (urllib3 connections through the same connect loop).
* :func:`hub_guard`: huggingface_hub's client (2.x httpx2, 1.x httpx, 0.x requests) guarded per call, for
  ``hf://`` downloads.

A guard may carry the fetch's deadline (:class:`cog_triton.fetch.deadline.FetchDeadline`): the transport hands it
each request's connections through httpcore's ``trace`` extension, the urllib3 connections register theirs, and
after it no request or connection starts. The connect itself is held to it too (:meth:`FetchGuard.connect`): the name
is resolved within the time left, each address is tried with at most the time left, and once the deadline has passed
no further address is tried, so no answer of the resolver, however many addresses it names or however long it takes,
makes a fetch outlive its deadline (:func:`bound_connects` gives the operator's own downloads, which have no rules,
the same connect). A guard without rules (``rules=None``) checks nothing else.

Split from :mod:`cog_triton.fetch.rules` so that the rules stay pure (addresses, names, lists) and this module
holds what touches httpx, httpcore and huggingface_hub.

Why one module: one concern, holding a fetch's connections to its rules and its deadline, once
for every HTTP client a fetch may use (httpx, huggingface_hub's httpx2 or requests/urllib3); each client's adapter
is a thin layer over the one connect (:meth:`FetchGuard.connect`), and apart they would share it only through a
private interface.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import ipaddress
import logging
import os
import socket
import threading
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, TypeVar, Union

from common.errors import FetchRefusedError
from cog_triton.fetch.deadline import FetchDeadline
from cog_triton.fetch.rules import FetchRules, normalize_host
from cog_triton.fetch.redaction import redact_url

log = logging.getLogger(__name__)
T = TypeVar("T")

Resolver = Callable[[str, int], Sequence[str]]
#: dial(address, the most seconds it may take, or None for its own timeout) -> an open connection.
Dialler = Callable[[str, Optional[float]], T]


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


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    return True


def _resolve_within(resolver: Resolver, host: str, port: int, deadline: FetchDeadline) -> Sequence[str]:
    """``resolver(host, port)`` within the deadline's time left.

    ``getaddrinfo`` cannot be interrupted, so the resolution runs in a daemon thread of its own and the fetch waits
    for it only until the deadline; a resolver that has not answered by then is left to finish on its own (glibc
    bounds it by resolv.conf's ``timeout`` x ``attempts`` per nameserver: at most 30 s x 5 x 3) and its answer is
    dropped. An address literal needs no resolver and gets no thread.

    Raises:
        FetchDeadlineError: the deadline passed first. OSError: what the resolver raised.
    """
    deadline.check()
    if _is_address(host):
        return resolver(host, port)
    answer: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            answer["addresses"] = resolver(host, port)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            answer["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="fetch-resolve", daemon=True).start()
    if not done.wait(deadline.remaining()):
        log.info("%s: %s was not resolved within the deadline of %g s", deadline.what, host, deadline.seconds)
        raise deadline.error()
    if "error" in answer:
        raise answer["error"]
    return answer["addresses"]


@dataclass
class FetchGuard:
    """The rules applied to one fetch (one download and its redirects, or one Hub call): what the transport and
    the network backend ask before each request and each connection.

    Args:
        rules: the rules; None: none (the operator's own weights): only the connect's deadline
            (:meth:`connect`) applies.
        what: what is fetched, for messages ("adapters", "checkpoints").
        check_hosts: apply the host allow-list (URLs a caller gives; not the Hub's own hops).
        resolver: host, port -> addresses (None: :func:`resolve`, looked up per call; tests give their own).
        single_url: the fetch is one URL and its redirects (a refused later hop is named as the redirect); False
            for a client that makes several requests (the Hub's): a refusal names the request's URL.
        deadline: the fetch's one deadline (:mod:`cog_triton.fetch.deadline`), held on every request and
            connection made under this guard; None: none.
    """

    rules: Optional[FetchRules]
    what: str
    check_hosts: bool = True
    resolver: Optional[Resolver] = None
    single_url: bool = True
    deadline: Optional[FetchDeadline] = None
    first_url: Optional[str] = field(default=None, init=False)
    first_host: Optional[str] = field(default=None, init=False)

    def check_request(self, url: str, scheme: str, host: str) -> None:
        """Before each request (the first and every redirect): its scheme and host, as the HTTP client parsed the
        URL it is about to request (``url``: its text, for messages).

        Raises:
            FetchRefusedError: naming the rule (and the redirect, for a later hop).
        """
        if self.first_url is None:
            self.first_url, self.first_host = url, normalize_host(host)
        if self.rules is None:
            return
        refusal = self.rules.scheme_refusal(scheme, self.what)
        if refusal is None and self.check_hosts:
            refusal = self.rules.host_refusal(host, self.what)
        if refusal is not None:
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
        if self.rules is None:
            return
        refusal = self.rules.address_refusal(address, host, self.what, dialled)
        if refusal is not None:
            later = self.single_url and self.first_host not in (None, normalize_host(host))
            hop = f"the redirect to {host}: " if later else ""
            raise FetchRefusedError(hop + refusal)

    def connect(self, host: str, port: int, *, dial: Dialler[T], peer_of: Callable[[T], str],
                failures: tuple[type[BaseException], ...], error: Callable[[str], BaseException]) -> T:
        """A connection for ``host``:``port`` to an allowed address: resolve once (:attr:`resolver`), skip refused
        addresses, ``dial`` an allowed one (the address itself, so no second resolution can answer differently),
        then check the connected peer (``peer_of``, the socket's ``getpeername``) before returning it.

        Under a deadline (:attr:`deadline`) the whole connect is held to it: the resolution waits at most the time
        left (:func:`_resolve_within`), each address is dialled with at most the time left (its own connect timeout
        otherwise: every address got the whole timeout, so 8 addresses that drop connection attempts held a fetch 8
        timeouts), and once the deadline has passed no further address is tried.

        Args:
            dial: (address, the most seconds the connect may take, or None for the dialler's own timeout) -> an open
                connection (it raises one of ``failures`` when it cannot connect).
            error: message -> the client library's connection error (no address, unresolvable).

        Raises:
            FetchDeadlineError: the deadline passed before a connection was made (the last address's failure is its
                cause).
            FetchRefusedError: every address is refused, or the connected peer is (that connection closed).
            One of ``failures`` / ``error``: no allowed address could be connected to, or the name does not resolve.
        """
        deadline = self.deadline
        resolver = self.resolver or resolve
        try:
            addresses = resolver(host, port) if deadline is None else _resolve_within(resolver, host, port, deadline)
        except OSError as exc:
            raise error(f"cannot resolve {host}: {exc}") from exc
        refused: Optional[FetchRefusedError] = None
        failed: Optional[BaseException] = None
        for address in addresses:
            try:
                self.check_address(host, address)
            except FetchRefusedError as exc:
                refused = refused or exc
                continue
            if deadline is not None and deadline.passed():
                raise deadline.error() from failed
            try:
                conn = dial(address, None if deadline is None else deadline.remaining())
            except failures as exc:
                failed = exc
                continue
            try:
                self.check_address(host, peer_of(conn), dialled=address)
            except FetchRefusedError:
                conn.close()  # type: ignore[attr-defined]
                raise
            return conn
        if deadline is not None and deadline.passed():
            raise deadline.error() from failed
        if failed is not None:
            raise failed
        if refused is not None:
            raise refused
        raise error(f"{host} resolves to no address")


def _capped(timeout: Optional[float], cap: Optional[float]) -> Optional[float]:
    """The smaller of a connect timeout (None: none) and a cap (None: none), at least 1 ms."""
    if cap is None:
        return timeout
    return max(0.001, cap if timeout is None else min(timeout, cap))


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
        return self._guard().connect(
            host, port,
            dial=lambda address, cap: self._inner.connect_tcp(address, port, timeout=_capped(timeout, cap),
                                                              local_address=local_address,
                                                              socket_options=socket_options),
            peer_of=lambda stream: str(stream.get_extra_info("server_addr")[0]),
            failures=(self._core.ConnectError, self._core.ConnectTimeout),
            error=self._core.ConnectError,
        )

    def connect_unix_socket(self, path: str, timeout: Optional[float] = None,
                            socket_options: Optional[Iterable[Any]] = None) -> Any:
        raise FetchRefusedError(f"a Unix socket ({path}) is refused for {self._guard().what}")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def bound_connects(client: Any, deadline: FetchDeadline) -> None:
    """Hold every connection ``client`` (an ``httpx.Client`` without a guarded transport: the operator's own
    weights, which honour ``HTTP(S)_PROXY``) makes to ``deadline``, as :meth:`FetchGuard.connect` holds a guarded
    fetch's: each of its connection pools (the default transport's and each proxy mount's) connects through a
    :class:`GuardedBackend` without rules around the backend it had.

    httpcore's own ``SyncBackend.connect_tcp`` is ``socket.create_connection``, which tries every address the name
    resolves to with the whole timeout (httpcore 1.0.9 ``_backends/sync.py``; CPython ``socket.py``): 8 addresses that
    drop connection attempts held a download 8 timeouts, whatever its deadline. httpx keeps the pools on its
    transports (``Client._transport``, ``Client._mounts``; ``HTTPTransport._pool``, an httpcore ``ConnectionPool`` or
    ``HTTPProxy`` whose connections call ``_network_backend.connect_tcp``: httpx 0.28.1 ``_client.py`` and
    ``_transports/default.py``, httpcore 1.0.9 ``_sync/connection_pool.py``), which is where this reaches.

    Raises:
        TypeError: a transport without such a pool (another httpx): the deadline could not be held.
    """
    import httpcore  # noqa: PLC0415 - httpx's own

    guard = FetchGuard(None, what="weights", deadline=deadline)
    transports = [client._transport, *(t for t in client._mounts.values() if t is not None)]
    for transport in transports:
        pool = getattr(transport, "_pool", None)
        inner = getattr(pool, "_network_backend", None)
        if inner is None:
            raise TypeError(f"{type(transport).__name__} has no httpcore pool: its connects cannot be held to the "
                            "fetch's deadline")
        if not isinstance(inner, GuardedBackend):
            pool._network_backend = GuardedBackend(httpcore, guard, inner)


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
            url = request.url  # as httpx parsed it: the URL it sends the request to
            guard = self._current()
            guard.check_request(str(url), url.scheme, url.raw_host.decode("ascii"))
            if guard.deadline is not None:  # its watchdog learns the request's connections (httpcore's trace)
                guard.deadline.check()
                trace = request.extensions.get("trace")
                if trace != guard.deadline.trace:  # (a caller that passed it already: once is enough)
                    request.extensions = {**request.extensions, "trace": _chained(trace, guard.deadline.trace)}
            return super().handle_request(request)

    return GuardedTransport


_transport_classes: dict[str, type] = {}


def _chained(first: Optional[Callable[[str, dict], Any]], second: Callable[[str, dict], Any]) -> Callable[[str, dict], Any]:
    """A ``trace`` extension calling ``first`` (one the request had) and then ``second``."""
    if first is None:
        return second

    def both(event: str, info: dict) -> None:
        first(event, info)
        second(event, info)

    return both


def _stack_missing(exc: ImportError) -> FetchRefusedError:
    return FetchRefusedError(f"the HTTP client huggingface_hub uses is not importable ({exc}): hf:// cannot be held "
                             "to the fetch rules, so it is refused")


def _transport_class(flavor: str) -> type:
    if flavor not in _transport_classes:
        if flavor == "httpx":
            import httpcore  # noqa: PLC0415
            import httpx  # noqa: PLC0415

            _transport_classes[flavor] = _guarded_transport_class(httpx, httpcore)
        else:
            try:  # huggingface_hub 2.x's HTTP stack: there only with it
                import httpcore2  # noqa: PLC0415
                import httpx2  # noqa: PLC0415
            except ImportError as exc:
                raise _stack_missing(exc) from exc
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


def _refuse_if_offline(url: str) -> None:
    """Raise huggingface_hub's ``OfflineModeIsEnabled`` when ``HF_HUB_OFFLINE`` is set, as its own clients do
    before each request (0.x: the ``OfflineAdapter`` its default session factory mounts, ``utils/_http.py`` 0.36.0;
    2.x: ``hf_request_event_hook``, 2.4.0): a client of ours in their place must not reach the Hub either."""
    from huggingface_hub import constants  # noqa: PLC0415 - only for Hub calls
    from huggingface_hub.errors import OfflineModeIsEnabled  # noqa: PLC0415

    is_offline = getattr(constants, "is_offline_mode", None)  # 1.x+; 0.x reads the constant
    if is_offline() if callable(is_offline) else constants.HF_HUB_OFFLINE:
        raise OfflineModeIsEnabled(f"Cannot reach {url}: offline mode is enabled. To disable it, please unset the "
                                   "`HF_HUB_OFFLINE` environment variable.")


def _hub_client(flavor: str) -> Any:
    """huggingface_hub's shared client (1.x: httpx, 2.x: httpx2; its ``default_client_factory``'s settings:
    redirects followed, no timeout of its own, ``HF_HUB_OFFLINE`` honoured) on a guarded transport that opens a
    new connection for every request, so that each request's guard checks the address it connects to."""
    module = importlib.import_module(flavor)
    transport = _transport_class(flavor)(_current_hub_guard, keepalive=False)
    return module.Client(transport=transport, trust_env=False, follow_redirects=True, timeout=None,
                         event_hooks={"request": [lambda request: _refuse_if_offline(str(request.url))]})


# Why one function: the guarded urllib3 connection, its two pool classes and the requests adapter
# are made together, each closing over ``guard_of`` and ``before_send``; apart, they would carry both as state.
def _requests_classes(guard_of: Callable[[], FetchGuard],
                      before_send: Optional[Callable[[str], None]] = None) -> tuple[type, type, type]:
    """urllib3 connection classes whose ``_new_conn`` connects through :meth:`FetchGuard.connect`, and a requests
    adapter using them, each request checked first (requests follows redirects by sending each hop through the
    adapter; ``before_send(url)`` runs before that check). ``_new_conn`` makes the socket of both HTTPConnection and
    HTTPSConnection (TLS is wrapped around it afterwards) in urllib3 1.26 and 2.x (``urllib3/connection.py``); a
    PoolManager picks its pool classes from ``pool_classes_by_scheme`` (``urllib3/poolmanager.py``).

    The pools keep no connection: ``_put_conn`` (where a connection goes back to the pool once its response is
    read, urllib3 1.26 and 2.x ``connectionpool.py``) closes it instead. A session lives on between fetches
    (huggingface_hub 0.x caches one per thread, ``get_session``), and a kept-alive connection, checked under the
    rules of the fetch that opened it, would otherwise carry a later fetch held to other rules to the same
    address unchecked (the httpx transports open a new connection per request for the same reason)."""
    try:  # huggingface_hub 0.x's HTTP stack: there only with it
        import requests.adapters  # noqa: PLC0415
        from urllib3 import connection as u3connection  # noqa: PLC0415
        from urllib3 import connectionpool  # noqa: PLC0415
        from urllib3.exceptions import ConnectTimeoutError, NewConnectionError  # noqa: PLC0415
        from urllib3.util import connection as u3util  # noqa: PLC0415
        from urllib3.util import parse_url  # noqa: PLC0415
    except ImportError as exc:
        raise _stack_missing(exc) from exc

    class Guarded:
        def connect(self: Any) -> None:
            """urllib3's connect (``_new_conn``, then TLS around the socket); the deadline watches the connection
            throughout: a duplicate of the plain socket while TLS detaches it, then the socket in use."""
            try:
                super().connect()  # type: ignore[misc]
            finally:
                deadline, duplicate = getattr(self, "_cog_triton_watch", (None, None))
                self._cog_triton_watch = (None, None)
                if deadline is not None:
                    deadline.unwatch(duplicate)
                    duplicate.close()
                    deadline.watch(getattr(self, "sock", None))

        def getresponse(self: Any, *args: Any, **kwargs: Any) -> Any:
            """urllib3's response; after the deadline, its error instead (http.client takes a head cut short by the
            watchdog's shutdown for a complete one)."""
            response = super().getresponse(*args, **kwargs)  # type: ignore[misc]
            deadline = guard_of().deadline
            if deadline is not None and deadline.passed():
                response.close()
                raise deadline.error()
            return response

        def _new_conn(self: Any) -> socket.socket:
            def dial(address: str, cap: Optional[float]) -> socket.socket:
                # self.timeout: seconds, None (none) or urllib3's default sentinel (the socket default's); under a
                # deadline, the time left caps the first and replaces the others
                timeout = self.timeout
                if cap is not None:
                    timeout = _capped(timeout if isinstance(timeout, (int, float)) else None, cap)
                try:
                    return u3util.create_connection((address, self.port), timeout,
                                                    source_address=self.source_address,
                                                    socket_options=self.socket_options)
                except TimeoutError as exc:
                    raise ConnectTimeoutError(self, f"Connection to {self.host} timed out") from exc
                except OSError as exc:
                    raise NewConnectionError(self, f"Failed to establish a new connection: {exc}") from exc

            guard = guard_of()
            if guard.deadline is not None:
                guard.deadline.check()
            sock = guard.connect(self._dns_host, self.port, dial=dial,
                                 peer_of=lambda sock: str(sock.getpeername()[0]),
                                 failures=(ConnectTimeoutError, NewConnectionError),
                                 error=lambda message: NewConnectionError(self, message))
            if guard.deadline is not None:
                duplicate = sock.dup()
                self._cog_triton_watch = (guard.deadline, duplicate)
                guard.deadline.watch(duplicate)
            return sock

    def _put_conn(self: Any, conn: Any) -> None:
        if conn is not None:
            conn.close()

    http_conn = type("GuardedHTTPConnection", (Guarded, u3connection.HTTPConnection), {})
    https_conn = type("GuardedHTTPSConnection", (Guarded, u3connection.HTTPSConnection), {})
    pools = {
        "http": type("GuardedHTTPConnectionPool", (connectionpool.HTTPConnectionPool,),
                     {"ConnectionCls": http_conn, "_put_conn": _put_conn}),
        "https": type("GuardedHTTPSConnectionPool", (connectionpool.HTTPSConnectionPool,),
                      {"ConnectionCls": https_conn, "_put_conn": _put_conn}),
    }

    class GuardedAdapter(requests.adapters.HTTPAdapter):
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            self.poolmanager.pool_classes_by_scheme = pools

        session_class = requests.Session

        def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:
            if before_send is not None:
                before_send(request.url)
            parsed = parse_url(request.url)  # urllib3's parser: the URL the connection pool requests
            guard_of().check_request(request.url, parsed.scheme or "", parsed.host or "")
            return super().send(request, *args, **kwargs)

    return http_conn, https_conn, GuardedAdapter


def requests_ca_bundle(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The CA certificates (a file or a folder) a guarded requests session verifies with: the ones the httpx
    fetches use first (``SSL_CERT_FILE``, else ``SSL_CERT_DIR``, the first one set: httpx 0.28.1
    ``create_ssl_context`` with ``trust_env``, ``httpx/_config.py``), else requests' own variables
    (``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE``); None: requests' default (certifi). So one ``SSL_CERT_FILE`` is
    trusted by every fetch whatever client huggingface_hub uses, also where ``REQUESTS_CA_BUNDLE`` names another
    bundle (requests alone would prefer that one)."""
    env = os.environ if environ is None else environ
    return next((env[name] for name in ("SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
                 if env.get(name)), None)


def guarded_requests_session(guard: Union[FetchGuard, Callable[[], FetchGuard]],
                             before_send: Optional[Callable[[str], None]] = None) -> Any:
    """A ``requests.Session`` whose every request and connection follows ``guard`` (or the guard a function
    returns, per connection), each request on a new connection: no proxy, no .netrc (``trust_env`` off). The CA
    certificates are :func:`requests_ca_bundle`'s. ``before_send(url)`` runs before each request (and each redirect)
    and may raise to stop it."""
    guard_of = (lambda: guard) if isinstance(guard, FetchGuard) else guard
    adapter = _requests_classes(guard_of, before_send)[2]()
    session = adapter.session_class()
    session.trust_env = False
    bundle = requests_ca_bundle()
    if bundle:
        session.verify = bundle
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def _hub_requests_session() -> Any:
    """huggingface_hub 0.x's per-thread session factory (``configure_http_backend``), guarded per call, and
    ``HF_HUB_OFFLINE`` honoured per request."""
    return guarded_requests_session(_current_hub_guard, _refuse_if_offline)


def _install(hub: Any) -> str:
    """Give the huggingface_hub module ``hub`` the guarded client; return which HTTP stack it uses.

    huggingface_hub 1.x (httpx) and 2.x (httpx2) take a client factory (``set_client_factory``, 2.4.0's
    ``huggingface_hub/utils/_http.py``, which imports httpx2 where 1.x imported httpx); 0.x takes a
    ``requests.Session`` factory (``configure_http_backend``, one session per thread). Xet storage is switched
    off (``constants.HF_HUB_DISABLE_XET``, read per call by ``is_xet_available``).

    Raises:
        FetchRefusedError: a huggingface_hub with neither (hf:// cannot be held to the rules).
    """
    hub.constants.HF_HUB_DISABLE_XET = True
    if hasattr(hub, "set_client_factory"):
        flavor = "httpx2" if hasattr(importlib.import_module("huggingface_hub.utils._http"), "httpx2") else "httpx"
        hub.set_client_factory(functools.partial(_hub_client, flavor))
        return flavor
    if hasattr(hub, "configure_http_backend"):
        hub.configure_http_backend(backend_factory=_hub_requests_session)
        return "requests"
    raise FetchRefusedError(f"huggingface_hub {getattr(hub, '__version__', '?')} cannot be given a guarded HTTP "
                            "client, so hf:// references are refused; use an https:// URL of an archive")


def install_hub_guard() -> None:
    """Make this process's huggingface_hub client the guarded one and switch Xet storage off (once).

    Raises:
        FetchRefusedError: see :func:`_install`.
    """
    global _hub_installed
    with _hub_lock:
        if _hub_installed:
            return
        import huggingface_hub  # noqa: PLC0415
        import huggingface_hub.constants  # noqa: PLC0415, F401 - a lazy attribute of the package until imported

        stack = _install(huggingface_hub)
        _hub_installed = True
        log.info("huggingface_hub %s downloads follow the fetch rules (its %s client; Xet storage off: files come "
                 "over HTTP)", huggingface_hub.__version__, stack)


@contextlib.contextmanager
def hub_guard(rules: FetchRules, what: str = "adapters",
              deadline: Optional[FetchDeadline] = None) -> Iterator[FetchGuard]:
    """Run huggingface_hub calls of this thread (and of the threads it starts in a copy of its context) under
    ``rules`` (installing the guarded client first): the Hub endpoint and its redirects are held to the address and
    scheme rules, and every request and connection to ``deadline`` (entered by the caller)."""
    install_hub_guard()
    import huggingface_hub.constants  # noqa: PLC0415 - installed above

    huggingface_hub.constants.HF_HUB_DISABLE_XET = True  # again per call: nothing else may have turned it back on
    guard = FetchGuard(rules, what=what, check_hosts=False, single_url=False, deadline=deadline)
    token = _HUB_GUARD.set(guard)
    try:
        yield guard
    finally:
        _HUB_GUARD.reset(token)


__all__ = (
    "FetchGuard",
    "GuardedBackend",
    "bound_connects",
    "guarded_requests_session",
    "guarded_transport",
    "hub_guard",
    "install_hub_guard",
    "resolve",
)
