"""Prometheus metrics an operator can scrape: the service's own, served with Triton's on a port of their own.

Cog records metrics per prediction only (:mod:`cog_triton.worker.metrics`, in each prediction's response), and
Triton serves its own metrics (``nv_inference_*``, the C++ backend's ``nv_trt_llm_*``) on a port bound to
127.0.0.1 (:mod:`tensorrtllm_backend.server`, ``--metrics-address``). vLLM, TGI and trtllm-serve expose a
Prometheus endpoint; this module gives the predictor one:

* :class:`ServiceMetrics`: the service's metrics in their own ``prometheus_client`` registry, named
  ``cog_triton_*`` (running and queued predictions, outcomes, errors by code, time to first token and time
  per output token, prompt and generated tokens, Triton and stream-process restarts, LoRA adapter cache
  counts, and for a model that thinks its reasoning and answer tokens and the reasoning levels applied). The names
  follow vLLM's (``num_requests_running``/``waiting``, ``prompt_tokens_total``,
  ``generation_tokens_total``, ``time_to_first_token_seconds``, ``time_per_output_token_seconds``:
  vllm-project/vllm ``vllm/engine/metrics.py`` @f0afa0c2).
* :class:`PredictionTracker`: one prediction's part, recorded once per prediction (never per token: the time
  per output token is (last token - first token) / (tokens - 1), observed once at its end).
* :class:`MetricsServer`: ``GET /metrics`` on ``COG_TRITON_PROMETHEUS_ADDRESS:COG_TRITON_PROMETHEUS_PORT``
  in a thread of the Cog worker (the process where the metrics live; never on coglet's event loop), one thread
  with non-blocking I/O whatever its clients do (idle and half-sent connections time out, their number is
  capped; the class says why this design). Each scrape
  returns the service's registry (``prometheus_client.generate_latest``) followed by the text Triton's own
  ``/metrics`` answered at that moment, unchanged (fetched with a short timeout; when Triton cannot be
  read, the service's metrics still come back, with ``cog_triton_triton_metrics_up 0``).

Both parts are in the Prometheus text format 0.0.4, which is what Triton serves (its metrics names do not
overlap ours: they start with ``nv_``), so the response is sent with that content type.

"Queued" here is what the worker can see: coglet has no queue (all slots busy answers ``409 At capacity``:
replicate/cog 6110c912 ``crates/coglet/src/transport/http/routes.rs``), so a prediction waits only inside
predict(), for a Triton restart or a stream process. The engine's own queue is Triton's metric
``nv_trt_llm_request_metrics{request_type="waiting"}`` of the C++ backend (NVIDIA/TensorRT-LLM 0d5352f5
``triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc``), in the same
scrape.
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
from typing import Callable, Mapping, Optional, Union

import h11
import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from common.errors import CogTritonError, ConfigError
from common.http import default_ssl_context
from cog_triton.worker.metrics import (
    ANSWER_TOKEN_COUNT,
    IMAGE_COUNT,
    IMAGE_TOKEN_COUNT,
    INPUT_TOKEN_COUNT,
    OUTPUT_TOKEN_COUNT,
    REASONING_EFFORT_APPLIED,
    REASONING_TOKEN_COUNT,
    TIME_TO_FIRST_TOKEN_NAMES,
    MetricSink,
)

log = logging.getLogger(__name__)

# No <name>_created series beside each counter and histogram (a timestamp per series, which doubles what a scrape
# carries and no query here needs); vLLM does the same (vllm/engine/metrics.py @f0afa0c2). prometheus_client's
# switch is process-wide: in the Cog worker this registry is its only user.
disable_created_metrics()

#: The text exposition format both parts of a scrape are in (Triton's /metrics is version 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: How long a scrape waits for Triton's own metrics, seconds.
TRITON_SCRAPE_TIMEOUT_S = 2.0
#: Seconds. From a few ms (a warm, idle engine) to minutes (a long queue, a LoRA download before the first token).
TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0,
                40.0, 80.0, 160.0)
#: Seconds per token: GPU decoding takes a few ms to tens of ms a token, the CPU reference model tens to hundreds.
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
                0.3, 0.5, 0.75, 1.0, 2.5)
#: The name of the time to first token this module observes (:func:`cog_triton.worker.metrics.record_time_to_first_token`
#: records one value under two names).
_TTFT_NAME = TIME_TO_FIRST_TOKEN_NAMES[-1]
#: LoRA adapter counts a stream process reports (keys of :meth:`cog_triton.streaming.lora.tasks.Adapters.take_counts`).
LORA_COUNTS = ("memory_hits", "disk_hits", "fetches", "engine_misses")

OUTCOMES = ("succeeded", "failed", "canceled")


def error_code(error: BaseException) -> str:
    """The ``code`` label of a failed prediction: our error's code (common/errors.py), else ``internal``."""
    return error.code if isinstance(error, CogTritonError) else "internal"


