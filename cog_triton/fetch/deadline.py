"""One deadline per fetch, enforced from outside the reads.

A timeout on each socket operation does not bound a fetch: a server that sends one byte of its response headers
every half second, under any per-read timeout, kept a fetch going for as long as h11's 16 KiB header limit lasts
(about 11 days at the defaults); the deadline and the minimum rate were only checked between body chunks. So a
fetch gets one :class:`FetchDeadline`, which covers the connections, TLS handshakes, response headers, bodies and
redirects of all its attempts, and which no server can hold past its end:

* **A watchdog** (a ``threading.Timer`` armed for the deadline) shuts down every socket the fetch has open
  (``shutdown(SHUT_RDWR)``): a ``recv`` or ``send`` blocked in another thread returns at once (end of file, or
  EPIPE), whatever the server does. A socket connected after the deadline is shut down as it is handed over.
* **Which sockets**: httpcore (and huggingface_hub's httpcore2) report each connection and TLS handshake through
  the request's ``trace`` extension (:meth:`FetchDeadline.trace`; httpcore 1.0.9 ``httpcore/_trace.py``, events
  ``<prefix>.connect_tcp.complete`` with the stream as ``return_value``, ``<prefix>.start_tls.started`` /
  ``.complete`` / ``.failed``, documented in httpcore's "Extensions: trace"); httpx passes a request's
  extensions to each redirect (httpx 0.28.1 ``_client.py`` ``_build_redirect_request``). During a TLS handshake
  the plain socket is already detached into the ``SSLSocket`` being built, so a duplicate of its descriptor
  (``socket.dup``: ``shutdown`` acts on the connection, not the descriptor) is watched until the handshake ends.
  urllib3's connections (huggingface_hub 0.x) are watched by :mod:`cog_triton.fetch.guard` through the same
  :meth:`FetchDeadline.watch`.
* **The error**: once the deadline has passed, every trace event that starts a step (connecting, a TLS
  handshake, sending a request) and every failure the shutdown causes raises :class:`FetchDeadlineError`, which
  httpx and httpcore pass through unchanged (only httpcore's own exceptions are mapped, ``httpx/_transports/
  default.py`` ``map_httpcore_exceptions``), so no client retries it (huggingface_hub's ``http_backoff`` retries
  only httpx2's timeout, network and remote-protocol errors: 2.4.0 ``utils/_http.py``
  ``_DEFAULT_RETRY_ON_EXCEPTIONS``), and the caller names the deadline. A client that takes a head the shutdown
  cut short for a whole one (http.client, under urllib3) gets the deadline from :mod:`cog_triton.fetch.guard`'s
  ``getresponse``; whatever a client makes of it, the callers (:func:`cog_triton.weights.fetch_weights`,
  :class:`cog_triton.streaming.lora.store.AdapterStore`) report the deadline once it has passed.

**The connect** is held to the deadline where it is made, not by the watchdog (a socket still connecting is not
handed over until it has connected): :meth:`cog_triton.fetch.guard.FetchGuard.connect` resolves the name within
the time left and dials each address the name resolves to with at most the time left, and tries none once the
deadline has passed. Without that, each address got the whole connect timeout: a name with 8 addresses that drop
connection attempts held a fetch 8 timeouts (16.1 s against a 3 s deadline), whatever the deadline. Every fetch
connects that way: the guarded transport and urllib3 connections of fetches under the rules, huggingface_hub's
client, and the operator's own downloads (:func:`cog_triton.fetch.guard.bound_connects`). ``getaddrinfo`` cannot
be interrupted, so a resolution runs in a thread of its own which the fetch stops waiting for at the deadline; the
thread ends when the resolver gives up (its own timeouts), and its answer is dropped.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Optional

from common.errors import FetchDeadlineError

log = logging.getLogger(__name__)


#: The download defaults (COG_TRITON_DOWNLOAD_* settings and fetch_weights' own), defined once here, where both
#: cog_triton.settings and cog_triton.weights may import them.
#: Default deadline of a whole download, all attempts and the waits between them (seconds; 0: none).
DEFAULT_DOWNLOAD_DEADLINE_S = 6 * 3600.0


#: Default lowest transfer rate (bytes per second; 0: no minimum) ...
DEFAULT_DOWNLOAD_MIN_RATE_BYTES_S = 100_000


#: ... measured over consecutive windows of this many seconds, the first from the start of each attempt.
DEFAULT_DOWNLOAD_RATE_GRACE_S = 60.0


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


class FetchDeadline:
    """The deadline of one fetch (see the module docstring); thread-safe (a fetch may use several threads).

    Args:
        seconds: the deadline, in seconds from now (for messages too).
        at: the ``time.monotonic()`` instant it ends, when the caller's clock started earlier (``seconds`` is then
            only what messages say).
        what: what is fetched, for the message ("the download of https://host/a.tar.gz").
        setting: the setting that sets it, for the message.

    Use ``with deadline:`` around the fetch (arms the watchdog, disarms it after), pass :meth:`trace` as the
    ``trace`` extension of each httpx request, and call :meth:`check` before each step a client makes.
    """

    def __init__(self, seconds: float, *, at: Optional[float] = None, what: str = "the fetch",
                 setting: str = "") -> None:
        if not seconds > 0:
            raise ValueError(f"a deadline must be > 0 seconds, got {seconds!r}")
        self.seconds = float(seconds)
        self.at = at if at is not None else time.monotonic() + self.seconds
        self.what = what
        self.setting = setting
        self._lock = threading.Lock()
        self._watched: list[socket.socket] = []
        self._timer: Optional[threading.Timer] = None
        self._expired = False
        self._local = threading.local()  # per thread: the plain socket of the connection being made

    # ------------------------------------------------------------------ time
    def remaining(self) -> float:
        """Seconds left (0 once passed)."""
        return max(0.0, self.at - time.monotonic())

    def passed(self) -> bool:
        return self._expired or time.monotonic() >= self.at

    def error(self) -> FetchDeadlineError:
        setting = f" ({self.setting})" if self.setting else ""
        return FetchDeadlineError(f"{self.what} did not finish within the deadline of {_num(self.seconds)} s{setting}")

    def check(self) -> None:
        """Raises: FetchDeadlineError: the deadline has passed."""
        if self.passed():
            raise self.error()

    # ------------------------------------------------------------------ the watchdog
    def __enter__(self) -> "FetchDeadline":
        with self._lock:
            if self._timer is None and not self._expired:
                self._timer = threading.Timer(self.remaining(), self._expire)
                self._timer.name = "fetch-deadline"
                self._timer.daemon = True
                self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            timer, self._timer = self._timer, None
            self._watched.clear()
        if timer is not None:
            timer.cancel()

    def _expire(self) -> None:
        with self._lock:
            self._expired = True
            watched = list(self._watched)
        if watched:
            log.info("%s: the deadline of %s s passed; closing its %d connection(s)", self.what, _num(self.seconds),
                     len(watched))
        for sock in watched:
            _shut(sock)

    def watch(self, sock: Any) -> None:
        """Shut ``sock`` down when the deadline passes (at once when it has). Closed sockets are forgotten."""
        if not isinstance(sock, socket.socket):
            return
        with self._lock:
            self._watched = [s for s in self._watched if s.fileno() != -1]
            self._watched.append(sock)
            expired = self._expired
        if expired:
            _shut(sock)

    def unwatch(self, sock: Any) -> None:
        with self._lock:
            self._watched = [s for s in self._watched if s is not sock and s.fileno() != -1]

    # ------------------------------------------------------------------ httpcore's trace extension
    def trace(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's ``trace`` callback (``<prefix>.<step>.<started|complete|failed>``; see the module docstring).

        Raises:
            FetchDeadlineError: the deadline has passed, at a step's start or failure, or as a connection or TLS
                handshake completes (that connection is closed first).
        """
        step, _, phase = event.rpartition(".")
        step = step.rpartition(".")[2]
        if step == "connect_tcp" and phase == "complete":
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            self._local.plain = sock
            self.watch(sock)
            if self.passed():
                stream.close()
                raise self.error()
        elif step == "start_tls":
            if phase == "started":
                plain = getattr(self._local, "plain", None)
                if isinstance(plain, socket.socket) and plain.fileno() != -1:
                    duplicate = plain.dup()  # the same connection, for as long as the handshake detaches it
                    self._local.duplicate = duplicate
                    self.watch(duplicate)
            else:
                duplicate = getattr(self._local, "duplicate", None)
                self._local.duplicate = None
                if duplicate is not None:
                    self.unwatch(duplicate)
                    duplicate.close()
                if phase == "complete":
                    stream = info.get("return_value")
                    self.watch(stream.get_extra_info("socket") if stream is not None else None)
                    if self.passed():
                        stream.close()
                        raise self.error()
        if phase == "failed" and self.passed() and isinstance(info.get("exception"), Exception):
            # Only errors become the deadline's: a body stream that is closed or collected (GeneratorExit, a
            # BaseException) ends its step "failed" too, inside the generator's close, where raising would be
            # "Exception ignored" and the close would not finish.
            raise self.error() from info.get("exception")
        if phase == "started" and step in ("connect_tcp", "start_tls", "send_request_headers") and self.passed():
            raise self.error()


def _shut(sock: socket.socket) -> None:
    """Shut the connection down in both directions (the plain socket's method: for an SSLSocket, without touching
    its TLS state, which another thread may be reading with). A closed socket is left alone: its object holds -1
    once closed (CPython ``sock_close``), so only a close racing this very call, in the few instructions between
    reading the descriptor and ``shutdown(2)``, could reach a descriptor reused meanwhile."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


__all__ = ("FetchDeadline", "FetchDeadlineError")
