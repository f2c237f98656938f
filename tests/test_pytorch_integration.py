"""The PyTorch-backend ``tensorrt_llm`` rendered by the product's renderer and served by a real Triton, under the
predictor's own request path: the ensemble over gRPC, built by :class:`cog_triton.streaming.generation.Generator` with
``GeneratorConfig.backend="pytorch"`` (prompt rendering, the adapter fetched through the disk cache and sent as
its folder and content-hash id, detokenizing). TensorRT-LLM runs as its LLM API stand-in (the one mock,
benchmarks/llmapi_standin), found by Triton's stub through the overlay virtualenv (tests/llmapi_overlay.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from common.errors import TritonStartupError
from cog_triton.fetch.rules import FetchRules
from cog_triton.streaming.generation import RequestState, build_generator
from cog_triton.stream_config import GeneratorConfig
from cog_triton.ipc import PredictInputs
from cog_triton.worker.inputs import validate_inputs
from cog_triton.dev.local import WeightsHTTPServer
from cog_triton.stream_config import StoreLimits
from tensorrtllm_backend.engine import inspect_weights
from tensorrtllm_backend.server import LaunchConfig, TritonServer, locate_tritonserver
from tests.llmapi_overlay import overlay_venv, render_pytorch_repository, standin_installation
from tests.lora_adapters import AdapterFactory, pack
from tests.proc import stop_at_once
from tests.test_conformance import _free_ports

pytestmark = pytest.mark.integration

EOS = 2
PROMPT = "What is machine learning?"


def _triton(tmp: Path, repo: Path) -> TritonServer:
    http, grpc, metrics = _free_ports(3)
    installation = standin_installation(locate_tritonserver(work_dir=tmp / "work"), overlay_venv(tmp / "overlay"))
    return TritonServer(installation, LaunchConfig(model_repo=repo, http_port=http, grpc_port=grpc,
                                                   metrics_port=metrics), log_file=tmp / "triton.log",
                        stop_timeout_s=5)


@pytest.fixture(scope="module")
def served(tmp_path_factory, checkpoint_dir):
    """Triton serving the rendered repository (LLM arguments with LoRA on), an adapter over HTTP, and
    transformers (+ peft)'s greedy tokens for the prompt."""
    tmp = tmp_path_factory.mktemp("pytorch_integration")
    render_pytorch_repository(tmp / "repo", checkpoint_dir, llm_args={
        "model": str(checkpoint_dir), "max_batch_size": 4, "lora_config": {"max_lora_rank": 8}})
    factory = AdapterFactory(checkpoint_dir)
    adapter = factory.make(tmp / "adapter", r=4, alpha=8, targets=["q_proj", "v_proj"], seed=41)
    pack(adapter, tmp / "served" / "adapter.tar.gz")
    server = _triton(tmp, tmp / "repo")
    server.start()
    try:
        server.wait_ready(180)
        with WeightsHTTPServer(tmp / "served") as files:
            yield {"server": server, "tmp": tmp, "url": f"{files.url}/adapter.tar.gz", "factory": factory,
                   "adapter": adapter}
    finally:
        stop_at_once(server)


def _text(served, checkpoint_dir, hf_tokenizer, **inputs) -> tuple[str, list]:
    """The predictor's generation of ``inputs``: its text, and the gRPC requests' ids (lora_task_id)."""
    info = inspect_weights(checkpoint_dir, reference_lora={"max_lora_rank": 8})
    config = GeneratorConfig(tokenizer_dir=checkpoint_dir, limits=info.limits, grpc_address=served["server"].grpc_address,
                             lora=info.lora, adapter_limits=StoreLimits(root=served["tmp"] / "adapters", retries=0,
                                                                         rules=FetchRules.open()),  # 127.0.0.1
                             backend="pytorch")
    generator = build_generator(config, tokenizer=hf_tokenizer)
    values = validate_inputs(prompt=PROMPT, temperature=0, seed=0, **inputs)

    async def run() -> tuple[str, object]:
        prepared = generator.prepare(values, "pt-integration")
        try:
            text = "".join([part async for part in generator.text_deltas(values, prepared, RequestState())])
        finally:
            await generator.client.aclose()
        return text, prepared

    return asyncio.run(run())


def _expected(served, hf_tokenizer, adapter, n) -> str:
    from cog_triton.streaming.prompt import PromptTokenizer

    ids = PromptTokenizer(hf_tokenizer).encode(PROMPT).ids
    tokens = served["factory"].greedy(adapter, ids, n, EOS)
    return hf_tokenizer.decode(tokens, skip_special_tokens=True)


def test_the_predictor_streams_transformers_greedy_text(served, checkpoint_dir, hf_tokenizer):
    text, prepared = _text(served, checkpoint_dir, hf_tokenizer, max_tokens=12)
    assert text == _expected(served, hf_tokenizer, None, 12) and text
    assert prepared.request.lora_path is None


def test_an_adapter_goes_as_its_folder_and_gives_peft_s_text(served, checkpoint_dir, hf_tokenizer):
    """lora_weights through the predictor: fetched into the disk cache, sent as lora_path + its content-hash id
    through the ensemble (its lora_path input, rendered for this model), generated with the adapter."""
    text, prepared = _text(served, checkpoint_dir, hf_tokenizer, max_tokens=8, lora_weights=served["url"])
    request = prepared.request
    assert request.lora is None and Path(request.lora_path).is_dir() and request.lora_task_id > 0
    expected = _expected(served, hf_tokenizer, served["adapter"], 8)
    assert text == expected and expected != _expected(served, hf_tokenizer, None, 8)


def test_a_failing_llm_fails_the_model_load_with_its_text(tmp_path, checkpoint_dir):
    """LLM(...) raises (here an argument TorchLlmArgs does not have): the model fails to load, Triton does not
    become ready, and its log carries the LLM's error."""
    render_pytorch_repository(tmp_path / "repo", checkpoint_dir,
                              llm_args={"model": str(checkpoint_dir), "max_queue_size": 4})
    server = _triton(tmp_path, tmp_path / "repo")
    server.start()
    try:
        with pytest.raises(TritonStartupError) as info:
            server.wait_ready(180)
    finally:
        server.stop()
    log = (tmp_path / "triton.log").read_text(errors="replace")
    assert "LLM got invalid argument: max_queue_size" in log and "tensorrt_llm" in str(info.value)
