"""What a Cog user gets when Triton misbehaves in ways the real Triton cannot be made to here: a
generation stream that ends (gRPC status OK) before its final response, and one that stops sending
tokens. End to end: the real Cog server (coglet), the product's predictor and its stream processes,
the real SmolLM2 tokenizer; only ``tritonserver`` is a stand-in (the one mock, and why: a real Triton
ends a decoupled stream only with its final response, or breaks it off with an error status when it
dies, which tests/test_faults.py does for real).

The stand-in is started by the predictor's own TritonServer as ``COG_TRITON_TRITONSERVER``. It answers
every HTTP GET on ``--http-port`` with 200 (readiness, as the supervisor probes it) and speaks Triton's
``ModelStreamInfer`` on ``--grpc-port`` (responses as tests/test_client.py's ``response`` builds them,
as Triton's gRPC frontend sends them). For each request it reads a ``mode`` file the test writes:

* ``{"ids": [...]}``: one response per token id, the last one final (a whole answer);
* ``{"ids": [...], "cut": n}``: the first ``n`` ids, then the stream ends with status OK, no final;
* ``{"ids": [...], "silent": n}``: the first ``n`` ids, then nothing (the stream stays open).

A stop request (``tensorrt_llm`` with ``stop=true``, as cog_triton.streaming.client sends it) gets an empty final
response, as the TensorRT-LLM backend answers it. Every request's model, id and kind is appended to a
``requests`` file, so a test sees what the predictor asked of Triton.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from cog_triton.dev.local import CogServer, serving_env
from cog_triton.settings import REPO_ROOT

pytestmark = pytest.mark.integration

STANDIN = f"""#!{sys.executable}
import asyncio, http.server, json, socketserver, sys, threading
from pathlib import Path

sys.path.insert(0, {str(REPO_ROOT)!r})
import grpc
from tritonclient.grpc import service_pb2_grpc
from tests.test_client import response

HERE = Path(__file__).resolve().parent


def arg(name):
    return int(next(a.split("=", 1)[1] for a in sys.argv if a.startswith(name + "=")))


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


class HTTP(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


class Triton(service_pb2_grpc.GRPCInferenceServiceServicer):
    async def ModelStreamInfer(self, requests, context):
        async for request in requests:
            stop = any(i.name == "stop" for i in request.inputs)
            mode = json.loads((HERE / "mode").read_text())
            with open(HERE / "requests", "a") as log:
                log.write(json.dumps({{"model": request.model_name, "id": request.id, "stop": stop}}) + "\\n")
            if stop:
                yield response(None, final=True, request_id=request.id)
                continue
            ids = mode["ids"]
            sent = ids[:mode.get("cut", mode.get("silent", len(ids)))]
            for i, token in enumerate(sent):
                yield response([token], final="cut" not in mode and "silent" not in mode and i == len(ids) - 1,
                               request_id=request.id)
            if "cut" in mode:
                return  # the call ends with status OK and no final response
            if "silent" in mode:
                await asyncio.sleep(3600)


async def serve():
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Triton(), server)
    server.add_insecure_port(f"127.0.0.1:{{arg('--grpc-port')}}")
    await server.start()
    print("stand-in: serving", flush=True)
    await server.wait_for_termination()


