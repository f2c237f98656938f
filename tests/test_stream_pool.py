"""The stream processes (cog_triton.worker.stream_pool, cog_triton.streaming.streamer) against a real gRPC server that
speaks Triton's ModelStreamInfer.

The processes are real (``python -m cog_triton.streaming.streamer``, the default model's tokenizer); the
server is tests/test_client.py's FakeTriton, so every answer of Triton can be produced on purpose.
The tests run the worker's side (StreamPool.open and the generator coglet would iterate) on their
own event loop; the Cog server itself is exercised by the integration and fault tests.
"""

from __future__ import annotations

import asyncio
import os
import signal
import struct
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import grpc
import pytest
from tritonclient.grpc import service_pb2_grpc

from common.errors import ConfigError, InferenceError, InputError, StreamProcessError, TritonDiedError, TritonError
from cog_triton.worker.exporter import ServiceMetrics
from cog_triton.stream_config import GeneratorConfig
from cog_triton.ipc import PredictInputs
from cog_triton.worker.inputs import validate_inputs
from cog_triton.worker.stream_pool import RoutedPrediction, StreamPool
from tensorrtllm_backend.engine import ModelLimits
from tests.test_client import FakeTriton, Running, State, error, response

CHECKPOINT = Path(__file__).resolve().parents[1] / "build" / "default_model" / "checkpoint"
LIMITS = ModelLimits(max_batch_size=8, max_input_len=64, max_seq_len=1024)
INTERVAL_MS = 100


@pytest.fixture(scope="module")
def triton() -> Iterator[Running]:
    """FakeTriton on a free port, for the whole module (the stream processes keep their channel)."""
    state = State()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def serve() -> None:
        server = grpc.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(FakeTriton(state), server)
        holder["port"] = server.add_insecure_port("127.0.0.1:0")
        holder["shutdown"] = asyncio.Event()
        await server.start()
        ready.set()
        await holder["shutdown"].wait()
        await server.stop(None)

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    assert ready.wait(10)
    yield Running(address=f"127.0.0.1:{holder['port']}", state=state)
    loop.call_soon_threadsafe(holder["shutdown"].set)
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(CHECKPOINT), local_files_only=True)


class Watcher:
    """Stands in for the supervisor: records the streams the pool registers."""

    def __init__(self) -> None:
        self.running: list[RoutedPrediction] = []
        self.lock = threading.Lock()

    def register(self, stream: RoutedPrediction) -> None:
        with self.lock:
            self.running.append(stream)

    def unregister(self, stream: RoutedPrediction) -> None:
        with self.lock:
            if stream in self.running:
                self.running.remove(stream)


@pytest.fixture(scope="module")
def pool(triton: Running) -> Iterator[tuple[StreamPool, Watcher, list[BaseException]]]:
    config = GeneratorConfig(tokenizer_dir=CHECKPOINT, limits=LIMITS, grpc_address=triton.address,
                             token_timeout_s=2.0)
    transport_errors: list[BaseException] = []

    async def on_transport_error(exc: TritonError) -> BaseException:
        transport_errors.append(exc)
        return TritonDiedError(f"decided by the service: {exc.message}")

    watcher = Watcher()
    pool = StreamPool(config, 2, interval_ms=INTERVAL_MS, start_timeout_s=120, on_transport_error=on_transport_error,
                      register=watcher.register, unregister=watcher.unregister, metrics=ServiceMetrics())
    pool.launch()
    pool.wait_ready()
    yield pool, watcher, transport_errors
    pool.stop()


def is_stop(request: Any) -> bool:
    return any(tensor.name == "stop" for tensor in request.inputs)


def paced(token_ids: list[int], step_s: float = 0.0, final: bool = True, then_hang: bool = False):
    """A scenario: ``token_ids`` one per response, ``step_s`` apart; a stop request gets its empty final."""

    async def scenario(request):
        if is_stop(request):
            yield response([], final=True, request_id=request.id)
            return
        for i, token in enumerate(token_ids):
            if step_s:
                await asyncio.sleep(step_s)
            yield response([token], final=final and i == len(token_ids) - 1, request_id=request.id)
        if then_hang:
            await asyncio.sleep(3600)

    return scenario


