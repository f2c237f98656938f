"""Tests of cog_triton.streaming.thinking_generation's per-request part, with the fixture tokenizers of each family's
format (tests/reasoning_fixtures.py): the guide a model that thinks is sent, the thinking budget planned or refused,
and the guided answer checked. No request is sent (the gRPC address is never dialled); the per-token part, with its
budget, stop sequences and guides, runs through the real stack in tests/test_reasoning_integration.py."""

from __future__ import annotations

import dataclasses
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

from common.errors import IncompleteOutputError, InputError  # noqa: E402
from cog_triton.ipc import answer_request_id  # noqa: E402
from cog_triton.reasoning import resolve  # noqa: E402
from cog_triton.streaming.client import GenerateRequest  # noqa: E402
from cog_triton.streaming.thinking import harmony_forced_end_max  # noqa: E402
from cog_triton.streaming.thinking_generation import _answer_request, check_guided_answer  # noqa: E402
from tests import reasoning_fixtures as rf  # noqa: E402

SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
_GENERATORS: dict[tuple[str, bool, int], object] = {}


def generator(name: str, *, guided: bool = True, max_input_len: int = 512):
    """The Generator of fixture ``name`` ("": the default model's), built once per process."""
    from cog_triton.stream_config import GeneratorConfig
    from cog_triton.streaming.generation import build_generator
    from tensorrtllm_backend.engine import ModelLimits

    key = (name, guided, max_input_len)
    if key not in _GENERATORS:
        from tests.test_reasoning import CHECKPOINT, smollm2

        folder = rf.tokenizer_dir(name) if name else CHECKPOINT
        config = GeneratorConfig(tokenizer_dir=folder, grpc_address="127.0.0.1:9", guided=guided,
                                 guided_off_reason="" if guided else "off in this test",
                                 limits=ModelLimits(4, max_input_len=max_input_len, max_seq_len=1024))
        _GENERATORS[key] = build_generator(config, tokenizer=rf.tokenizer(name) if name else smollm2())
    return _GENERATORS[key]


def inputs(gen, **given):
    from cog_triton.worker.inputs import validate_inputs

    checked = validate_inputs(prompt=given.pop("prompt", "Q"), seed=1, **given)
    resolved = resolve(gen.template, checked.reasoning_effort, checked.chat_template_kwargs,
                       prompt_template=checked.prompt_template is not None)
    return dataclasses.replace(checked, template_kwargs=resolved.template_kwargs)


def accepts(gen, request: GenerateRequest, text: str) -> bool:
    """Whether the engine's matcher of the request's grammar takes ``text``'s tokens, then the end token."""
    from cog_triton.ipc import Guide

    ids = rf.ids(gen.tokenizer, text)
    return gen.guides.is_complete(Guide(request.guide_type, request.guide, "test"), ids)


# --- guides -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "given", "output"), [
    ("qwen3", {}, "<think>\nHm.\n</think>\n\n{\"a\": 1}"),
    ("deepseek_r1", {}, "Hm.\n</think>\n\n{\"a\": 1}"),  # once refused: the prompt opens the thinking
    ("gpt_oss", {}, "<|channel|>analysis<|message|>Hm.<|end|><|start|>assistant<|channel|>final<|message|>"
                    "{\"a\": 1}"),  # once refused: harmony's channels
    ("magistral", {}, "[THINK]Hm.[/THINK]{\"a\": 1}"),
])
def test_a_guide_on_a_model_that_thinks_is_sent_as_one_grammar_that_lets_the_thinking_through(name, given,
                                                                                            output) -> None:
    gen = generator(name)
    prepared = gen.prepare(inputs(gen, json_schema=SCHEMA, **given), "g")
    request = prepared.request
    assert request.guide_type == "ebnf_grammar" and "TagDispatch" in request.guide
    assert accepts(gen, request, output)
    assert not accepts(gen, request, output.replace('"a"', '"b"'))
    assert prepared.budget is None


