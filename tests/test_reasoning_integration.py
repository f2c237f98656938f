"""Reasoning through the real stack, on both backends: the real Cog server running predict.py, a real Triton, and an
engine that emits a scripted token sequence (no reasoning model runs on this machine).

* **The C++ engine path**: a checkpoint with the Qwen3-format fixture tokenizer (tests/reasoning_fixtures.py), served
  by setup() on the reference backend with benchmarks/standin as ``tensorrt_llm`` (the reference model's request
  parsing and scheduler, the C++ backend's tensors) in its scripted mode.
* **The PyTorch backend**: a checkpoint with the gpt-oss (harmony) fixture tokenizer, planned by setup() for the
  PyTorch backend (a faked GPU, as tests/test_pytorch_e2e.py), served by the product's ``tensorrt_llm_pytorch``
  model over the LLM API stand-in (benchmarks/llmapi_standin) in its scripted mode.
* **A real model**: SmolLM2 itself on the CPU reference model (the C++ backend's tensors), its tokenizer with two of
  its own special tokens renamed to the markers (tests/reasoning_fixtures.py ``build_model_markers``), so that
  guided decoding runs for real: the grammar lets the model's own thought through and holds its answer to the guide.

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
from cog_triton.dev.local import CogServer, serving_env
from tests import reasoning_fixtures as rf
from tests.gpu_fakes import fake_nvidia_smi, gpus
from tests.llmapi_overlay import overlay_venv
from tests.stacks import STACK_SETTINGS

pytestmark = pytest.mark.integration

QWEN_THOUGHT = "<think>\nAdd two and two.\n</think>\n\nIt is 4."
#: A thought that uses braces and quotes, as JSON does, then a JSON answer.
JSON_THOUGHT = '<think>\nThe "a" key {of the answer} is 4.\n</think>\n\n{"a": 4}'
#: A long thought, longer than the budgets below.
LONG = " ponder" * 40
SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})


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
        # an answer request after a thinking budget ran out: its prompt holds the thinking kept
        ("JSON-PONDER", rf.ids(tok, '\n\n{"a": 4}') + eos),
        ("PONDER", rf.ids(tok, "\n\nThe answer after the budget.") + eos),
        ("Q-LONG-JSON", rf.ids(tok, "<think>JSON-PONDER" + LONG + "</think>\n\n{\"a\": 1}") + eos),
        ("Q-LONG", rf.ids(tok, "<think>PONDER" + LONG + "</think>\n\nToo late.") + eos),
        ("Q-JSON-BAD", rf.ids(tok, '<think>\nHm.\n</think>\n\n{"b": 4}') + eos),
        ("Q-JSON-SPELLED", [tok.convert_tokens_to_ids("<think>"), *rf.ids(tok, "Hm </"), *rf.ids(tok, "think>"),
                            *rf.ids(tok, '{"a": 4}'), *eos]),  # the closing marker as ordinary tokens
        ("Q-JSON", rf.ids(tok, JSON_THOUGHT) + eos),
        ("Q-NO-CLOSE", rf.ids(tok, "<think>\nStill thinking about it")),
        ("Q-", rf.ids(tok, QWEN_THOUGHT) + eos),
        ("", rf.ids(tok, "Hi.") + eos),  # anything else (setup's self-test)
    ])
    templates = write_standin_templates(work / "templates", step_ms=2, sender_threads=1, script_file=scripts)
    env = serving_env(str(checkpoint), work=work, COG_TRITON_TEMPLATE_DIR=str(templates),
                      COG_TRITON_PROMETHEUS_REUSE_S=STACK_SETTINGS["COG_TRITON_PROMETHEUS_REUSE_S"],
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
        ({"thinking_budget_tokens": 100, "reasoning_effort": "none"},
         "thinking_budget_tokens=100 bounds the thinking, and this prediction's prompt turns the thinking off"),
        ({"thinking_budget_tokens": 1}, "its thinking takes at least 2 tokens"),
        ({"reasoning_effort": "low", "prompt_template": "{prompt}"}, "prompt_template replaces it"),
    ):
        doc = cog.predict({"prompt": "Q-6", **inputs})
        assert doc["status"] == "failed" and phrase in doc["error"], doc
    with pytest.raises(httpx.HTTPStatusError) as error:  # coglet's own schema check: the choices
        list(cog.stream({"prompt": "Q-6", "reasoning_effort": "max"}))
    assert error.value.response.status_code == 422


def test_a_guide_lets_the_thinking_through_and_holds_the_answer_to_it(engine_stack) -> None:
    """The stand-in replays every scripted token through the grammar the predictor sent, as a guided engine's mask
    allows only what it accepts: a thought with braces and quotes passes, then the JSON answer; the stream is the
    convention and the answer is the document."""
    cog = engine_stack["cog"]
    text, final = _stream(cog, {"prompt": "Q-JSON", "json_schema": SCHEMA})
    assert final["status"] == "succeeded", final
    assert text == '<think>\nThe "a" key {of the answer} is 4.\n</think>{"a": 4}'
    tok = engine_stack["tok"]
    ids = rf.ids(tok, JSON_THOUGHT)
    assert final["metrics"]["answer_token_count"] == len(ids) - ids.index(tok.convert_tokens_to_ids("</think>")) - 1
    text, final = _stream(cog, {"prompt": "Q-JSON", "json_schema": SCHEMA, "include_reasoning": False})
    assert final["status"] == "succeeded" and json.loads(text) == {"a": 4}


def test_the_grammar_refuses_an_answer_the_guide_refuses(engine_stack) -> None:
    doc = engine_stack["cog"].predict({"prompt": "Q-JSON-BAD", "json_schema": SCHEMA})
    assert doc["status"] == "failed" and "the guide refuses scripted token" in doc["error"], doc


def test_an_answer_that_cannot_be_told_from_the_thinking_fails_rather_than_return_it(engine_stack) -> None:
    """The closing marker's text written with ordinary tokens satisfies the grammar (xgrammar matches text), but the
    stream splits by the marker's token id: what followed stayed in the thinking, and the prediction fails."""
    doc = engine_stack["cog"].predict({"prompt": "Q-JSON-SPELLED", "json_schema": SCHEMA})
    assert doc["status"] == "failed", doc
    assert "the model wrote the end of its thinking as ordinary text, not as its marker token" in doc["error"]