def inputs(prompt: str = "Hi", **extra: Any) -> PredictInputs:
    return validate_inputs(prompt=prompt, temperature=0, seed=1, **extra)


def stream(pool: StreamPool, what: PredictInputs, request_id: str, *, until: Optional[int] = None,
           close_after: Optional[int] = None, opened: Optional[threading.Event] = None,
           ) -> tuple[list[str], Optional[BaseException], dict[str, Any], float]:
    """Open a stream and read it like coglet's slot thread; return (chunks, error, metrics, seconds to
    the first chunk). ``close_after``: close the generator after that many chunks (a cancel); ``opened`` is
    set once the stream process accepted the stream (open returned). An error open raises (its process
    died, a fault before acceptance) is returned as the error: predict's run() raises it the same way.
    An input error open raises is raised (tests check it with pytest.raises)."""
    metrics: dict[str, Any] = {}

    async def run() -> tuple[list[str], Optional[BaseException], float]:
        started = time.monotonic()
        chunks: list[str] = []
        first = float("nan")
        try:
            generator = await pool.open(what, request_id, started, metrics.__setitem__)
        except (StreamProcessError, TritonError) as exc:  # run() raises it, as in predict
            return chunks, exc, first
        if opened is not None:
            opened.set()

        def read() -> Optional[BaseException]:
            nonlocal first
            try:
                for chunk in generator:
                    if not chunks:
                        first = time.monotonic() - started
                    chunks.append(chunk)
                    if close_after is not None and len(chunks) >= close_after:
                        generator.close()
                        return None
            except Exception as exc:  # noqa: BLE001 - the test inspects it
                return exc
            return None

        # In a daemon thread (not asyncio.to_thread's executor, which the interpreter joins at exit): a stream
        # that never ends fails the test that waits for it, and pytest still exits.
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Optional[BaseException]] = loop.create_future()
        threading.Thread(target=lambda: loop.call_soon_threadsafe(done.set_result, read()), daemon=True).start()
        failure = await done
        return chunks, failure, first

    chunks, failure, first = asyncio.run(run())
    return chunks, failure, metrics, first


def wait_for(predicate, timeout_s: float = 10.0) -> bool:
    """Poll ``predicate`` until true; generous deadline: it only means "not hung"."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_text_and_metrics_come_back_from_a_stream_process(pool, triton: Running, tokenizer: Any) -> None:
    p, watcher, _ = pool
    ids = tokenizer.encode("Hello there, how are you today?", add_special_tokens=False)
    triton.state.scenario = paced(ids)
    chunks, failure, metrics, _ = stream(p, inputs(), "pool-text")
    assert failure is None
    assert "".join(chunks) == tokenizer.decode(ids, skip_special_tokens=True)
    prompt_ids = [struct.unpack_from("<i", r.raw_input_contents[0], 4 * i)[0]
                  for r in triton.state.requests if r.id == "pool-text"
                  for i in range(len(r.raw_input_contents[0]) // 4)]
    assert metrics["input_token_count"] == len(prompt_ids) > 0
    assert metrics["output_token_count"] == len(ids)
    assert 0 <= metrics["time_to_first_token_s"] < 60
    # Replicate's name and ours, one value (cog_triton/worker/metrics.py says why both)
    assert metrics["time_to_first_token"] == metrics["time_to_first_token_s"]
    assert wait_for(lambda: not watcher.running)  # unregistered once ended
    assert p.running_predictions == 0


def test_the_stream_interval_joins_text_and_sends_the_first_at_once(pool, triton: Running, tokenizer: Any) -> None:
    """20 tokens 20 ms apart (400 ms) with a 100 ms interval: the first chunk leaves with the first token,
    then at most one chunk per interval, and nothing is lost."""
    ids = tokenizer.encode(" one two three four five six seven eight nine ten eleven twelve", add_special_tokens=False)
    ids = (ids * 3)[:20]
    step = 0.02
    triton.state.scenario = paced(ids, step_s=step)
    chunks, failure, _, first = stream(pool[0], inputs(), "pool-interval")
    assert failure is None
    assert "".join(chunks) == tokenizer.decode(ids, skip_special_tokens=True)
    assert first < 10 * step  # the first token's text was not held for the interval
    # 400 ms of tokens at one chunk per 100 ms, plus the first and the last: far fewer chunks than tokens
    assert 2 <= len(chunks) <= 7, chunks


def test_an_input_error_is_raised_by_open_before_any_output(pool, triton: Running) -> None:
    requests_before = len(triton.state.requests)
    with pytest.raises(InputError) as caught:
        stream(pool[0], inputs("word " * 200), "pool-too-long")
    assert "maximum input length is 64 tokens" in caught.value.message
    assert len(triton.state.requests) == requests_before  # nothing reached Triton
    assert pool[0].running_predictions == 0


def sample(p: StreamPool, name: str, **labels: str) -> float:
    """A value of the pool's Prometheus metrics (cog_triton.worker.exporter)."""
    assert p.metrics is not None
    return p.metrics.registry.get_sample_value(name, labels) or 0.0


