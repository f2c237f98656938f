"""The local Cog client (cog_triton.dev.local.CogServer) against coglet's spurious ``409 At capacity``.

coglet 0.23.1 answers 409 to a prediction that arrives while another is taking a slot, even with slots free
(``PermitPool::try_acquire``, replicate/cog 6110c912 ``crates/coglet/src/permit/pool.rs``; see
``cog_triton.dev.local.AT_CAPACITY_RETRIES``). tests/test_integration.py's four concurrent predictions got it once in a
fresh clone, once the client no longer spent 70 ms building an SSL context first (common/http.py) and the four
arrived together. The server here is an HTTP server on a free port that answers as coglet does: the 409 with
coglet's body a set number of times, then the prediction.
"""

from __future__ import annotations

import http.server
import json
import threading
from typing import Any, Iterator

import httpx
import pytest

from cog_triton.dev.local import AT_CAPACITY_RETRIES, CogServer

#: coglet's answer (crates/coglet/src/transport/http/routes.rs, ``CreatePredictionError::AtCapacity``)
BUSY = b'{"error":"At capacity - all prediction slots busy","status":"failed"}'


class _Coglet(http.server.BaseHTTPRequestHandler):
    """POST /predictions: ``busy`` 409s in a row, then the prediction (JSON, or SSE with Accept: text/event-stream)."""

    busy = 0
    posts = 0
    lock = threading.Lock()

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            type(self).posts += 1
            refuse = type(self).busy > 0
            if refuse:
                type(self).busy -= 1
        if refuse:
            self._send(409, BUSY, "application/json")
            return
        done = {"status": "succeeded", "output": [body["input"]["prompt"]]}
        if self.headers.get("Accept") == "text/event-stream":
            events = f"event: output\ndata: {json.dumps({'chunk': 'hi'})}\n\n" \
                     f"event: completed\ndata: {json.dumps(done)}\n\n"
            self._send(200, events.encode(), "text/event-stream")
        else:
            self._send(200, json.dumps(done).encode(), "application/json")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def coglet() -> Iterator[tuple[CogServer, type[_Coglet]]]:
    handler = type("Handler", (_Coglet,), {"busy": 0, "posts": 0, "lock": threading.Lock()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield CogServer({}, port=server.server_address[1]), handler  # only its client is used: no process is started
    server.shutdown()
    server.server_close()


def test_a_spurious_409_is_retried_and_counted(coglet) -> None:
    cog, handler = coglet
    handler.busy = 3
    assert cog.predict({"prompt": "hi"}) == {"status": "succeeded", "output": ["hi"]}
    assert (handler.posts, cog.retried_409) == (4, 3)
    handler.busy = 2
    events = list(cog.stream({"prompt": "hi"}))
    assert [event for event, _ in events] == ["output", "completed"] and events[0][1] == {"chunk": "hi"}
    assert (handler.posts, cog.retried_409) == (7, 5)


def test_slots_busy_for_longer_still_come_back_as_the_409(coglet) -> None:
    cog, handler = coglet
    handler.busy = 10 * AT_CAPACITY_RETRIES
    assert cog.predict({"prompt": "hi"}) == json.loads(BUSY)
    assert handler.posts == AT_CAPACITY_RETRIES + 1
    with pytest.raises(httpx.HTTPStatusError) as raised:
        list(cog.stream({"prompt": "hi"}))
    assert raised.value.response.status_code == 409 and "At capacity" in raised.value.response.text
    assert handler.posts == 2 * (AT_CAPACITY_RETRIES + 1)
    assert cog.retried_409 == 2 * AT_CAPACITY_RETRIES
