"""LoRA adapters per request, end to end: the real Cog HTTP server running predict.py, its stream process,
a real Triton with the CPU reference model applying adapters with peft. Nothing is mocked.

The weights are the bundled SmolLM2-135M checkpoint with a manifest.json whose build config has
``lora: {max_lora_rank: 8, lora_target_modules: [all but mlp_gate]}``, as scripts/build_engine records
it; the LoRA cache holds 5,000,000 bytes (COG_TRITON_LORA_CACHE_HOST_MEMORY_BYTES): adapters a1 and a2
together, not a third beside them. One stream process (COG_TRITON_STREAM_PROCESSES=1), so which tasks it
believes Triton holds is deterministic. Adapters are served over HTTP as .tar.gz, .zip and .tar (with a
folder inside) archives. Expected outputs: transformers + peft on the same checkpoint, greedy.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from cog_triton.dev.local import CogServer, WeightsHTTPServer, free_port, serving_env
from cog_triton.streaming.prompt import PromptTokenizer
from cog_triton.settings import REPO_ROOT
from tensorrtllm_backend.build_config import parse_build_config
from tensorrtllm_backend.manifest import write_manifest
from tests.lora_adapters import AdapterFactory, pack, pack_files

pytestmark = pytest.mark.integration

N = 8
EOS = 2
PROMPT = "What is machine learning?"
MODULES = ["attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_4h_to_h"]
BUDGET = 5_000_000
ADAPTERS = {  # name: (peft settings, archive name)
    "a1": (dict(r=4, alpha=8, targets=["q_proj", "v_proj"], seed=11), "a1.tar.gz"),
    "a2": (dict(r=8, alpha=32, targets=["k_proj", "o_proj", "down_proj"], seed=12), "a2.zip"),
    "a3": (dict(r=2, alpha=12, targets=["gate_proj"], seed=13), "a3.tar"),
    "rank16": (dict(r=16, alpha=16, targets=["q_proj"], seed=14), "rank16.tar.gz"),
    "up": (dict(r=4, alpha=8, targets=["up_proj"], seed=15), "up.tar.gz"),
}


def _output(doc: dict[str, Any]) -> str:
    assert doc["status"] == "succeeded", doc.get("error") or doc
    out = doc["output"]
    return "".join(out) if isinstance(out, list) else out


def _weights_folder(checkpoint: Path, target: Path) -> Path:
    """The checkpoint (hard links) with a manifest whose build config has the test's lora section."""
    target.mkdir(parents=True)
    for path in checkpoint.iterdir():
        if path.is_file():
            os.link(path, target / path.name)
    data = yaml.safe_load((REPO_ROOT / "configs/engines/smollm2-135m-instruct-reference.yaml").read_text())
    data["source"] = {"checkpoint": "HuggingFaceTB/SmolLM2-135M-Instruct"}
    data["lora"] = {"max_lora_rank": 8, "lora_target_modules": MODULES, "max_loras": 2}
    config = parse_build_config(data)
    write_manifest(target, name=config.name, backend="reference", build_config=config.to_manifest())
    return target


