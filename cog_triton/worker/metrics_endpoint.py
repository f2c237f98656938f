"""The Prometheus endpoint: ``GET /metrics`` answering the service's metrics (:mod:`cog_triton.worker.exporter`)
followed by Triton's own, for any number of clients (:class:`MetricsServer` says how), in a thread of the Cog worker.

Split from :mod:`cog_triton.worker.exporter` (the metrics and their registry) so that each holds one concern: this
module is the HTTP server, its admission of connections and its shared renderings.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import Callable, Optional, Union

import h11
import httpx

from common.errors import ConfigError
from common.http import default_ssl_context
from cog_triton.worker.exporter import CONTENT_TYPE, ServiceMetrics

log = logging.getLogger(__name__)

# The bounds' defaults are the settings' (COG_TRITON_PROMETHEUS_*), defined once there with their reasons.
from cog_triton.settings.metrics import (  # noqa: E402 - beside the module's other constants
    BACKLOG,
    MAX_CONNECTIONS,
    REQUEST_TIMEOUT_S,
    REUSE_S,
    TRITON_SCRAPE_TIMEOUT_S,
)

#: A request head still incomplete past this many bytes is refused (h11's ``max_incomplete_event_size``: 431).
MAX_REQUEST_BYTES = 8192
#: Seconds a connection may wait for its request before it counts as idle, and may be closed to make room for a new
#: one. Without it, a burst of connections accepted at once closed each other before the loop had read the requests
#: already in their sockets (256 clients looping: 5,115 of 5,782 reset); a client sends its request as it connects.
IDLE_GRACE_S = 0.25


class MetricsServer:
    """``GET /metrics`` on ``host:port``: the service's metrics, then Triton's (see the module docstring).

    **One thread with non-blocking I/O** (an asyncio event loop of its own, parsing with h11), not prometheus_client's
    WSGI app under a threaded server: that server (prometheus_client 0.26 ``exposition.py`` ``ThreadingWSGIServer``,
    and the standard library's ``ThreadingHTTPServer`` this endpoint used) starts a thread per connection and keeps
    it for as long as the client keeps the connection, and a socket timeout bounds only each read, so a client
    dripping a byte per timeout holds its thread for ever; 400 idle connections left 400 threads in the Cog worker.
    No WSGI server with a deadline for a whole request is installed here. On the event loop a connection costs a
    socket and a protocol object (:class:`_Connection`, no task), never a thread:

    * each connection has :attr:`request_timeout_s` for its whole request head (however it is dripped) and again
      for taking the answer, then it is closed; one request per connection (``Connection: close``);
    * **admission**: at most :attr:`max_connections` are held. The endpoint accepts a connection only when it can
      hold it: below the bound, or by closing the oldest connection that has waited :data:`IDLE_GRACE_S` without a
      whole request (an idle or half-sent one: those cannot hold the endpoint). While every connection held is being
      answered (or has only just come), it accepts none, and new ones wait in the kernel's accept queue
      (:attr:`backlog`) in the order they came, each admitted as an answer ends. So however many clients loop
      ``GET /metrics``, a newcomer is queued behind them, never reset: the endpoint this replaced reset it when all
      held connections were being answered (64 clients looping left a real scraper answered 12 times of 37);
    * **one rendering for many scrapes**: a scrape is answered by a rendering of the metrics (:meth:`scrape`: our
      registry, then Triton's text, up to :attr:`triton_timeout_s`) that started at most :attr:`reuse_s` before
      the scrape arrived; one that arrives later waits for the next rendering, which starts when the one in flight
      ends. At most one rendering runs at a time, in the one thread that renders, so Triton's ``/metrics`` is
      fetched at most once at a time and at most about once per :attr:`reuse_s`, its text shared by every scrape
      it answers, however many clients scrape; a scrape waits at most for the rendering in flight and then its
      own. Each answer's bytes are made once per rendering and written as they are;
    * the threads are two, whatever the clients do: the loop's, and the one that renders.

    Args:
        metrics: the service's metrics.
        host / port: where to listen (port 0: any free port, for tests); an address with ":" is IPv6.
        triton_url: Triton's own metrics URL (``http://127.0.0.1:<COG_TRITON_METRICS_PORT>/metrics``), or a
            callable giving it (None: no Triton yet); None: not included.
        triton_timeout_s: how long a rendering waits for Triton, seconds.
        request_timeout_s / max_connections / backlog / reuse_s: :data:`REQUEST_TIMEOUT_S`, :data:`MAX_CONNECTIONS`,
            :data:`BACKLOG`, :data:`REUSE_S`.
    """

    def __init__(self, metrics: ServiceMetrics, host: str, port: int,
                 triton_url: Union[str, Callable[[], Optional[str]], None] = None,
                 triton_timeout_s: float = TRITON_SCRAPE_TIMEOUT_S, *, request_timeout_s: float = REQUEST_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS, backlog: int = BACKLOG, reuse_s: float = REUSE_S) -> None:
        if max_connections < 1 or backlog < 1 or reuse_s < 0 or request_timeout_s <= 0:
            raise ValueError("max_connections and backlog must be >= 1, reuse_s >= 0 and request_timeout_s > 0")
        self.metrics = metrics
        self.host = host
        self.requested_port = port
        self.triton_url = triton_url
        self.triton_timeout_s = triton_timeout_s
        self.request_timeout_s = request_timeout_s
        self.max_connections = max_connections
        self.backlog = backlog
        self.reuse_s = reuse_s
        #: Connections accepted so far, and renderings made so far (for tests and figures).
        self.accepted = 0
        self.renderings = 0
        self._port: Optional[int] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._scraper: Optional[ThreadPoolExecutor] = None
        self._triton_client: Optional[httpx.Client] = None
        # connection -> still waiting for its request; in the order they were admitted (the oldest first)
        self._open: "OrderedDict[_Connection, bool]" = OrderedDict()
        self._waiting = 0  # of them, still waiting for their request
        self._room: Optional[asyncio.Event] = None
        # the latest rendering (its answer, as a future of the loop) and when it started; the next one, asked for
        # while the latest was in flight but too old to answer
        self._current: Optional["asyncio.Future[_Answer]"] = None
        self._current_at = 0.0
        self._next: Optional["asyncio.Future[_Answer]"] = None
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        """The port it listens on (after :meth:`start`)."""
        assert self._port is not None, "not started"
        return self._port

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host  # noqa: S104 - a URL to reach it by
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/metrics"

    @property
    def connections(self) -> int:
        """Connections held now."""
        return len(self._open)

    def start(self) -> None:
        """Listen on ``host:port`` (bound here, so a failure is raised here) and serve in a daemon thread.

        Raises:
            ConfigError: the address cannot be bound (in use, not an address of this host); names it and
                the settings.
        """
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as http.server does: restart after a stop
            sock.bind((self.host, self.requested_port))
            sock.listen(self.backlog)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            raise ConfigError(
                f"the Prometheus endpoint cannot listen on {self.host}:{self.requested_port} "
                f"(COG_TRITON_PROMETHEUS_ADDRESS, COG_TRITON_PROMETHEUS_PORT): {exc.strerror or exc}; choose another "
                "port, or set COG_TRITON_PROMETHEUS_PORT=0 to turn the endpoint off"
            ) from None
        self._port = int(sock.getsockname()[1])
        self._scraper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prometheus-scrape")
        # loopback: never a proxy; one SSL context per process, not one per scrape (common.http says why); kept alive
        # between renderings, which are one at a time (the one thread above)
        self._triton_client = httpx.Client(timeout=self.triton_timeout_s, trust_env=False,
                                           verify=default_ssl_context())
        self._loop = asyncio.new_event_loop()
        started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(sock, started), name="prometheus-endpoint",
                                        daemon=True)
        self._thread.start()
        started.wait()

    def stop(self) -> None:
        """Stop listening and close every connection (idempotent)."""
        loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None and thread is not None:
            try:
                loop.call_soon_threadsafe(loop.stop)
            except RuntimeError:  # the loop has already ended
                pass
            thread.join(timeout=10)
        if self._scraper is not None:
            self._scraper.shutdown(wait=False, cancel_futures=True)
            self._scraper = None
        if self._triton_client is not None:
            self._triton_client.close()
            self._triton_client = None

    # ------------------------------------------------------------------ the event loop's thread
    def _run(self, sock: socket.socket, started: threading.Event) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        self._room = asyncio.Event()
        accepting = loop.create_task(self._accept(sock))
        started.set()
        try:
            loop.run_forever()
        finally:
            accepting.cancel()
            for connection in list(self._open):
                connection.abort()
            tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            sock.close()
            loop.close()

    def _idle(self) -> Optional["_Connection"]:
        """The oldest connection still waiting for its request, once it has waited :data:`IDLE_GRACE_S`, and with no
        byte unread in its socket: one whose request arrived while this loop was busy (a loaded host) is not idle,
        its ``data_received`` is due in the loop's next pass."""
        now = time.monotonic()
        for connection, waiting in self._open.items():  # in the order they were admitted
            if not waiting:
                continue
            if now - connection.admitted_at < IDLE_GRACE_S:
                return None  # the later ones were admitted later still
            if not connection.bytes_unread():
                return connection
        return None

    async def _room_for_one(self) -> Optional["_Connection"]:
        """Until a connection can be held: below the bound (None), or an idle one to close (returned; see the class
        docstring)."""
        room = self._room
        assert room is not None
        while len(self._open) >= self.max_connections:
            idle = self._idle()
            if idle is not None:
                return idle
            oldest = next((c for c, waiting in self._open.items() if waiting), None)
            room.clear()
            if oldest is None:  # every one being answered: until one ends
                await room.wait()
                continue
            try:  # until one ends, or the oldest waiting one has waited long enough to be idle (or was read)
                await asyncio.wait_for(room.wait(), max(0.0, oldest.admitted_at + IDLE_GRACE_S - time.monotonic()))
            except asyncio.TimeoutError:
                pass
        return None

    async def _accept(self, listener: socket.socket) -> None:
        """Accept connections while one can be held (see the class docstring: admission); meanwhile they wait in
        the kernel's queue. Each is accepted right after the check that it can be held, nothing awaited between."""
        loop = asyncio.get_running_loop()
        while True:
            idle = await self._room_for_one()
            try:
                conn, _ = listener.accept()
            except BlockingIOError:  # none waiting: until one is
                readable = loop.create_future()
                loop.add_reader(listener.fileno(), lambda: readable.done() or readable.set_result(None))
                try:
                    await readable
                finally:
                    loop.remove_reader(listener.fileno())
                continue
            except OSError as exc:  # e.g. EMFILE: try again shortly rather than stop serving
                log.warning("the Prometheus endpoint could not accept a connection: %s", exc)
                await asyncio.sleep(0.1)
                continue
            self.accepted += 1
            if idle is not None:  # chosen by _room_for_one, nothing awaited since
                self._closed(idle)  # forgotten now: its connection_lost comes later
                idle.abort()
                log.debug("metrics endpoint: %d connections held; closed the oldest idle one", self.max_connections)
            conn.setblocking(False)
            connection = _Connection(self, conn)
            try:
                await loop.connect_accepted_socket(lambda: connection, sock=conn)
            except OSError:
                conn.close()

    def _opened(self, connection: "_Connection") -> None:
        self._open[connection] = True
        self._waiting += 1

    def _answering(self, connection: "_Connection") -> None:
        if self._open.get(connection):
            self._open[connection] = False
            self._waiting -= 1

    def _closed(self, connection: "_Connection") -> None:
        waiting = self._open.pop(connection, None)
        if waiting:
            self._waiting -= 1
        if self._room is not None:
            self._room.set()

    # ------------------------------------------------------------------ renderings, shared
    def rendering(self) -> "asyncio.Future[_Answer]":
        """The rendering that answers a scrape arriving now (on the loop's thread; see the class docstring)."""
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        current = self._current
        failed = current is not None and current.done() and (current.cancelled() or current.exception() is not None)
        if current is not None and now - self._current_at <= self.reuse_s and not failed:
            return current
        if current is not None and not current.done():  # in flight, started too long ago: the next one, after it
            if self._next is None:
                self._next = loop.create_future()
            return self._next
        return self._render()

    def _render(self, into: Optional["asyncio.Future[_Answer]"] = None) -> "asyncio.Future[_Answer]":
        loop = asyncio.get_running_loop()
        future = into if into is not None else loop.create_future()
        self._current, self._current_at = future, time.monotonic()
        self.renderings += 1
        work = loop.run_in_executor(self._scraper, self._answer_of_scrape)

        def done(result: "asyncio.Future[_Answer]") -> None:
            if not future.done():
                if result.cancelled():
                    future.cancel()
                elif result.exception() is not None:
                    future.set_exception(result.exception())  # type: ignore[arg-type]
                else:
                    future.set_result(result.result())
            waiting, self._next = self._next, None
            if waiting is not None and not waiting.done():
                self._render(waiting)

        work.add_done_callback(done)
        return future

    def _answer_of_scrape(self) -> "_Answer":
        try:
            body = self.scrape()
        except Exception:  # noqa: BLE001 - a scrape must answer, whatever broke
            log.exception("rendering the metrics failed")
            return _Answer.of(500, b"rendering the metrics failed; see the predictor's log\n")
        return _Answer.of(200, body)

    # ------------------------------------------------------------------ what a scrape answers
    def scrape(self) -> bytes:
        """What ``GET /metrics`` answers: the service's metrics, then Triton's text as Triton sent it (one
        rendering; :meth:`rendering` shares it)."""
        triton = self._triton_text()
        with self._lock:  # the gauge and the text of one scrape belong together
            self.metrics.triton_up.set(1 if triton is not None else 0)
            ours = self.metrics.render()
        if not triton:
            return ours
        return ours + triton if triton.endswith(b"\n") else ours + triton + b"\n"

    def _triton_text(self) -> Optional[bytes]:
        url = self.triton_url() if callable(self.triton_url) else self.triton_url
        if not url:
            return None
        try:
            if self._triton_client is not None:
                response = self._triton_client.get(url)
            else:  # scrape() called without start() (tests)
                response = httpx.get(url, timeout=self.triton_timeout_s, trust_env=False,
                                     verify=default_ssl_context())
        except httpx.HTTPError as exc:
            log.debug("Triton's metrics could not be read from %s: %s", url, exc)
            return None
        if response.status_code != 200:
            log.debug("Triton's metrics answered HTTP %d", response.status_code)
            return None
        return response.content


class _Answer:
    """An answer's bytes, made once and written as they are to every connection it answers: the whole response,
    and its head alone (for HEAD)."""

    __slots__ = ("head", "whole")

    def __init__(self, head: bytes, whole: bytes) -> None:
        self.head, self.whole = head, whole

    @classmethod
    def of(cls, status: int, body: bytes) -> "_Answer":
        content_type = CONTENT_TYPE if status == 200 else "text/plain; charset=utf-8"
        head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode("ascii")
        return cls(head, head + body)


class _Connection(asyncio.Protocol):
    """One connection to the endpoint: its request head parsed with h11 within the request timeout, one answer,
    then closed (after the client took the answer, within the request timeout again)."""

    def __init__(self, server: MetricsServer, sock: Optional[socket.socket] = None) -> None:
        self.server = server
        self.sock = sock  # the accepted socket, to peek at (the transport reads it)
        self.transport: Optional[asyncio.Transport] = None
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
        self.timer: Optional[asyncio.TimerHandle] = None
        self.answered = False
        self.admitted_at = time.monotonic()

    def bytes_unread(self) -> bool:
        """Whether the client's bytes wait in the socket, not yet read by the loop (peeked, never consumed)."""
        if self.sock is None:
            return False
        try:
            return bool(self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))  # b"": the client closed
        except OSError:  # BlockingIOError: nothing there; another error: nothing to wait for
            return False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server._opened(self)
        self.timer = asyncio.get_running_loop().call_later(self.server.request_timeout_s, self.abort)

    def data_received(self, data: bytes) -> None:
        if self.answered:
            return  # one request per connection: whatever follows it is not read
        try:
            self.conn.receive_data(data)
            event = self.conn.next_event()
        except h11.RemoteProtocolError as exc:
            self._send(_Answer.of(exc.error_status_hint, b"bad request\n"), head_only=False)
            return
        if isinstance(event, h11.Request):
            self._request(event)
        elif event is not h11.NEED_DATA:  # the client closed before its request was whole
            self.abort()

    def eof_received(self) -> bool:
        if not self.answered:
            self.abort()
        return True  # a half-closed client still takes its answer

    def _request(self, request: h11.Request) -> None:
        self.answered = True
        self.server._answering(self)
        head_only = request.method == b"HEAD"
        if request.method not in (b"GET", b"HEAD"):
            self._send(_Answer.of(405, b"only GET /metrics is served here\n"), head_only)
        elif request.target.split(b"?", 1)[0] != b"/metrics":
            self._send(_Answer.of(404, b"only /metrics is served here\n"), head_only)
        else:
            rendering = self.server.rendering()
            if rendering.done():
                self._rendered(rendering, head_only)
            else:
                rendering.add_done_callback(lambda done: self._rendered(done, head_only))

    def _rendered(self, rendering: "asyncio.Future[_Answer]", head_only: bool) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        if rendering.cancelled() or rendering.exception() is not None:
            self._send(_Answer.of(500, b"rendering the metrics failed; see the predictor's log\n"), head_only)
        else:
            self._send(rendering.result(), head_only)

    def _send(self, answer: _Answer, head_only: bool) -> None:
        """Write the answer and close once it is sent; the client has the request timeout to take it."""
        self.answered = True
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.timer is not None:
            self.timer.cancel()
        self.timer = asyncio.get_running_loop().call_later(self.server.request_timeout_s, self.abort)
        transport.write(answer.head if head_only else answer.whole)
        transport.close()  # after what is buffered has been sent

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.transport = None
        self.server._closed(self)


def serve_metrics(metrics: ServiceMetrics, address: str, port: int, *, triton_metrics_port: Optional[int],
                  max_connections: int = MAX_CONNECTIONS, request_timeout_s: float = REQUEST_TIMEOUT_S,
                  backlog: int = BACKLOG, reuse_s: float = REUSE_S,
                  triton_timeout_s: float = TRITON_SCRAPE_TIMEOUT_S) -> Optional[MetricsServer]:
    """Start the Prometheus endpoint on ``address:port`` (COG_TRITON_PROMETHEUS_ADDRESS/PORT), with Triton's metrics
    from ``http://127.0.0.1:<triton_metrics_port>/metrics``; None when ``port`` is 0 (off). The other arguments are
    :class:`MetricsServer`'s (COG_TRITON_PROMETHEUS_MAX_CONNECTIONS, _REQUEST_TIMEOUT_S, _BACKLOG, _REUSE_S,
    _TRITON_TIMEOUT_S).

    Raises:
        ConfigError: the address cannot be bound.
    """
    if not port:
        log.info("Prometheus endpoint off (COG_TRITON_PROMETHEUS_PORT=0)")
        return None
    triton = f"http://127.0.0.1:{triton_metrics_port}/metrics" if triton_metrics_port else None
    server = MetricsServer(metrics, address, port, triton_url=triton, triton_timeout_s=triton_timeout_s,
                           request_timeout_s=request_timeout_s, max_connections=max_connections, backlog=backlog,
                           reuse_s=reuse_s)
    server.start()
    log.info("Prometheus metrics (the predictor's, then Triton's) on http://%s:%d/metrics "
             "(COG_TRITON_PROMETHEUS_ADDRESS, COG_TRITON_PROMETHEUS_PORT): at most %d connections held, renderings "
             "reused for %g s", address, server.port, max_connections, reuse_s)
    return server


__all__ = (
    "BACKLOG", "IDLE_GRACE_S", "MAX_CONNECTIONS", "MAX_REQUEST_BYTES", "MetricsServer", "REQUEST_TIMEOUT_S",
    "REUSE_S", "TRITON_SCRAPE_TIMEOUT_S", "serve_metrics",
)