class ServiceMetrics:
    """The service's metrics, in their own registry (every name starts with ``cog_triton_``).

    Thread-safe: prometheus_client's metrics take a lock per update; everything here is called once per
    prediction (or per restart, per adapter), from any thread.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.running = Gauge(
            "cog_triton_predictions_running",
            "Predictions in predict() or streaming their output, less those queued.", registry=r)
        self.queued = Gauge(
            "cog_triton_predictions_queued",
            "Predictions in predict() waiting for Triton (being restarted) or for a stream process to run.",
            registry=r)
        self.predictions = Counter(
            "cog_triton_predictions", "Predictions that ended, by outcome.", ["outcome"], registry=r)
        self.errors = Counter(
            "cog_triton_prediction_errors",
            "Failed predictions by error code (the [code] their error starts with; internal: not one of ours).",
            ["code"], registry=r)
        self.ttft = Histogram(
            "cog_triton_time_to_first_token_seconds",
            "Time from predict() to the first generated token, seconds.", buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram(
            "cog_triton_time_per_output_token_seconds",
            "Per prediction that succeeded or failed with 2 or more tokens: (last token - first token) / "
            "(tokens - 1), seconds.",
            buckets=TPOT_BUCKETS, registry=r)
        self.prompt_tokens = Counter(
            "cog_triton_prompt_tokens", "Prompt tokens of the predictions sent to Triton.", registry=r)
        self.images = Counter(
            "cog_triton_images", "Images of the predictions sent to Triton (image_input and image parts of messages).",
            registry=r)
        self.image_tokens = Counter(
            "cog_triton_image_tokens", "Prompt tokens the images of those predictions fill (the engine's count).",
            registry=r)
        self.generation_tokens = Counter(
            "cog_triton_generation_tokens",
            "Tokens generated: each prediction's output_token_count; for a stream stopped early (a cancel, a "
            "Triton fault), the tokens it had generated.", registry=r)
        self.reasoning_tokens = Counter(
            "cog_triton_reasoning_tokens",
            "Of the generated tokens, the thinking's (through the token that ends it), for a model that thinks; also "
            "for a stream stopped early.", registry=r)
        self.answer_tokens = Counter(
            "cog_triton_answer_tokens",
            "Of the generated tokens, the answer's (after the thinking), for a model that thinks; also for a stream "
            "stopped early.", registry=r)
        self.reasoning_levels = Counter(
            "cog_triton_reasoning_effort_applied",
            "Predictions on a model that thinks (or given reasoning_effort), by the level applied: default (the chat "
            "template's), none, low, medium, high, or on (a level on a template that only turns thinking on or off, "
            "or always thinks).", ["level"], registry=r)
        self.triton_restarts = Counter(
            "cog_triton_triton_restarts", "Times the supervisor restarted Triton after a fault.", registry=r)
        self.stream_process_restarts = Counter(
            "cog_triton_stream_process_restarts", "Times a stream process was restarted after it exited.",
            registry=r)
        self.lora_hits = Counter(
            "cog_triton_lora_cache_hits",
            "LoRA adapters served from a cache: memory (converted, in the stream process), disk (the adapter "
            "cache folder).", ["cache"], registry=r)
        self.lora_fetches = Counter(
            "cog_triton_lora_fetches", "LoRA adapters downloaded into the adapter cache.", registry=r)
        self.lora_engine_misses = Counter(
            "cog_triton_lora_engine_cache_misses",
            "Requests sent again with their adapter's weights because the engine's LoRA cache no longer held it.",
            registry=r)
        self.triton_up = Gauge(
            "cog_triton_triton_metrics_up",
            "1 when this scrape includes Triton's own metrics, 0 when Triton's /metrics could not be read.",
            registry=r)
        for outcome in OUTCOMES:  # every series exists from the start (a rate() needs its zero)
            self.predictions.labels(outcome)
        for cache in ("memory", "disk"):
            self.lora_hits.labels(cache)

    # ----------------------------------------------------------------- per prediction
    def track(self, sink: Optional[MetricSink], started: float) -> "PredictionTracker":
        """A :class:`PredictionTracker` for a prediction that began at ``started`` (``time.monotonic()``)."""
        return PredictionTracker(self, sink, started)

    def refused(self, error: BaseException) -> None:
        """A prediction refused before it started (its inputs did not validate): failed, with its code."""
        self.predictions.labels("failed").inc()
        self.errors.labels(error_code(error)).inc()

    def cancelled_stream(self, output_tokens: int, reasoning_tokens: Optional[int] = None) -> None:
        """A stream process stopped a cancelled stream after generating ``output_tokens`` (the prediction's own
        output_token_count is not recorded then), ``reasoning_tokens`` of them thinking (None: a model that does not
        think)."""
        if output_tokens > 0:
            self.generation_tokens.inc(output_tokens)
        if reasoning_tokens is not None:
            self.reasoning_tokens.inc(reasoning_tokens)
            self.answer_tokens.inc(max(output_tokens - reasoning_tokens, 0))

    def lora(self, counts: Mapping[str, int]) -> None:
        """Add LoRA adapter counts (increments since the last report; keys: :data:`LORA_COUNTS`)."""
        for key, value in counts.items():
            if value <= 0:
                continue
            if key == "memory_hits":
                self.lora_hits.labels("memory").inc(value)
            elif key == "disk_hits":
                self.lora_hits.labels("disk").inc(value)
            elif key == "fetches":
                self.lora_fetches.inc(value)
            elif key == "engine_misses":
                self.lora_engine_misses.inc(value)
            else:
                log.warning("unknown LoRA count %r ignored", key)

    def render(self) -> bytes:
        """The service's metrics in the text format."""
        return generate_latest(self.registry)