def test_with_the_thinking_off_the_guide_is_sent_as_it_is() -> None:
    gen = generator("qwen3")
    given = inputs(gen, json_schema=SCHEMA, reasoning_effort="none")
    request = gen.prepare(given, "g").request
    assert (request.guide_type, request.guide) == ("json_schema", given.guide.guide)
    plain = generator("")  # a model that does not think: as before
    assert plain.prepare(inputs(plain, json_schema=SCHEMA), "p").request.guide_type == "json_schema"


def test_a_format_a_grammar_cannot_write_is_refused_naming_reasoning_effort_none(monkeypatch) -> None:
    gen = generator("qwen3")
    fmt = gen.template.thinking
    monkeypatch.setattr(gen.guides, "unwritable_markers", lambda f: [f.close_text] if f is fmt else [])
    with pytest.raises(InputError) as error:
        gen.prepare(inputs(gen, regex="[0-9]+"), "u")
    message = error.value.message
    assert "a guided-decoding grammar cannot write its thinking markers (</think>" in message
    assert "use reasoning_effort=none to turn the thinking off, or leave regex empty" in message
    gen.prepare(inputs(gen, regex="[0-9]+", reasoning_effort="none"), "v")  # thinking off: served
    r1 = generator("deepseek_r1")  # no way to turn it off: only the guide can go
    monkeypatch.setattr(r1.guides, "unwritable_markers", lambda f: ["</think>"])
    with pytest.raises(InputError, match="; leave regex empty"):
        r1.prepare(inputs(r1, regex="[0-9]+"), "w")


# --- the thinking budget -------------------------------------------------------------------------------------------


def test_a_budget_is_planned_with_the_guide_of_its_answer_request() -> None:
    gen = generator("qwen3")
    prepared = gen.prepare(inputs(gen, thinking_budget_tokens=64, json_schema=SCHEMA, max_tokens=300), "b")
    budget = prepared.budget
    assert budget is not None and budget.tokens == 64
    assert budget.answer_guide["guide_type"] == "ebnf_grammar"
    after = dataclasses.replace(prepared.request, guide_type=budget.answer_guide["guide_type"],
                                guide=budget.answer_guide["guide"])
    assert accepts(gen, after, '\n\n{"a": 2}') and not accepts(gen, after, '<think>{"a": 2}')
    oss = generator("gpt_oss")
    given = inputs(oss, thinking_budget_tokens=64, json_schema=SCHEMA)
    plan = oss.prepare(given, "h").budget  # after harmony's forced final header the answer begins at once
    assert plan is not None and plan.answer_guide == {"guide_type": "json_schema", "guide": given.guide.guide}
    assert gen.prepare(inputs(gen, thinking_budget_tokens=64), "n").budget.answer_guide == {}
    assert gen.prepare(inputs(gen), "z").budget is None


def test_the_answer_request_continues_the_prompt_with_the_thinking_and_its_ending() -> None:
    gen = generator("qwen3")
    prepared = gen.prepare(inputs(gen, thinking_budget_tokens=8, json_schema=SCHEMA, max_tokens=20, min_tokens=10),
                           "req-7")
    continuation = [5, 6, 7, gen.template.thinking.close_id]
    following = _answer_request(gen, prepared, prepared.budget, continuation)
    request = following.request
    assert request.input_ids == prepared.request.input_ids + continuation
    assert (request.max_tokens, request.min_tokens) == (16, 6)
    assert request.request_id == answer_request_id("req-7") == "req-7-answer"
    assert (request.guide_type, request.guide) == (prepared.budget.answer_guide["guide_type"],
                                                   prepared.budget.answer_guide["guide"])
    assert (request.seed, request.temperature) == (prepared.request.seed, prepared.request.temperature)
    assert _answer_request(gen, prepared, prepared.budget, list(range(20))) is None  # max_tokens all thinking


