"""LoRA in the predictor's request path: real stream processes (cog_triton.streaming.streamer) against FakeTriton
(tests/test_client.py), with an adapter of the bundled model made with peft and served over HTTP.

What Triton answers is produced on purpose, as TensorRT-LLM's executor words it
(batch_manager/peftCacheManager.cpp addRequestPeft, behind the backend's "Executor failed process
requestId N due to the following error: " and the ensemble's "in ensemble 'ensemble', "): the cache miss
(the request is sent again, once, with the weights), and the full cache (a retryable lora_cache_full error).
"""

from __future__ import annotations

import asyncio
import http.server
import struct
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

from common.errors import InferenceError, LoraAdapterError, LoraCacheFullError
from cog_triton.worker.exporter import ServiceMetrics
from cog_triton.stream_config import GeneratorConfig
from cog_triton.dev.local import WeightsHTTPServer
from cog_triton.fetch.rules import FetchRules
from cog_triton.stream_config import StoreLimits
from cog_triton.worker.stream_pool import StreamPool
from tensorrtllm_backend.engine import ModelLimits, inspect_weights
from tensorrtllm_backend.lora import engine_lora_spec
from tests.lora_adapters import make_adapter, pack
from tests.test_client import Running, error, response
from tests.test_stream_pool import tokenizer  # noqa: F401 - the default model's tokenizer
from tests.test_stream_pool import inputs, is_stop, paced, stream, triton  # noqa: F401 - the module's FakeTriton

CHECKPOINT = Path(__file__).resolve().parents[1] / "build" / "default_model" / "checkpoint"
LIMITS = ModelLimits(max_batch_size=8, max_input_len=2048, max_seq_len=4096)
TOKENS = [504, 1205, 2106]


def _names(request) -> dict[str, Any]:
    return {t.name: t for t in request.inputs}


def _task_id(request) -> int:
    index = [t.name for t in request.inputs].index("lora_task_id")
    return struct.unpack("<Q", request.raw_input_contents[index])[0]


def miss_text(task: int) -> str:
    return (f"in ensemble 'ensemble', Executor failed process requestId 7 due to the following error: LoRA task "
            f"{task} not found in cache. Please send LoRA weights with request")


@pytest.fixture(scope="module")
def adapter_url(tmp_path_factory) -> Iterator[str]:
    work = tmp_path_factory.mktemp("lora_gen")
    folder = make_adapter(CHECKPOINT, work / "made", r=4, alpha=8, targets=["q_proj", "v_proj"], seed=5)
    pack(folder, work / "served" / "a.tar.gz")
    with WeightsHTTPServer(work / "served") as server:
        server.work = work  # type: ignore[attr-defined]
        yield f"{server.url}/a.tar.gz", server


def _pool(triton: Running, work: Path, lora, metrics: Optional[ServiceMetrics] = None) -> StreamPool:  # noqa: F811
    config = GeneratorConfig(tokenizer_dir=CHECKPOINT, limits=LIMITS, grpc_address=triton.address,
                             token_timeout_s=5.0, lora=lora, adapter_limits=StoreLimits(root=work, retries=0, rules=FetchRules.open()))  # 127.0.0.1
    pool = StreamPool(config, 1, interval_ms=0, start_timeout_s=120, metrics=metrics)
    pool.launch()
    pool.wait_ready()
    return pool


@pytest.fixture(scope="module")
def lora_pool(triton: Running, tmp_path_factory) -> Iterator[StreamPool]:  # noqa: F811
    info = inspect_weights(CHECKPOINT, reference_lora={"max_lora_rank": 8})
    pool = _pool(triton, tmp_path_factory.mktemp("adapter_cache"), info.lora)
    yield pool
    pool.stop()


