"""cog_triton.worker.cog_bridge: the facts about coglet 0.23.1 it relies on, reproduced with the installed
coglet, and the bridge itself.

The coglet facts run small predictors (no Triton) under the real Cog HTTP server, with
COG_MAX_CONCURRENCY=4 as our image sets it, and stream over SSE. Each one is a behaviour of coglet
that our predict() is built around (crates/coglet-python/src/predictor.rs, worker_bridge.rs at
replicate/cog 6110c912): if a coglet release changes one, its test fails and the bridge can be
simplified.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import httpx
import pytest

from common.errors import InferenceError
from common.http import default_ssl_context
from cog_triton.worker import cog_bridge
from cog_triton.dev.local import free_port
from cog_triton.settings import REPO_ROOT
from tests.bridge_source import relay

STEP_S = 0.3

PREAMBLE = textwrap.dedent(
    f"""
    import asyncio, sys, time
    import cog
    from cog import AsyncConcatenateIterator, BasePredictor, ConcatenateIterator, Input
    sys.path.insert(0, {str(REPO_ROOT)!r})
    from cog_triton.worker import cog_bridge
    from tests.bridge_source import relay

    def note(text):
        print(text, file=sys.stderr, flush=True)
    """
)

ASYNC_GENERATOR = PREAMBLE + textwrap.dedent(
    f"""
    class Predictor(BasePredictor):
        @cog.streaming
        async def predict(self, n: int = Input(default=4)) -> AsyncConcatenateIterator[str]:
            for i in range(n):
                await asyncio.sleep({STEP_S})
                yield f"t{{i}} "
    """
)

RETURNED_GENERATOR = PREAMBLE + textwrap.dedent(
    f"""
    def tokens(n):
        try:
            for i in range(n):
                time.sleep({STEP_S})
                yield f"t{{i}} "
        finally:
            note("GENERATOR ENDED")

    class Predictor(BasePredictor):
        @cog.streaming
        async def predict(self, n: int = Input(default=4)) -> ConcatenateIterator[str]:
            return tokens(n)
    """
)

BRIDGE = PREAMBLE + textwrap.dedent(
    f"""
    cog_bridge.install_cancel_hook()

    async def tokens(n, fail_at):
        try:
            for i in range(n):
                await asyncio.sleep({STEP_S})
                if i == fail_at:
                    raise RuntimeError("the engine broke at token " + str(i))
                yield f"t{{i}} "
        except asyncio.CancelledError:
            note("SOURCE CANCELLED")
            raise

    class Predictor(BasePredictor):
        @cog.streaming
        async def predict(self, n: int = Input(default=4), fail_at: int = Input(default=-1)) -> ConcatenateIterator[str]:
            return await relay(tokens(n, fail_at))
    """
)


def minimal_schema(properties: dict[str, Any]) -> dict[str, Any]:
    """The parts of a Cog schema coglet reads: the Input component and x-cog-streaming (test fixture)."""
    return {
        "openapi": "3.0.2",
        "info": {"title": "Cog", "version": "0.1.0"},
        "paths": {"/predictions": {"post": {"x-cog-streaming": True}}},
        "components": {"schemas": {"Input": {"type": "object", "title": "Input", "properties": properties}}},
    }


class ToyServer:
    """The real Cog HTTP server running a toy predictor from ``work`` (cwd), on a free port."""

    def __init__(self, work: Path, source: str, inputs: dict[str, Any]) -> None:
        work.mkdir(parents=True)
        (work / "predict.py").write_text(source)
        (work / ".cog").mkdir()
        (work / ".cog" / "openapi_schema.json").write_text(json.dumps(minimal_schema(inputs)))
        self.port = free_port()
        self.log = work / "cog.log"
        env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "COG_PREDICT_TYPE_STUB": "predict.py:Predictor",
            "COG_MAX_CONCURRENCY": "4",
            "PORT": str(self.port),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cog.server.http", "--host", "127.0.0.1"],
            cwd=work, env=env, stdout=open(self.log, "wb"), stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                health = httpx.get(f"{self.url}/health-check", timeout=2, verify=default_ssl_context())
                if health.json()["status"] == "READY":
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"toy Cog server not ready: {self.log.read_text()[-2000:]}")

    def stream(self, inputs: dict[str, Any], prediction_id: str = "") -> list[tuple[float, str, Any]]:
        """(seconds since the request, event, data) of each SSE event."""
        started = time.monotonic()
        body: dict[str, Any] = {"input": inputs}
        if prediction_id:
            body["id"] = prediction_id
        events, event = [], "message"
        with httpx.stream("POST", f"{self.url}/predictions", json=body,
                          headers={"Accept": "text/event-stream"}, timeout=60) as response:
            assert response.status_code == 200, response.read()
            for line in response.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    events.append((time.monotonic() - started, event, json.loads(line[5:])))
        return events

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def toy(tmp_path: Path):
    servers: list[ToyServer] = []

    def start(source: str, inputs: dict[str, Any]) -> ToyServer:
        server = ToyServer(tmp_path / f"toy{len(servers)}", source, inputs)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


INT_INPUT = {"type": "integer", "default": 4}


def outputs(events: list[tuple[float, str, Any]]) -> list[tuple[float, str]]:
    return [(t, data["chunk"]) for t, event, data in events if event == "output"]


@pytest.mark.integration
def test_fact_an_async_generator_is_collected_before_any_output(toy) -> None:
    """coglet's _collect_async_gen: an async predict that yields streams nothing until it ends."""
    server = toy(ASYNC_GENERATOR, {"n": INT_INPUT})
    out = outputs(server.stream({"n": 4}))
    assert [chunk for _, chunk in out] == ["t0 ", "t1 ", "t2 ", "t3 "]
    assert out[0][0] > 3.5 * STEP_S  # the first chunk comes only after the last one was made


