"""The CPU reference ``tensorrt_llm`` model's LoRA, through a real Triton (the rendered model repository, the
ensemble over gRPC as the predictor sends it), against TensorRT-LLM's contract (see the reference's lora.py
for the upstream sources of each fact) and against transformers + peft token for token.

Adapters: random PEFT adapters of the bundled SmolLM2-135M made with peft (tests/lora_adapters.py),
converted by the predictor's converter (cog_triton.streaming.lora.convert). The model is configured as an engine
built with max_lora_rank 8 and every module but mlp_gate, and a LoRA cache of 5,000,000 bytes: adapters
A1 (921,600 bytes) and A2 (3,870,720 bytes) fit together, A3 (506,880 bytes) does not fit beside them.
"""

from __future__ import annotations

import asyncio
import re
import struct
from pathlib import Path

import pytest

from common.errors import InferenceError
from cog_triton.streaming.client import GenerateRequest, LoraTensors, TritonClient
from cog_triton.streaming.lora.convert import convert
from cog_triton.streaming.lora.tasks import task_id_of
from cog_triton.settings import REPO_ROOT
from tensorrtllm_backend.engine import inspect_weights
from tests.lora_adapters import AdapterFactory, adapter_config
from tests.proc import stop_at_once

pytestmark = pytest.mark.integration

MODULES = ["attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_4h_to_h"]
BUDGET = 5_000_000
N = 8
EOS = 2
PROMPT = "What is machine learning?"
TEMPLATE = REPO_ROOT / "triton_model_repo" / "tensorrt_llm_reference"
ADAPTERS = {
    "a1": dict(r=4, alpha=8, targets=["q_proj", "v_proj"], seed=11),
    "a2": dict(r=8, alpha=32, targets=["k_proj", "o_proj", "down_proj"], seed=12),
    "a3": dict(r=2, alpha=12, targets=["gate_proj"], seed=13),
}
TASK_IDS = {"a1": 1001, "a2": 1002, "a3": 1003}


@pytest.fixture(scope="module")
def lora_env(tmp_path_factory, checkpoint_dir: Path, hf_tokenizer):
    """Triton serving the rendered repository (reference model with LoRA) + adapters + expected outputs."""
    from cog_triton.streaming.prompt import PromptTokenizer
    from tensorrtllm_backend.server import LaunchConfig, TritonServer, locate_tritonserver
    from tensorrtllm_backend.templates import RenderOptions, render_model_repository
    from tests.test_reference_model import _free_ports

    tmp = tmp_path_factory.mktemp("lora_reference")
    info = inspect_weights(checkpoint_dir, reference_max_batch_size=4, reference_max_seq_len=512,
                           reference_lora={"max_lora_rank": 8, "lora_target_modules": MODULES})
    assert info.lora.enabled, info.lora.off_reason
    render_model_repository(RenderOptions(template_dir=REPO_ROOT / "triton_model_repo",
                                          model_repo_dir=tmp / "repo", guided_decoding=False,
                                          lora_cache_host_memory_bytes=BUDGET), info)
    prompt = PromptTokenizer(hf_tokenizer).encode(PROMPT).ids
    factory = AdapterFactory(checkpoint_dir)
    adapters, converted, expected = {}, {}, {None: factory.greedy(None, prompt, N, EOS)}
    for name, spec in ADAPTERS.items():
        adapters[name] = factory.make(tmp / name, **spec)
        weights = adapters[name] / "adapter_model.safetensors"
        converted[name] = convert(adapter_config(adapters[name]), weights, info.lora, name).tensors
        expected[name] = factory.greedy(adapters[name], prompt, N, EOS)
    del factory
    assert len({tuple(v) for v in expected.values()}) == len(expected), "each adapter must change the output"
    http, grpc, metrics = _free_ports(3)
    server = TritonServer(locate_tritonserver(work_dir=tmp / "work"),
                          LaunchConfig(model_repo=tmp / "repo", http_port=http, grpc_port=grpc, metrics_port=metrics),
                          log_file=tmp / "triton.log", stop_timeout_s=5)
    server.start()
    try:
        server.wait_ready(180)
        yield {"grpc": f"127.0.0.1:{grpc}", "prompt": prompt, "tensors": converted, "expected": expected,
               "log": tmp / "triton.log", "spec": info.lora}
    finally:
        stop_at_once(server)


def _request(env, adapter=None, *, weights=True, n=N, task=None, lora=None, request_id="", min_tokens=0):
    tensors = lora if lora is not None else (env["tensors"][adapter] if adapter else None)
    return GenerateRequest(
        input_ids=env["prompt"], max_tokens=n, min_tokens=min_tokens, top_k=1, request_id=request_id,
        lora_task_id=task if task is not None else (TASK_IDS[adapter] if adapter else None),
        lora=tensors if weights else None,
    )