def scripted(answers: list[str]):
    """A scenario: a request without weights gets the next scripted answer ("miss", "full") or tokens."""

    async def scenario(request):
        if is_stop(request):
            yield response([], final=True, request_id=request.id)
            return
        names = _names(request)
        answer = answers.pop(0) if answers and "lora_weights" not in names else "ok"
        if answer == "miss":
            yield error(miss_text(_task_id(request)))
        elif answer == "full":
            yield error("in ensemble 'ensemble', Executor failed process requestId 9 due to the following error: "
                        f"PEFT Cache is full. Could not store taskId={_task_id(request)}")
        else:
            for i, token in enumerate(TOKENS):
                yield response([token], final=i == len(TOKENS) - 1, request_id=request.id)

    return scenario


def test_weights_go_with_the_first_request_only_and_with_upstreams_names(lora_pool, triton, adapter_url):  # noqa: F811
    url, server = adapter_url
    triton.state.scenario = scripted([])
    before = len(triton.state.requests)
    for request_id in ("lora-1", "lora-2"):
        chunks, failure, _, _ = stream(lora_pool, inputs(lora_weights=url), request_id)
        assert failure is None and chunks
    first, second = triton.state.requests[before:before + 2]
    names = _names(first)
    assert names["lora_task_id"].datatype == "UINT64" and list(names["lora_task_id"].shape) == [1, 1]
    assert names["lora_weights"].datatype == "FP32"  # the reference model's dtype
    rows, width = list(names["lora_weights"].shape)[1:]
    assert list(names["lora_weights"].shape) == [1, 60, 4 * (576 + 576)] and rows == 60
    assert names["lora_config"].datatype == "INT32" and list(names["lora_config"].shape) == [1, 60, 3]
    index = [t.name for t in first.inputs].index("lora_weights")
    assert len(first.raw_input_contents[index]) == rows * width * 4
    assert "lora_weights" not in _names(second) and "lora_config" not in _names(second)
    assert _task_id(second) == _task_id(first)
    assert server.counter["/a.tar.gz"] == 1


def test_a_cache_miss_is_answered_by_sending_the_weights_again_once(lora_pool, triton, adapter_url):  # noqa: F811
    url, _ = adapter_url
    triton.state.scenario = scripted([])
    stream(lora_pool, inputs(lora_weights=url), "lora-warm")  # the process now believes Triton holds the task
    triton.state.scenario = scripted(["miss"])
    before = len(triton.state.requests)
    chunks, failure, _, _ = stream(lora_pool, inputs(lora_weights=url), "lora-miss")
    assert failure is None and chunks
    sent = [r for r in triton.state.requests[before:] if not is_stop(r)]
    assert ["lora_weights" in _names(r) for r in sent] == [False, True]
    assert sent[0].id == sent[1].id == "lora-miss"


def test_only_one_resend(lora_pool, triton, adapter_url):  # noqa: F811
    """Should the weights not stay in the cache either, the second miss is the prediction's error."""
    url, _ = adapter_url
    triton.state.scenario = scripted([])
    stream(lora_pool, inputs(lora_weights=url), "lora-warm2")

    async def always_miss(request):
        if is_stop(request):
            yield response([], final=True, request_id=request.id)
            return
        yield error(miss_text(_task_id(request)))

    triton.state.scenario = always_miss
    before = len(triton.state.requests)
    _, failure, _, _ = stream(lora_pool, inputs(lora_weights=url), "lora-miss2")
    assert isinstance(failure, InferenceError) and "not found in cache" in failure.message
    assert len([r for r in triton.state.requests[before:] if not is_stop(r)]) == 2


