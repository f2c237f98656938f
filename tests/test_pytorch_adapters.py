"""The PyTorch-backend ``tensorrt_llm`` model in a real Triton, over an LLM API stand-in that is as unkind as
TensorRT-LLM 1.2.1 under load (benchmarks/llmapi_standin; tests/test_llmapi_standin.py checks it):

* it keeps every distinct LoRA adapter's device tensors for the LLM's life, and a load beyond the device memory left
  (``LLMAPI_STANDIN_LORA_DEVICE_BYTES``: here room for two of the test's adapters) fails as CUDA does, stopping its
  executor worker, the LLM with it (lora_manager.py @30e6fb55, worker.py @cc4777e9);
* an abort reaches its executor late (``LLMAPI_STANDIN_ABORT_DELAY_MS``: 700 ms here, seven cancellation periods),
  as 1.2.1's travels through the proxy and the worker to the executor's next iteration.

The model bounds the adapters per LLM (``max_adapters_per_llm`` 2: the third distinct adapter recycles the LLM,
without cutting the running request) and reports the count in Triton's metrics; it never ends a request the LLM
has answered before the LLM does. The stand-in is the one mock (TensorRT-LLM cannot run here); Triton, its metrics
endpoint and the model are real.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import httpx
import pytest

from tests.proc import stop_at_once
from tests.test_conformance import (
    CHECKPOINT, EOS, PYTORCH_DIR, Stream, _free_ports, grpc_call, render_pytorch_config, request, scalars, stop_request,
    stream, write_model,
)

pytestmark = pytest.mark.integration

MODEL = "tensorrt_llm"
ABORT_DELAY_MS = 700


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, prompts):
    """Three small adapters and transformers + peft's greedy tokens with each."""
    from tests.lora_adapters import AdapterFactory

    tmp = tmp_path_factory.mktemp("pytorch_adapters")
    factory = AdapterFactory(CHECKPOINT)
    made = {name: factory.make(tmp / name, r=4, alpha=8, targets=["q_proj", "v_proj"], seed=seed)
            for name, seed in (("a", 51), ("b", 52), ("c", 53))}
    expected = {name: factory.greedy(path, prompts["haiku"], 8, EOS) for name, path in made.items()}
    assert len({tuple(v) for v in expected.values()}) == 3
    return made, expected


@pytest.fixture(scope="module")
def prompts(hf_tokenizer) -> dict[str, list[int]]:
    enc = hf_tokenizer.apply_chat_template([{"role": "user", "content": "Write a haiku about the sea."}],
                                           add_generation_prompt=True, tokenize=True)
    return {"haiku": list(enc["input_ids"] if not isinstance(enc, list) else enc)}


def _device_bytes(folder: Path) -> int:
    """What 1.2.1 keeps on the device for one adapter of this float32 checkpoint (every LoRA value, 4 bytes)."""
    from safetensors.torch import load_file

    return 4 * sum(t.numel() for n, t in load_file(str(folder / "adapter_model.safetensors")).items() if "lora_" in n)


@pytest.fixture(scope="module")
def server(tmp_path_factory, adapters):
    from tensorrtllm_backend.server import LaunchConfig, TritonServer, locate_tritonserver
    from tests.llmapi_overlay import overlay_venv, standin_installation

    made, _ = adapters
    tmp = tmp_path_factory.mktemp("pytorch_adapters_server")
    repo = tmp / "repo"
    write_model(repo / MODEL, PYTORCH_DIR, render_pytorch_config(
        MODEL, max_adapters_per_llm=2, adapter_snapshot_dir=str(tmp / "snapshots"), cancellation_check_period_ms=100),
        {"model": str(CHECKPOINT), "max_batch_size": 2, "max_seq_len": 512, "lora_config": {"max_lora_rank": 8}})
    installation = standin_installation(locate_tritonserver(work_dir=tmp / "work"), overlay_venv(tmp / "overlay"))
    installation = dataclasses.replace(installation, env={
        **installation.env, "LLMAPI_STANDIN_LORA_DEVICE_BYTES": str(2 * _device_bytes(made["a"])),
        "LLMAPI_STANDIN_ABORT_DELAY_MS": str(ABORT_DELAY_MS)})
    http, grpc, metrics = _free_ports(3)
    triton = TritonServer(installation, LaunchConfig(model_repo=repo, http_port=http, grpc_port=grpc,
                                                     metrics_port=metrics), log_file=tmp / "triton.log")
    triton.start()
    try:
        triton.wait_ready(180)
        yield {"url": triton.url, "grpc": f"127.0.0.1:{grpc}", "log": tmp / "triton.log",
               "metrics": f"http://127.0.0.1:{metrics}/metrics", "snapshots": tmp / "snapshots"}
    finally:
        stop_at_once(triton)


