"""LLMService's streaming path against a real local gRPC server speaking Triton's ModelStreamInfer.

The path is the product's: real stream processes (``python -m cog_triton.streaming.streamer``, the default model's
tokenizer) started by the service's :class:`cog_triton.worker.stream_pool.StreamPool`, reading from
tests/test_client.py's FakeTriton. The Triton *process* is replaced by a small stand-in object (alive, not
stopped, no stubs), the one thing mocked here: the tests are about how the service treats what Triton answers.
"""

from __future__ import annotations

import asyncio
import struct
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import grpc
import pytest

from common.errors import InferenceError, InputError, TritonError
from cog_triton.stream_config import GeneratorConfig
from cog_triton.ipc import PredictInputs
from cog_triton.worker.inputs import validate_inputs
from cog_triton.worker.service import LLMService
from cog_triton.settings import Settings
from cog_triton.worker.stream_pool import StreamPool
from cog_triton.worker.supervisor import Supervisor
from tensorrtllm_backend.engine import ModelLimits, WeightsInfo
from tests.test_client import Running, error, response
from tests.test_stream_pool import triton  # noqa: F401 - FakeTriton for the module (the processes keep their channel)

CHECKPOINT = Path(__file__).resolve().parents[1] / "build" / "default_model" / "checkpoint"


class AliveProcess:
    """Stands in for the TritonServer process handle (mock: only what the service asks of it)."""

    url = "http://127.0.0.1:1"

    def __init__(self) -> None:
        self.polls = 0  # is_alive() calls: the service's "is Triton dying?" look polls it every 0.1 s

    def is_alive(self) -> bool:
        self.polls += 1
        return True

    def is_stopped(self) -> bool:
        return False

    def stub_processes(self) -> list:
        return []

    @staticmethod
    def process_alive(pid: int) -> bool:
        return True

    def exit_description(self) -> str:
        return "is running"

    def log_tail(self, lines: int = 20) -> str:
        return ""

    def stop(self, timeout_s: Optional[float] = None) -> None:
        pass


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(CHECKPOINT), local_files_only=True)


LIMITS = ModelLimits(max_batch_size=8, max_input_len=512, max_seq_len=1024)


@pytest.fixture(scope="module")
def pools(triton: Running) -> Iterator[dict[GeneratorConfig, StreamPool]]:  # noqa: F811
    """The stream pools of this module, one per generator config (a process loads its tokenizer in seconds)."""
    started: dict[GeneratorConfig, StreamPool] = {}
    yield started
    for pool in started.values():
        pool.stop()


@pytest.fixture
def service_for(triton: Running, pools: dict[GeneratorConfig, StreamPool]  # noqa: F811
                ) -> Iterator[Callable[..., LLMService]]:
    """Make a service whose one stream process streams from FakeTriton (``token_timeout_s``: the no-token
    timeout; ``config``: what else the generator gets, e.g. LoRA). Each service is new (its supervisor, its
    Triton stand-in, its metrics); the pool of its config is started once per module and handed to it, as
    setup() does with its own. FakeTriton's scenario is reset after the test."""

    def make(token_timeout_s: float = 120.0, settings: Optional[Settings] = None, **config: Any) -> LLMService:
        service = LLMService(settings or Settings())
        service.info = WeightsInfo(kind="hf_checkpoint", weights_dir=CHECKPOINT, tokenizer_dir=CHECKPOINT,
                                   limits=LIMITS)
        generator = GeneratorConfig(tokenizer_dir=CHECKPOINT, limits=LIMITS, grpc_address=triton.address,
                                    token_timeout_s=token_timeout_s, **config)
        pool = pools.get(generator)
        if pool is None:
            pool = pools[generator] = StreamPool(generator, 1, interval_ms=service.settings.stream.interval_ms,
                                                 start_timeout_s=120)
            pool.launch()
            pool.wait_ready()
        pool.on_transport_error, pool.metrics = service._died_or, service.metrics
        process: Any = AliveProcess()
        service.server = process
        service.supervisor = Supervisor(process, [], startup_timeout_s=5)
        pool.set_watcher(service.supervisor.register, service.supervisor.unregister)
        service.pool = pool
        return service

    yield make
    triton.state.scenario, triton.state.abort, triton.state.end_call_after_scenario = None, None, False


