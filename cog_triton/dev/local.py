"""The local stack used by ``scripts/serve``, ``scripts/demo.py`` and the integration tests.

* :class:`WeightsHTTPServer`: serves a folder (the weights archive) over HTTP on 127.0.0.1, with
  the standard library's ``SimpleHTTPRequestHandler``; counts GET requests per path.
* :func:`serving_env`: the environment of a predictor serving an archive from that server, Triton
  on free ports.
* :class:`CogServer`: runs the real Cog HTTP server (``python -m cog.server.http``, coglet) on
  127.0.0.1 as a subprocess in its own process group, with the committed Cog schema in place (as
  ``cog build`` bundles it, so inputs are validated and SSE streaming works as in the image), waits
  for ``/health-check`` to report READY, and stops it (SIGTERM, then SIGKILL of the whole group, so
  Triton goes too).
"""

from __future__ import annotations

import collections
import http.server
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

import httpx

from common.http import default_ssl_context
from cog_triton.worker.schema import install_for_coglet
from cog_triton.settings import REPO_ROOT

log = logging.getLogger("cog_triton.local")  # the name its log lines have always carried

#: coglet 0.23.1 answers ``409 At capacity`` to a prediction that arrives while another is taking a slot, even with
#: slots free: ``PermitPool::try_acquire`` gives up when ``try_lock`` of the pool's receiver fails (replicate/cog
#: 6110c912, ``crates/coglet/src/permit/pool.rs``; ``service.rs`` maps that to ``AtCapacity``, ``routes.rs`` to 409).
#: It also gives a slot back only once the worker reports it idle, a moment after ``completed``, so a prediction sent
#: right after another ended finds that slot taken. Nothing ran either way. docs/operations.md tells clients to retry
#: it; :class:`CogServer` does, up to this many times, :data:`AT_CAPACITY_RETRY_S` apart, and counts the retries. All
#: slots busy for longer than that still comes back as the 409.
AT_CAPACITY_RETRIES = 50
AT_CAPACITY_RETRY_S = 0.005


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serving_env(weights_url: str, *, sha256: str = "", work: Optional[Path] = None, triton_http_port: int = 0,
                **settings: str) -> dict[str, str]:
    """Environment for a :class:`CogServer` whose ``setup()`` fetches ``weights_url``, with Triton's
    HTTP, gRPC and metrics ports and the Prometheus endpoint's (on 127.0.0.1) free ports
    (``triton_http_port`` fixes the HTTP one).

    ``sha256`` is checked over the download (``COG_TRITON_WEIGHTS_SHA256``); ``work`` holds the
    weights, the model repository and Triton's log; ``settings`` adds more variables.
    """
    env = {
        "COG_WEIGHTS": weights_url,
        "COG_TRITON_HTTP_PORT": str(triton_http_port or free_port()),
        "COG_TRITON_GRPC_PORT": str(free_port()),
        "COG_TRITON_METRICS_PORT": str(free_port()),
        "COG_TRITON_PROMETHEUS_PORT": str(free_port()),
        "COG_TRITON_PROMETHEUS_ADDRESS": "127.0.0.1",
    }
    if sha256:
        env["COG_TRITON_WEIGHTS_SHA256"] = sha256
    if work is not None:
        env.update({
            "COG_TRITON_WEIGHTS_DIR": str(work / "weights"),
            "COG_TRITON_MODEL_REPO_DIR": str(work / "model_repository"),
            "COG_TRITON_TRITON_LOG_FILE": str(work / "triton.log"),
        })
    env.update(settings)
    return env


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    counter: "collections.Counter[str]"

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self.counter[self.path] += 1
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        log.debug("weights server: " + format, *args)