def metric(server, name: str) -> float:
    """The model's metric ``name`` in Triton's Prometheus endpoint (python_backend's custom metrics)."""
    text = httpx.get(server["metrics"], timeout=30).text
    found = re.search(rf'^{name}\{{[^}}]*model="{MODEL}"[^}}]*\}} (\S+)$', text, re.M)
    assert found, f"{name} is not in Triton's metrics"
    return float(found.group(1))


def _lora(folder: Path, task: int) -> dict:
    import numpy as np

    return {"lora_task_id": np.array([[task]], np.uint64),
            "lora_path": np.array([[str(folder).encode()]], dtype=np.object_)}


def test_the_third_distinct_adapter_recycles_the_llm_without_cutting_the_running_request(server, prompts, adapters):
    """max_adapters_per_llm 2: adapter c, the LLM's third, waits while the request running with adapter a (200
    tokens, streamed) runs to its end, then a new LLM serves it; the old LLM's snapshots are removed. Without the
    bound, c's load would fail as CUDA does and stop the stand-in's worker (1.2.1's leak: every later request of the
    LLM unanswered). Triton's metrics: the adapter count of the current LLM and the recycles."""
    made, expected = adapters
    haiku = prompts["haiku"]
    assert metric(server, "cog_triton_llm_lora_adapters") == 0
    running = Stream(server["url"], {**request(haiku, 200, streaming=[True], end_id=[-1], lora_task_id=[1],
                                              lora_path=[str(made["a"])]), "id": "running-a"})
    assert running.first.wait(120) and running.events, "the request with adapter a produced no token"
    tokens, errors = grpc_call(server, MODEL, scalars(haiku, 8, **_lora(made["b"], 2)))
    assert errors == [] and tokens == expected["b"] and metric(server, "cog_triton_llm_lora_adapters") == 2
    first_life = {p.name for p in server["snapshots"].iterdir()}
    tokens, errors = grpc_call(server, MODEL, scalars(haiku, 8, **_lora(made["c"], 3)))
    assert errors == [] and tokens == expected["c"]
    events = running.finish()
    assert all("error" not in e for e in events) and len(running.tokens()) == 200, "the running request was cut"
    assert metric(server, "cog_triton_llm_recycles") == 1 and metric(server, "cog_triton_llm_lora_adapters") == 1
    assert not first_life & {p.name for p in server["snapshots"].iterdir()}, "the old LLM's snapshots are gone"
    log = server["log"].read_text(errors="replace")
    assert "recycling the LLM: adapter 3 would be the LLM's distinct adapter number 3, above max_adapters_per_llm 2" \
        in log and "LLM recycled in" in log
    tokens, errors = grpc_call(server, MODEL, scalars(haiku, 8, **_lora(made["a"], 1)))  # the new LLM serves a too
    assert errors == [] and tokens == expected["a"]


def test_a_stop_whose_abort_travels_slowly_ends_the_request_with_every_token_the_llm_made(server, prompts):
    """The stop reaches the stand-in's executor 700 ms late (seven 100-ms cancellation periods). The model ends a
    request the LLM has answered only with the LLM's own final response: tokens made after the stop still reach the
    client, and the request is not ended early ("stopped while waiting for a batch slot" is only for requests the
    LLM never answered)."""
    before = server["log"].read_text(errors="replace").count("stopped while waiting for a batch slot")
    running = Stream(server["url"], {**request(prompts["haiku"], 400, streaming=[True], end_id=[-1]), "id": "slow"})
    assert running.first.wait(120) and running.events
    stopped_at = time.monotonic()
    status, _ = stream(server["url"], stop_request("slow"))
    assert status == 200
    events = running.finish()
    after_stop = [e for t, e in running.events if t > stopped_at + 0.2]
    assert all("error" not in e for e in events) and after_stop, "no token reached the client after the stop"
    assert len(running.tokens()) < 400
    assert server["log"].read_text(errors="replace").count("stopped while waiting for a batch slot") == before