def run(service: LLMService, **inputs: Any) -> tuple[str, Optional[BaseException], float]:
    async def main() -> tuple[str, Optional[BaseException], float]:
        started = time.monotonic()
        text, error = "", None
        try:
            async for part in service.generate(validate_inputs(prompt="Hi", temperature=0, **inputs)):
                text += part
        except Exception as exc:  # noqa: BLE001 - inspected by the test
            error = exc
        return text, error, time.monotonic() - started

    return asyncio.run(main())


def polls_of(service: LLMService) -> int:
    """How often the service asked the process whether Triton is alive."""
    return service.server.polls  # type: ignore[union-attr]


def test_an_error_triton_answers_arrives_at_once(triton: Running, tokenizer: Any,  # noqa: F811
                                                  service_for: Callable[..., LLMService]) -> None:
    """Before: every error waited 2 s for "is Triton dying?", errors Triton answered included. The look
    polls the process every 0.1 s: an answered error polls it no more often than a request that succeeds
    (the baseline, measured here), so nothing waited for a dying Triton."""

    async def answered(request):
        yield response([tokenizer.encode("Hi")[0]], final=True, request_id=request.id)

    triton.state.scenario = answered
    service = service_for()
    text, failure, _ = run(service)
    assert failure is None and text == "Hi"
    baseline = polls_of(service)

    async def refused(request):
        yield error("in ensemble 'ensemble', bad input")

    triton.state.scenario = refused
    service = service_for()
    _, failure, _ = run(service)
    assert isinstance(failure, InferenceError) and "bad input" in failure.message
    assert polls_of(service) == baseline

    async def error_after_a_token(request):
        yield response([tokenizer.encode("Hi")[0]], request_id=request.id)
        yield error("Encountered an error in forward function")

    triton.state.scenario = error_after_a_token
    service = service_for()
    _, failure, _ = run(service)
    assert isinstance(failure, InferenceError) and "forward function" in failure.message
    assert polls_of(service) == baseline


def test_a_broken_connection_waits_briefly_for_a_dying_triton(triton: Running, tokenizer: Any,  # noqa: F811
                                                               service_for: Callable[..., LLMService]) -> None:
    """A transport error may mean Triton is going down: the service looks for 2 s (20 polls, 0.1 s
    apart) before reporting it."""

    async def answered(request):
        yield response([tokenizer.encode("Hi")[0]], final=True, request_id=request.id)

    triton.state.scenario = answered
    service = service_for()
    assert run(service)[1] is None
    baseline = polls_of(service)
    triton.state.abort = grpc.StatusCode.UNAVAILABLE
    service = service_for()
    _, failure, elapsed = run(service)
    assert type(failure) is TritonError and "UNAVAILABLE" in failure.message
    assert polls_of(service) == baseline + 20
    # 20 sleeps of 0.1 s never take less; the upper bound only means "not hung" (a loaded machine).
    assert 2.0 <= elapsed < 120, elapsed


def test_the_end_token_final_is_not_a_token(triton: Running, tokenizer: Any,  # noqa: F811
                                            service_for: Callable[..., LLMService]) -> None:
    ids = tokenizer.encode("Hello there")

    async def scenario(request):
        for token in ids:
            yield response([token], request_id=request.id)
        yield response([], final=True, request_id=request.id)  # [1,1,0]: the request ended on the end token

    triton.state.scenario = scenario
    metrics: dict[str, Any] = {}
    service = service_for()

    async def main() -> str:
        out = "".join([p async for p in service.generate(validate_inputs(prompt="Hi", temperature=0),
                                                             metric=metrics.__setitem__)])
        return out

    assert asyncio.run(main()) == "Hello there"
    assert metrics["output_token_count"] == len(ids)
    # the time to first token under both names (cog_triton/worker/metrics.py)
    assert metrics["time_to_first_token"] == metrics["time_to_first_token_s"] >= 0