async def _tokens(client: TritonClient, request: GenerateRequest) -> list[int]:
    return [t async for chunk in client.generate_stream(request) for t in chunk.output_ids]


def run(coro):
    return asyncio.run(coro)


async def _generate(env, request: GenerateRequest) -> list[int]:
    client = TritonClient(env["grpc"])
    try:
        return await _tokens(client, request)
    finally:
        await client.aclose()


def _error(env, request: GenerateRequest) -> str:
    with pytest.raises(InferenceError) as info:
        run(_generate(env, request))
    return info.value.message


def test_greedy_output_with_each_adapter_equals_transformers_and_peft(lora_env):
    assert run(_generate(lora_env, _request(lora_env))) == lora_env["expected"][None]
    for name in ("a1", "a2"):
        assert run(_generate(lora_env, _request(lora_env, name))) == lora_env["expected"][name], name
        # cached: the task id alone serves it
        assert run(_generate(lora_env, _request(lora_env, name, weights=False))) == lora_env["expected"][name], name


def test_adapters_and_the_base_model_in_one_batch(lora_env):
    """Four requests at once (the model batches 4): two adapters, one twice, and none; each gets its own output."""
    order = [None, "a1", "a2", "a1"]
    spans: dict[int, tuple[float, float]] = {}

    async def one(index: int, name):
        loop = asyncio.get_running_loop()
        start = loop.time()
        tokens = await _generate(lora_env, _request(lora_env, name, n=N))
        spans[index] = (start, loop.time())
        return tokens

    async def all_of():
        return await asyncio.gather(*(one(i, name) for i, name in enumerate(order)))

    results = run(all_of())
    for name, tokens in zip(order, results):
        assert tokens == lora_env["expected"][name], name
    assert max(s for s, _ in spans.values()) < min(e for _, e in spans.values()), "they were not served together"


def test_an_unknown_task_without_weights_is_upstreams_cache_miss(lora_env):
    message = _error(lora_env, _request(lora_env, "a3", weights=False, task=987654321))
    assert re.fullmatch(
        r"Triton reported: in ensemble 'ensemble_ids', Executor failed process requestId \d+ due to the following error: "
        r"LoRA task 987654321 "
        r"not found in cache\. Please send LoRA weights with request", message), message


def test_lora_tensors_without_a_task_id_are_ignored(lora_env):
    """utils.cc getLoraConfigFromTensors reads lora_weights and lora_config only with lora_task_id."""
    raw = _request(lora_env, "a1").to_grpc("ensemble_ids")
    names = [t.name for t in raw.inputs]
    index = names.index("lora_task_id")
    del raw.inputs[index]
    del raw.raw_input_contents[index]

    async def send():
        client = TritonClient(lora_env["grpc"])
        try:
            ids = []
            async for response in client._stream(raw):
                from cog_triton.streaming.client import parse_response

                chunk, final = parse_response(response)
                ids += chunk.output_ids
                if final:
                    return ids
        finally:
            await client.aclose()

    assert run(send()) == lora_env["expected"][None]


def _one_row(config: list[int], width: int) -> LoraTensors:
    return LoraTensors("FP32", 1, width, bytes(4 * width), struct.pack("<3i", *config))


@pytest.mark.parametrize("config,width,text", [
    ([1, 0, 16], 16 * 1152, "Invalid low_rank (16). low_rank must be smaller than mMaxLowRank (8)"),
    ([7, 0, 4], 4 * 2112, "lora module mlp_gate not enabled for this model"),
    ([1, 30, 4], 4 * 1152, "Expected layerId to be in the range [0, numModelLayers)"),
    ([5, 0, 4], 100, "lora_weights has to few values for mlp_h_to_4h"),
    ([1, 0, 0], 4 * 1152, "Expected adapterSize to be > 0"),
])
def test_the_executors_checks_have_upstreams_text(lora_env, config, width, text):
    message = _error(lora_env, _request(lora_env, task=5555, lora=_one_row(config, width)))
    assert re.fullmatch(
        r"Triton reported: in ensemble 'ensemble_ids', Executor failed process requestId \d+ due to the following error: "
        r"Encountered an error "
        r"when fetching new request: \[TensorRT-LLM\]\[ERROR\] Assertion failed: " + re.escape(text) + r" \(.*\)",
        message), message