def test_stop_sequences_match_in_the_answer_not_in_the_thinking(engine_stack) -> None:
    cog = engine_stack["cog"]
    text, final = _stream(cog, {"prompt": "Q-7", "stop_sequences": "two,Add"})  # words of the thinking only
    assert final["status"] == "succeeded" and text == "<think>\nAdd two and two.\n</think>It is 4."
    text, final = _stream(cog, {"prompt": "Q-8", "stop_sequences": "two, is"})  # " is" is in the answer
    assert final["status"] == "succeeded" and text == "<think>\nAdd two and two.\n</think>It", text
    text, final = _stream(cog, {"prompt": "Q-9", "stop_sequences": "It", "include_reasoning": False})
    assert final["status"] == "succeeded" and text == ""


def _budget_counts(env) -> float:
    return _sample(_scrape(env), "cog_triton_thinking_budget_reached_total")


def test_a_thinking_budget_ends_a_long_thought_then_the_answer_streams(engine_stack) -> None:
    """The scripted thought runs on past the budget: the stream process stops that request after budget - 1 tokens
    of thinking, ends the thinking with </think> (the budget's last token) and asks for the answer with a second
    request whose prompt holds the thinking (the script for it is keyed on the thinking's first word)."""
    cog, tok, env = engine_stack["cog"], engine_stack["tok"], engine_stack["env"]
    before = _budget_counts(env)
    text, final = _stream(cog, {"prompt": "Q-LONG", "thinking_budget_tokens": 12})
    assert final["status"] == "succeeded", final
    thought = rf.ids(tok, "<think>PONDER" + LONG)[:11]
    assert text == "<think>" + tok.decode(thought[1:]) + "</think>The answer after the budget."
    metrics = final["metrics"]
    assert metrics["reasoning_token_count"] == 12 and metrics["thinking_budget_reached"] is True
    assert metrics["answer_token_count"] == len(rf.ids(tok, "\n\nThe answer after the budget."))  # as scripted
    assert "Too late" not in text
    assert _budget_counts(env) - before == 1
    text, final = _stream(cog, {"prompt": "Q-1", "thinking_budget_tokens": 100})  # a thought within the budget
    assert final["status"] == "succeeded" and text == "<think>\nAdd two and two.\n</think>It is 4."
    assert final["metrics"]["thinking_budget_reached"] is False and _budget_counts(env) - before == 1


