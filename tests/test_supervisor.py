"""cog_triton.worker.supervisor's fault paths that need Triton to misbehave in ways it cannot be made to here:
a Triton that stops answering its readiness probes (hung), one that answers them with HTTP 503, and
one that cannot be restarted.

The process the supervisor watches is the real :class:`TritonServer` (process group, guardian, log,
SIGINT/SIGKILL stop) running a stand-in for the ``tritonserver`` binary: a small Python HTTP server on
the ``--http-port`` it is given. The stand-in is the one thing not real (the real Triton cannot be made
to hang or to exit at startup on demand); what it does is read from a ``mode`` file on each request and
at each start, so a test changes its behaviour while the supervisor watches:

* ``ok``: 200 to every GET;
* ``hang``: the connection is accepted and never answered (its path is written to the ``held`` file);
* ``503 <path>``: HTTP 503 for that path, 200 for the others;
* ``exit``: the process exits with status 1 at once when it starts.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from common.errors import TritonDiedError, TritonError
from cog_triton.worker.supervisor import State, Supervisor
from tensorrtllm_backend.server import LaunchConfig, TritonInstallation, TritonServer
from tests.proc import stop_at_once
from tests.test_server import launch_config

STANDIN = f"""#!{sys.executable}
import http.server, socketserver, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def mode():
    return (HERE / "mode").read_text().split()


with open(HERE / "starts", "a") as starts:
    starts.write("start\\n")
if mode()[0] == "exit":
    print("stand-in: exiting at startup", flush=True)
    sys.exit(1)