def test_closing_the_generator_stops_the_request_in_triton(pool, triton: Running, tokenizer: Any) -> None:
    """... and the stream process reports the tokens it had made (CANCELLED): they count as generated."""
    ids = tokenizer.encode(" a b c d e f g h i j k l m n o p", add_special_tokens=False) * 20
    triton.state.scenario = paced(ids, step_s=0.02)
    generated = sample(pool[0], "cog_triton_generation_tokens_total")
    chunks, failure, metrics, _ = stream(pool[0], inputs(), "pool-cancel", close_after=1)
    assert failure is None and len(chunks) == 1
    assert wait_for(lambda: any(r.id == "pool-cancel" and is_stop(r) for r in triton.state.requests))
    assert wait_for(lambda: pool[0].running_predictions == 0)
    assert "output_token_count" not in metrics  # the prediction's own metric is not recorded after a cancel
    assert wait_for(lambda: sample(pool[0], "cog_triton_generation_tokens_total") > generated)
    made = sample(pool[0], "cog_triton_generation_tokens_total") - generated
    assert len(tokenizer.encode(chunks[0], add_special_tokens=False)) <= made < len(ids)


def test_a_supervisor_fault_fails_the_stream_without_a_stop_request(pool, triton: Running, tokenizer: Any) -> None:
    """A fault once the stream runs (open returned): the iteration fails with the supervisor's error."""
    p, watcher, _ = pool
    ids = tokenizer.encode(" x", add_special_tokens=False) * 500
    triton.state.scenario = paced(ids, step_s=0.02)
    result: dict[str, Any] = {}
    opened = threading.Event()
    reader = threading.Thread(target=lambda: result.update(out=stream(p, inputs(), "pool-fault", opened=opened)),
                              daemon=True)
    reader.start()
    assert opened.wait(60), "the stream process did not accept the stream"
    watcher.running[0].fail(TritonDiedError("Triton exited with signal 9; the prediction was stopped"))
    reader.join(timeout=30)
    assert not reader.is_alive(), "the stream did not end after the fault"
    chunks, failure, _, _ = result["out"]
    assert isinstance(failure, TritonDiedError) and "signal 9" in failure.message
    time.sleep(0.5)  # a stop request would have been sent by now
    assert not any(r.id == "pool-fault" and is_stop(r) for r in triton.state.requests)
    assert wait_for(lambda: p.running_predictions == 0)