def test_a_thinking_budget_with_a_guide_holds_both_requests_to_it(engine_stack) -> None:
    cog, tok = engine_stack["cog"], engine_stack["tok"]
    text, final = _stream(cog, {"prompt": "Q-LONG-JSON", "thinking_budget_tokens": 10, "json_schema": SCHEMA,
                                "stop_sequences": "ponder"})  # the thought's word: it stops nothing
    assert final["status"] == "succeeded", final
    assert text.startswith("<think>JSON-PONDER ponder") and text.endswith('</think>{"a": 4}'), text
    assert final["metrics"]["reasoning_token_count"] == 10
    text, final = _stream(cog, {"prompt": "Q-LONG", "thinking_budget_tokens": 12, "max_tokens": 12})
    assert final["status"] == "succeeded" and text.endswith("</think>") and final["metrics"]["answer_token_count"] == 0


# ------------------------------------------------------------------------------ the PyTorch backend (gpt-oss format)
HARMONY = "<|channel|>analysis<|message|>Think it through.<|end|><|start|>assistant<|channel|>final<|message|>{}"


@pytest.fixture(scope="module")
def pytorch_stack(tmp_path_factory):
    work = tmp_path_factory.mktemp("reasoning_pytorch")
    checkpoint = rf.build("gpt_oss", work / "weights")
    tok = _tokenizer(checkpoint)
    end = [tok.convert_tokens_to_ids("<|return|>")]
    scripts = _script(work / "scripts.json", [
        ("HMARK", rf.ids(tok, "4.") + end),  # the answer request after a thinking budget ran out
        ("Q-H-LONG", rf.ids(tok, "<|channel|>analysis<|message|>HMARK" + LONG + "<|end|><|start|>assistant"
                                 "<|channel|>final<|message|>Too late.") + end),
        ("Q-H-JSON-BAD", rf.ids(tok, HARMONY.format('{"b": 4}')) + end),
        ("Q-H-JSON", rf.ids(tok, HARMONY.format('{"a": 4}')) + end),
        ("Reasoning: high", rf.ids(tok, HARMONY.format("High answer.")) + end),
        ("Reasoning: medium", rf.ids(tok, HARMONY.format("Medium answer.")) + end),
        ("", rf.ids(tok, "Hi.") + end),  # anything else
    ])
    overlay = overlay_venv(work / "overlay")
    smi = fake_nvidia_smi(work / "gpu", gpus(1))
    env = serving_env(
        str(checkpoint), work=work, COG_TRITON_LLM_MAX_SEQ_LEN="512", COG_TRITON_LLM_MAX_NUM_TOKENS="384",
        COG_TRITON_STOP_TIMEOUT_S="5", COG_TRITON_PROMETHEUS_REUSE_S=STACK_SETTINGS["COG_TRITON_PROMETHEUS_REUSE_S"],
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


def test_a_guide_lets_harmonys_thinking_through_on_the_pytorch_backend(pytorch_stack) -> None:
    """Harmony's channels are text to xgrammar 0.1.32 (its control tokens have their own text), so one grammar lets
    the analysis channel through and holds the final channel to the guide; the LLM API stand-in replays the scripted
    tokens through it, as the PyTorch backend's guided decoder accepts each new token."""
    text, final = _stream(pytorch_stack["cog"], {"prompt": "Q-H-JSON", "temperature": 0, "json_schema": SCHEMA})
    assert final["status"] == "succeeded", final
    assert text == '<think>Think it through.</think>{"a": 4}'
    doc = pytorch_stack["cog"].predict({"prompt": "Q-H-JSON-BAD", "temperature": 0, "json_schema": SCHEMA})
    assert doc["status"] == "failed" and "failed to accept last new token" in doc["error"], doc


def test_a_thinking_budget_ends_harmonys_thinking_with_the_final_channel_on_the_pytorch_backend(pytorch_stack) -> None:
    from cog_triton.streaming.thinking import harmony_forced_end_max

    cog, tok = pytorch_stack["cog"], pytorch_stack["tok"]
    budget = harmony_forced_end_max(tok) + 6
    text, final = _stream(cog, {"prompt": "Q-H-LONG", "temperature": 0, "thinking_budget_tokens": budget,
                                "stop_sequences": "ponder"})
    assert final["status"] == "succeeded", final
    assert text.startswith("<think>HMARK") and text.endswith("</think>4."), text
    metrics = final["metrics"]
    assert metrics["thinking_budget_reached"] is True and metrics["reasoning_token_count"] <= budget
    assert metrics["answer_token_count"] == len(rf.ids(tok, "4."))


def test_stop_sequences_leave_harmonys_thinking_alone(pytorch_stack) -> None:
    text, final = _stream(pytorch_stack["cog"], {"prompt": "What is 2+2?", "temperature": 0,
                                                 "stop_sequences": "through, answer"})
    assert final["status"] == "succeeded" and text == "<think>Think it through.</think>Medium", text


# ------------------------------------------------------------------- a real model: SmolLM2 on the CPU reference model
ANSWER_SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}