port = int(next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--http-port=")))


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        now = mode()
        if now[0] == "hang":
            with open(HERE / "held", "a") as held:
                held.write(self.path + "\\n")
            time.sleep(3600)  # accepted, never answered
        status = 503 if now[0] == "503" and self.path == now[1] else 200
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


print("stand-in: serving on", port, flush=True)
Server(("127.0.0.1", port), Handler).serve_forever()
"""

MODELS = ["ensemble_ids", "preprocessing", "tensorrt_llm"]
NOT_HUNG_S = 60  # only "not hung": the supervisor polls every 0.05 s here


class Recorder:
    """A registered prediction (a Failable): records the error the supervisor fails it with."""

    def __init__(self) -> None:
        self.errors: list[TritonError] = []
        self.failed = threading.Event()

    def fail(self, error: TritonError) -> None:
        self.errors.append(error)
        self.failed.set()


class StandIn:
    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        binary = root / "tritonserver"
        binary.write_text(STANDIN)
        binary.chmod(0o755)
        self.set("ok")
        cfg: LaunchConfig = launch_config(root / "repo")
        self.server = TritonServer(TritonInstallation(binary=binary, backend_dir=root), cfg, root / "triton.log",
                                   stop_timeout_s=2)

    def set(self, mode: str) -> None:
        (self.root / "mode").write_text(mode)

    @property
    def starts(self) -> int:
        path = self.root / "starts"
        return path.read_text().count("start") if path.exists() else 0


@pytest.fixture
def standin(tmp_path: Path) -> Iterator[StandIn]:
    made = StandIn(tmp_path / "triton")
    made.server.start()
    made.server.wait_ready(NOT_HUNG_S)
    yield made
    stop_at_once(made.server)


def supervise(standin: StandIn, **kwargs) -> Supervisor:
    options = {"startup_timeout_s": 5.0, "interval_s": 0.05, "probe_timeout_s": 0.3, "hung_after": 3,
               **kwargs}
    supervisor = Supervisor(standin.server, MODELS, **options)
    supervisor.start()
    return supervisor


def wait_for(predicate, timeout_s: float = NOT_HUNG_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def test_a_triton_that_stops_answering_its_probes_is_hung_unhealthy_and_restarted(standin: StandIn) -> None:
    restarted: list[int] = []
    supervisor = supervise(standin, on_restart=lambda: restarted.append(standin.server.pid or 0))
    try:
        stream = Recorder()
        supervisor.register(stream)
        old_pid = standin.server.pid
        assert supervisor.health().healthy
        standin.set("hang")
        assert stream.failed.wait(NOT_HUNG_S), "a hung Triton was never detected"
        [error] = stream.errors
        assert isinstance(error, TritonDiedError)
        assert "has not answered 3 readiness probes in a row (ReadTimeout): it is hung" in error.message
        assert "the prediction was stopped and Triton is restarting" in error.message
        # While it restarts after a hang (the new process hangs too), the health check says so.
        health = supervisor.health()
        assert not health.healthy and "it is hung; restarting it" in health.reason, health
        assert supervisor.state is State.RESTARTING
        assert wait_for(lambda: standin.server.pid != old_pid)
        standin.set("ok")
        assert wait_for(lambda: supervisor.state is State.READY)
        assert supervisor.counters.restarts == 1 and supervisor.counters.faults == 1
        assert restarted == [standin.server.pid] and supervisor.health().healthy
    finally:
        supervisor.stop()


def test_a_triton_stopped_while_a_probe_waits_for_its_answer_is_a_fault_at_once(standin: StandIn) -> None:
    """The process checks do not wait behind a readiness probe: a Triton stopped (SIGSTOP) while a probe waits for
    an answer fails the running predictions within a round, not after the probe's timeout (600 s here; before, the
    probe and the checks ran in turn on one thread, so the stop was seen only after that timeout)."""
    import os
    import signal

    supervisor = supervise(standin, probe_timeout_s=600.0, hung_after=1000)
    try:
        stream = Recorder()
        supervisor.register(stream)
        standin.set("hang")
        assert wait_for(lambda: (standin.root / "held").exists()), "no probe reached the stand-in"
        assert not stream.errors  # a probe waits for its answer; nothing is a fault yet
        os.kill(standin.server.pid, signal.SIGSTOP)
        assert stream.failed.wait(NOT_HUNG_S), "a Triton stopped during a probe was not a fault before the probe's timeout"
        [error] = stream.errors
        assert "Triton is stopped (state T" in error.message, error.message
        standin.set("ok")  # the restarted stand-in answers
    finally:
        supervisor.stop()


def test_probes_below_the_hang_count_are_not_a_fault(standin: StandIn) -> None:
    """hung_after probes in a row make a hang; a slow answer now and then does not."""
    supervisor = supervise(standin, hung_after=1000)
    try:
        stream = Recorder()
        supervisor.register(stream)
        standin.set("hang")
        assert wait_for(lambda: supervisor._failed_probes >= 3)
        health = supervisor.health()
        assert health.healthy, health  # not yet hung_after in a row
        assert "on a readiness probe" in supervisor.counters.last_fault
        standin.set("ok")
        assert wait_for(lambda: supervisor._failed_probes == 0)
        assert not stream.errors and supervisor.counters.faults == 0 and supervisor.state is State.READY
    finally:
        supervisor.stop()


def test_a_non_200_readiness_answer_is_a_fault_named_with_status_and_path(standin: StandIn) -> None:
    supervisor = supervise(standin)
    try:
        stream = Recorder()
        supervisor.register(stream)
        standin.set("503 /v2/models/tensorrt_llm/ready")
        assert stream.failed.wait(NOT_HUNG_S), "a 503 readiness answer was never taken for a fault"
        [error] = stream.errors
        assert "Triton answered HTTP 503 to GET /v2/models/tensorrt_llm/ready: the model is not ready" in error.message
        # Not a hang: requests wait for the restart, and the health check stays healthy meanwhile.
        assert supervisor.health().healthy
        assert wait_for(lambda: supervisor.counters.restarts == 1)  # the restarted stand-in answers 503 too ...
        assert wait_for(lambda: supervisor.counters.faults >= 2)  # ... so it is a fault again
        standin.set("ok")
        assert wait_for(lambda: supervisor.state is State.READY and supervisor.counters.restarts >= 2)
        assert supervisor.health().healthy
    finally:
        supervisor.stop()


def test_repeated_failed_restarts_end_in_could_not_be_restarted_and_unhealthy(standin: StandIn) -> None:
    """Triton dies and every restart exits at startup: after max_restarts failures in a row the state is
    unrecoverable, the health check (and so the predictor's healthcheck, coglet's UNHEALTHY) says Triton
    could not be restarted, and a new prediction gets that error at once instead of waiting."""
    from predict import Predictor

    supervisor = supervise(standin, max_restarts=2)
    try:
        starts = standin.starts
        standin.set("exit")
        assert standin.server.pid is not None
        standin.server.stop(timeout_s=2)  # it died
        assert wait_for(lambda: supervisor.state is State.FAILED), supervisor.state
        assert standin.starts - starts == 2, "max_restarts=2: two restarts, then no more"
        assert supervisor.counters.failed_restarts_in_a_row == 2
        last = supervisor.counters.last_fault
        assert last.startswith(
            "restart 2 failed: [triton_startup_failed] Triton exited with status 1 during startup"), last
        assert "stand-in: exiting at startup" in last
        health = supervisor.health()
        assert not health.healthy and health.reason == f"Triton could not be restarted: {last}"

        predictor = Predictor()
        predictor.service = type("Service", (), {"health": lambda self: supervisor.health()})()
        with pytest.raises(RuntimeError, match="Triton could not be restarted: restart 2 failed"):
            predictor.healthcheck()

        with pytest.raises(TritonError, match="Triton could not be restarted"):
            asyncio.run(supervisor.wait_ready())
        time.sleep(supervisor.interval_s * 10)
        assert standin.starts - starts == 2, "the supervisor went on restarting an unrecoverable Triton"
    finally:
        supervisor.stop()