@pytest.mark.parametrize("drop,text", [
    ("lora_config", "Request for LoRA inference with lora weights must also have lora config"),
    ("lora_weights", "Request for LoRA inference must have both lora_weights and lora_keys"),
])
def test_weights_and_config_go_together(lora_env, drop, text):
    raw = _request(lora_env, "a1", task=4444).to_grpc("ensemble_ids")
    names = [t.name for t in raw.inputs]
    index = names.index(drop)
    del raw.inputs[index]
    del raw.raw_input_contents[index]

    async def send():
        client = TritonClient(lora_env["grpc"])
        try:
            async for _ in client._stream(raw):
                pass
        finally:
            await client.aclose()

    with pytest.raises(InferenceError) as info:
        run(send())
    assert text in info.value.message


def test_the_cache_evicts_the_least_recently_used_task_and_a_resend_restores_it(lora_env):
    expected = lora_env["expected"]
    for name in ("a1", "a2"):  # both cached (a2 most recently)
        assert run(_generate(lora_env, _request(lora_env, name, n=1))) == expected[name][:1]
    assert run(_generate(lora_env, _request(lora_env, "a3"))) == expected["a3"]  # evicts a1, the LRU one
    assert "not found in cache" in _error(lora_env, _request(lora_env, "a1", weights=False))
    assert run(_generate(lora_env, _request(lora_env, "a2", weights=False, n=1))) == expected["a2"][:1]  # kept
    assert run(_generate(lora_env, _request(lora_env, "a1"))) == expected["a1"]  # the resend


def test_a_full_cache_is_upstreams_error_and_frees_up_when_requests_end(lora_env):
    """a1 and a2 in use by running requests fill the cache: a3 cannot be stored ("PEFT Cache is full");
    once they end, it can."""
    expected = lora_env["expected"]

    async def scenario():
        client = TritonClient(lora_env["grpc"])
        long = []
        try:
            for name in ("a1", "a2"):
                request = _request(lora_env, name, n=400, min_tokens=400, request_id=f"long-{name}")
                stream = client.generate_stream(request)
                await stream.__anext__()  # admitted and generating
                long.append((stream, request))
            with pytest.raises(InferenceError) as info:
                await _tokens(client, _request(lora_env, "a3", task=TASK_IDS["a3"] + 100))
            for stream, request in long:
                await client.send_stop_request(request.request_id)
                async for _ in stream:
                    pass
            after = await _tokens(client, _request(lora_env, "a3", task=TASK_IDS["a3"] + 100))
            return info.value.message, after
        finally:
            await client.aclose()

    message, after = run(scenario())
    assert re.fullmatch(r"Triton reported: in ensemble 'ensemble_ids', Executor failed process requestId \d+ due to the "
                        r"following error: PEFT "
                        rf"Cache is full\. Could not store taskId={TASK_IDS['a3'] + 100}", message), message
    assert after == expected["a3"]


def test_the_converter_rows_sent_for_a1(lora_env):
    """The rows the model above unpacked for a1: [module id, layer, rank] (lora_manager.py's layout), one per
    layer and module, the width of the widest row; and task ids are 60-bit (positive UINT64)."""
    tensors = lora_env["tensors"]["a1"]
    config = struct.unpack(f"<{3 * tensors.rows}i", tensors.config)
    rows = [config[i:i + 3] for i in range(0, len(config), 3)]
    assert rows[:2] == [(1, 0, 4), (3, 0, 4)] and len(rows) == 60  # q_proj, v_proj of each of 30 layers
    assert tensors.width == 4 * (576 + 576)  # the widest row: attn_q, [4, 576] + [576, 4]
    assert len(tensors.weights) == 60 * tensors.width * 4
    assert task_id_of("f" * 64) == 0xFFFFFFFFFFFFFFF


def test_the_reference_models_module_ids_and_sizes_are_tensorrt_llms():
    """The reference model's own copies (it is loaded by Triton without the repository on its path) of the
    module ids (lora_manager.py), Hugging Face names (lora_helper.py) and module sizes (loraModule.cpp) equal
    tensorrtllm_backend.lora's."""
    import json

    from tensorrtllm_backend.lora import LORA_MODULE_IDS, SUPPORTED_MODULES, TRTLLM_TO_HF, ModelShape
    from tests.modules import load_file

    module = load_file("tensorrt_llm_reference_lora_check", TEMPLATE / "1" / "lora.py")
    assert module.ALL_MODULE_NAMES == {v: k for k, v in LORA_MODULE_IDS.items()}
    assert module.HF_NAMES == TRTLLM_TO_HF
    shape = ModelShape(num_layers=3, hidden_size=40, mlp_hidden_size=96, num_heads=5, num_kv_heads=1, head_size=6)
    model = module.LoraModel.from_parameters(json.dumps(list(SUPPORTED_MODULES)), "8", json.dumps(shape.to_json()))
    assert model.dims == {m: shape.module_dims(m) for m in SUPPORTED_MODULES}