class _Queued:
    """The context in which a prediction waits (queued, not running)."""

    __slots__ = ("metrics",)

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics

    def __enter__(self) -> None:
        self.metrics.running.dec()
        self.metrics.queued.inc()

    def __exit__(self, *exc: object) -> None:
        self.metrics.queued.dec()
        self.metrics.running.inc()


class PredictionTracker:
    """One prediction in :class:`ServiceMetrics`: counted as running from its creation until :meth:`finish`.

    It is the prediction's metric sink (``tracker(name, value)``): it observes the time to first token, the
    prompt and output token counts, and the time per output token, then passes each metric on to ``sink``
    (Cog's scope), unchanged. :meth:`queued` is the context in which the prediction waits.
    """

    __slots__ = ("metrics", "sink", "started", "_first_at", "_tpot", "_done", "_lock")

    def __init__(self, metrics: ServiceMetrics, sink: Optional[MetricSink], started: float) -> None:
        self.metrics = metrics
        self.sink = sink
        self.started = started
        self._first_at: Optional[float] = None
        self._tpot: Optional[float] = None  # observed when the prediction ends, unless it was cancelled
        self._done = False
        self._lock = threading.Lock()
        metrics.running.inc()

    def __call__(self, name: str, value: Union[int, float, str]) -> None:
        m = self.metrics
        if name == _TTFT_NAME:
            m.ttft.observe(value)
            self._first_at = self.started + float(value)
        elif name == OUTPUT_TOKEN_COUNT:
            tokens = int(value)
            if tokens > 0:
                m.generation_tokens.inc(tokens)
            if tokens >= 2 and self._first_at is not None:
                self._tpot = max(0.0, time.monotonic() - self._first_at) / (tokens - 1)
        elif name == INPUT_TOKEN_COUNT:
            m.prompt_tokens.inc(int(value))
        elif name == REASONING_TOKEN_COUNT:
            m.reasoning_tokens.inc(int(value))
        elif name == ANSWER_TOKEN_COUNT:
            m.answer_tokens.inc(int(value))
        elif name == REASONING_EFFORT_APPLIED:
            m.reasoning_levels.labels(str(value)).inc()
        elif name == IMAGE_COUNT:
            m.images.inc(int(value))
        elif name == IMAGE_TOKEN_COUNT:
            m.image_tokens.inc(int(value))
        if self.sink is not None:
            self.sink(name, value)

    def queued(self) -> _Queued:
        """``with tracker.queued(): ...`` counts the prediction as queued, not running, meanwhile."""
        return _Queued(self.metrics)

    def finish(self, error: Optional[BaseException] = None, cancelled: bool = False) -> None:
        """The prediction ended (only the first call counts): failed with ``error``, else canceled when
        ``cancelled`` (or ``error`` is a CancelledError), else succeeded."""
        with self._lock:
            if self._done:
                return
            self._done = True
        m = self.metrics
        m.running.dec()
        if error is not None and not _is_cancel(error):
            m.predictions.labels("failed").inc()
            m.errors.labels(error_code(error)).inc()
        elif cancelled or error is not None:
            m.predictions.labels("canceled").inc()
            return
        else:
            m.predictions.labels("succeeded").inc()
        if self._tpot is not None:
            m.tpot.observe(self._tpot)


