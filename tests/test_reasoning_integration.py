"""Reasoning through the real stack, on both backends: the real Cog server running predict.py, a real Triton, and an
engine that emits a scripted token sequence (no reasoning model runs on this machine).

* **The C++ engine path**: a checkpoint with the Qwen3-format fixture tokenizer (tests/reasoning_fixtures.py), served
  by setup() on the reference backend with benchmarks/standin as ``tensorrt_llm`` (the reference model's request
  parsing and scheduler, the C++ backend's tensors) in its scripted mode.
* **The PyTorch backend**: a checkpoint with the gpt-oss (harmony) fixture tokenizer, planned by setup() for the
  PyTorch backend (a faked GPU, as tests/test_pytorch_e2e.py), served by the product's ``tensorrt_llm_pytorch``
  model over the LLM API stand-in (benchmarks/llmapi_standin) in its scripted mode.

The scripted engines are the one mock: they pick their tokens by the text of the prompt they are sent, so a script
keyed on what the chat template renders (an empty thinking block, ``Reasoning: high``, an earlier turn's thinking)
also shows what reached the template. Everything between the HTTP request and the engine is the product's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.paths import STANDIN_TEXT
from benchmarks.stack import write_standin_templates
from cog_triton.local import CogServer, serving_env
from tests import reasoning_fixtures as rf
from tests.gpu_fakes import fake_nvidia_smi, gpus
from tests.llmapi_overlay import overlay_venv

pytestmark = pytest.mark.integration

QWEN_THOUGHT = "<think>\nAdd two and two.\n</think>\n\nIt is 4."


def _tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def _script(path: Path, scripts: list[tuple[str, list[int]]]) -> Path:
    path.write_text(json.dumps({"scripts": [{"when": when, "ids": ids} for when, ids in scripts]}))
    return path


def _stream(cog: CogServer, inputs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The streamed text and the completed prediction."""
    events = list(cog.stream(inputs))
    final = next(data for name, data in events if name == "completed")
    return "".join(data["chunk"] for name, data in events if name == "output"), final


def _scrape(env: dict[str, str]) -> dict[tuple, float]:
    response = httpx.get(f"http://127.0.0.1:{env['COG_TRITON_PROMETHEUS_PORT']}/metrics", timeout=30)
    assert response.status_code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.text) for s in family.samples}


