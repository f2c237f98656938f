"""A Hugging Face checkpoint given as ``hf://owner/repo`` streams through the real Cog server on TensorRT-LLM's
PyTorch backend: setup() fetches it from the Hub, sees a GPU, chooses the PyTorch backend (the default ``auto``),
checks and writes the LLM's arguments, renders the PyTorch-backend ``tensorrt_llm`` model and starts Triton.

What cannot run here is stood in for, and only that:
* the Hub: tests/hub_server.py, reached through ``HF_ENDPOINT`` as huggingface_hub reaches the real one;
* the GPU: an ``nvidia-smi`` that reports one H100 (tests/gpu_fakes.py), so the product's own GPU probe runs;
* TensorRT-LLM's LLM API: benchmarks/llmapi_standin (transformers on the CPU), found by Triton's stub and the
  Cog worker through an overlay virtualenv first on PATH (tests/llmapi_overlay.py). The product imports nothing
  of it (tests/test_llmapi_standin_isolation.py).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from cog_triton.dev.local import CogServer, serving_env
from cog_triton.streaming.prompt import PromptTokenizer
from tests.gpu_fakes import fake_nvidia_smi, gpus
from tests.hub_server import FakeHub, commit_of
from tests.llmapi_overlay import overlay_venv

pytestmark = pytest.mark.integration

PROMPT = "What is machine learning?"


@pytest.fixture(scope="module")
def stack(tmp_path_factory, checkpoint_dir: Path):
    work = tmp_path_factory.mktemp("pytorch_e2e")
    overlay = overlay_venv(work / "overlay")
    smi = fake_nvidia_smi(work / "gpu", gpus(1))
    with FakeHub() as hub:
        hub.add_folder("me/smollm2", checkpoint_dir)
        env = serving_env(
            "hf://me/smollm2", work=work, COG_TRITON_LLM_MAX_SEQ_LEN="512", COG_TRITON_LLM_MAX_NUM_TOKENS="384",
            COG_TRITON_STOP_TIMEOUT_S="5", COG_TRITON_LLM_MAX_BATCH_SIZE="1", **hub.env(),
            PATH=os.pathsep.join([str(smi), str(overlay / "bin"), str(Path(sys.executable).parent), os.environ["PATH"]]),
        )
        cog = CogServer(env, log_file=work / "cog.log", max_concurrency=2)
        cog.start()
        try:
            cog.wait_ready(timeout_s=400)
            yield {"cog": cog, "work": work, "hub": hub, "repo": work / "model_repository",
                   "triton": f"http://127.0.0.1:{env['COG_TRITON_HTTP_PORT']}"}
        finally:
            cog.stop()


def _greedy(hf_model, hf_tokenizer, prompt: str, max_new_tokens: int) -> str:
    import torch

    ids = PromptTokenizer(hf_tokenizer).encode(prompt).ids
    with torch.inference_mode():
        out = hf_model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens,
                                attention_mask=torch.ones(1, len(ids)))
    new = out[0, len(ids):].tolist()
    if hf_tokenizer.eos_token_id in new:
        new = new[: new.index(hf_tokenizer.eos_token_id)]
    return hf_tokenizer.decode(new, skip_special_tokens=True)


def test_setup_serves_the_hub_checkpoint_on_the_pytorch_backend(stack: dict[str, Any], checkpoint_dir: Path) -> None:
    log = (stack["work"] / "cog.log").read_text(errors="replace")
    assert "on the PyTorch backend (LLM API) with tp 1 x pp 1: max_seq_len 512, longest prompt 384" in log, log[-3000:]
    model = stack["work"] / "model_repository" / "tensorrt_llm"
    assert 'backend: "python"' in (model / "config.pbtxt").read_text()
    product = (Path(__file__).resolve().parents[1] / "triton_model_repo" / "tensorrt_llm_pytorch" / "1" / "model.py")
    assert (model / "1" / "model.py").read_text() == product.read_text()
    args = json.loads((model / "1" / "llm_args.json").read_text())
    assert args["max_seq_len"] == 512 and args["max_num_tokens"] == 384
    assert Path(args["model"]).is_dir() and (Path(args["model"]) / "config.json").is_file()
    # the weights are the Hub's files at the commit the revision named
    assert commit_of("me/smollm2", "main") in log
    fetched = {p.name for p in Path(args["model"]).iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= fetched


def test_a_prediction_streams_transformers_greedy_text(stack: dict[str, Any], hf_model, hf_tokenizer) -> None:
    events = list(stack["cog"].stream({"prompt": PROMPT, "max_tokens": 32, "temperature": 0}))
    chunks = [data["chunk"] for name, data in events if name == "output"]
    final = next(data for name, data in events if name == "completed")
    assert final["status"] == "succeeded", final
    assert "".join(chunks) == _greedy(hf_model, hf_tokenizer, PROMPT, 32)
    assert len(chunks) > 1, "the text arrives as a stream"
    assert final["metrics"]["input_token_count"] == len(PromptTokenizer(hf_tokenizer).encode(PROMPT).ids)


def test_the_prompt_limit_is_the_pytorch_backends(stack: dict[str, Any]) -> None:
    """Without chunked prefill the LLM API refuses a prompt longer than max_num_tokens (llm.py _check_arguments):
    the predictor refuses it first, naming the limit and why."""
    doc = stack["cog"].predict({"prompt": "word " * 500, "max_tokens": 8})
    assert doc["status"] == "failed" and "the prompt is too long" in doc["error"], doc
    assert "maximum input length is 384 tokens" in doc["error"], doc["error"]


def test_inputs_the_default_sampler_would_ignore_are_refused_and_a_drawn_seed_is_not_sent(stack: dict[str, Any]) -> None:
    """TensorRT-LLM 1.2.1's TorchSampler (the default, sampler_type auto) ignores penalties, min_tokens (as asked)
    and a request's seed (tensorrtllm_backend/samplers.py): such a prediction fails with an input error that leads
    with what the caller can do, the operator's remedy (the sampler setting) in the server's log; a sampled prediction
    without a seed is served, the drawn seed not sent."""
    cog = stack["cog"]
    log = stack["work"] / "cog.log"
    for inputs, phrase in (({"repetition_penalty": 1.3}, "repetition_penalty=1.3 cannot be applied here: leave "
                                                         "repetition_penalty out"),
                           ({"min_tokens": 2}, "min_tokens=2 cannot be applied here: leave min_tokens out"),
                           ({"seed": 7}, "seed=7 cannot be applied here: leave seed out, or set temperature to 0")):
        remedies = log.read_text(errors="replace").count("COG_TRITON_LLM_SAMPLER=TRTLLMSampler")
        doc = cog.predict({"prompt": PROMPT, "max_tokens": 4, **inputs})
        # coglet's prefix, then the error's code and its message
        assert doc["status"] == "failed" and f"InputError: [invalid_input] {phrase}" in doc["error"], doc
        assert "TorchSampler" in doc["error"] and "COG_TRITON_LLM_SAMPLER" not in doc["error"]
        assert log.read_text(errors="replace").count("COG_TRITON_LLM_SAMPLER=TRTLLMSampler") > remedies
    before = log.read_text(errors="replace").count("no seed sent: the PyTorch backend's TorchSampler takes none")
    doc = cog.predict({"prompt": PROMPT, "max_tokens": 4, "temperature": 0.8})
    assert doc["status"] == "succeeded" and doc["output"], doc
    assert log.read_text(errors="replace").count("no seed sent: the PyTorch backend's TorchSampler takes none") == \
        before + 1


def test_images_on_a_text_only_checkpoint_are_refused_naming_the_image_architectures(stack: dict[str, Any]) -> None:
    """TensorRT-LLM 1.2.1's default input processor would drop them without a word (the stand-in does too:
    tests/test_llmapi_standin_images.py); the predictor refuses them instead."""
    doc = stack["cog"].predict({"prompt": PROMPT, "max_tokens": 4, "temperature": 0,
                                "image_input": ["data:image/png;base64,iVBORw0KGgo="]})
    assert doc["status"] == "failed", doc
    assert "[invalid_image] 1 image(s) were given (image_input, image parts of messages), but architecture " \
           "LlamaForCausalLM is served text only" in doc["error"]
    assert "Gemma3ForConditionalGeneration" in doc["error"]


def test_a_prediction_waiting_in_the_llm_when_triton_dies_is_sent_again_after_the_restart(
        stack: dict[str, Any]) -> None:
    """The PyTorch path (COG_TRITON_LLM_MAX_BATCH_SIZE=1: a second prediction waits in the LLM's queue, no token,
    while the first generates): Triton killed, the one with tokens fails naming it, the waiting one is sent once more
    after the restart and gets its whole text once (tests/test_faults.py has the C++ path's). Last in the module: it
    restarts Triton."""
    from tests.test_faults import resend_after_triton_died

    resend_after_triton_died(stack, {"prompt": PROMPT, "max_tokens": 8, "temperature": 0},
                             {"prompt": "Write a very long story about a robot.", "max_tokens": 400, "temperature": 0})