class WeightsHTTPServer:
    """Serve ``directory`` read-only at ``http://127.0.0.1:<port>/`` in a background thread."""

    def __init__(self, directory: Path, port: int = 0) -> None:
        self.counter: collections.Counter[str] = collections.Counter()
        handler = type("Handler", (_QuietHandler,), {"counter": self.counter})
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), partial(handler, directory=str(directory)))
        # shutdown() returns once serve_forever's loop looks again: every 0.05 s, not the default 0.5 s (tests start
        # and stop many of these)
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="weights-http", daemon=True)

    @property
    def url(self) -> str:
        """Base URL without trailing slash."""
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __enter__(self) -> "WeightsHTTPServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class CogServer:
    """The real Cog HTTP server running ``predict.py:Predictor`` (or ``train.py:train``) from the repository root.

    Args:
        env: extra environment (COG_WEIGHTS, COG_TRITON_* settings).
        port: HTTP port on 127.0.0.1 (0 = pick a free one).
        log_file: where the server's output goes.
        max_concurrency: COG_MAX_CONCURRENCY (coglet's prediction slots).
        mode: "predict", or "train" (coglet's ``--x-mode train`` with ``COG_TRAIN_TYPE_STUB``;
            ``/trainings`` then runs ``train.py:train``).
        work_dir: run another predictor: coglet's working directory, holding that predictor's
            ``predict.py`` and ``.cog/openapi_schema.json`` (default: this repository, with the
            committed schema put in place); the repository is on its PYTHONPATH.
        prefix: a command the server runs under (``[*prefix, python, -m, cog.server.http, ...]``), which must
            ``exec`` it (the server keeps its process); e.g. a resolver of the tests' own (tests/dropnet.py).
    """

    def __init__(
        self,
        env: Mapping[str, str],
        *,
        port: int = 0,
        log_file: Optional[Path] = None,
        max_concurrency: int = 8,
        host: str = "127.0.0.1",
        mode: str = "predict",
        work_dir: Optional[Path] = None,
        prefix: Sequence[str] = (),
    ) -> None:
        if mode not in ("predict", "train"):
            raise ValueError(f"mode must be 'predict' or 'train', got {mode!r}")
        self.mode = mode
        self.port = port or free_port()
        self.host = host
        self.log_file = log_file or REPO_ROOT / "build" / f"cog-{self.port}.log"
        self.max_concurrency = max_concurrency
        self.extra_env = dict(env)
        self.work_dir = work_dir
        self.prefix = list(prefix)
        self.proc: Optional[subprocess.Popen[bytes]] = None
        #: ``409 At capacity`` answers retried by :meth:`predict` and :meth:`stream` (see :data:`AT_CAPACITY_RETRIES`).
        self.retried_409 = 0
        self._retried_lock = threading.Lock()

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:5000."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start the server (returns at once)."""
        venv_bin = str(Path(sys.executable).parent)
        env = dict(os.environ)
        env.update(
            {
                "PATH": f"{venv_bin}{os.pathsep}{env.get('PATH', '')}",
                "COG_PREDICT_TYPE_STUB": "predict.py:Predictor",
                "COG_TRAIN_TYPE_STUB": "train.py:train",
                "PORT": str(self.port),
                "COG_MAX_CONCURRENCY": str(self.max_concurrency),
                "COG_TRITON_MAX_CONCURRENCY": str(self.max_concurrency),
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.extra_env)
        if self.work_dir is None:
            install_for_coglet(REPO_ROOT)  # coglet reads .cog/openapi_schema.json from its working directory
        else:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        sink = open(self.log_file, "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(  # noqa: S603
            [*self.prefix, sys.executable, "-m", "cog.server.http", "--host", self.host]
            + (["--x-mode", "train"] if self.mode == "train" else []),
            cwd=self.work_dir or REPO_ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        sink.close()
        log.info("Cog HTTP server starting on %s (pid %d, log %s)", self.url, self.proc.pid, self.log_file)

    def health(self) -> dict[str, Any]:
        """The JSON of ``GET /health-check``."""
        return httpx.get(f"{self.url}/health-check", timeout=5, verify=default_ssl_context()).json()

    def wait_ready(self, timeout_s: float = 600.0) -> dict[str, Any]:
        """Wait for status READY; return the health document.

        Raises:
            RuntimeError: SETUP_FAILED (with the setup logs), the process exited, or the deadline passed.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"Cog server exited with {self.proc.returncode}; see {self.log_file}")
            try:
                doc = self.health()
            except httpx.TransportError:
                time.sleep(0.1)
                continue
            status = doc.get("status")
            if status == "READY":
                return doc
            if status in ("SETUP_FAILED", "DEFUNCT"):
                logs = (doc.get("setup") or {}).get("logs", "")
                raise RuntimeError(f"Cog setup failed ({status}):\n{logs[-4000:]}")
            time.sleep(0.1)  # a GET to coglet's health check: cheap; setup ends at any moment
        raise RuntimeError(f"Cog server not ready after {timeout_s:.0f} s; see {self.log_file}")

    def _at_capacity(self, response: httpx.Response, attempt: int) -> bool:
        """Whether ``response`` is a 409 to retry (then counted, after a short wait)."""
        if response.status_code != 409 or attempt >= AT_CAPACITY_RETRIES:
            return False
        with self._retried_lock:
            self.retried_409 += 1
        time.sleep(AT_CAPACITY_RETRY_S)
        return True

    def predict(self, inputs: Mapping[str, Any], timeout_s: float = 300.0) -> dict[str, Any]:
        """``POST /predictions`` synchronously; return the prediction document (a ``409 At capacity`` retried:
        :data:`AT_CAPACITY_RETRIES`)."""
        for attempt in range(AT_CAPACITY_RETRIES + 1):
            response = httpx.post(f"{self.url}/predictions", json={"input": dict(inputs)}, timeout=timeout_s,
                                  verify=default_ssl_context())
            if not self._at_capacity(response, attempt):
                break
        return response.json()

    def stream(self, inputs: Mapping[str, Any], timeout_s: float = 300.0) -> Iterator[tuple[str, Any]]:
        """``POST /predictions`` with ``Accept: text/event-stream``: yield (event, data) as coglet sends them.

        Events (coglet 0.23.1, crates/coglet/src/prediction.rs): ``start``, ``output`` (data
        ``{"chunk": text, "index": n}``), ``log``, ``metric``, and last ``completed`` with the whole
        prediction. A ``409 At capacity`` is retried (:data:`AT_CAPACITY_RETRIES`); another non-200 answer (422 for
        an invalid input, 406 without the schema) raises httpx.HTTPStatusError with the body.
        """
        headers = {"Accept": "text/event-stream"}
        for attempt in range(AT_CAPACITY_RETRIES + 1):
            with httpx.stream(
                "POST", f"{self.url}/predictions", json={"input": dict(inputs)}, headers=headers, timeout=timeout_s,
                verify=default_ssl_context(),
            ) as response:
                if response.status_code != 200:
                    response.read()
                    if self._at_capacity(response, attempt):
                        continue
                    response.raise_for_status()
                event = "message"
                for line in response.iter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:"):
                        yield event, json.loads(line[5:].strip())
                        event = "message"
                return

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the server's process group, then SIGKILL it after ``timeout_s`` seconds."""
        if self.proc is None:
            return
        for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything left in the group (Triton)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def __enter__(self) -> "CogServer":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