def test_log_performance_metrics_prints_replicates_lines_at_the_end(triton: Running, tokenizer: Any,  # noqa: F811
                                                                     service_for: Callable[..., LLMService],
                                                                     capsys: pytest.CaptureFixture) -> None:
    """replicate/cog-triton's log_performance_metrics input: the prediction logs its token count, tokens
    per second, execution time and time to first token when the stream ends (printed from the thread
    iterating the stream, coglet's, so they land in the prediction's logs); not without it."""
    ids = tokenizer.encode("Hello there")

    async def scenario(request):
        for i, token in enumerate(ids):
            yield response([token], final=i == len(ids) - 1, request_id=request.id)

    triton.state.scenario = scenario
    service = service_for()

    async def main(flag: bool) -> str:
        return "".join([p async for p in service.generate(
            validate_inputs(prompt="Hi", temperature=0, log_performance_metrics=flag))])

    assert asyncio.run(main(False)) == "Hello there"
    assert "Tokens processed" not in capsys.readouterr().out
    assert asyncio.run(main(True)) == "Hello there"
    out = capsys.readouterr().out
    assert f"Tokens processed: {len(ids)}\n" in out
    assert "Serverside tokens per second: " in out and "Serverside execution time: " in out
    assert "Serverside time to first token: " in out


def test_lora_weights_go_once_and_again_after_a_cache_miss_and_count_in_the_services_metrics(
    triton: Running, tokenizer: Any, service_for: Callable[..., LLMService], tmp_path: Path  # noqa: F811
) -> None:
    """The adapter is fetched and converted in the stream process, its weights go with the first request only and
    once more after the engine's cache miss, and the process's adapter counts (its STATS events) reach the
    service's own Prometheus metrics."""
    from cog_triton.dev.local import WeightsHTTPServer
    from cog_triton.fetch.rules import FetchRules
    from cog_triton.stream_config import StoreLimits
    from tensorrtllm_backend.engine import inspect_weights
    from tests.lora_adapters import make_adapter, pack

    folder = make_adapter(CHECKPOINT, tmp_path / "made", r=2, alpha=4, targets=["q_proj"], seed=1)
    pack(folder, tmp_path / "served" / "a.tar.gz")
    answers = ["ok", "miss", "ok"]
    seen: list[bool] = []

    async def scenario(request):
        names = [t.name for t in request.inputs]
        seen.append("lora_weights" in names)
        if answers.pop(0) == "miss":
            task = struct.unpack("<Q", request.raw_input_contents[names.index("lora_task_id")])[0]
            yield error(f"in ensemble 'ensemble', Executor failed process requestId 3 due to the following error: "
                        f"LoRA task {task} not found in cache. Please send LoRA weights with request")
            return
        yield response([tokenizer.encode("Hi")[0]], final=True, request_id=request.id)

    triton.state.scenario = scenario
    lora = inspect_weights(CHECKPOINT, reference_lora={"max_lora_rank": 8}).lora
    service = service_for(
        settings=Settings(fetch_allow_private=True, fetch_allow_http=True),  # the adapter is served from 127.0.0.1
        lora=lora, adapter_limits=StoreLimits(root=tmp_path / "cache", retries=0, rules=FetchRules.open()),
    )
    with WeightsHTTPServer(tmp_path / "served") as server:
        url = f"{server.url}/a.tar.gz"
        for _ in range(2):
            text, failure, _ = run(service, lora_weights=url)
            assert failure is None and text == "Hi"
    assert seen == [True, False, True]
    counts = {name: sample(service, name, **labels) for name, labels in (
        ("cog_triton_lora_fetches_total", {}), ("cog_triton_lora_cache_hits_total", {"cache": "memory"}),
        ("cog_triton_lora_engine_cache_misses_total", {}))}
    assert counts == {"cog_triton_lora_fetches_total": 1, "cog_triton_lora_cache_hits_total": 1,
                      "cog_triton_lora_engine_cache_misses_total": 1}


