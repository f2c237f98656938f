"""Tests of cog_triton.client: the request body, SSE event parsing, and streaming against a real
local HTTP server speaking Triton's generate_stream protocol (HTTP/1.1, chunked, text/event-stream)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator, Optional

import pytest

from cog_triton.client import GenerateChunk, GenerateRequest, TritonClient, parse_event
from common.errors import InferenceError, TritonError

# --- GenerateRequest.to_json -----------------------------------------------------------------


def test_to_json_leaves_out_unused_optional_tensors() -> None:
    body = GenerateRequest(input_ids=[1, 2], max_tokens=16).to_json()
    assert body == {
        "input_ids": [1, 2],
        "max_tokens": 16,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "seed": 0,
        "stream": True,
    }
    assert "min_tokens" not in body and "stop_words" not in body and "text_input" not in body
    assert json.loads(json.dumps(body)) == body  # plain JSON


def test_to_json_includes_set_optional_tensors() -> None:
    request = GenerateRequest(
        input_ids=[5],
        max_tokens=8,
        min_tokens=3,
        temperature=0.0,
        top_k=1,
        top_p=0.5,
        repetition_penalty=1.2,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        seed=42,
        stream=False,
    )
    body = request.to_json()
    assert body["min_tokens"] == 3
    assert "stop_words" not in body  # stop sequences are matched by the predictor, on the text
    assert (body["temperature"], body["top_k"], body["top_p"], body["seed"], body["stream"]) == (0.0, 1, 0.5, 42, False)
    assert (body["repetition_penalty"], body["presence_penalty"], body["frequency_penalty"]) == (1.2, 0.5, -0.5)


# --- parse_event -----------------------------------------------------------------------------


def test_parse_event_flattens_nested_output_ids_and_cuts_to_sequence_length() -> None:
    chunk = parse_event(json.dumps({"output_ids": [[5, 6, 7, -1, -1]], "sequence_length": [[3]]}))
    assert chunk == GenerateChunk(output_ids=[5, 6, 7])


@pytest.mark.parametrize(
    ("payload", "ids"),
    [
        ({"output_ids": [[[1], [2]], [3]]}, [1, 2, 3]),  # no sequence_length: everything
        ({"output_ids": 9}, [9]),  # a scalar
        ({"output_ids": [1, 2], "sequence_length": 1}, [1]),  # scalar length
        ({"output_ids": [1, 2], "sequence_length": [5]}, [1, 2]),  # longer than the ids
        ({"output_ids": [1, 2], "sequence_length": [0]}, []),
        ({"output_ids": [1, 2], "sequence_length": [-1]}, []),
        ({"output_ids": [1, 2], "sequence_length": []}, [1, 2]),
        ({"output_ids": [], "sequence_length": 0}, []),  # the end-token final (C++ backend, conformance)
        ({"output_ids": [[]], "sequence_length": [[0]]}, []),
    ],
)
def test_parse_event_output_ids(payload: dict, ids: list[int]) -> None:
    assert parse_event(json.dumps(payload)).output_ids == ids


@pytest.mark.parametrize("payload", ['{"text_output": "hello"}', '{}', '{"model_name": "ensemble", "id": "x"}'])
def test_an_event_without_output_ids_is_an_error_not_an_empty_chunk(payload: str) -> None:
    """Upstream's ensemble returns only text_output: the predictor must not take that for success."""
    with pytest.raises(InferenceError) as info:
        parse_event(payload)
    assert "without output_ids" in str(info.value)


def test_parse_event_error_payload() -> None:
    with pytest.raises(InferenceError) as info:
        parse_event('{"error": "in ensemble \'ensemble\', max_tokens must be positive"}')
    assert info.value.message == "Triton reported: in ensemble 'ensemble', max_tokens must be positive"
    assert str(info.value).startswith("[inference_error] ")


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ("not json at all", "not JSON: 'not json at all'"),
        ('{"output_ids": [1,', "not JSON"),
        ("[1, 2, 3]", "unexpected event: '[1, 2, 3]'"),
        ('"text"', "unexpected event"),
        ('{"output_ids": ["x"]}', "output_ids"),
        ('{"output_ids": [null]}', "output_ids"),
        ('{"output_ids": [1], "sequence_length": ["n"]}', "sequence_length"),
    ],
)
def test_parse_event_rejects_unexpected_payloads(data: str, fragment: str) -> None:
    with pytest.raises(InferenceError) as info:
        parse_event(data)
    assert fragment in str(info.value)


def test_parse_event_shortens_long_garbage() -> None:
    with pytest.raises(InferenceError) as info:
        parse_event("x" * 5000)
    assert len(str(info.value)) < 400


# --- a real SSE server -----------------------------------------------------------------------

