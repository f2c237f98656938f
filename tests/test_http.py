"""One SSL context per process for one-shot httpx requests (common/http.py).

Each ``httpx.get``/``post``/``stream`` without ``verify=`` builds a new SSL context (certifi's CA bundle loaded:
about 70 CPU-ms on the 2-core development machine). The local Cog client (readiness polls every 0.1 s,
predictions) and the Prometheus endpoint (one request to Triton per scrape) pass the process's one context
instead. These tests count the SSL contexts built while they make requests to real HTTP servers on free ports.
"""

from __future__ import annotations

import http.server
import json
import ssl
import threading
from typing import Any, Iterator

import httpx
import pytest

from common.http import default_ssl_context
from cog_triton.dev.local import CogServer
from cog_triton.worker.exporter import ServiceMetrics
from cog_triton.worker.metrics_endpoint import MetricsServer


@pytest.fixture
def ssl_contexts_made(monkeypatch) -> list[type]:
    """The classes of the SSL contexts this test's thread builds from here on (ssl.SSLContext.__new__, counted;
    nothing else changed). The requests under test run on that thread; other threads of this pytest process
    are not counted."""
    default_ssl_context()  # the process's one context exists before counting starts
    made: list[type] = []
    original = ssl.SSLContext.__new__
    thread = threading.get_ident()

    def counting(cls, *args: Any, **kwargs: Any):
        if threading.get_ident() == thread:
            made.append(cls)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "__new__", staticmethod(counting))
    return made


class _CogLike(http.server.BaseHTTPRequestHandler):
    """coglet's answers as far as CogServer's client reads them: /health-check, POST /predictions (JSON or SSE)."""

    def _send(self, body: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/health-check":
            self._send(b'{"status": "READY"}', "application/json")
        else:  # Triton's /metrics
            self._send(b"nv_inference_count 1\n", "text/plain; charset=utf-8")

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        done = {"status": "succeeded", "output": [body["input"]["prompt"]]}
        if self.headers.get("Accept") == "text/event-stream":
            self._send(f"event: completed\ndata: {json.dumps(done)}\n\n".encode(), "text/event-stream")
        else:
            self._send(json.dumps(done).encode(), "application/json")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def http_server() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CogLike)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_the_context_is_made_once_and_is_httpx_default() -> None:
    context = default_ssl_context()
    assert default_ssl_context() is context
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname  # as httpx's verify=True
    assert context.cert_store_stats()["x509_ca"] > 0  # the CA bundle is loaded: https URLs still verify


def test_the_local_cog_client_builds_no_ssl_context_per_request(http_server, ssl_contexts_made) -> None:
    cog = CogServer({}, port=http_server)  # only its client is used: no process is started
    for _ in range(5):
        assert cog.health() == {"status": "READY"}
    assert cog.wait_ready(timeout_s=10) == {"status": "READY"}
    assert cog.predict({"prompt": "hi"})["output"] == ["hi"]
    assert [event for event, _ in cog.stream({"prompt": "hi"})] == ["completed"]
    assert ssl_contexts_made == []
    httpx.get(f"{cog.url}/health-check", timeout=5)  # the counting sees a one-shot request without the context
    assert len(ssl_contexts_made) == 1


def test_a_scrape_builds_no_ssl_context(http_server, ssl_contexts_made) -> None:
    server = MetricsServer(ServiceMetrics(), "127.0.0.1", 0, triton_url=f"http://127.0.0.1:{http_server}/metrics")
    for _ in range(5):
        assert server.scrape().endswith(b"nv_inference_count 1\n")  # Triton's text was read each time
    assert ssl_contexts_made == []