def test_a_supervisor_fault_before_acceptance_fails_open_with_its_error_and_starts_nothing(
    pool, triton: Running, tokenizer: Any
) -> None:
    """A fault that reaches the stream before its process accepted it (here: as it is registered, before its
    START is sent): open raises the supervisor's error, as predict's run() then does; no stop request is sent;
    and the process does not go on streaming it (its CANCEL, sent before START, is sent again after it)."""
    p, watcher, _ = pool
    hello = tokenizer.encode(" Hi", add_special_tokens=False)
    closed: set[str] = set()

    async def scenario(request):
        if is_stop(request):
            yield response([], final=True, request_id=request.id)
            return
        if request.id == "pool-after":
            yield response(hello, final=True, request_id=request.id)
            return
        try:  # one token, then a stream that only ends when the client goes away
            yield response(hello, request_id=request.id)
            await asyncio.sleep(3600)
        finally:
            closed.add(request.id)

    triton.state.scenario = scenario
    error = TritonDiedError("Triton exited with signal 9; the prediction was stopped")
    def fail_on_register(s: RoutedPrediction) -> None:
        watcher.register(s)
        s.fail(error)

    p.set_watcher(fail_on_register, watcher.unregister)
    try:
        chunks, failure, _, _ = stream(p, inputs(), "pool-early")
    finally:
        p.set_watcher(watcher.register, watcher.unregister)
    assert failure is error and chunks == []
    assert wait_for(lambda: p.running_predictions == 0) and not watcher.running
    # The next stream goes to the same process (the first of those with fewest streams) and ends: its process
    # handled the early stream's START and CANCEL before it.
    chunks, failure, _, _ = stream(p, inputs(), "pool-after")
    assert failure is None and "".join(chunks) == " Hi"
    seen = [r.id for r in triton.state.requests]
    assert "pool-early" not in seen or wait_for(lambda: "pool-early" in closed), "the failed stream went on in Triton"
    # An orphaned stream would end only by the no-token timeout (2 s here), which sends the stop request.
    assert not any(r.id == "pool-early" and is_stop(r) for r in triton.state.requests), "the failed stream went on"


def test_a_silent_stream_fails_with_the_no_token_timeout(pool, triton: Running, tokenizer: Any) -> None:
    """token_timeout_s is 2 s in this pool: one token, then nothing."""
    triton.state.scenario = paced(tokenizer.encode(" Hi", add_special_tokens=False), final=False, then_hang=True)
    chunks, failure, metrics, _ = stream(pool[0], inputs(), "pool-silent")
    assert isinstance(failure, InferenceError) and "no token from Triton for 2 s" in failure.message
    assert metrics["output_token_count"] == 1
    assert wait_for(lambda: any(r.id == "pool-silent" and is_stop(r) for r in triton.state.requests))


def test_an_error_triton_answers_fails_the_stream_with_its_text(pool, triton: Running, tokenizer: Any) -> None:
    async def scenario(request):
        if is_stop(request):
            yield response([], final=True, request_id=request.id)
            return
        yield response(tokenizer.encode(" Hi", add_special_tokens=False), request_id=request.id)
        yield error("Encountered an error in forward function")

    triton.state.scenario = scenario
    chunks, failure, _, _ = stream(pool[0], inputs(), "pool-error")
    assert isinstance(failure, InferenceError) and "forward function" in failure.message
    assert "".join(chunks) == " Hi"  # what came before the error still reached the user


def test_a_broken_connection_is_decided_by_the_service(pool, triton: Running) -> None:
    """A bare TritonError (transport) goes to on_transport_error, which may name Triton's death."""
    transport_errors = pool[2]
    transport_errors.clear()
    triton.state.abort = grpc.StatusCode.UNAVAILABLE
    try:
        _, failure, _, _ = stream(pool[0], inputs(), "pool-transport")
    finally:
        triton.state.abort = None
    assert len(transport_errors) == 1 and "UNAVAILABLE" in str(transport_errors[0])
    assert isinstance(failure, TritonDiedError) and "decided by the service" in failure.message


class Restart:
    """Stands in for the supervisor's wait_ready: returns once :meth:`done` is called (Triton serves again), or raises
    TritonError when told Triton could not be restarted; counts its callers."""

    def __init__(self, then=None) -> None:
        self.event = threading.Event()
        self.waiters = 0
        self.error: Optional[TritonError] = None
        self.then = then

    async def wait_ready(self) -> None:
        self.waiters += 1
        await asyncio.get_running_loop().run_in_executor(None, self.event.wait, 60)
        if self.then is not None:
            self.then()
        if self.error is not None:
            raise self.error

    def done(self, error: Optional[TritonError] = None) -> None:
        self.error = error
        self.event.set()


