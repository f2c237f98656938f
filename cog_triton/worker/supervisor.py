"""Watching Triton while it serves: faults fail the running predictions fast, and Triton restarts.

One :class:`Supervisor` thread per service polls, every ``interval_s`` seconds:

* the ``tritonserver`` process: exited, or stopped (state T, e.g. SIGSTOP);
* the Python backend stubs Triton started (``preprocessing``, the CPU reference ``tensorrt_llm``):
  since python_backend r24.06 a dead stub is never restarted, and every later request to its model
  fails with "Stub process ... is not healthy" (src/stub_launcher.cc); on Triton 2.51
  ``/v2/models/<m>/ready`` and ``/v2/health/ready`` still answer 200 then (r26.02 reports the
  model unready, the server health only from r26.04), so stub processes are watched directly;
* ``/v2/health/ready`` and each model's ``/v2/models/<m>/ready``, with a short timeout: a Triton
  that stops answering (hung) is a fault after ``hung_after`` failed probes in a row. The probes run
  on a thread of their own, so a probe waiting for its answer never delays the process checks.

On a fault every registered stream is failed at once (within about ``interval_s`` of the fault,
not at the 120 s no-token timeout) with an error that names it, and Triton is restarted in the
background: stopped (SIGKILL after a short grace), its shared memory removed, started, and waited
for up to the startup deadline. While it restarts, new requests wait for it
(:meth:`Supervisor.wait_ready`) instead of failing with "connection refused". A restart that
fails is retried; ``max_restarts`` failures in a row make the state unrecoverable, which the
predictor's ``healthcheck()`` reports (coglet then shows UNHEALTHY).

Nothing here runs per token: a stream registers once and is only touched on a fault. (A stream
that receives nothing for ``COG_TRITON_REQUEST_TIMEOUT_S`` is failed where it runs, by
:meth:`cog_triton.streaming.generation.Generator.watchdog`.)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol

import httpx

from common.errors import TritonDiedError, TritonError
from tensorrtllm_backend.server import TritonServer

log = logging.getLogger(__name__)


class State(str, enum.Enum):
    """Where Triton is, as the supervisor sees it."""

    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"  # could not be restarted: unrecoverable
    STOPPED = "stopped"  # shut down on purpose


class Failable(Protocol):
    """A running prediction the supervisor can end: ``fail(error)`` may be called from its thread."""

    def fail(self, error: TritonError) -> None: ...


@dataclass(frozen=True)
class Fault:
    """What a round of checks found. ``hang``: Triton runs but serves nothing (stopped, not answering)."""

    message: str
    hang: bool = False


@dataclass
class Health:
    """Whether a part of the service can serve (Triton, from the supervisor; the stream processes, from
    :meth:`cog_triton.worker.stream_pool.StreamPool.health`), and why not: the predictor's healthcheck reports it."""

    healthy: bool
    reason: str = ""


@dataclass
class _Counters:
    faults: int = 0
    restarts: int = 0
    failed_restarts_in_a_row: int = 0
    last_fault: str = ""
    streams_failed: int = 0
    history: list[str] = field(default_factory=list)