@pytest.mark.integration
def test_fact_a_returned_generator_streams(toy) -> None:
    """process_async_result: a generator returned by an async predict is iterated as it produces."""
    server = toy(RETURNED_GENERATOR, {"n": INT_INPUT})
    out = outputs(server.stream({"n": 4}))
    assert [chunk for _, chunk in out] == ["t0 ", "t1 ", "t2 ", "t3 "]
    # Streamed: the chunks arrive spread over the source's sleeps (each at least STEP_S), not together at
    # the end. A lower bound: a loaded machine only makes it larger.
    assert out[-1][0] - out[0][0] > 2 * STEP_S


def _cancel_after(server: ToyServer, prediction_id: str, delay_s: float) -> threading.Thread:
    def cancel() -> None:
        time.sleep(delay_s)
        httpx.post(f"{server.url}/predictions/{prediction_id}/cancel", timeout=10)

    thread = threading.Thread(target=cancel)
    thread.start()
    return thread


@pytest.mark.integration
def test_fact_cancel_does_not_reach_a_returned_generator(toy) -> None:
    """worker_bridge.rs cancel -> future.cancel() of the finished predict coroutine: a no-op."""
    server = toy(RETURNED_GENERATOR, {"n": INT_INPUT})
    canceller = _cancel_after(server, "plain-cancel", 2 * STEP_S)
    events = server.stream({"n": 8}, prediction_id="plain-cancel")
    canceller.join()
    assert events[-1][1] == "completed" and events[-1][2]["status"] == "canceled"
    assert events[-1][0] > 7 * STEP_S  # it ran to the end before reporting canceled


