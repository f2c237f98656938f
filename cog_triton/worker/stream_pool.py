"""The Cog worker's side of the stream processes: start them, route predictions, relay their text.

:class:`StreamPool` starts ``COG_TRITON_STREAM_PROCESSES`` processes (:mod:`cog_triton.streaming.streamer`),
each joined to the worker by one Unix socket pair (:mod:`cog_triton.ipc`), and gives each new
prediction to the one with the fewest running predictions. What the worker does per prediction: send
one :class:`~cog_triton.ipc.Start` command, wait for its :class:`~cog_triton.ipc.Accepted` (or
:class:`~cog_triton.ipc.Rejected`: the input error predict() raises), record three metrics. Per text chunk
(not per token): one receiver thread per process reads a frame
holding many predictions' chunks, and puts each chunk on its prediction's queue, which wakes that
prediction's coglet thread (:mod:`cog_triton.worker.cog_bridge`). Nothing else per token happens in the
worker's interpreter.

Faults:

* A stream process that dies (killed, crashed) fails only its own predictions, at once, with a
  :class:`common.errors.StreamProcessError` naming it; another process is asked to send Triton
  the stop request of each of them (Triton also cancels them when their gRPC streams close), and
  the process is restarted in the background. While none is running, new predictions wait for
  one, up to ``start_timeout_s``.
* A Triton fault found by the supervisor fails the running predictions through
  :meth:`RoutedPrediction.fail` (the supervisor holds them while they run).
* A transport error a stream process reports (the gRPC stream broke) is handed to
  ``on_transport_error``, which decides on the worker's loop whether Triton is dying.
* A prediction that meets a dying Triton before any token (a :class:`common.errors.TritonDiedError` from either
  path, no token generated, none of its text relayed) is sent once more instead of failing
  (:meth:`StreamPool.resend_later`): it waits for the restart (``wait_ready``, the supervisor's, within the usual
  startup deadline) and goes to a stream process again, under the same request id, into the same output, so
  coglet's generator never knows; nothing of the first attempt reached the user, so no token is duplicated. A
  prediction that had tokens, or was sent once more already, fails with the error as before.

Why one module: one concern, a prediction's life between the Cog worker and a stream process
(routed, relayed, ended, failed or sent again) and the processes that carry it; the routing, the receiver thread
and the fault paths share the same per-prediction state and locks, which a split would spread over modules.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Awaitable, Callable, Iterator, Optional, Union

from common.errors import ConfigError, StreamProcessError, TritonDiedError, TritonError
from cog_triton import ipc
from cog_triton.worker.cog_bridge import PredictionOutput, output_generator
from cog_triton.stream_config import GeneratorConfig
from cog_triton.ipc import PredictInputs
from cog_triton.reasoning import TemplateInfo
from cog_triton.worker.metrics import (
    ANSWER_TOKEN_COUNT,
    IMAGE_COUNT,
    IMAGE_TOKEN_COUNT,
    INPUT_TOKEN_COUNT,
    OUTPUT_TOKEN_COUNT,
    REASONING_TOKEN_COUNT,
    THINKING_BUDGET_REACHED,
    MetricSink,
    record_time_to_first_token,
)
from cog_triton.settings import REPO_ROOT
from cog_triton.worker.supervisor import Health
from cog_triton.worker.timing import OFF, StartTiming, TimingOff

if TYPE_CHECKING:
    from cog_triton.worker.exporter import ServiceMetrics

log = logging.getLogger(__name__)

#: A stream process that fails to start this many times in a row is given up (the pool reports it).
MAX_START_FAILURES = 3


class RoutedPrediction:
    """One prediction routed to a stream process, as the worker sees it: its id on the channel (``sid``), its
    process, the :class:`~cog_triton.worker.cog_bridge.PredictionOutput` coglet's generator drains, and its metric sink.

    ``fail(error)`` (the supervisor's fault path) and ``output.cancel()`` (coglet's cancel) may come
    from any thread; the receiver thread finishes it when its End or Failed event arrives.
    """

    __slots__ = ("sid", "request_id", "process", "output", "metric", "loop", "accepted", "pool", "stop_request_on_cancel",
                 "timing", "inputs", "started_at", "queued", "tokens_seen", "resending", "resent", "budgeted",
                 "__weakref__")

    def __init__(self, pool: "StreamPool", sid: int, request_id: str, process: "StreamProcess",
                 metric: Optional[MetricSink], loop: asyncio.AbstractEventLoop, *,
                 inputs: Optional[PredictInputs] = None, started_at: float = 0.0,
                 queued: Optional[Callable[[], AbstractContextManager[None]]] = None,
                 output: Optional[PredictionOutput] = None, accepted: "Optional[asyncio.Future[int]]" = None,
                 resent: bool = False, budgeted: bool = False) -> None:
        self.pool = pool
        self.sid = sid
        self.request_id = request_id
        #: The prediction has a thinking budget: Triton may also run its answer request (ipc.answer_request_id).
        self.budgeted = budgeted
        self.process = process
        self.metric = metric
        self.loop = loop
        self.accepted: "asyncio.Future[int]" = accepted if accepted is not None else loop.create_future()
        if output is None:
            output = PredictionOutput(self._cancelled)
        else:
            output.rebind_cancel(self._cancelled)
        self.output = output
        #: Set once the prediction is cancelled or failed here: whether its process sends Triton the stop request.
        self.stop_request_on_cancel: Optional[bool] = None
        self.timing: Union[StartTiming, TimingOff] = OFF  # the timing metric's steps (cog_triton.worker.timing)
        self.inputs, self.started_at, self.queued = inputs, started_at, queued  # what a resend sends again
        #: A token was generated or text relayed (the receiver thread sets it first, then reads ``resending``) ...
        self.tokens_seen = False
        #: ... and a resend is being decided (the deciding thread sets it first, then reads ``tokens_seen``): under the
        #: GIL one of the two sees the other's write, so text is never both relayed and sent again.
        self.resending = False
        self.resent = resent  # this is the prediction sent once more: it is not sent again

    def _cancelled(self) -> None:
        """coglet cancelled the prediction (or its generator was closed): stop the prediction there, and its request
        in Triton."""
        self._cancel(asyncio.CancelledError(), send_stop_request=True)

    def fail(self, error: BaseException) -> None:
        """End the prediction with ``error`` (from any thread; the supervisor's fault path); the stream process drops
        the prediction without sending Triton a stop request (Triton is being restarted). A prediction without a
        token is sent once more instead when :meth:`StreamPool.resend_later` takes it."""
        self.stop_request_on_cancel = False
        if self.pool.forget(self):
            self.process.send(ipc.Cancel(self.sid, False))
            if self.pool.resend_later(self, error):
                return
        self.settle_open(error)
        self.output.fail(error)

    def _cancel(self, reason: BaseException, *, send_stop_request: bool) -> None:
        """Stop the prediction from the worker's side (once): its process is sent a Cancel, and ``open`` raises
        ``reason`` if it has not returned yet."""
        self.stop_request_on_cancel = send_stop_request
        if self.pool.forget(self):
            self.process.send(ipc.Cancel(self.sid, send_stop_request))
        self.settle_open(reason)

    def record(self, name: str, value: Union[int, float]) -> None:
        if self.metric is not None:
            try:
                self.metric(name, value)
            except Exception:  # noqa: BLE001 - a metric must never break a prediction
                log.exception("recording metric %s failed", name)

    def settle_open(self, outcome: Union[int, BaseException]) -> None:
        """Settle what :meth:`StreamPool.open` waits for, from any thread (once): the prompt's length in tokens
        (accepted), or the error ``open`` raises."""

        def settle() -> None:
            if self.accepted.done():
                return
            if isinstance(outcome, BaseException):
                self.accepted.set_exception(outcome)
            else:
                self.accepted.set_result(outcome)

        try:
            self.loop.call_soon_threadsafe(settle)
        except RuntimeError:  # the loop is closed
            pass


class StreamProcess:
    """One stream process: its ``Popen``, its end of the socket pair, and the predictions it runs."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.name = f"stream-{index}"
        self.popen: Optional[subprocess.Popen[bytes]] = None
        self.sock: Optional[socket.socket] = None
        self.predictions: dict[int, RoutedPrediction] = {}
        self.alive = False
        self.ready = threading.Event()
        self.load_s: Optional[float] = None  # seconds it took to load its tokenizer (its Ready event)
        self.start_error: Optional[str] = None
        self.start_failures = 0
        self.restarts = 0
        self._send_lock = threading.Lock()

    @property
    def pid(self) -> Optional[int]:
        return self.popen.pid if self.popen is not None else None

    def send(self, command: ipc.Command) -> bool:
        """Send a command (from any thread); False when the process is gone."""
        sock = self.sock
        if sock is None:
            return False
        frame = ipc.encode(command)
        try:
            with self._send_lock:
                sock.sendall(frame)
            return True
        except OSError:
            return False

    def exit_description(self) -> str:
        popen = self.popen
        if popen is None:
            return "was not started"
        try:
            code = popen.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            return "closed its channel but is still running"
        if code < 0:
            return f"was killed by signal {-code}"
        return f"exited with code {code}"


class StreamPool:
    """The stream processes of one service (see the module docstring).

    Args:
        config: what each process builds its generator from.
        processes: how many stream processes (>= 1).
        interval_ms: the stream interval, milliseconds (:mod:`cog_triton.streaming.coalesce`).
        start_timeout_s: how long a process may take to start (import, tokenizer), seconds.
        on_transport_error: async callable run on the prediction's loop for a transport error; returns
            the error the prediction fails with (the service checks whether Triton is dying).
        register / unregister: called with each running :class:`RoutedPrediction` (the supervisor's).
        metrics: the service's Prometheus metrics (:mod:`cog_triton.worker.exporter`): counts what only the pool sees
            (stream-process restarts, tokens of cancelled predictions, the processes' LoRA adapter counts).
        timing: record, as each prediction's ``timing`` metric, when its start passed each step
            (:mod:`cog_triton.worker.timing`; COG_TRITON_TIMING_METRICS, for scripts/benchmark).
        interval_max_ms / interval_streams: the stream interval under load
            (:class:`cog_triton.streaming.coalesce.StreamLoad`: COG_TRITON_STREAM_INTERVAL_MAX_MS, milliseconds, and
            COG_TRITON_STREAM_INTERVAL_STREAMS over all processes).
    """

    def __init__(
        self,
        config: GeneratorConfig,
        processes: int,
        *,
        interval_ms: int,
        start_timeout_s: float = 120.0,
        on_transport_error: Optional[Callable[[TritonError], Awaitable[BaseException]]] = None,
        register: Optional[Callable[[RoutedPrediction], None]] = None,
        unregister: Optional[Callable[[RoutedPrediction], None]] = None,
        metrics: Optional["ServiceMetrics"] = None,
        timing: bool = False,
        interval_max_ms: int = 0,
        interval_streams: int = 0,
    ) -> None:
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        self.config = config
        self.interval_ms = interval_ms
        self.start_timeout_s = start_timeout_s
        self.on_transport_error = on_transport_error
        self._register = register or (lambda prediction: None)
        self._unregister = unregister or (lambda prediction: None)
        self.metrics = metrics
        self.timing = timing
        self.interval_max_ms = interval_max_ms
        self.interval_streams = interval_streams
        self.processes = [StreamProcess(i) for i in range(processes)]
        #: What the model's chat template says about reasoning, as the stream processes found it (their Ready; the same
        #: tokenizer in each); None until one is ready.
        self.template: Optional[TemplateInfo] = None
        self._wait_ready: Optional[Callable[[], Awaitable[None]]] = None  # Triton's restart (set_watcher)
        self._sids = itertools.count(1)
        self._lock = threading.Lock()
        self._any_ready = threading.Condition(self._lock)
        self._closing = False

    # ------------------------------------------------------------------ lifecycle
    def launch(self) -> None:
        """Start every process (returns at once; each loads its tokenizer in parallel)."""
        for process in self.processes:
            self._spawn(process)

    def set_watcher(self, register: Callable[[RoutedPrediction], None],
                    unregister: Callable[[RoutedPrediction], None],
                    wait_ready: Optional[Callable[[], Awaitable[None]]] = None) -> None:
        """Hand every running prediction to ``register`` (and back to ``unregister`` when it ends): the
        supervisor, which fails them on a Triton fault. ``wait_ready``: returns once Triton serves again after a
        restart (raising :class:`common.errors.TritonError` when it does not within its deadline); with it, a
        prediction that meets a dying Triton before any token is sent once more (:meth:`resend_later`)."""
        self._register, self._unregister = register, unregister
        self._wait_ready = wait_ready

    def wait_ready(self) -> None:
        """Wait until every process is ready.

        Raises:
            ConfigError: a process could not start (its error, e.g. the tokenizer would not load), or
                was not ready within ``start_timeout_s``.
        """
        deadline = time.monotonic() + self.start_timeout_s
        for process in self.processes:
            if not process.ready.wait(max(0.0, deadline - time.monotonic())):
                self.stop()
                raise ConfigError(
                    f"stream process {process.name} (pid {process.pid}) was not ready after "
                    f"{self.start_timeout_s:g} s; see the log above"
                )
            if process.start_error is not None:
                error = process.start_error
                self.stop()
                raise ConfigError(f"stream process {process.name} could not start: {error}")
        log.info(
            "%d stream process(es) ready (pids %s; loaded in %s s), stream interval %g ms",
            len(self.processes), ", ".join(str(p.pid) for p in self.processes),
            ", ".join("?" if p.load_s is None else f"{p.load_s:g}" for p in self.processes), self.interval_ms,
        )

    def stop(self) -> None:
        """Close every channel (each process then exits) and wait for the processes, briefly."""
        self._closing = True
        for process in self.processes:
            sock, process.sock = process.sock, None
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()
        for process in self.processes:
            if process.popen is not None and process.popen.poll() is None:
                try:
                    process.popen.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    process.popen.kill()
                    process.popen.wait()

    def _spawn(self, process: StreamProcess) -> None:
        """Start ``process`` and its receiver thread (it is sent :class:`~cog_triton.ipc.Config`; the thread waits for
        its :class:`~cog_triton.ipc.Ready`)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        process.ready.clear()
        process.start_error = None
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        process.popen = subprocess.Popen(  # noqa: S603 - our own module, our interpreter
            [sys.executable, "-m", "cog_triton.streaming.streamer", str(theirs.fileno()), process.name],
            pass_fds=[theirs.fileno()],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        process.sock = ours
        process.predictions = {}
        # Each process runs about 1 / processes of the streams (open() gives a prediction to the least busy one).
        process.send(ipc.Config(self.config, self.interval_ms, self.timing, self.interval_max_ms,
                                self.interval_streams / len(self.processes)))
        threading.Thread(target=self._receive, args=(process, ours), name=f"{process.name}-receiver",
                         daemon=True).start()

    # ------------------------------------------------------------------- requests
    async def open(self, inputs: PredictInputs, request_id: str, started_at: float,
                   metric: Optional[MetricSink] = None,
                   queued: Optional[Callable[[], AbstractContextManager[None]]] = None) -> Iterator[str]:
        """Start streaming ``inputs`` in a stream process; return the generator coglet iterates.

        Returns once the stream process has prepared the request and sent it to Triton. While no stream
        process runs (all restarting), it waits for one inside ``queued()`` (the prediction counts as queued).

        Raises:
            InputError (or another error of the request's preparation): what the stream process
                rejected the request with.
            StreamProcessError: no stream process could take it within ``start_timeout_s``, or the
                one that had it died before accepting it.
        """
        prediction = await self._start(inputs, request_id, started_at, metric, queued)
        try:
            await prediction.accepted
        except asyncio.CancelledError:
            prediction.output.cancel()
            raise
        return output_generator(prediction.output)

    async def _start(self, inputs: PredictInputs, request_id: str, started_at: float, metric: Optional[MetricSink],
                     queued: Optional[Callable[[], AbstractContextManager[None]]],
                     resend_of: Optional[RoutedPrediction] = None) -> RoutedPrediction:
        """Route ``inputs`` to a stream process and send it the Start (waiting inside ``queued()`` while none runs);
        return the routed prediction. ``resend_of``: the prediction this one sends again (its output and its
        accepted future are reused, so that whoever waits for them gets this one's).

        Raises:
            StreamProcessError: see :meth:`open`.
        """
        loop = asyncio.get_running_loop()
        for attempt in range(2):
            process = self._pick()
            if process is None:
                with queued() if queued is not None else contextlib.nullcontext():
                    process = await loop.run_in_executor(None, self._wait_for_process)
            prediction = RoutedPrediction(
                self, next(self._sids), request_id, process, metric, loop, inputs=inputs, started_at=started_at,
                queued=queued, output=resend_of.output if resend_of is not None else None,
                accepted=resend_of.accepted if resend_of is not None else None, resent=resend_of is not None,
                budgeted=inputs.thinking_budget_tokens > 0)
            with self._lock:
                process.predictions[prediction.sid] = prediction
            self._register(prediction)
            if self.timing and resend_of is None:  # before the send: the process's Timings may come back first
                prediction.timing = StartTiming(started_at, prediction.record)
                prediction.output.on_first = prediction.timing.yielded
            prediction.timing.start_sent()
            if process.send(ipc.Start(prediction.sid, request_id, inputs, started_at)):
                if prediction.stop_request_on_cancel is not None:
                    # Failed (the supervisor) or cancelled between its registration and this Start: that Cancel
                    # may have reached the process first, where it found nothing to cancel. Once more, after Start.
                    process.send(ipc.Cancel(prediction.sid, prediction.stop_request_on_cancel))
                return prediction
            self.forget(prediction)  # its process died a moment ago: try another
        raise StreamProcessError("no stream process could take the prediction (each died as it was sent)")

    def resend_later(self, prediction: RoutedPrediction, error: BaseException) -> bool:
        """Take ``prediction``, already forgotten here, to send it once more after Triton's restart (from any
        thread), when ``error`` is Triton dying (:class:`common.errors.TritonDiedError`), it had no token (none
        generated, none of its text relayed), it was not sent again before, it was not cancelled, and the pool
        knows how to wait for Triton. True: it will be sent again (:meth:`_resend`; the caller must not fail it);
        False: the caller fails it with ``error``."""
        if (not isinstance(error, TritonDiedError) or self._wait_ready is None or prediction.inputs is None
                or prediction.resent or self._closing or prediction.output.cancelled.is_set()):
            return False
        prediction.resending = True  # first: the receiver thread reads it after it sets tokens_seen
        if prediction.tokens_seen:
            prediction.resending = False
            return False
        try:
            asyncio.run_coroutine_threadsafe(self._resend(prediction, error), prediction.loop)
        except RuntimeError:  # the loop is closed
            return False
        return True

    async def _resend(self, prediction: RoutedPrediction, error: BaseException) -> None:
        """Wait for Triton to serve again, then send ``prediction``'s inputs once more (the prediction's loop); fail
        it with ``error`` when Triton is not back within its deadline."""
        log.warning("Triton request %s: %s, before any token: sending it once more when Triton is back",
                    prediction.request_id, getattr(error, "message", error))
        output = prediction.output
        output.rebind_cancel(None)  # cancelled while it waits: the generator ends, nothing runs to stop
        try:
            with prediction.queued() if prediction.queued is not None else contextlib.nullcontext():
                await self._wait_ready()  # type: ignore[misc]
        except TritonError as exc:
            prediction.settle_open(error)
            output.fail(TritonDiedError(f"{getattr(error, 'message', error)}; it was to be sent again once Triton was "
                                        f"back, but {exc.message}"))
            return
        if output.cancelled.is_set():
            prediction.settle_open(asyncio.CancelledError())
            return
        if self.metrics is not None:
            self.metrics.resent_predictions.inc()
        try:
            again = await self._start(prediction.inputs, prediction.request_id, prediction.started_at,  # type: ignore
                                      prediction.metric, prediction.queued, resend_of=prediction)
        except StreamProcessError as exc:
            prediction.settle_open(exc)
            output.fail(exc)
            return
        log.info("Triton request %s sent again (stream process %s)", prediction.request_id, again.process.name)

    def _pick(self) -> Optional[StreamProcess]:
        """The running process with the fewest predictions, or None."""
        best: Optional[StreamProcess] = None
        for process in self.processes:
            if process.alive and (best is None or len(process.predictions) < len(best.predictions)):
                best = process
        return best

    def _wait_for_process(self) -> StreamProcess:
        deadline = time.monotonic() + self.start_timeout_s
        with self._any_ready:
            while True:
                process = self._pick()
                if process is not None:
                    return process
                left = deadline - time.monotonic()
                if left <= 0 or self._closing:
                    raise StreamProcessError(
                        f"no stream process is running (waited {self.start_timeout_s:g} s for a restart); "
                        f"{self.health().reason}"
                    )
                self._any_ready.wait(min(left, 1.0))

    def forget(self, prediction: RoutedPrediction) -> bool:
        """Remove ``prediction`` from its process's running predictions and from the watcher (from any thread);
        True if it was still there: whoever gets True ends it, so it ends exactly once."""
        with self._lock:
            found = prediction.process.predictions.pop(prediction.sid, None) is not None
        if found:
            self._unregister(prediction)
        return found

    def reconnect(self) -> None:
        """Triton was restarted: every stream process replaces its gRPC channel before its next request."""
        for process in self.processes:
            if process.alive:
                process.send(ipc.Reconnect())

    def stop_request(self, request_id: str) -> None:
        """Ask a running stream process to send Triton the stop request of ``request_id``."""
        process = self._pick()
        if process is not None:
            process.send(ipc.StopRequest(request_id))

    # -------------------------------------------------------------------- receive
    def _receive(self, process: StreamProcess, sock: socket.socket) -> None:
        """The receiver thread of ``process``: :class:`~cog_triton.ipc.Ready` first, then every frame until EOF.

        Per frame: its text chunks go to their predictions' queues (a dict lookup and a put each), then its
        events are handled in order (a few per prediction)."""
        reader = ipc.FrameReader(sock)
        predictions = process.predictions
        timing = self.timing
        try:
            while True:
                frame: ipc.Frame = reader.read()
                for sid, text in frame.texts:
                    prediction = predictions.get(sid)
                    if prediction is not None:
                        if not prediction.tokens_seen:
                            prediction.tokens_seen = True  # first, then resending (see RoutedPrediction)
                            if prediction.resending:
                                continue  # being sent again: this attempt's text never reaches the user
                        if timing:
                            prediction.timing.relayed()
                        prediction.output.queue.put(text)
                for event in frame.events:
                    self._event(process, event)
        except (EOFError, OSError, ValueError) as exc:
            if not isinstance(exc, EOFError):
                log.error("%s: channel error: %s", process.name, exc)
        finally:
            reader.close()
        self._exited(process)

    def _event(self, process: StreamProcess, event: ipc.Event) -> None:
        match event:
            case ipc.Ready(load_s=load_s, error=error, template=template):
                process.load_s = load_s
                if error:
                    process.start_error = error
                else:
                    if template is not None:
                        self.template = template
                    with self._any_ready:
                        process.alive = True
                        process.start_failures = 0
                        self._any_ready.notify_all()
                process.ready.set()
                return
            case ipc.Cancelled(output_tokens=tokens, reasoning_tokens=reasoning):
                # one the worker cancelled (and forgot): its tokens count
                if self.metrics is not None:
                    self.metrics.cancelled_stream(tokens, reasoning if self._thinks() else None)
                return
            case ipc.Stats(counts):
                if self.metrics is not None:
                    self.metrics.lora(counts)
                return
        prediction = process.predictions.get(event.sid)
        if prediction is None:
            return  # cancelled or failed here already
        match event:
            case ipc.FirstToken(seconds=seconds):
                prediction.tokens_seen = True  # first, then resending (see RoutedPrediction)
                if not prediction.resending:
                    record_time_to_first_token(prediction.record, seconds)
            case ipc.Timings(received_at=received, prepared_at=prepared, first_text_at=first_text):
                prediction.timing.stream_process(received, prepared, first_text)
            case ipc.Accepted(prompt_tokens=prompt_tokens):
                if prompt_tokens is not None:  # None: a prediction with images, counted by the engine (below)
                    prediction.record(INPUT_TOKEN_COUNT, prompt_tokens)
                prediction.settle_open(prompt_tokens or 0)
            case ipc.ImageCounts(images=images, prompt_tokens=prompt_tokens, image_tokens=image_tokens):
                prediction.record(INPUT_TOKEN_COUNT, prompt_tokens)
                prediction.record(IMAGE_COUNT, images)
                prediction.record(IMAGE_TOKEN_COUNT, image_tokens)
            case ipc.End(output_tokens=output_tokens, reasoning_tokens=reasoning_tokens,
                         thinking_budget_reached=budget_reached):
                if self.forget(prediction):
                    self._record_tokens(prediction, output_tokens, reasoning_tokens)
                    if budget_reached is not None:
                        prediction.record(THINKING_BUDGET_REACHED, budget_reached)
                    prediction.output.end()
            case ipc.Rejected(error=error):
                if self.forget(prediction):
                    prediction.settle_open(error)
                    prediction.output.end()
            case ipc.Failed(error=error, output_tokens=output_tokens, reasoning_tokens=reasoning_tokens):
                if self.forget(prediction):
                    self._record_tokens(prediction, output_tokens, reasoning_tokens)
                    if output_tokens:
                        prediction.tokens_seen = True
                    self._failed(prediction, error)

    def _thinks(self) -> bool:
        """The model thinks (its tokenizer has a thinking format): its predictions count thinking and answer apart."""
        template = self.template
        return template is not None and template.thinking is not None

    def _record_tokens(self, prediction: RoutedPrediction, output_tokens: int, reasoning_tokens: int) -> None:
        """A prediction's output_token_count, and for a model that thinks its reasoning and answer token counts."""
        prediction.record(OUTPUT_TOKEN_COUNT, output_tokens)
        if self._thinks():
            prediction.record(REASONING_TOKEN_COUNT, reasoning_tokens)
            prediction.record(ANSWER_TOKEN_COUNT, output_tokens - reasoning_tokens)

    def _failed(self, prediction: RoutedPrediction, error: BaseException) -> None:
        """A prediction failed in its process: a bare TritonError (the connection broke) may mean Triton is
        dying, which ``on_transport_error`` decides on the prediction's loop (a prediction without a token is then
        sent once more: :meth:`resend_later`); anything else fails it now."""
        if type(error) is TritonError and self.on_transport_error is not None:
            check = self.on_transport_error

            async def decide() -> None:
                try:
                    decided = await check(error)  # type: ignore[arg-type]
                    if not self.resend_later(prediction, decided):
                        prediction.output.fail(decided)
                except BaseException as exc:  # noqa: BLE001 - the prediction must end either way
                    prediction.output.fail(exc)

            try:
                asyncio.run_coroutine_threadsafe(decide(), prediction.loop)
                return
            except RuntimeError:  # the loop is closed
                pass
        prediction.output.fail(error)

    def _exited(self, process: StreamProcess) -> None:
        """``process`` closed its channel: fail its predictions, send their stop requests elsewhere, restart it."""
        with self._lock:
            was_alive, process.alive = process.alive, False
            predictions = list(process.predictions.values())
            process.predictions.clear()
        if self._closing:
            return
        how = process.exit_description()
        if not process.ready.is_set() or not was_alive:
            process.start_failures += 1
            process.start_error = process.start_error or f"it {how} while starting"
            process.ready.set()
        error = StreamProcessError(
            f"the stream process {process.name} (pid {process.pid}) {how}; the prediction was stopped "
            "(the other predictions are not affected, and the process is being restarted)"
        )
        if predictions:
            log.error("stream process %s (pid %s) %s: failing its %d running prediction(s)", process.name,
                      process.pid, how, len(predictions))
        for prediction in predictions:
            self._unregister(prediction)
            prediction.record(OUTPUT_TOKEN_COUNT, 0)
            prediction.settle_open(error)
            prediction.output.fail(error)
            self.stop_request(prediction.request_id)  # the backup for Triton's own cancellation
            if prediction.budgeted:  # its answer request, if its thinking budget had run out
                self.stop_request(ipc.answer_request_id(prediction.request_id))
        if process.start_failures >= MAX_START_FAILURES:
            log.error("stream process %s failed to start %d times in a row: not restarting it (%s)",
                      process.name, process.start_failures, process.start_error)
            with self._any_ready:
                self._any_ready.notify_all()
            return
        threading.Thread(target=self._restart, args=(process,), name=f"{process.name}-restart", daemon=True).start()

    def _restart(self, process: StreamProcess) -> None:
        time.sleep(min(0.5 * 2 ** process.start_failures, 10.0))
        if self._closing:
            return
        process.restarts += 1
        if self.metrics is not None:
            self.metrics.stream_process_restarts.inc()
        log.warning("restarting stream process %s (restart %d)", process.name, process.restarts)
        self._spawn(process)
        if process.ready.wait(self.start_timeout_s) and process.alive:
            log.info("stream process %s restarted (pid %s)", process.name, process.pid)

    # --------------------------------------------------------------------- status
    def health(self) -> Health:
        """Unhealthy when no stream process runs and none will be restarted."""
        if any(p.alive for p in self.processes):
            return Health(True)
        if all(p.start_failures >= MAX_START_FAILURES for p in self.processes):
            reasons = "; ".join(f"{p.name}: {p.start_error}" for p in self.processes)
            return Health(False, f"no stream process could be started ({reasons})")
        return Health(True, "stream processes are restarting")

    @property
    def running_predictions(self) -> int:
        return sum(len(p.predictions) for p in self.processes)


__all__ = ("RoutedPrediction", "StreamPool", "StreamProcess")