threading.Thread(target=HTTP(("127.0.0.1", arg("--http-port")), Health).serve_forever, daemon=True).start()
asyncio.run(serve())
"""

WORDS = "Once upon a time there was a robot who loved to paint the sea."


@pytest.fixture(scope="module")
def tokenizer(hf_tokenizer: Any) -> Any:
    return hf_tokenizer


@pytest.fixture(scope="module")
def stack(tmp_path_factory, checkpoint_dir: Path) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("standin")
    standin = work / "bin" / "tritonserver"
    standin.parent.mkdir()
    standin.write_text(STANDIN)
    standin.chmod(0o755)
    (standin.parent / "mode").write_text(json.dumps({"ids": [1]}))
    env = serving_env(
        str(checkpoint_dir), work=work, COG_TRITON_TRITONSERVER=str(standin),
        COG_TRITON_BACKEND_DIR=str(standin.parent), COG_TRITON_SELF_TEST="0", COG_TRITON_STREAM_INTERVAL_MS="0",
        COG_TRITON_REQUEST_TIMEOUT_S="3",
    )
    cog = CogServer(env, log_file=work / "cog.log", max_concurrency=2)
    cog.start()
    try:
        cog.wait_ready(timeout_s=300)
        yield {"cog": cog, "dir": standin.parent, "grpc": f"127.0.0.1:{env['COG_TRITON_GRPC_PORT']}"}
    finally:
        cog.stop()


def requests_seen(stack: dict[str, Any]) -> list[dict[str, Any]]:
    path = stack["dir"] / "requests"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def predict(stack: dict[str, Any], mode: dict[str, Any],
            requests: int = 1) -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
    """Run one prediction over SSE with the stand-in in ``mode``: (the text streamed, the final
    prediction document, the requests Triton got since it started, once there are ``requests`` of them).

    A stop request is sent in the background as the prediction fails (Generator.send_stop_request_in_background): it
    may reach Triton after the client has the failure, so it is waited for, not read at once."""
    (stack["dir"] / "mode").write_text(json.dumps(mode))
    before = len(requests_seen(stack))
    chunks: list[str] = []
    final: dict[str, Any] = {}
    for name, data in stack["cog"].stream({"prompt": "Tell me a story.", "max_tokens": 64}, timeout_s=120):
        if name == "output":
            chunks.append(data["chunk"])
        elif name == "completed":
            final = data
    deadline = time.monotonic() + 30  # only "not hung": the stop request follows the failure within moments
    while len(requests_seen(stack)) - before < requests and time.monotonic() < deadline:
        time.sleep(0.02)
    return "".join(chunks), final, requests_seen(stack)[before:]


def test_a_whole_answer_through_the_standin(stack: dict[str, Any], tokenizer: Any) -> None:
    """The baseline the fault tests differ from: every token, final response, no stop request."""
    ids = tokenizer.encode(WORDS)
    text, final, asked = predict(stack, {"ids": ids})
    assert final["status"] == "succeeded", final
    assert text == "".join(final["output"]) == tokenizer.decode(ids)
    assert [(r["model"], r["stop"]) for r in asked] == [("ensemble_ids", False)]


def test_a_stream_ending_without_its_final_response_fails_keeping_the_partial_text(
        stack: dict[str, Any], tokenizer: Any) -> None:
    """Triton's stream ends (status OK) after 5 of 14 tokens: the prediction fails, saying the answer is
    incomplete and which Triton, not passed off as a shorter whole answer; the 5 tokens' text reached
    the user; the engine is told to stop the request (its id), so nothing keeps generating."""
    ids = tokenizer.encode(WORDS)
    assert len(ids) > 8
    text, final, asked = predict(stack, {"ids": ids, "cut": 5}, requests=2)
    assert final["status"] == "failed", final
    assert "ended without the final response" in final["error"] and stack["grpc"] in final["error"], final
    assert text == "".join(final["output"]) == tokenizer.decode(ids[:5])
    assert [(r["model"], r["stop"]) for r in asked] == [("ensemble_ids", False), ("tensorrt_llm", True)], asked
    assert asked[1]["id"] == asked[0]["id"]
    whole, after, _ = predict(stack, {"ids": ids})  # the next prediction is unaffected
    assert after["status"] == "succeeded" and whole == tokenizer.decode(ids), after


def test_a_stream_that_stops_sending_fails_after_the_request_timeout(stack: dict[str, Any], tokenizer: Any) -> None:
    """No token for COG_TRITON_REQUEST_TIMEOUT_S (3 s here) after 4 tokens: the prediction fails naming the
    setting and keeps the text that came; the engine gets a stop request for that request id."""
    ids = tokenizer.encode(WORDS)
    started = time.monotonic()
    text, final, asked = predict(stack, {"ids": ids, "silent": 4}, requests=2)
    assert time.monotonic() - started >= 3
    assert final["status"] == "failed", final
    # coglet puts its own prefix before the predictor's error ("Prediction failed: Generator iteration error: ...")
    assert final["error"].endswith("InferenceError: [inference_error] no token from Triton for 3 s "
                                   "(COG_TRITON_REQUEST_TIMEOUT_S)"), final
    assert text == "".join(final["output"]) == tokenizer.decode(ids[:4])
    assert [(r["model"], r["stop"]) for r in asked] == [("ensemble_ids", False), ("tensorrt_llm", True)], asked
    assert asked[1]["id"] == asked[0]["id"]