def test_a_stream_silent_for_the_request_timeout_fails_naming_the_setting(triton: Running,  # noqa: F811
                                                                          tokenizer: Any,
                                                                          service_for: Callable[..., LLMService]) -> None:
    """COG_TRITON_REQUEST_TIMEOUT_S: Triton opened the stream, sent one token and then nothing. The
    watchdog fails the prediction after the timeout (not before it: it counts from the last token),
    with the text streamed so far kept and an error naming the setting."""
    sent: dict[str, float] = {}

    async def one_token_then_silence(request):
        if request.model_name == "tensorrt_llm":  # the stop request that follows the failure
            return
        yield response([tokenizer.encode("Hi")[0]], request_id=request.id)
        sent["at"] = time.monotonic()
        await asyncio.sleep(3600)

    triton.state.scenario = one_token_then_silence
    timeout_s = 1.5
    text, failure, elapsed = run(service_for(token_timeout_s=timeout_s))
    failed_at = time.monotonic()
    assert text == "Hi"
    assert isinstance(failure, InferenceError), failure
    assert failure.message == f"no token from Triton for {timeout_s:g} s (COG_TRITON_REQUEST_TIMEOUT_S)"
    assert failed_at - sent["at"] >= timeout_s
    assert elapsed < 120, elapsed  # only "not hung": without the watchdog the stream waits an hour


def test_a_stream_ending_without_its_final_response_fails_and_keeps_what_came(triton: Running,  # noqa: F811
                                                                              tokenizer: Any,
                                                                              service_for: Callable[..., LLMService]) -> None:
    """Triton's stream closed (OK status) after two tokens and no final response: the user gets the
    text so far and an error that says the answer is incomplete, not a shorter answer passed off as
    whole. It is a broken connection, so the service first looks whether Triton is dying (20 polls)."""
    ids = tokenizer.encode("Hello there")
    assert len(ids) >= 2

    async def cut(request):
        for token in ids[:2]:
            yield response([token], request_id=request.id)

    triton.state.scenario = cut
    triton.state.end_call_after_scenario = True
    service = service_for()
    text, failure, _ = run(service)
    assert text == tokenizer.decode(ids[:2])
    assert type(failure) is TritonError, failure
    assert "ended without the final response" in failure.message and triton.address in failure.message
    assert polls_of(service) == 1 + 20  # supervisor.wait_ready's look, then the 2-s look for a dying Triton


def sample(service: LLMService, name: str, **labels: str) -> float:
    """A value of the service's Prometheus metrics (cog_triton.worker.exporter)."""
    return service.metrics.registry.get_sample_value(name, labels) or 0.0