class Supervisor:
    """Watches one :class:`TritonServer` (see the module docstring).

    Args:
        server: the running Triton (already started and ready).
        models: model names to probe (``/v2/models/<m>/ready``).
        startup_timeout_s: deadline of a restart, seconds.
        interval_s: polling period, seconds.
        probe_timeout_s: timeout of each readiness probe, seconds.
        hung_after: failed probes in a row (while the process runs) that make Triton hung.
        max_restarts: failed restarts in a row after which the state is unrecoverable.
        on_restart: called (in the supervisor thread) after each successful restart.
    """

    def __init__(
        self,
        server: TritonServer,
        models: list[str],
        *,
        startup_timeout_s: float,
        interval_s: float = 0.5,
        probe_timeout_s: float = 2.0,
        hung_after: int = 3,
        max_restarts: int = 3,
        on_restart: Optional[Callable[[], None]] = None,
    ) -> None:
        self.server = server
        self.models = list(models)
        self.startup_timeout_s = startup_timeout_s
        self.interval_s = interval_s
        self.probe_timeout_s = probe_timeout_s
        self.hung_after = hung_after
        self.max_restarts = max_restarts
        self.on_restart = on_restart
        self.state = State.READY
        self.counters = _Counters()
        self._ready = threading.Event()
        self._ready.set()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._streams: set[Failable] = set()
        self._stubs: dict[int, str] = {}
        self._thread: Optional[threading.Thread] = None
        self._failed_probes = 0
        self._hang: Optional[str] = None  # the fault, while restarting after a hang

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start watching (a daemon thread)."""
        self._remember_stubs()
        self._thread = threading.Thread(target=self._run, name="triton-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (Triton itself is stopped by its owner)."""
        self.state = State.STOPPED
        self._stop.set()
        self._wake.set()
        self._ready.set()  # nobody waits for a restart that will not come
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    # ------------------------------------------------------------------- requests
    def register(self, stream: Failable) -> None:
        """Register a running prediction; on a fault, ``stream.fail(error)`` is called."""
        with self._lock:
            self._streams.add(stream)

    def unregister(self, stream: Failable) -> None:
        with self._lock:
            self._streams.discard(stream)

    async def wait_ready(self) -> None:
        """Return at once while Triton is ready; during a restart wait for it (up to the startup deadline).

        Raises:
            TritonError: Triton could not be restarted, or was not back within the deadline.
        """
        if self._ready.is_set() and self.state is State.READY:
            if self.server.is_alive():
                return
            self._wake.set()  # it died since the last round: check now rather than in up to interval_s
            await asyncio.sleep(0)
            while self.state is State.READY and not self.server.is_alive() and not self._stop.is_set():
                await asyncio.sleep(0.02)  # the supervisor thread takes the fault in a moment
        if self.state is State.FAILED:
            raise TritonError(f"Triton could not be restarted: {self.counters.last_fault}")
        log.info("waiting for Triton to restart before sending the request")
        ok = await asyncio.get_running_loop().run_in_executor(None, self._ready.wait, self.startup_timeout_s)
        if not ok or self.state is not State.READY:
            raise TritonError(
                f"Triton is not serving ({self.state.value}) after waiting {self.startup_timeout_s:g} s for it to "
                f"restart (COG_TRITON_STARTUP_TIMEOUT_S); last fault: {self.counters.last_fault}"
            )

    def health(self) -> Health:
        """The verdict for the predictor's healthcheck (cheap: no request to Triton).

        Unhealthy when Triton could not be restarted (unrecoverable), when it is stopped or not
        answering right now, and while it restarts after such a hang; a restart after a crash or a
        dead stub is recovery, during which requests wait, so it stays healthy.
        """
        if self.state is State.FAILED:
            return Health(False, f"Triton could not be restarted: {self.counters.last_fault}")
        if self.state is State.READY and self.server.is_stopped():
            return Health(False, "Triton is stopped (state T) and serves nothing")
        if self.state is State.READY and self._failed_probes >= self.hung_after:
            return Health(False, f"Triton is not answering: {self.counters.last_fault}")
        if self.state is State.RESTARTING and self._hang is not None:
            return Health(False, f"{self._hang}; restarting it")
        return Health(True)

    # ---------------------------------------------------------------------- watch
    def _remember_stubs(self) -> None:
        self._stubs = {stub.pid: stub.model for stub in self.server.stub_processes()}

    def _run(self) -> None:
        # The readiness probes run on a thread of their own: a probe waits up to probe_timeout_s for an answer, and
        # the checks of the process (exited, stopped, a stub gone) must not wait behind it. A Triton stopped while a
        # probe was on its way (SIGSTOP) was found only after that probe's timeout and one more round: 2.5 s, where
        # the module promises about interval_s (tests/test_faults.py's stopped-Triton test failed so, once).
        with httpx.Client(base_url=self.server.url, timeout=self.probe_timeout_s) as client, \
                concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="triton-probe") as probes:
            probe: Optional[concurrent.futures.Future] = None
            slept = False  # this round's interval was spent waiting for a probe
            while not self._stop.is_set():
                if not slept:
                    self._wake.wait(self.interval_s)
                    self._wake.clear()
                slept = False
                if self._stop.is_set():
                    return
                if self.state is not State.READY:
                    probe = None  # a probe of the Triton before the restart: its answer is not looked at
                    continue
                fault = self.check_process()
                if fault is None:
                    if probe is None:
                        probe = probes.submit(self._probe, client)
                        # A healthy answer comes within this round; one that does not, took the round's interval,
                        # and the next round's process checks come without another.
                        slept = not concurrent.futures.wait([probe], timeout=self.interval_s).done
                    if probe.done():
                        fault = self._probe_verdict(probe.result())
                        probe = None
                if fault is not None and not self._stop.is_set():
                    probe = None
                    self._handle_fault(fault)

    def check_process(self) -> Optional[Fault]:
        """The checks of Triton's processes (from /proc, no request): exited, stopped, a stub gone; the fault, or
        None."""
        server = self.server
        if not server.is_alive():
            return Fault(f"Triton {server.exit_description()}")
        if server.is_stopped():
            return Fault("Triton is stopped (state T: it received SIGSTOP or is being traced) and serves nothing", hang=True)
        # The stubs were listed once Triton was ready (a scan of every Triton thread's children);
        # each round only looks at those pids.
        for pid, model in self._stubs.items():
            if not server.process_alive(pid):
                return Fault(
                    f"the Python backend stub of model '{model}' (pid {pid}) exited; Triton does not restart it, and "
                    "every request to the model would fail with 'Stub process is not healthy'"
                )
        return None

    def _probe(self, client: httpx.Client) -> "Optional[Fault] | httpx.HTTPError":
        """Triton's readiness endpoints, each within probe_timeout_s (the probe thread): None when all answer 200, the
        fault of a non-200 answer, or the error of a request that got no answer."""
        try:
            for path in ["/v2/health/ready", *(f"/v2/models/{m}/ready" for m in self.models)]:
                response = client.get(path)
                if response.status_code != 200:
                    return Fault(f"Triton answered HTTP {response.status_code} to GET {path}: the model is not ready")
            return None
        except httpx.HTTPError as exc:
            return exc

    def _probe_verdict(self, outcome: "Optional[Fault] | httpx.HTTPError") -> Optional[Fault]:
        """Count a probe's outcome (the supervisor thread): an answered probe resets the count of failed ones in a
        row; ``hung_after`` failed in a row make a hang."""
        if not isinstance(outcome, httpx.HTTPError):
            self._failed_probes = 0
            return outcome
        self._failed_probes += 1
        self.counters.last_fault = f"{type(outcome).__name__} on a readiness probe ({self._failed_probes} in a row)"
        if self._failed_probes >= self.hung_after:
            return Fault(
                f"Triton has not answered {self._failed_probes} readiness probes in a row ({type(outcome).__name__}): "
                "it is hung",
                hang=True,
            )
        return None

    def _handle_fault(self, found: Fault) -> None:
        fault = found.message
        self.counters.faults += 1
        self.counters.last_fault = fault
        self.counters.history.append(f"{time.strftime('%H:%M:%S')} {fault}")
        self._hang = fault if found.hang else None
        self.state = State.RESTARTING
        self._ready.clear()
        log.error("%s; failing the running predictions and restarting Triton. Last log lines:\n%s",
                  fault, self.server.log_tail(20))
        error = TritonDiedError(f"{fault}; the prediction was stopped and Triton is restarting")
        with self._lock:
            streams = list(self._streams)
            self._streams.clear()
        for stream in streams:
            stream.fail(error)
        self.counters.streams_failed += len(streams)
        self._restart()

    def _restart(self) -> None:
        while not self._stop.is_set():
            try:
                self.server.stop(timeout_s=2.0)
                self.server.start()
                self.server.wait_ready(self.startup_timeout_s)
            except TritonError as exc:
                self.counters.failed_restarts_in_a_row += 1
                self.counters.last_fault = f"restart {self.counters.failed_restarts_in_a_row} failed: {exc}"
                log.error("%s", self.counters.last_fault)
                if self.counters.failed_restarts_in_a_row >= self.max_restarts:
                    self.state = State.FAILED
                    self._ready.set()  # waiters get the failure at once
                    return
                self._stop.wait(min(2.0 ** self.counters.failed_restarts_in_a_row, 30.0))
                continue
            self.counters.restarts += 1
            self.counters.failed_restarts_in_a_row = 0
            self._failed_probes = 0
            self._remember_stubs()
            if self.on_restart is not None:
                self.on_restart()
            self._hang = None
            self.state = State.READY
            self._ready.set()
            log.info("Triton restarted (%d restarts so far)", self.counters.restarts)
            return