def _in_background(p: StreamPool, request_id: str) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: result.update(out=stream(p, inputs(), request_id)), daemon=True)
    thread.start()
    return thread, result


def _attempts(triton: Running, request_id: str) -> int:
    return sum(1 for r in triton.state.requests if r.id == request_id and not is_stop(r))


@pytest.mark.parametrize("restarted", [True, False])
def test_a_prediction_that_meets_a_dying_triton_before_any_token_is_sent_again_after_the_restart(
        pool, triton: Running, tokenizer: Any, restarted: bool) -> None:
    """Triton has the request but has generated nothing when the supervisor finds it dead: the prediction waits for
    the restart (the supervisor's wait_ready) and is sent once more, under its request id, into the same generator:
    the user gets the whole text once. Triton not back within its deadline: it fails with Triton's death."""
    p, watcher, _ = pool
    ids = tokenizer.encode(" Sent again, whole.", add_special_tokens=False)
    request_id = f"pool-resend-{restarted}"

    async def scenario(request):
        if is_stop(request):
            yield response([], final=True, request_id=request.id)
            return
        if _attempts(triton, request.id) == 1:
            await asyncio.sleep(3600)  # Triton has it and dies before a token
        for i, token in enumerate(ids):
            yield response([token], final=i == len(ids) - 1, request_id=request.id)

    triton.state.scenario = scenario
    restart = Restart()
    resent = sample(p, "cog_triton_resent_predictions_total")
    p.set_watcher(watcher.register, watcher.unregister, restart.wait_ready)
    try:
        thread, result = _in_background(p, request_id)
        assert wait_for(lambda: _attempts(triton, request_id) == 1 and watcher.running, 60)
        watcher.running[0].fail(TritonDiedError("Triton exited with signal 9; the prediction was stopped"))
        assert wait_for(lambda: restart.waiters == 1)
        assert thread.is_alive(), "it waits for the restart"
        restart.done(None if restarted else TritonError("Triton is not serving after waiting 600 s for it"))
        thread.join(60)
    finally:
        p.set_watcher(watcher.register, watcher.unregister)
    chunks, failure, metrics, _ = result["out"]
    if restarted:
        assert failure is None and "".join(chunks) == tokenizer.decode(ids, skip_special_tokens=True)
        assert _attempts(triton, request_id) == 2 and metrics["output_token_count"] == len(ids)
        assert sample(p, "cog_triton_resent_predictions_total") == resent + 1
    else:
        assert isinstance(failure, TritonDiedError) and chunks == [] and _attempts(triton, request_id) == 1
        assert "signal 9" in failure.message and "not serving after waiting 600 s" in failure.message
    assert wait_for(lambda: p.running_predictions == 0 and not watcher.running)


def test_a_prediction_that_had_tokens_still_fails_and_one_is_sent_again_only_once(pool, triton: Running,
                                                                                  tokenizer: Any) -> None:
    """A token reached the prediction before Triton died: it fails with Triton's death (its text so far delivered),
    it is not sent again. A prediction sent again that meets a dying Triton once more (before a token) fails."""
    p, watcher, _ = pool
    hi = tokenizer.encode(" Hi", add_special_tokens=False)

    async def scenario(request):
        if is_stop(request):
            yield response([], final=True, request_id=request.id)
            return
        if request.id == "pool-had-tokens":
            yield response(hi, request_id=request.id)
        await asyncio.sleep(3600)

    triton.state.scenario = scenario
    restart = Restart()
    restart.done()
    p.set_watcher(watcher.register, watcher.unregister, restart.wait_ready)
    try:
        thread, result = _in_background(p, "pool-had-tokens")
        assert wait_for(lambda: any(s.tokens_seen for s in watcher.running), 60)
        watcher.running[0].fail(TritonDiedError("Triton exited with signal 9; the prediction was stopped"))
        thread.join(60)
        chunks, failure, _, _ = result["out"]
        assert isinstance(failure, TritonDiedError) and "".join(chunks) == " Hi"
        assert _attempts(triton, "pool-had-tokens") == 1 and restart.waiters == 0
        thread, result = _in_background(p, "pool-twice")
        for attempt in (1, 2):
            assert wait_for(lambda: _attempts(triton, "pool-twice") == attempt and watcher.running, 60)
            watcher.running[0].fail(TritonDiedError(f"Triton died ({attempt}); the prediction was stopped"))
        thread.join(60)
        chunks, failure, _, _ = result["out"]
        assert isinstance(failure, TritonDiedError) and "Triton died (2)" in failure.message and chunks == []
        assert restart.waiters == 1
    finally:
        p.set_watcher(watcher.register, watcher.unregister)
    assert wait_for(lambda: p.running_predictions == 0 and not watcher.running)