def _sample(samples: dict[tuple, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


# --------------------------------------------------------------------------------- the C++ engine path (Qwen3 format)
@pytest.fixture(scope="module")
def engine_stack(tmp_path_factory):
    work = tmp_path_factory.mktemp("reasoning_engine")
    checkpoint = rf.build("qwen3", work / "weights")  # the weights folder itself: setup() copies nothing
    tok = _tokenizer(checkpoint)
    eos = [tok.eos_token_id]
    scripts = _script(work / "scripts.json", [
        # first match wins: what the template rendered decides the tokens
        ("<think>\n\n</think>", rf.ids(tok, "Thinking was off.") + eos),  # enable_thinking=false's empty block
        ("an earlier thought", rf.ids(tok, "LEAKED") + eos),  # an earlier turn's thinking reached the prompt
        ("Q-NO-CLOSE", rf.ids(tok, "<think>\nStill thinking about it")),
        ("Q-", rf.ids(tok, QWEN_THOUGHT) + eos),
        ("", rf.ids(tok, "Hi.") + eos),  # anything else (setup's self-test)
    ])
    templates = write_standin_templates(work / "templates", step_ms=2, sender_threads=1, script_file=scripts)
    env = serving_env(str(checkpoint), work=work, COG_TRITON_TEMPLATE_DIR=str(templates),
                      COG_TRITON_CHECKPOINT_BACKEND="reference", COG_TRITON_STOP_TIMEOUT_S="5",
                      COG_TRITON_REFERENCE_MAX_SEQ_LEN="512")
    cog = CogServer(env, log_file=work / "cog.log", max_concurrency=2)
    cog.start()
    try:
        cog.wait_ready(timeout_s=400)
        yield {"cog": cog, "env": env, "work": work, "tok": tok}
    finally:
        cog.stop()


def test_the_thinking_streams_between_the_markers_then_the_answer_with_its_tokens_counted_apart(engine_stack) -> None:
    cog, tok = engine_stack["cog"], engine_stack["tok"]
    before = _scrape(engine_stack["env"])
    text, final = _stream(cog, {"prompt": "Q-1: what is 2+2?"})
    assert final["status"] == "succeeded", final
    assert text == "<think>\nAdd two and two.\n</think>It is 4."
    ids = rf.ids(tok, QWEN_THOUGHT)
    metrics = final["metrics"]
    assert metrics["output_token_count"] == len(ids)
    assert metrics["reasoning_token_count"] == ids.index(tok.convert_tokens_to_ids("</think>")) + 1
    assert metrics["answer_token_count"] == len(ids) - metrics["reasoning_token_count"]
    assert metrics["reasoning_effort_applied"] == "default"
    assert "reasoning_effort: the template's default" in final["logs"]
    after = _scrape(engine_stack["env"])
    for name, value in (("cog_triton_reasoning_tokens_total", metrics["reasoning_token_count"]),
                        ("cog_triton_answer_tokens_total", metrics["answer_token_count"])):
        assert _sample(after, name) - _sample(before, name) == value, name
    level = "cog_triton_reasoning_effort_applied_total"
    assert _sample(after, level, level="default") - _sample(before, level, level="default") == 1


def test_include_reasoning_false_streams_the_answer_alone(engine_stack) -> None:
    text, final = _stream(engine_stack["cog"], {"prompt": "Q-2", "include_reasoning": False})
    assert final["status"] == "succeeded" and text == "It is 4."
    assert final["metrics"]["reasoning_token_count"] > 0  # the thinking was generated (and counted), not shown


def test_reasoning_effort_reaches_the_templates_switch_and_the_log_says_what_was_applied(engine_stack) -> None:
    cog = engine_stack["cog"]
    text, final = _stream(cog, {"prompt": "Q-3", "reasoning_effort": "none"})
    assert final["status"] == "succeeded" and text == "Thinking was off."  # the prompt had the empty block
    assert final["metrics"]["reasoning_effort_applied"] == "none" and final["metrics"]["reasoning_token_count"] == 0
    assert "reasoning_effort=none (enable_thinking=false)" in final["logs"]
    text, final = _stream(cog, {"prompt": "Q-4", "reasoning_effort": "high"})
    assert text.startswith("<think>") and final["metrics"]["reasoning_effort_applied"] == "on"
    assert "reasoning_effort=high applied as on (enable_thinking=true)" in final["logs"]


def test_thinking_the_tokens_ran_out_in_is_closed(engine_stack) -> None:
    text, final = _stream(engine_stack["cog"], {"prompt": "Q-NO-CLOSE", "max_tokens": 4})
    assert final["status"] == "succeeded" and text.startswith("<think>") and text.endswith("</think>")
    metrics = final["metrics"]
    assert metrics["output_token_count"] == metrics["reasoning_token_count"] == 4 and metrics["answer_token_count"] == 0


def test_an_earlier_turns_thinking_is_rendered_as_the_template_wants(engine_stack) -> None:
    """The Qwen3-format template drops an earlier turn's thinking (given as the stream gave it, or as
    reasoning_content): the engine never sees it."""
    for earlier in ({"role": "assistant", "content": "<think>an earlier thought</think>\n\nIt is 4."},
                    {"role": "assistant", "content": "It is 4.", "reasoning_content": "an earlier thought"}):
        messages = [{"role": "user", "content": "Q-5"}, earlier, {"role": "user", "content": [
            {"type": "text", "text": "And"}, {"type": "text", "text": "3+3?"}]}]
        text, final = _stream(engine_stack["cog"], {"messages": json.dumps(messages)})
        assert final["status"] == "succeeded", final
        assert "LEAKED" not in text and text.endswith("It is 4."), text


def test_refusals_name_what_is_allowed(engine_stack) -> None:
    cog = engine_stack["cog"]
    for inputs, phrase in (
        ({"chat_template_kwargs": '{"enable_thinking": false}'}, "which reasoning_effort sets"),
        ({"chat_template_kwargs": '{"date_string": "today"}'}, "which this model's chat template does not read"),
        ({"thinking_budget_tokens": 100}, "thinking_budget_tokens=100 is not applied yet: give 0"),
        ({"reasoning_effort": "low", "prompt_template": "{prompt}"}, "prompt_template replaces it"),
    ):
        doc = cog.predict({"prompt": "Q-6", **inputs})
        assert doc["status"] == "failed" and phrase in doc["error"], doc
    with pytest.raises(httpx.HTTPStatusError) as error:  # coglet's own schema check: the choices
        list(cog.stream({"prompt": "Q-6", "reasoning_effort": "max"}))
    assert error.value.response.status_code == 422


# ------------------------------------------------------------------------------ the PyTorch backend (gpt-oss format)
HARMONY = "<|channel|>analysis<|message|>Think it through.<|end|><|start|>assistant<|channel|>final<|message|>{}"


@pytest.fixture(scope="module")
def pytorch_stack(tmp_path_factory):
    work = tmp_path_factory.mktemp("reasoning_pytorch")
    checkpoint = rf.build("gpt_oss", work / "weights")
    tok = _tokenizer(checkpoint)
    end = [tok.convert_tokens_to_ids("<|return|>")]
    scripts = _script(work / "scripts.json", [
        ("Reasoning: high", rf.ids(tok, HARMONY.format("High answer.")) + end),
        ("Reasoning: medium", rf.ids(tok, HARMONY.format("Medium answer.")) + end),
        ("", rf.ids(tok, "Hi.") + end),  # anything else
    ])
    overlay = overlay_venv(work / "overlay")
    smi = fake_nvidia_smi(work / "gpu", gpus(1))
    env = serving_env(
        str(checkpoint), work=work, COG_TRITON_LLM_MAX_SEQ_LEN="512", COG_TRITON_LLM_MAX_NUM_TOKENS="384",
        COG_TRITON_STOP_TIMEOUT_S="5",
        LLMAPI_STANDIN_STEP_MS="2", LLMAPI_STANDIN_TEXT=str(STANDIN_TEXT), LLMAPI_STANDIN_SCRIPT=str(scripts),
        PATH=os.pathsep.join([str(smi), str(overlay / "bin"), str(Path(sys.executable).parent), os.environ["PATH"]]),
    )
    cog = CogServer(env, log_file=work / "cog.log", max_concurrency=2)
    cog.start()
    try:
        cog.wait_ready(timeout_s=400)
        yield {"cog": cog, "env": env, "work": work, "tok": tok}
    finally:
        cog.stop()


def test_harmony_channels_stream_in_the_same_convention_on_the_pytorch_backend(pytorch_stack) -> None:
    log = (pytorch_stack["work"] / "cog.log").read_text(errors="replace")
    assert "on the PyTorch backend (LLM API)" in log, log[-2000:]
    tok = pytorch_stack["tok"]
    text, final = _stream(pytorch_stack["cog"], {"prompt": "What is 2+2?", "temperature": 0})
    assert final["status"] == "succeeded", final
    assert text == "<think>Think it through.</think>Medium answer."
    ids = rf.ids(tok, HARMONY.format("Medium answer."))
    metrics = final["metrics"]
    assert metrics["output_token_count"] == len(ids)
    assert metrics["answer_token_count"] == len(rf.ids(tok, "Medium answer."))
    assert metrics["reasoning_effort_applied"] == "default"


def test_an_effort_level_reaches_the_template_as_it_is(pytorch_stack) -> None:
    cog = pytorch_stack["cog"]
    text, final = _stream(cog, {"prompt": "What is 2+2?", "temperature": 0, "reasoning_effort": "high",
                                "include_reasoning": False})
    assert final["status"] == "succeeded" and text == "High answer."  # the prompt said "Reasoning: high"
    assert final["metrics"]["reasoning_effort_applied"] == "high"
    assert "reasoning_effort=high (reasoning_effort=high)" in final["logs"]
    doc = cog.predict({"prompt": "What is 2+2?", "temperature": 0, "reasoning_effort": "none"})
    assert doc["status"] == "failed" and "allowed: '', 'low', 'medium', 'high'" in doc["error"], doc


def test_harmony_thinking_the_tokens_ran_out_in_is_closed(pytorch_stack) -> None:
    text, final = _stream(pytorch_stack["cog"], {"prompt": "What is 2+2?", "temperature": 0, "max_tokens": 6})
    assert final["status"] == "succeeded" and text.startswith("<think>") and text.endswith("</think>"), text
    assert final["metrics"]["answer_token_count"] == 0 and final["metrics"]["output_token_count"] == 6