Scenario = Callable[["Handler"], None]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # chunked streaming, as Triton answers generate_stream
    server: "SSEServer"

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length) or b"null")
        self.server.state.requests.append((self.path, dict(self.headers), body))
        self.server.state.scenario(self)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass

    # helpers for scenarios
    def start_stream(self, content_type: str = "text/event-stream") -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()

    def chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def event(self, payload: Any) -> None:
        self.chunk(f"data: {json.dumps(payload)}\n\n".encode())

    def end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def send_json(self, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()


@dataclass
class ServerState:
    scenario: Scenario = lambda h: None  # noqa: E731
    requests: list = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


class SSEServer(ThreadingHTTPServer):
    daemon_threads = True
    state: ServerState


@dataclass
class Running:
    url: str
    state: ServerState


@pytest.fixture
def sse_server() -> Iterator[Running]:
    server = SSEServer(("127.0.0.1", 0), Handler)
    server.state = ServerState()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield Running(url=f"http://127.0.0.1:{server.server_address[1]}", state=server.state)
    finally:
        server.state.release.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def event(i: int) -> dict:
    return {"output_ids": [[100 + i]], "sequence_length": [1], "model_name": "ensemble"}


def collect(client: TritonClient, request: GenerateRequest) -> tuple[list[GenerateChunk], Optional[BaseException]]:
    """Run one generation; return the chunks received and the exception that ended it (if any)."""

    async def main() -> tuple[list[GenerateChunk], Optional[BaseException]]:
        chunks: list[GenerateChunk] = []
        error: Optional[BaseException] = None
        try:
            async for chunk in client.generate_stream(request):
                chunks.append(chunk)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            error = exc
        finally:
            await client.aclose()
        return chunks, error

    return asyncio.run(main())


REQUEST = GenerateRequest(input_ids=[9, 8, 7], max_tokens=3, seed=7)


def test_stream_of_three_events(sse_server: Running) -> None:
    def scenario(h: Handler) -> None:
        h.start_stream()
        h.chunk(b": keep-alive comment\n\n")
        for i in range(3):
            h.event(event(i))
        h.chunk(b"data:\n\n")  # an event without data is skipped
        h.end_stream()

    sse_server.state.scenario = scenario
    chunks, error = collect(TritonClient(sse_server.url + "/"), REQUEST)
    assert error is None
    assert chunks == [GenerateChunk([100]), GenerateChunk([101]), GenerateChunk([102])]
    [(path, headers, body)] = sse_server.state.requests
    assert path == "/v2/models/ensemble/generate_stream"
    assert body == REQUEST.to_json()
    assert headers["Accept"] == "text/event-stream"


def test_events_split_across_network_chunks(sse_server: Running) -> None:
    def scenario(h: Handler) -> None:
        h.start_stream()
        data = "".join(f"data: {json.dumps(event(i))}\n\n" for i in range(3)).encode()
        for start in range(0, len(data), 7):  # 7-byte chunks: events cut anywhere
            h.chunk(data[start : start + 7])
        h.end_stream()

    sse_server.state.scenario = scenario
    chunks, error = collect(TritonClient(sse_server.url, model="other_ensemble"), REQUEST)
    assert error is None
    assert [c.output_ids for c in chunks] == [[100], [101], [102]]
    assert sse_server.state.requests[0][0] == "/v2/models/other_ensemble/generate_stream"


def test_client_survives_a_new_event_loop(sse_server: Running) -> None:
    def scenario(h: Handler) -> None:
        h.start_stream()
        h.event(event(0))
        h.end_stream()

    sse_server.state.scenario = scenario
    client = TritonClient(sse_server.url)

    async def once(close: bool) -> list[GenerateChunk]:
        chunks = [chunk async for chunk in client.generate_stream(REQUEST)]
        if close:
            await client.aclose()
        return chunks

    # Two asyncio.run calls: the connection pool of the first (closed) loop is not reused.
    assert asyncio.run(once(close=False)) == [GenerateChunk([100])]
    assert asyncio.run(once(close=True)) == [GenerateChunk([100])]
    assert len(sse_server.state.requests) == 2


def test_http_400_with_json_error(sse_server: Running) -> None:
    sse_server.state.scenario = lambda h: h.send_json(400, {"error": "unexpected inference input 'bogus'"})
    chunks, error = collect(TritonClient(sse_server.url), REQUEST)
    assert chunks == []
    assert isinstance(error, InferenceError)
    assert error.message == "Triton answered HTTP 400: unexpected inference input 'bogus'"


def test_http_error_with_plain_text_body(sse_server: Running) -> None:
    def scenario(h: Handler) -> None:
        data = b"model 'ensemble' is not ready"
        h.send_response(503)
        h.send_header("Content-Type", "text/plain")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    sse_server.state.scenario = scenario
    _, error = collect(TritonClient(sse_server.url), REQUEST)
    assert isinstance(error, InferenceError)
    assert error.message == "Triton answered HTTP 503: model 'ensemble' is not ready"


def test_error_event_mid_stream(sse_server: Running) -> None:
    def scenario(h: Handler) -> None:
        h.start_stream()
        h.event(event(0))
        h.event(event(1))
        h.event({"error": "Encountered an error in forward function: out of memory"})
        h.event(event(2))  # never reaches the caller
        h.end_stream()

    sse_server.state.scenario = scenario
    chunks, error = collect(TritonClient(sse_server.url), REQUEST)
    assert [c.output_ids for c in chunks] == [[100], [101]]
    assert isinstance(error, InferenceError)
    assert error.message == "Triton reported: Encountered an error in forward function: out of memory"


def test_response_that_is_not_an_event_stream(sse_server: Running) -> None:
    sse_server.state.scenario = lambda h: h.send_json(200, {"text_output": "whole"})
    _, error = collect(TritonClient(sse_server.url), REQUEST)
    assert isinstance(error, InferenceError)
    assert "not an event stream" in error.message and "application/json" in error.message


def test_stalled_stream_times_out(sse_server: Running) -> None:
    def scenario(h: Handler) -> None:
        h.start_stream()
        h.event(event(0))
        h.server.state.release.wait(10)  # stops sending until the test ends

    sse_server.state.scenario = scenario
    client = TritonClient(sse_server.url, token_timeout_s=0.5)
    t0 = time.monotonic()
    chunks, error = collect(client, REQUEST)
    elapsed = time.monotonic() - t0
    assert [c.output_ids for c in chunks] == [[100]]
    assert isinstance(error, InferenceError)
    assert error.message == "no token from Triton for 0.5 s (COG_TRITON_REQUEST_TIMEOUT_S)"
    assert 0.4 < elapsed < 5


def test_connection_refused() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        _, error = collect(TritonClient(f"http://127.0.0.1:{port}", connect_timeout_s=2), REQUEST)
    assert type(error) is TritonError
    assert f"connection to Triton at http://127.0.0.1:{port} failed: ClientConnectorError" in error.message


def test_server_closes_connection_mid_stream(sse_server: Running) -> None:
    def scenario(h: Handler) -> None:
        h.start_stream()
        h.event(event(0))
        h.event(event(1))
        h.close_connection = True  # closes the socket without the final chunk

    sse_server.state.scenario = scenario
    chunks, error = collect(TritonClient(sse_server.url), REQUEST)
    assert [c.output_ids for c in chunks] == [[100], [101]]
    # A broken-off stream is a connection failure (the caller then checks whether Triton died).
    assert type(error) is TritonError
    assert error.message.startswith(f"connection to Triton at {sse_server.url} failed: ClientPayloadError: ")
    assert "Response payload is not completed" in error.message


def test_server_closes_connection_before_answering(sse_server: Running) -> None:
    def scenario(h: Handler) -> None:
        h.close_connection = True  # no status line at all

    sse_server.state.scenario = scenario
    chunks, error = collect(TritonClient(sse_server.url), REQUEST)
    assert chunks == []
    assert type(error) is TritonError
    assert "ServerDisconnectedError" in error.message and "Server disconnected" in error.message


def test_request_id_is_sent_as_the_generate_extension_id() -> None:
    body = GenerateRequest(input_ids=[1], max_tokens=4, request_id="cog-triton-abc").to_json()
    assert body["id"] == "cog-triton-abc"
    assert "id" not in GenerateRequest(input_ids=[1], max_tokens=4).to_json()


def test_stop_against_a_closed_port_raises_triton_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = TritonClient(f"http://127.0.0.1:{port}", connect_timeout_s=1.0)

    async def run() -> None:
        try:
            await client.stop("some-id")
        finally:
            await client.aclose()

    with pytest.raises(TritonError, match="stop request to Triton failed"):
        asyncio.run(run())


def test_http_400_as_triton_writes_it_an_sse_error_event(sse_server: Running) -> None:
    """Triton answers an error before the first response with HTTP 400 and one `data: {"error": ...}` event."""

    def scenario(h: Handler) -> None:
        data = b'data: {"error":"in ensemble \'ensemble\', preprocessing: the prompt has zero tokens"}\n\n'
        h.send_response(400)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    sse_server.state.scenario = scenario
    _, error = collect(TritonClient(sse_server.url), REQUEST)
    assert isinstance(error, InferenceError)
    assert error.message == "Triton answered HTTP 400: in ensemble 'ensemble', preprocessing: the prompt has zero tokens"


def test_sse_framing_details(sse_server: Running) -> None:
    def scenario(h: Handler) -> None:
        h.start_stream()
        h.chunk(b'data:{"output_ids": 1}\r\n\r\n')  # no space after the colon, CRLF line ends
        h.chunk(b'event: ignored\nid: 7\ndata: {"output_ids":\ndata:  [2, 3]}\n\n')  # data over two lines
        h.chunk(b'data: {"output_ids": [], "sequence_length": 0}\n')  # the last event without a blank line
        h.end_stream()

    sse_server.state.scenario = scenario
    chunks, error = collect(TritonClient(sse_server.url), REQUEST)
    assert error is None
    assert [c.output_ids for c in chunks] == [[1], [2, 3], []]