@pytest.mark.integration
def test_bridge_streams_and_cancel_reaches_the_source(toy) -> None:
    server = toy(BRIDGE, {"n": INT_INPUT, "fail_at": {"type": "integer", "default": -1}})
    out = outputs(server.stream({"n": 4}))
    assert "".join(chunk for _, chunk in out) == "t0 t1 t2 t3 "
    assert out[-1][0] - out[0][0] > 2 * STEP_S  # streamed, not collected (a lower bound: load only adds)

    canceller = _cancel_after(server, "bridge-cancel", 2.5 * STEP_S)
    events = server.stream({"n": 40}, prediction_id="bridge-cancel")
    canceller.join()
    assert events[-1][1] == "completed" and events[-1][2]["status"] == "canceled"
    # Not run to its end (the fact above: coglet alone streams all of it before reporting canceled): of the
    # 40 chunks, those made before the cancel (about 2) came, and not half of them.
    assert len(outputs(events)) < 20, len(outputs(events))
    deadline = time.monotonic() + 60  # only "not hung"
    while "SOURCE CANCELLED" not in server.log.read_text(errors="replace") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "SOURCE CANCELLED" in server.log.read_text(errors="replace")


@pytest.mark.integration
def test_bridge_error_fails_the_prediction_with_its_message(toy) -> None:
    server = toy(BRIDGE, {"n": INT_INPUT, "fail_at": {"type": "integer", "default": -1}})
    events = server.stream({"n": 5, "fail_at": 2})
    assert [chunk for _, chunk in outputs(events)] == ["t0 ", "t1 "]
    final = events[-1][2]
    assert final["status"] == "failed" and "the engine broke at token 2" in final["error"]


# --- the bridge without coglet --------------------------------------------------------------------


async def _source(parts: list[str], gate: asyncio.Event, log: list[str]) -> AsyncIterator[str]:
    try:
        for part in parts:
            await gate.wait()
            yield part
    finally:
        log.append("source closed")


def _run_loop() -> tuple[asyncio.AbstractEventLoop, threading.Thread]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    return loop, thread


@pytest.mark.parametrize("waiting", [1, 5])
def test_waiting_deltas_are_joined_into_one_item(waiting: int) -> None:
    loop, _ = _run_loop()
    log: list[str] = []

    async def start() -> tuple[Iterator[str], asyncio.Event]:
        gate = asyncio.Event()
        return await relay(_source([f"p{i} " for i in range(waiting)], gate, log)), gate

    generator, gate = asyncio.run_coroutine_threadsafe(start(), loop).result()
    loop.call_soon_threadsafe(gate.set)
    # Every part is waiting in the queue before the first read: the source has ended (it logs so after
    # its last part was queued).
    deadline = time.monotonic() + 60  # only "not hung"
    while not log and time.monotonic() < deadline:
        time.sleep(0.01)
    assert log == ["source closed"]
    items = list(generator)
    assert "".join(items) == "".join(f"p{i} " for i in range(waiting))
    assert len(items) == 1
    loop.call_soon_threadsafe(loop.stop)


def test_closing_the_generator_cancels_the_source() -> None:
    loop, _ = _run_loop()
    log: list[str] = []

    async def start() -> tuple[Iterator[str], asyncio.Event]:
        gate = asyncio.Event()
        gate.set()

        async def endless() -> AsyncIterator[str]:
            try:
                while True:
                    await asyncio.sleep(0.01)
                    yield "x"
            finally:
                log.append("source closed")

        return await relay(endless()), gate

    generator, _ = asyncio.run_coroutine_threadsafe(start(), loop).result()
    assert next(generator).startswith("x")
    generator.close()
    deadline = time.monotonic() + 2
    while not log and time.monotonic() < deadline:
        time.sleep(0.01)
    assert log == ["source closed"]
    loop.call_soon_threadsafe(loop.stop)


def test_cancel_hook_leaves_other_futures_alone() -> None:
    import concurrent.futures

    cog_bridge.install_cancel_hook()
    cog_bridge.install_cancel_hook()  # idempotent
    pending: concurrent.futures.Future = concurrent.futures.Future()
    assert pending.cancel() and pending.cancelled()
    done: concurrent.futures.Future = concurrent.futures.Future()
    done.set_result([1, 2])  # not weakly referenceable, not ours
    assert done.cancel() is False and done.result() == [1, 2]
    failed: concurrent.futures.Future = concurrent.futures.Future()
    failed.set_exception(ValueError("x"))
    assert failed.cancel() is False