@pytest.mark.parametrize(("name", "given", "phrase"), [
    ("", {"thinking_budget_tokens": 100}, "thinking_budget_tokens=100 bounds a model's thinking, and this model "
                                          "does not think"),
    ("qwen3", {"thinking_budget_tokens": 100, "reasoning_effort": "none"},
     "this prediction's prompt turns the thinking off (reasoning_effort=none turns it off); give 0"),
    ("qwen3", {"thinking_budget_tokens": 1}, "its thinking takes at least 2 tokens (the markers <think> and </think>)"),
    ("gpt_oss", {"thinking_budget_tokens": 3}, "ending a harmony thinking message and opening the final channel"),
])
def test_a_budget_that_cannot_apply_is_refused_saying_why(name: str, given: dict, phrase: str) -> None:
    gen = generator(name)
    with pytest.raises(InputError) as error:
        gen.prepare(inputs(gen, **given), "r")
    assert phrase in error.value.message, error.value.message


def test_the_least_budgets() -> None:
    r1 = generator("deepseek_r1")  # the prompt opened the thinking: the closing marker alone
    assert r1.prepare(inputs(r1, thinking_budget_tokens=1), "a").budget.tokens == 1
    qwen = generator("qwen3")
    assert qwen.prepare(inputs(qwen, thinking_budget_tokens=2), "b").budget.tokens == 2
    oss = generator("gpt_oss")
    least = harmony_forced_end_max(oss.tokenizer)
    assert oss.prepare(inputs(oss, thinking_budget_tokens=least), "c").budget.tokens == least
    with pytest.raises(InputError, match=f"give 0 \\(no budget\\) or at least {least}"):
        oss.prepare(inputs(oss, thinking_budget_tokens=least - 1), "d")


def test_a_budget_whose_answer_request_would_not_fit_the_input_length_is_refused() -> None:
    gen = generator("qwen3", max_input_len=64)
    prompt_tokens = gen.prepare(inputs(gen, prompt="A question."), "x").prompt_tokens
    room = 64 - prompt_tokens
    ok = gen.prepare(inputs(gen, prompt="A question.", thinking_budget_tokens=room, max_tokens=500), "y")
    assert ok.budget.tokens == room
    with pytest.raises(InputError) as error:
        gen.prepare(inputs(gen, prompt="A question.", thinking_budget_tokens=room + 1, max_tokens=500), "z")
    assert f"{prompt_tokens} + {room + 1} tokens, and the model's maximum input length is 64 tokens; give at most " \
           f"{room}" in error.value.message
    # a budget the tokens cannot reach is never cut, so nothing is continued: no limit to check
    assert gen.prepare(inputs(gen, prompt="A question.", thinking_budget_tokens=999, max_tokens=30), "w").budget


# --- the guided answer, checked -----------------------------------------------------------------------------------


def test_the_answer_the_caller_gets_is_checked_against_the_guide() -> None:
    gen = generator("qwen3")
    given = inputs(gen, json_schema=SCHEMA, max_tokens=40)
    request = GenerateRequest(input_ids=[1], max_tokens=40)
    check_guided_answer(gen, given, request, '{"a": 1}', True, 12, 6, 12)  # complete
    with pytest.raises(IncompleteOutputError) as limit:
        check_guided_answer(gen, given, request, '{"a": ', True, 40, 30, 40)
    assert ("generation stopped after 40 tokens (30 of them thinking; thinking_budget_tokens bounds it) at the "
            "token limit (max_tokens=40)") in limit.value.message
    with pytest.raises(IncompleteOutputError) as spelled:
        check_guided_answer(gen, given, request, "", False, 12, 12, 12)
    assert "the model wrote the end of its thinking as ordinary text, not as its marker token" in \
        spelled.value.message
    second = GenerateRequest(input_ids=[1], max_tokens=10)  # an answer request: 30 tokens before it
    budgeted = inputs(gen, json_schema=SCHEMA, max_tokens=40, thinking_budget_tokens=30)
    with pytest.raises(IncompleteOutputError, match="30 of them thinking, which thinking_budget_tokens bounds"):
        check_guided_answer(gen, budgeted, second, '{"a"', True, 10, 30, 40)