def test_the_adapter_cache_counts_reach_the_worker(triton, adapter_url, tmp_path):  # noqa: F811
    """The stream process reports its LoRA counts (a STATS event after each request with an adapter) to the
    worker's metrics: a download, then a hit in the process's memory, an engine cache miss (the request sent
    again with the weights), and a new process (after a restart) finding the adapter on disk."""
    url, server = adapter_url
    lora = inspect_weights(CHECKPOINT, reference_lora={"max_lora_rank": 8}).lora
    metrics = ServiceMetrics()
    downloads = server.counter["/a.tar.gz"]

    def count(name: str, **labels: str) -> float:
        return metrics.registry.get_sample_value(name, labels) or 0.0

    first = _pool(triton, tmp_path, lora, metrics)
    try:
        for request_id, answers in (("count-1", []), ("count-2", []), ("count-3", ["miss"])):
            triton.state.scenario = scripted(answers)
            chunks, failure, _, _ = stream(first, inputs(lora_weights=url), request_id)
            assert failure is None and chunks
    finally:
        first.stop()
    assert server.counter["/a.tar.gz"] == downloads + 1
    assert count("cog_triton_lora_fetches_total") == 1
    assert count("cog_triton_lora_cache_hits_total", cache="memory") == 2
    assert count("cog_triton_lora_cache_hits_total", cache="disk") == 0
    assert count("cog_triton_lora_engine_cache_misses_total") == 1
    second = _pool(triton, tmp_path, lora, metrics)  # a new process: the same disk cache
    try:
        triton.state.scenario = scripted([])
        assert stream(second, inputs(lora_weights=url), "count-4")[1] is None
    finally:
        second.stop()
    assert server.counter["/a.tar.gz"] == downloads + 1
    assert count("cog_triton_lora_cache_hits_total", cache="disk") == 1
    assert count("cog_triton_lora_fetches_total") == 1


def test_a_full_cache_is_a_retryable_error(lora_pool, triton, adapter_url):  # noqa: F811
    url, _ = adapter_url
    triton.state.scenario = scripted([])
    stream(lora_pool, inputs(lora_weights=url), "lora-warm3")
    triton.state.scenario = scripted(["full"])
    _, failure, _, _ = stream(lora_pool, inputs(lora_weights=url), "lora-full")
    assert isinstance(failure, LoraCacheFullError) and failure.code == "lora_cache_full"
    assert "Retry in a moment" in failure.message and "PEFT Cache is full" in failure.message


def test_an_engine_without_the_lora_plugin_refuses_before_anything_is_fetched(  # noqa: F811
        triton, adapter_url, tmp_path):
    """Its executor would ignore the adapter (NoOpPeftCacheManager) and answer with the base model."""
    url, server = adapter_url
    config = {"pretrained_config": {"dtype": "bfloat16", "architecture": "LlamaForCausalLM"},
              "build_config": {"plugin_config": {"lora_plugin": None}, "lora_config": {}}}
    pool = _pool(triton, tmp_path / "cache", engine_lora_spec(config))
    try:
        downloads = server.counter["/a.tar.gz"]
        before = len(triton.state.requests)
        with pytest.raises(LoraAdapterError) as info:  # an input error: raised by predict(), before any output
            stream(pool, inputs(lora_weights=url), "lora-off")
    finally:
        pool.stop()
    assert "built without the LoRA plugin" in info.value.message and "lora_plugin null" in info.value.message
    assert len(triton.state.requests) == before and server.counter["/a.tar.gz"] == downloads


class SlowFiles(http.server.SimpleHTTPRequestHandler):
    """Serves a folder, each answer after ``delay_s`` seconds (a slow adapter host)."""

    delay_s = 3.0

    def do_GET(self) -> None:  # noqa: N802
        time.sleep(self.delay_s)
        super().do_GET()

    def log_message(self, *args) -> None:
        pass