def test_a_chained_generator_is_cancelled_like_the_stream_it_wraps() -> None:
    """cog_bridge.then (log_performance_metrics wraps the stream with it): coglet's cancel looks up the
    object predict() returned, so the wrapper must lead to the same stream."""
    import concurrent.futures

    cog_bridge.install_cancel_hook()
    cancelled: list[str] = []
    output = cog_bridge.PredictionOutput(lambda: cancelled.append("stream"))
    ended: list[str] = []
    wrapped = cog_bridge.then(cog_bridge.output_generator(output), lambda: ended.append("at_end"))
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(wrapped)  # predict() returned the wrapper
    future.cancel()  # what coglet does on a cancel
    assert cancelled == ["stream"] and output.cancelled.is_set()
    assert list(wrapped) == [] and ended == ["at_end"]


def _ended(make) -> list[tuple[Any, bool]]:
    """Run ``make(output, generator)`` on a fresh stream with an end callback; return what the callback got."""
    calls: list[tuple[Any, bool]] = []
    output = cog_bridge.PredictionOutput()
    generator = cog_bridge.output_generator(output)
    assert cog_bridge.on_end(generator, lambda error, cancelled: calls.append((error, cancelled)))
    make(output, generator)
    return calls


def test_the_end_callback_says_how_the_stream_ended_once() -> None:
    """on_end (the service's metrics count each prediction's outcome with it): called once, in the iterating
    thread, after the last item: an end, a failure (the error raised), a cancel, or the generator closed early."""

    def ends(output: cog_bridge.PredictionOutput, generator: Iterator[str]) -> None:
        output.put("a")
        output.end()
        assert list(generator) == ["a"]

    def fails(output: cog_bridge.PredictionOutput, generator: Iterator[str]) -> None:
        output.put("a")
        output.fail(failure)
        with pytest.raises(RuntimeError):
            list(generator)

    def cancelled(output: cog_bridge.PredictionOutput, generator: Iterator[str]) -> None:
        output.put("a")
        assert next(generator) == "a"
        output.cancel()
        output.fail(RuntimeError("after the cancel"))  # e.g. the supervisor's, a moment later: not what ended it
        assert list(generator) == []

    def closed(output: cog_bridge.PredictionOutput, generator: Iterator[str]) -> None:
        output.put("a")
        assert next(generator) == "a"
        generator.close()

    failure = RuntimeError("Triton died")
    assert _ended(ends) == [(None, False)]
    assert _ended(fails) == [(failure, False)]
    assert _ended(cancelled) == [(None, True)]
    assert _ended(closed) == [(None, True)]
    assert not cog_bridge.on_end(iter(["not ours"]), lambda error, cancelled: None)


def test_the_end_callback_follows_a_chained_generator() -> None:
    calls: list[tuple[Any, bool]] = []
    output = cog_bridge.PredictionOutput()
    wrapped = cog_bridge.then(cog_bridge.output_generator(output), lambda: calls.append(("at_end", False)))
    assert cog_bridge.on_end(wrapped, lambda error, cancelled: calls.append((error, cancelled)))
    output.put("a")
    output.end()
    assert list(wrapped) == ["a"]
    assert calls == [(None, False), ("at_end", False)]


def test_a_failed_stream_raises_its_error_redacted() -> None:
    """The error a stream fails with reaches the caller and coglet's "Prediction failed" log line as its text: it
    leaves the generator without any URL's userinfo, query string or fragment (cog_triton.fetch.redaction)."""
    output = cog_bridge.PredictionOutput()
    generator = cog_bridge.output_generator(output)
    output.put("some text ")
    output.fail(InferenceError("Triton said: adapter https://u:pw-stream@h.example/a.tar.gz?sig=q-stream is gone"))
    assert next(generator) == "some text "
    with pytest.raises(InferenceError) as info:
        next(generator)
    assert info.value.message == "Triton said: adapter https://h.example/a.tar.gz is gone"
    assert "pw-stream" not in str(info.value) and "q-stream" not in str(info.value)