@pytest.fixture(scope="module")
def model_stack(tmp_path_factory):
    work = tmp_path_factory.mktemp("reasoning_model")
    checkpoint = rf.build_model_markers(work / "weights")
    env = serving_env(str(checkpoint), work=work, COG_TRITON_CHECKPOINT_BACKEND="reference",
                      COG_TRITON_STOP_TIMEOUT_S="5", COG_TRITON_REFERENCE_MAX_SEQ_LEN="512")
    cog = CogServer(env, log_file=work / "cog.log", max_concurrency=1)
    cog.start()
    try:
        cog.wait_ready(timeout_s=400)
        yield {"cog": cog, "env": env, "work": work, "tok": _tokenizer(checkpoint)}
    finally:
        cog.stop()


def _thought_and_answer(text: str) -> tuple[str, Any]:
    assert text.startswith("<think>") and text.count("</think>") == 1, text
    thought, answer = text[len("<think>"):].split("</think>")
    return thought, json.loads(answer)


def test_real_guided_decoding_lets_the_models_thinking_through_and_its_answer_validates(model_stack) -> None:
    """The prompt (a prompt_template of examples) opens the thinking; greedy under the grammar, the model thinks,
    writes its closing marker itself, then a JSON answer the schema accepts."""
    import jsonschema

    text, final = _stream(model_stack["cog"], {
        "prompt": "What is 4+4?", "prompt_template": rf.FEW_SHOT, "json_schema": json.dumps(ANSWER_SCHEMA),
        "temperature": 0, "max_tokens": 40})
    assert final["status"] == "succeeded", final
    thought, answer = _thought_and_answer(text)
    assert thought == "Four plus four."
    jsonschema.validate(answer, ANSWER_SCHEMA)
    metrics = final["metrics"]
    assert metrics["reasoning_token_count"] == len(rf.ids(model_stack["tok"], thought)) + 1  # and </think>


def test_a_real_models_thought_ended_by_its_budget_is_followed_by_a_valid_answer(model_stack) -> None:
    """The budget stops the real model after two tokens of thought; the answer request (the prompt, the thought and
    </think>) is guided by the answer's grammar alone, and the model answers in JSON."""
    import jsonschema

    text, final = _stream(model_stack["cog"], {
        "prompt": "What is 4+4?", "prompt_template": rf.FEW_SHOT, "json_schema": json.dumps(ANSWER_SCHEMA),
        "temperature": 0, "max_tokens": 40, "thinking_budget_tokens": 3})
    assert final["status"] == "succeeded", final
    thought, answer = _thought_and_answer(text)
    assert thought == "Four plus"
    jsonschema.validate(answer, ANSWER_SCHEMA)
    assert final["metrics"]["reasoning_token_count"] == 3 and final["metrics"]["thinking_budget_reached"] is True