def _foreign_adapter(out: Path) -> Path:
    """A LoRA adapter of another Llama (hidden size 64, 2 layers): the right names, the wrong sizes."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, vocab_size=1000))
    get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"])).save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def lora_stack(tmp_path_factory, checkpoint_dir: Path, hf_tokenizer):
    work = tmp_path_factory.mktemp("lora_e2e")
    weights = _weights_folder(checkpoint_dir, work / "weights_src")
    served = work / "adapters_served"
    prompt_ids = PromptTokenizer(hf_tokenizer).encode(PROMPT).ids
    factory = AdapterFactory(checkpoint_dir)
    expected = {None: hf_tokenizer.decode(factory.greedy(None, prompt_ids, N, EOS), skip_special_tokens=True)}
    for name, (spec, archive) in ADAPTERS.items():
        folder = factory.make(work / "made" / name, **spec)
        pack(folder, served / archive, folder="adapter" if archive.endswith(".tar") else "")
        if name in ("a1", "a2", "a3"):
            tokens = factory.greedy(folder, prompt_ids, N, EOS)
            expected[name] = hf_tokenizer.decode(tokens, skip_special_tokens=True)
    del factory
    assert len(set(expected.values())) == len(expected), "each adapter must change the output"
    pack(_foreign_adapter(work / "made" / "foreign"), served / "foreign.tar.gz")
    pack_files(served / "notpeft.tar.gz", {"README.md": b"not an adapter\n", "weights.bin": b"\0" * 64})
    with WeightsHTTPServer(served) as adapters:
        env = serving_env(
            str(weights), work=work,
            COG_TRITON_STREAM_PROCESSES="1", COG_TRITON_LORA_CACHE_HOST_MEMORY_BYTES=str(BUDGET),
            COG_TRITON_ADAPTER_CACHE_DIR=str(work / "adapter_cache"), COG_TRITON_REFERENCE_MAX_INPUT_LEN="256",
            COG_TRITON_REFERENCE_MAX_SEQ_LEN="512", COG_TRITON_STOP_TIMEOUT_S="5", COG_TRITON_DOWNLOAD_RETRIES="0",
            # the adapters come from 127.0.0.1 over http://, which the fetch rules refuse by default
            COG_TRITON_FETCH_ALLOW_PRIVATE="true", COG_TRITON_FETCH_ALLOW_HTTP="true",
        )
        cog = CogServer(env, log_file=work / "cog.log", max_concurrency=4)
        cog.start()
        try:
            cog.wait_ready(timeout_s=600)
            yield {"cog": cog, "adapters": adapters, "expected": expected, "work": work}
        finally:
            cog.stop()


def _url(stack, name: str) -> str:
    return f"{stack['adapters'].url}/{ADAPTERS[name][1] if name in ADAPTERS else name}"


def _predict(stack, lora: str = "", **extra) -> dict[str, Any]:
    inputs = {"prompt": PROMPT, "max_tokens": N, "temperature": 0, **extra}
    if lora:
        inputs["lora_weights"] = lora
    return stack["cog"].predict(inputs)


def test_each_adapter_equals_transformers_and_peft_and_none_equals_the_base(lora_stack):
    expected = lora_stack["expected"]
    assert _output(_predict(lora_stack)) == expected[None]
    for name in ("a1", "a2", "a3"):  # .tar.gz, .zip, and a .tar with the adapter in a folder
        assert _output(_predict(lora_stack, _url(lora_stack, name))) == expected[name], name


def test_both_adapters_and_the_base_at_once_each_correct(lora_stack):
    expected = lora_stack["expected"]
    order = [None, "a1", "a2", "a1"]
    results: dict[int, dict[str, Any]] = {}
    spans: dict[int, tuple[float, float]] = {}

    def run(index: int, name) -> None:
        start = time.monotonic()
        results[index] = _predict(lora_stack, _url(lora_stack, name) if name else "", max_tokens=N)
        spans[index] = (start, time.monotonic())

    threads = [threading.Thread(target=run, args=(i, name)) for i, name in enumerate(order)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    for index, name in enumerate(order):
        assert _output(results[index]) == expected[name], name
    assert max(s for s, _ in spans.values()) < min(e for _, e in spans.values()), "not all in flight together"


def test_an_adapter_with_a_guide_and_with_a_stop_sequence(lora_stack):
    """lora_weights with a guide and with a stop sequence, each on the adapter's output. A regex admitting either the
    adapter's greedy answer or the base model's gives the adapter's with the adapter and the base's without (greedy
    decoding under the guide's mask follows the adapter's logits, and the guide ends the answer); a stop sequence
    from the adapter's answer cuts it before its first occurrence."""
    expected = lora_stack["expected"]
    a1, base = expected["a1"], expected[None]
    regex = f"({re.escape(a1)}|{re.escape(base)})"
    assert _output(_predict(lora_stack, _url(lora_stack, "a1"), regex=regex, max_tokens=N + 4)) == a1
    assert _output(_predict(lora_stack, regex=regex, max_tokens=N + 4)) == base
    stop = next(a1[k:k + 2] for k in range(len(a1) // 2, len(a1) - 1)
                if not a1[k:k + 2].isspace() and a1.index(a1[k:k + 2]) > 0)
    cut = _output(_predict(lora_stack, _url(lora_stack, "a1"), stop_sequences=json.dumps([stop])))
    assert cut == a1[:a1.index(stop)] and len(cut) < len(a1), (cut, stop, a1)


def _resends(stack) -> int:
    log = (stack["work"] / "cog.log").read_text(errors="replace")
    return log.count("is not in Triton's cache: sending the request")


def test_after_an_eviction_the_adapter_is_resent_and_still_correct(lora_stack):
    """a1, a2 cached; a3 evicts a1 (least recently used). The stream process still believes Triton holds a1 and
    sends only its task id; Triton answers the cache miss; the request goes again with the weights. Each
    adapter was downloaded once, however often it was used, evicted and resent."""
    expected = lora_stack["expected"]
    for name in ("a1", "a2", "a3"):
        assert _predict(lora_stack, _url(lora_stack, name), max_tokens=1)["status"] == "succeeded", name
    before = _resends(lora_stack)
    assert _output(_predict(lora_stack, _url(lora_stack, "a1"))) == expected["a1"]
    deadline = time.monotonic() + 10
    while _resends(lora_stack) == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _resends(lora_stack) == before + 1, "a1 should have been evicted and sent again"
    triton_log = (lora_stack["work"] / "triton.log").read_text(errors="replace")
    assert "not found in cache. Please send LoRA weights with request" in triton_log
    for name in ("a1", "a2", "a3"):
        assert lora_stack["adapters"].counter[f"/{ADAPTERS[name][1]}"] == 1, name


def _closed_port_url() -> str:
    return f"http://127.0.0.1:{free_port()}/adapter.tar.gz"


REFUSALS = [
    ("notpeft.tar.gz", ["is not a PEFT LoRA adapter", "adapter_config.json", "README.md"]),
    ("foreign.tar.gz", ["made for a model of other sizes", "64 -> 64", "576 -> 576"]),
    ("rank16", ["rank r=16", "max_lora_rank of 8"]),
    ("up", ["up_proj (mlp_gate)", "lora_target_modules"]),
    ("missing.tar.gz", ["could not be fetched", "HTTP 404"]),
    ("closed", ["could not be fetched", "could not connect", "no retries configured"]),
    ("ftp://example.com/a.tar", ["lora_weights='ftp://example.com/a.tar' is not allowed", "hf://owner/repo"]),
]


def test_bad_adapters_are_refused_clearly_while_another_stream_goes_on(lora_stack):
    """Each refusal fails its prediction before any output, with the error naming what is wrong; a base
    prediction streaming meanwhile completes with the right text."""
    long: dict[str, Any] = {}

    def base() -> None:
        long["doc"] = _predict(lora_stack, max_tokens=32, min_tokens=32)
        long["end"] = time.monotonic()

    thread = threading.Thread(target=base)
    thread.start()
    first_refusal = time.monotonic()
    for source, fragments in REFUSALS:
        if source == "closed":
            url = _closed_port_url()
        elif "://" in source:
            url = source
        else:
            url = _url(lora_stack, source)
        doc = _predict(lora_stack, url)
        assert doc["status"] == "failed", (source, doc)
        assert doc.get("output") in (None, []), "a refused adapter must fail before any output"
        assert "[invalid_lora_adapter]" in doc["error"], doc["error"]
        for fragment in fragments:
            assert fragment in doc["error"], (fragment, doc["error"])
    thread.join(timeout=300)
    assert first_refusal < long["end"]
    assert long["doc"]["status"] == "succeeded", long["doc"]
    assert _output(long["doc"]).startswith(lora_stack["expected"][None])


def test_the_schema_carries_lora_weights_and_the_adapter_cache_is_on_disk(lora_stack):
    schema = json.loads((REPO_ROOT / "cog_triton" / "openapi_schema.json").read_text())
    field = schema["components"]["schemas"]["Input"]["properties"]["lora_weights"]
    assert field["type"] == "string" and field["default"] == "" and field["maxLength"] == 4096
    cached = [p for p in (lora_stack["work"] / "adapter_cache" / "adapters").iterdir() if not p.name.startswith(".")]
    assert len(cached) >= 3