def test_a_slow_adapter_download_does_not_hold_up_other_streams(  # noqa: F811
        lora_pool, triton, adapter_url, tokenizer):
    """Adapters are fetched on the stream process's adapter threads, neither on its event loop nor in its prompt
    thread: while one downloads for 3 s, a base prediction of the same process with a long prompt (prepared in
    the prompt thread) starts at once and receives its tokens (one every 50 ms) without a pause."""
    _, server = adapter_url
    folder = server.work / "served"  # type: ignore[attr-defined]
    handler = type("Slow", (SlowFiles,), {})
    slow = http.server.ThreadingHTTPServer(("127.0.0.1", 0), lambda *a, **k: handler(*a, directory=str(folder), **k))
    threading.Thread(target=slow.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    ids = tokenizer.encode(" one two three four five six seven eight nine ten" * 4, add_special_tokens=False)[:40]
    triton.state.scenario = paced(ids, step_s=0.05)
    arrivals: list[float] = []
    results: dict[str, Any] = {}
    long_prompt = "word " * 1000  # over INLINE_PREPARE_CHARS: prepared in the prompt thread

    def base() -> None:
        async def run():
            started = time.monotonic()
            generator = await lora_pool.open(inputs(long_prompt), "slow-base", started, None)

            def read():
                for _ in generator:
                    arrivals.append(time.monotonic())
            await asyncio.to_thread(read)
            return started
        results["base_started"] = asyncio.run(run())

    def with_adapter() -> None:
        # a URL no earlier test used: not in any cache, so it is downloaded (slowly)
        url = f"http://127.0.0.1:{slow.server_address[1]}/a.tar.gz?slow"
        results["lora"] = stream(lora_pool, inputs(lora_weights=url), "slow-lora")
    try:
        second = threading.Thread(target=with_adapter)
        second.start()
        time.sleep(0.5)  # the adapter's download has begun
        first = threading.Thread(target=base)
        first.start()
        first.join(60)
        second.join(60)
    finally:
        slow.shutdown()
        slow.server_close()
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert len(arrivals) > 10, arrivals
    first = arrivals[0] - results["base_started"]
    assert first < 1.5 and max(gaps) < 1.5, (first, gaps)
    assert results["lora"][1] is None  # and the adapter's request itself succeeded


def test_a_generator_without_lora_support_refuses_adapters(tokenizer):  # noqa: F811
    from cog_triton.streaming.generation import build_generator
    from cog_triton.fetch.adapter_refs import parse_adapter_ref

    generator = build_generator(GeneratorConfig(tokenizer_dir=CHECKPOINT, limits=LIMITS, grpc_address="127.0.0.1:1"),
                                tokenizer=tokenizer)
    with pytest.raises(LoraAdapterError) as info:
        generator.prepare(inputs(lora_weights="https://example.com/a.tar.gz"), "no-lora")
    assert "cannot serve LoRA adapters: no LoRA support was configured" in info.value.message


# --- the PyTorch backend: adapters go as folders ----------------------------------------------------


def _lora_path(request) -> str:
    raw = request.raw_input_contents[[t.name for t in request.inputs].index("lora_path")]
    (size,) = struct.unpack_from("<i", raw)
    return raw[4:4 + size].decode()


@pytest.fixture(scope="module")
def pytorch_adapters(tmp_path_factory) -> Iterator[tuple[dict[str, str], Any]]:
    """Adapter A served under two URLs, a different adapter C under a third."""
    work = tmp_path_factory.mktemp("lora_pytorch")
    a = make_adapter(CHECKPOINT, work / "a", r=4, alpha=8, targets=["q_proj"], seed=21)
    c = make_adapter(CHECKPOINT, work / "c", r=4, alpha=8, targets=["q_proj"], seed=22)
    pack(a, work / "served" / "a.tar.gz")
    pack(a, work / "served" / "a-again.tar.gz", folder="inside")
    pack(c, work / "served" / "c.tar.gz")
    with WeightsHTTPServer(work / "served") as server:
        yield {name: f"{server.url}/{name}.tar.gz" for name in ("a", "a-again", "c")}, server


@pytest.fixture(scope="module")
def pytorch_pool(triton: Running, tmp_path_factory) -> Iterator[StreamPool]:  # noqa: F811
    info = inspect_weights(CHECKPOINT, reference_lora={"max_lora_rank": 8})
    config = GeneratorConfig(tokenizer_dir=CHECKPOINT, limits=LIMITS, grpc_address=triton.address, token_timeout_s=5.0,
                             lora=info.lora, adapter_limits=StoreLimits(root=tmp_path_factory.mktemp("pt_cache"),
                                                                        retries=0, rules=FetchRules.open()),
                             backend="pytorch")
    pool = StreamPool(config, 1, interval_ms=0, start_timeout_s=120)
    pool.launch()
    pool.wait_ready()
    yield pool
    pool.stop()


def test_the_pytorch_backend_gets_the_folder_and_a_stable_id_with_every_request(  # noqa: F811
        pytorch_pool, triton, pytorch_adapters):
    urls, server = pytorch_adapters
    triton.state.scenario = scripted([])
    before = len(triton.state.requests)
    for request_id, name in (("pt-1", "a"), ("pt-2", "a"), ("pt-3", "a-again"), ("pt-4", "c")):
        chunks, failure, _, _ = stream(pytorch_pool, inputs(lora_weights=urls[name]), request_id)
        assert failure is None and chunks, failure
    sent = [r for r in triton.state.requests[before:] if not is_stop(r)]
    assert all("lora_weights" not in _names(r) and "lora_config" not in _names(r) for r in sent)
    ids = [_task_id(r) for r in sent]
    assert ids[0] == ids[1] == ids[2] != ids[3]  # one id per adapter, whatever its URL; another adapter another
    paths = [Path(_lora_path(r)) for r in sent]
    assert paths[0] == paths[1] and all(sorted(p.name for p in path.iterdir() if not p.name.startswith("."))
                                        == ["adapter_config.json", "adapter_model.safetensors"] for path in paths)
    assert paths[2] == paths[0]  # the same content: the folder it was first fetched to
    assert server.counter["/a.tar.gz"] == 1


def test_a_folder_evicted_from_the_disk_cache_is_fetched_again(pytorch_pool, triton, pytorch_adapters):  # noqa: F811
    import shutil

    urls, server = pytorch_adapters
    triton.state.scenario = scripted([])
    stream(pytorch_pool, inputs(lora_weights=urls["c"]), "pt-evict-1")
    before = len(triton.state.requests)
    first = [r for r in triton.state.requests if not is_stop(r) and "lora_path" in _names(r)][-1]
    folder = Path(_lora_path(first))
    shutil.rmtree(folder)  # as another process's eviction does (the store renames, then removes)
    downloads = server.counter["/c.tar.gz"]
    chunks, failure, _, _ = stream(pytorch_pool, inputs(lora_weights=urls["c"]), "pt-evict-2")
    assert failure is None and chunks
    (again,) = [r for r in triton.state.requests[before:] if not is_stop(r)]
    assert Path(_lora_path(again)).is_dir() and server.counter["/c.tar.gz"] == downloads + 1


def test_the_pytorch_backend_never_resends_tensors(pytorch_pool, triton, pytorch_adapters):  # noqa: F811
    """A cache-miss answer (which the PyTorch model gives only for an id without a folder) fails the prediction:
    there are no tensors to send."""
    urls, _ = pytorch_adapters
    triton.state.scenario = scripted(["miss"])
    before = len(triton.state.requests)
    _, failure, _, _ = stream(pytorch_pool, inputs(lora_weights=urls["a"]), "pt-miss")
    assert isinstance(failure, InferenceError) and "not found in cache" in failure.message
    assert len([r for r in triton.state.requests[before:] if not is_stop(r)]) == 1


def test_pytorch_adapter_ids_are_content_hashes_in_every_process(pytorch_adapters, tmp_path):
    """Two processes (two Adapters, two disk caches) give adapter A the same id from two URLs, adapter C another;
    nothing is converted (the LLM API loads the folder)."""
    from cog_triton.fetch.adapter_refs import parse_adapter_ref
    from cog_triton.streaming.lora.tasks import Adapters

    urls, _ = pytorch_adapters
    spec = inspect_weights(CHECKPOINT, reference_lora={"max_lora_rank": 8}).lora

    def resolve(root: str, name: str):
        adapters = Adapters(spec, StoreLimits(root=tmp_path / root, retries=0, rules=FetchRules.open()), backend="pytorch")
        return adapters.resolve(parse_adapter_ref(urls[name]))

    one, two, other = resolve("p1", "a"), resolve("p2", "a-again"), resolve("p3", "c")
    assert one.task_id == two.task_id != other.task_id
    assert one.tensors is None and one.converted is None and (one.path / "adapter_config.json").is_file()
    assert two.path.name == "inside" and two.path != one.path