def test_the_service_counts_each_prediction_once(triton: Running, tokenizer: Any,  # noqa: F811
                                                  service_for: Callable[..., LLMService]) -> None:
    """Every prediction through stream() (predict's path) is counted once, when its generator stops: its outcome
    and error code, its time to first token and time per output token, its tokens; a refusal of validate() too;
    the self-test's (track=False) not at all."""
    ids = tokenizer.encode("Hello there, friend")

    async def answered(request):
        for i, token in enumerate(ids):
            yield response([token], final=i == len(ids) - 1, request_id=request.id)

    async def refused(request):
        yield error("in ensemble 'ensemble', bad input")

    service = service_for()
    triton.state.scenario = answered
    seen: dict[str, Any] = {}

    async def main(**extra: Any) -> str:
        inputs = validate_inputs(prompt="Hi", temperature=0, **extra)
        return "".join([p async for p in service.generate(inputs, metric=seen.__setitem__)])

    assert asyncio.run(main()) == "Hello there, friend"
    first = dict(seen)
    assert asyncio.run(main(log_performance_metrics=True)) == "Hello there, friend"  # the sink chain holds
    triton.state.scenario = refused
    with pytest.raises(InferenceError):
        asyncio.run(main())
    with pytest.raises(InputError):
        service.validate(prompt="", temperature=0)
    triton.state.scenario = answered

    async def untracked() -> str:
        inputs = validate_inputs(prompt="Hi", temperature=0)
        return "".join([p async for p in service.generate(inputs, track=False)])

    assert asyncio.run(untracked()) == "Hello there, friend"
    assert sample(service, "cog_triton_predictions_total", outcome="succeeded") == 2
    assert sample(service, "cog_triton_predictions_total", outcome="failed") == 2
    assert sample(service, "cog_triton_prediction_errors_total", code="inference_error") == 1
    assert sample(service, "cog_triton_prediction_errors_total", code="invalid_input") == 1
    assert sample(service, "cog_triton_time_to_first_token_seconds_count") == 2
    assert sample(service, "cog_triton_time_per_output_token_seconds_count") == 2
    assert sample(service, "cog_triton_generation_tokens_total") == 2 * len(ids) == 2 * first["output_token_count"]
    assert sample(service, "cog_triton_prompt_tokens_total") == 3 * first["input_token_count"]  # the failed one too
    assert sample(service, "cog_triton_predictions_running") == 0


def test_setup_starts_the_metrics_endpoint_first_and_shutdown_stops_it(tmp_path: Path) -> None:
    """The endpoint is up from the start of setup() (a port in use fails setup before a long download; an
    operator can scrape a setup that fails), and shutdown() closes it."""
    import httpx

    from common.errors import WeightsError
    from cog_triton.dev.local import free_port

    port = free_port()
    service = LLMService(Settings(prometheus_port=port, prometheus_address="127.0.0.1", metrics_port=free_port(),
                                  weights_dir=tmp_path / "weights", model_repo_dir=tmp_path / "repo"))
    with pytest.raises(WeightsError):
        service.setup(str(tmp_path / "no-such-weights.tar"))
    scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
    assert scraped.status_code == 200
    assert "cog_triton_predictions_running 0.0" in scraped.text
    assert "cog_triton_triton_metrics_up 0.0" in scraped.text  # no Triton yet
    service.shutdown()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30)


def test_setup_serves_the_metrics_on_the_configured_address_with_the_configured_bounds(tmp_path: Path) -> None:
    """COG_TRITON_PROMETHEUS_ADDRESS=127.0.0.2 and the endpoint's bounds set: the kernel's table of listening
    sockets shows the one socket on 127.0.0.2 (not 0.0.0.0, nor 127.0.0.1: unreachable there), and the endpoint
    holds the bounds the settings gave."""
    import httpx

    from common.errors import WeightsError
    from cog_triton.dev.local import free_port
    from tests.proc import listening_on

    port = free_port()
    service = LLMService(Settings(prometheus_port=port, prometheus_address="127.0.0.2", metrics_port=free_port(),
                                  prometheus_max_connections=5, prometheus_backlog=9, prometheus_request_timeout_s=3,
                                  prometheus_reuse_s=0.5, prometheus_triton_timeout_s=0.25,
                                  weights_dir=tmp_path / "weights", model_repo_dir=tmp_path / "repo"))
    try:
        with pytest.raises(WeightsError):
            service.setup(str(tmp_path / "no-such-weights.tar"))
        assert [address for address, _ in listening_on(port)] == ["127.0.0.2"]
        assert httpx.get(f"http://127.0.0.2:{port}/metrics", timeout=30).status_code == 200
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30)
        server = service.metrics_server
        assert server is not None
        assert (server.max_connections, server.backlog, server.request_timeout_s, server.reuse_s,
                server.triton_timeout_s) == (5, 9, 3, 0.5, 0.25)
    finally:
        service.shutdown()