def _is_cancel(error: BaseException) -> bool:
    return isinstance(error, (asyncio.CancelledError, GeneratorExit))


#: Seconds a connection has to deliver its whole request (request line and headers), and then to take the answer;
#: then it is closed. Prometheus sends its request at once and reads the answer within its scrape_timeout (10 s by
#: default: prometheus/prometheus ``config/config.go`` DefaultGlobalConfig).
REQUEST_TIMEOUT_S = 10.0
#: Most connections the endpoint holds at once. A new one beyond it closes the oldest that is still waiting for its
#: request (an idle or half-sent one), so a scrape gets in whatever the others do.
MAX_CONNECTIONS = 64
#: A request head still incomplete past this many bytes is refused (h11's ``max_incomplete_event_size``: 431).
MAX_REQUEST_BYTES = 8192
_READ_BYTES = 4096


class MetricsServer:
    """``GET /metrics`` on ``host:port``: the service's metrics, then Triton's (see the module docstring).

    **One thread with non-blocking I/O** (an asyncio event loop of its own, parsing with h11), not prometheus_client's
    WSGI app under a threaded server: that server (prometheus_client 0.26 ``exposition.py`` ``ThreadingWSGIServer``,
    and the standard library's ``ThreadingHTTPServer`` this endpoint used) starts a thread per connection and keeps
    it for as long as the client keeps the connection, and a socket timeout bounds only each read, so a client
    dripping a byte per timeout holds its thread for ever; 400 idle connections left 400 threads in the Cog worker.
    No WSGI server with a deadline for a whole request is installed here. On the event loop an idle connection costs
    a socket and a small task, never a thread:

    * each connection has :data:`REQUEST_TIMEOUT_S` for its whole request head (however it is dripped) and again
      for taking the answer, then it is closed; one request per connection (``Connection: close``);
    * at most :data:`MAX_CONNECTIONS` are held: a new one beyond closes the oldest still waiting for its request;
    * the threads are two, whatever the clients do: the loop's, and one that renders each scrape
      (:meth:`scrape`: our registry, then Triton's text, up to ``triton_timeout_s``), so the loop never blocks.

    Args:
        metrics: the service's metrics.
        host / port: where to listen (port 0: any free port, for tests); an address with ":" is IPv6.
        triton_url: Triton's own metrics URL (``http://127.0.0.1:<COG_TRITON_METRICS_PORT>/metrics``), or a
            callable giving it (None: no Triton yet); None: not included.
        triton_timeout_s: how long a scrape waits for Triton, seconds.
        request_timeout_s / max_connections: :data:`REQUEST_TIMEOUT_S`, :data:`MAX_CONNECTIONS` (tests).
    """

    def __init__(self, metrics: ServiceMetrics, host: str, port: int,
                 triton_url: Union[str, Callable[[], Optional[str]], None] = None,
                 triton_timeout_s: float = TRITON_SCRAPE_TIMEOUT_S, *, request_timeout_s: float = REQUEST_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.metrics = metrics
        self.host = host
        self.requested_port = port
        self.triton_url = triton_url
        self.triton_timeout_s = triton_timeout_s
        self.request_timeout_s = request_timeout_s
        self.max_connections = max_connections
        self._port: Optional[int] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._scraper: Optional[ThreadPoolExecutor] = None
        self._open: "OrderedDict[asyncio.StreamWriter, bool]" = OrderedDict()  # writer -> still waiting for its request
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
            sock.listen(128)
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

    # ------------------------------------------------------------------ the event loop's thread
    def _run(self, sock: socket.socket, started: threading.Event) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        try:
            server = loop.run_until_complete(asyncio.start_server(self._serve, sock=sock))
        except BaseException:
            log.exception("the Prometheus endpoint could not start serving")
            sock.close()
            loop.close()
            return
        finally:
            started.set()
        try:
            loop.run_forever()
        finally:
            server.close()  # the listening socket
            for writer in list(self._open):
                writer.transport.abort()
            tasks = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(server.wait_closed())
            loop.close()

    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        """Count a new connection; at :attr:`max_connections`, close the oldest still waiting for its request (or
        this one, when every held one is being answered). False when this one was closed."""
        if len(self._open) >= self.max_connections:
            oldest = next((w for w, waiting in self._open.items() if waiting), None)
            if oldest is None:
                writer.transport.abort()
                return False
            del self._open[oldest]
            oldest.transport.abort()
            log.debug("metrics endpoint: %d connections held; closed the oldest idle one", self.max_connections)
        self._open[writer] = True
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._admit(writer):
            return
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
        try:
            try:
                request = await asyncio.wait_for(self._read_request(reader, conn), self.request_timeout_s)
            except h11.RemoteProtocolError as exc:
                await self._answer(writer, conn, exc.error_status_hint, b"bad request\n", head_only=False)
                return
            if request is None:
                return
            self._open[writer] = False  # being answered: never closed to make room
            status, body = 200, b""
            if request.method not in (b"GET", b"HEAD"):
                status, body = 405, b"only GET /metrics is served here\n"
            elif request.target.split(b"?", 1)[0] != b"/metrics":
                status, body = 404, b"only /metrics is served here\n"
            else:
                try:
                    body = await asyncio.get_running_loop().run_in_executor(self._scraper, self.scrape)
                except Exception:  # noqa: BLE001 - a scrape must answer, whatever broke
                    log.exception("rendering the metrics failed")
                    status, body = 500, b"rendering the metrics failed; see the predictor's log\n"
            await self._answer(writer, conn, status, body, head_only=request.method == b"HEAD")
        except (asyncio.TimeoutError, ConnectionError, OSError, h11.LocalProtocolError):
            pass  # too slow, gone, or broken: closed below
        finally:
            self._open.pop(writer, None)
            writer.transport.abort()

    @staticmethod
    async def _read_request(reader: asyncio.StreamReader, conn: h11.Connection) -> Optional[h11.Request]:
        """The request's head (h11), or None when the client closed first.

        Raises:
            h11.RemoteProtocolError: not HTTP/1.x, or a head over :data:`MAX_REQUEST_BYTES`.
        """
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(_READ_BYTES))  # b"": end of file
                continue
            if isinstance(event, h11.Request):
                return event
            return None  # ConnectionClosed (or PAUSED, which a first request never is)

    async def _answer(self, writer: asyncio.StreamWriter, conn: h11.Connection, status: int, body: bytes,
                      head_only: bool) -> None:
        """Send ``status`` and ``body`` (text/plain, or the metrics' type for 200), then ``Connection: close``;
        the client has :attr:`request_timeout_s` to take it."""
        content_type = CONTENT_TYPE if status == 200 else "text/plain; charset=utf-8"
        headers = [("Content-Type", content_type), ("Content-Length", str(len(body))), ("Connection", "close")]
        try:
            reason = HTTPStatus(status).phrase.encode()
            data = conn.send(h11.Response(status_code=status, headers=headers, reason=reason)) or b""
            if not head_only:
                data += conn.send(h11.Data(data=body)) or b""
            data += conn.send(h11.EndOfMessage()) or b""
        except h11.LocalProtocolError:  # no answer is possible in this state
            return
        writer.write(data)
        writer.close()  # after what is buffered has been sent
        await asyncio.wait_for(writer.wait_closed(), self.request_timeout_s)

    # ------------------------------------------------------------------ what a scrape answers
    def scrape(self) -> bytes:
        """What ``GET /metrics`` answers: the service's metrics, then Triton's text as Triton sent it."""
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
            # loopback: never a proxy; one SSL context per process, not one per scrape (common.http says why)
            response = httpx.get(url, timeout=self.triton_timeout_s, trust_env=False, verify=default_ssl_context())
        except httpx.HTTPError as exc:
            log.debug("Triton's metrics could not be read from %s: %s", url, exc)
            return None
        if response.status_code != 200:
            log.debug("Triton's metrics answered HTTP %d", response.status_code)
            return None
        return response.content