def test_a_broken_connection_before_any_token_that_is_triton_dying_is_sent_again(pool, triton: Running,
                                                                                 tokenizer: Any) -> None:
    """The transport path: the stream breaks (UNAVAILABLE) before a token, the service decides Triton is dying
    (TritonDiedError): the prediction waits for the restart and is sent once more."""
    p, watcher, transport_errors = pool
    ids = tokenizer.encode(" After the break.", add_special_tokens=False)
    triton.state.scenario = paced(ids)
    transport_errors.clear()
    restart = Restart(then=lambda: setattr(triton.state, "abort", None))
    restart.done()
    triton.state.abort = grpc.StatusCode.UNAVAILABLE
    p.set_watcher(watcher.register, watcher.unregister, restart.wait_ready)
    try:
        chunks, failure, _, _ = stream(p, inputs(), "pool-transport-resend")
    finally:
        triton.state.abort = None
        p.set_watcher(watcher.register, watcher.unregister)
    assert len(transport_errors) == 1 and restart.waiters == 1
    assert failure is None and "".join(chunks) == tokenizer.decode(ids, skip_special_tokens=True)
    assert _attempts(triton, "pool-transport-resend") == 2


def test_a_killed_stream_process_fails_only_its_streams_and_is_restarted(pool, triton: Running,
                                                                        tokenizer: Any) -> None:
    p, watcher, _ = pool
    restarts = sample(p, "cog_triton_stream_process_restarts_total")
    ids = tokenizer.encode(" tick", add_special_tokens=False) * 100
    triton.state.scenario = paced(ids, step_s=0.02)  # 2 s per stream
    results: dict[str, Any] = {}
    readers = {n: threading.Thread(target=lambda n=n: results.update({n: stream(p, inputs(), n)}), daemon=True)
               for n in ("pool-kill-a", "pool-kill-b")}
    for reader in readers.values():
        reader.start()
    assert wait_for(lambda: len(watcher.running) == 2)
    victim = watcher.running[0]
    survivor = next(n for n in readers if n != victim.request_id)
    pid = victim.process.pid
    assert {s.process.pid for s in watcher.running} == {q.pid for q in p.processes}  # one each (least loaded)
    os.kill(pid, signal.SIGKILL)
    readers[survivor].join(timeout=60)  # its own 2 s: only "not hung"
    assert not readers[survivor].is_alive(), "the stream of the surviving process did not end"
    # The killed process's stream ends at once, so before the survivor's 2 s of tokens.
    assert not readers[victim.request_id].is_alive(), "the stream of the killed process did not fail"
    lost = results[victim.request_id]
    kept = results[survivor]
    assert isinstance(lost[1], StreamProcessError) and f"(pid {pid}) was killed by signal 9" in lost[1].message
    assert kept[1] is None and "".join(kept[0]) == tokenizer.decode(ids)
    # the backup stop request for the lost generation went out through the other process
    assert wait_for(lambda: any(r.id == victim.request_id and is_stop(r) for r in triton.state.requests))
    assert wait_for(lambda: all(q.alive for q in p.processes), timeout_s=120)
    assert p.processes[victim.process.index].pid != pid and p.processes[victim.process.index].restarts == 1
    assert sample(p, "cog_triton_stream_process_restarts_total") == restarts + 1
    triton.state.scenario = paced(tokenizer.encode(" back", add_special_tokens=False))
    for n in range(2):  # both processes serve again
        chunks, failure, _, _ = stream(p, inputs(), f"pool-after-kill-{n}")
        assert failure is None and "".join(chunks) == " back"