def test_setup_and_validation_raise_their_errors_redacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What setup() and validate() raise reaches the caller and coglet's log as its text: a library's error quoting
    a signed URL (stood in for by a fetch_weights that raises it: the test is about the boundary, not the fetch), and
    an input error quoting a URL with a password, leave without their secrets, keeping their types."""
    from cog_triton.dev.local import free_port
    from cog_triton.worker import service as service_module

    def fetch_weights(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("huggingface_hub: Cannot access content at: https://cdn.example/f?X-Amz-Signature=q-setup.")

    def validate_inputs(**inputs: Any) -> Any:
        raise InputError("lora_weights https://deploy:pw-input@mirror.example/a.tar.gz is not allowed here")

    monkeypatch.setattr(service_module, "fetch_weights", fetch_weights)
    monkeypatch.setattr(service_module, "validate_inputs", validate_inputs)
    service = LLMService(Settings(prometheus_port=free_port(), prometheus_address="127.0.0.1", metrics_port=free_port(),
                                  weights_dir=tmp_path / "weights", model_repo_dir=tmp_path / "repo"))
    try:
        with pytest.raises(ValueError) as setup_error:
            service.setup("https://example.com/w.tar.gz")
        with pytest.raises(InputError) as input_error:
            service.validate(prompt="hi")
    finally:
        service.shutdown()
    assert str(setup_error.value) == "huggingface_hub: Cannot access content at: https://cdn.example/f."
    assert input_error.value.message == "lora_weights https://mirror.example/a.tar.gz is not allowed here"


@pytest.mark.parametrize("trust", [False, True])
def test_setup_fetches_a_hub_checkpoints_code_only_with_the_trust_setting(tmp_path: Path, monkeypatch, trust) -> None:
    """setup() hands COG_TRITON_LLM_TRUST_REMOTE_CODE to the hf:// fetch and to the checkpoint check, before
    Triton starts: off, the checkpoint naming code is refused naming the setting; on, the repository's top-level
    *.py files are fetched (configuration_x.py arrives, so the check reaches the module the repository lacks). A
    GPU is reported by a stand-in nvidia-smi (tests/gpu_fakes.py), so the PyTorch backend's check runs."""
    import os

    from common.errors import IncompatibleWeightsError
    from cog_triton.dev.local import free_port
    from tests.gpu_fakes import fake_nvidia_smi, gpus
    from tests.hub_server import FakeHub, tiny_checkpoint

    monkeypatch.setenv("PATH", os.pathsep.join([str(fake_nvidia_smi(tmp_path / "gpu", gpus(1))), os.environ["PATH"]]))
    files = tiny_checkpoint(auto_map={"AutoConfig": "configuration_x.XConfig", "AutoModel": "missing_y.Y"})
    with FakeHub() as hub:
        hub.use(monkeypatch)
        hub.add_repo("me/custom", {**files, "configuration_x.py": b"# the repository's code\n"})
        service = LLMService(Settings(prometheus_port=free_port(), prometheus_address="127.0.0.1",
                                      metrics_port=free_port(), weights_dir=tmp_path / "weights",
                                      model_repo_dir=tmp_path / "repo", llm_trust_remote_code=trust))
        try:
            with pytest.raises(IncompatibleWeightsError) as refused:
                service.setup("hf://me/custom")
        finally:
            service.shutdown()
    fetched_code = sorted(path for _, _, path in hub.gets if path.endswith(".py"))
    if trust:
        assert fetched_code == ["configuration_x.py"]
        assert "config.json auto_map AutoModel: missing_y.Y needs missing_y.py beside it" in refused.value.message
    else:
        assert fetched_code == []
        assert "COG_TRITON_LLM_TRUST_REMOTE_CODE=true" in refused.value.message