def serve_metrics(metrics: ServiceMetrics, address: str, port: int, *,
                  triton_metrics_port: Optional[int]) -> Optional[MetricsServer]:
    """Start the Prometheus endpoint on ``address:port`` (COG_TRITON_PROMETHEUS_ADDRESS/PORT), with Triton's metrics
    from ``http://127.0.0.1:<triton_metrics_port>/metrics``; None when ``port`` is 0 (off).

    Raises:
        ConfigError: the address cannot be bound.
    """
    if not port:
        log.info("Prometheus endpoint off (COG_TRITON_PROMETHEUS_PORT=0)")
        return None
    triton = f"http://127.0.0.1:{triton_metrics_port}/metrics" if triton_metrics_port else None
    server = MetricsServer(metrics, address, port, triton_url=triton)
    server.start()
    log.info("Prometheus metrics (the predictor's, then Triton's) on http://%s:%d/metrics "
             "(COG_TRITON_PROMETHEUS_ADDRESS, COG_TRITON_PROMETHEUS_PORT)", address, server.port)
    return server


__all__ = (
    "CONTENT_TYPE", "LORA_COUNTS", "MAX_CONNECTIONS", "MetricsServer", "PredictionTracker", "REQUEST_TIMEOUT_S",
    "ServiceMetrics", "TPOT_BUCKETS", "TRITON_SCRAPE_TIMEOUT_S", "TTFT_BUCKETS", "error_code", "serve_metrics",
)