def test_while_no_stream_process_runs_a_prediction_is_queued(pool, triton: Running, tokenizer: Any) -> None:
    """Both processes killed: a new prediction waits for one to be restarted, counted as queued meanwhile
    (cog_triton_predictions_queued), then streams."""
    p, _, _ = pool
    metrics = p.metrics
    assert metrics is not None
    triton.state.scenario = paced(tokenizer.encode(" back", add_special_tokens=False))
    for process in p.processes:
        os.kill(process.pid, signal.SIGKILL)
    assert wait_for(lambda: not any(q.alive for q in p.processes))
    tracker = metrics.track(None, time.monotonic())
    result: dict[str, Any] = {}

    async def run() -> str:
        generator = await p.open(inputs(), "pool-queued", time.monotonic(), tracker, tracker.queued)
        return "".join(await asyncio.to_thread(list, generator))

    reader = threading.Thread(target=lambda: result.update(text=asyncio.run(run())))
    reader.start()
    assert wait_for(lambda: sample(p, "cog_triton_predictions_queued") == 1)
    assert sample(p, "cog_triton_predictions_running") == 0
    reader.join(timeout=120)
    assert result["text"] == " back"
    assert sample(p, "cog_triton_predictions_queued") == 0 and sample(p, "cog_triton_predictions_running") == 1
    tracker.finish()


def test_a_stream_process_that_cannot_start_fails_start_with_its_error(tmp_path: Path, triton: Running) -> None:
    config = GeneratorConfig(tokenizer_dir=tmp_path / "no-tokenizer", limits=LIMITS, grpc_address=triton.address)
    pool = StreamPool(config, 1, interval_ms=50, start_timeout_s=120)
    with pytest.raises(ConfigError) as caught:
        pool.launch()
        pool.wait_ready()
    assert "stream process stream-0 could not start" in caught.value.message
    assert "no-tokenizer" in caught.value.message
    assert pool.processes[0].popen is not None and pool.processes[0].popen.poll() is not None


def test_the_timing_metric_has_every_step_of_the_start_in_order(pool, triton: Running, tokenizer: Any) -> None:
    """COG_TRITON_TIMING_METRICS: one ``timing`` metric per prediction, recorded once its first text was yielded,
    with when each step of its start happened (seconds since it began), in the order they happen, and when it
    began (time.monotonic()); without the setting (the module's pool) there is none."""
    from cog_triton.worker.timing import TIMING_METRIC, TIMING_STEPS

    config = GeneratorConfig(tokenizer_dir=CHECKPOINT, limits=LIMITS, grpc_address=triton.address, token_timeout_s=5)
    timed = StreamPool(config, 1, interval_ms=INTERVAL_MS, start_timeout_s=120, timing=True)
    timed.launch()
    timed.wait_ready()
    process = timed.processes[0]
    send = process.send

    def send_then_pause(message: Any) -> bool:  # as when the worker's thread loses the CPU right after sending
        sent = send(message)
        time.sleep(0.1)
        return sent

    process.send = send_then_pause  # type: ignore[method-assign]
    try:
        triton.state.scenario = paced(tokenizer.encode(" one two three", add_special_tokens=False), step_s=0.01)
        before = time.monotonic()
        chunks, failure, metrics, _ = stream(timed, inputs(), "pool-timing")
    finally:
        timed.stop()
    assert failure is None and chunks
    timing = metrics[TIMING_METRIC]
    assert set(timing) == set(TIMING_STEPS)
    assert before <= timing["run_at_monotonic"] <= time.monotonic()
    steps = [timing[k] for k in TIMING_STEPS[1:4]] + [metrics["time_to_first_token_s"]] + [
        timing[k] for k in TIMING_STEPS[4:]]
    assert all(0 <= a <= b for a, b in zip(steps, steps[1:])), steps
    triton.state.scenario = paced(tokenizer.encode(" again", add_special_tokens=False))
    _, failure, untimed, _ = stream(pool[0], inputs(), "pool-untimed")
    assert failure is None and TIMING_METRIC not in untimed
