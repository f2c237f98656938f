"""End to end: structured output (guided decoding) and conversations through the real Cog HTTP server
(coglet) running predict.py, a real Triton Inference Server, the ensemble and the CPU reference
``tensorrt_llm`` model enforcing the guide with xgrammar, on the bundled SmolLM2-135M-Instruct.
Nothing is mocked. The session's shared Cog server (``shared_stack``, tests/conftest.py, also used by
tests/test_integration.py); every generation is greedy and short (the model makes about 18 tokens/s on 2 cores).
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import jsonschema
import pytest

from cog_triton.streaming.prompt import PromptTokenizer
from tests.stacks import STACK_SETTINGS

pytestmark = pytest.mark.integration

MAX_INPUT_LEN = int(STACK_SETTINGS["COG_TRITON_REFERENCE_MAX_INPUT_LEN"])  # 384
MAX_SEQ_LEN = int(STACK_SETTINGS["COG_TRITON_REFERENCE_MAX_SEQ_LEN"])  # 768

SCHEMAS = {
    "nested_object_number_bounds": (
        "Describe Paris as a JSON object with its country and population.",
        {
            "type": "object",
            "properties": {
                "city": {
                    "type": "object",
                    "properties": {"name": {"type": "string", "maxLength": 20}, "country": {"type": "string", "maxLength": 20}},
                    "required": ["name", "country"],
                },
                "population_millions": {"type": "number", "minimum": 0, "maximum": 50},
            },
            "required": ["city", "population_millions"],
        },
    ),
    "array": (
        "List three fruits as JSON.",
        {
            "type": "object",
            "properties": {"fruits": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 3, "maxItems": 3}},
            "required": ["fruits"],
        },
    ),
    "enum_integer_bounds": (
        "What colour is the sky? Answer in JSON.",
        {
            "type": "object",
            "properties": {"colour": {"enum": ["red", "green", "blue"]}, "confidence": {"type": "integer", "minimum": 1, "maximum": 10}},
            "required": ["colour", "confidence"],
        },
    ),
    "number_and_boolean": (
        "Give the temperature of boiling water in Celsius as JSON.",
        {
            "type": "object",
            "properties": {"celsius": {"type": "number", "minimum": -50, "maximum": 150}, "ok": {"type": "boolean"}},
            "required": ["celsius", "ok"],
        },
    ),
}
DATE = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-[0-3][0-9]"
THREE_TURNS = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "2+2 is 4."},
    {"role": "user", "content": "And 3+3?"},
]


def _output(doc: dict[str, Any]) -> str:
    assert doc["status"] == "succeeded", doc.get("error") or doc
    out = doc["output"]
    return "".join(out) if isinstance(out, list) else out


def _failed(doc: dict[str, Any], *fragments: str) -> str:
    assert doc["status"] == "failed", doc
    for fragment in fragments:
        assert fragment in doc["error"], (fragment, doc["error"])
    return doc["error"]


def _template_ids(tokenizer, messages) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _greedy(hf_model, hf_tokenizer, ids: list[int], max_new_tokens: int) -> str:
    import torch

    with torch.inference_mode():
        out = hf_model.generate(
            torch.tensor([ids]), do_sample=False, max_new_tokens=max_new_tokens, attention_mask=torch.ones(1, len(ids))
        )
    new = out[0, len(ids):].tolist()
    if hf_tokenizer.eos_token_id in new:
        new = new[: new.index(hf_tokenizer.eos_token_id)]
    return hf_tokenizer.decode(new, skip_special_tokens=True)


@pytest.fixture
def cog(shared_stack):
    """The Cog server of the session's shared stack (tests/conftest.py: MAX_INPUT_LEN and MAX_SEQ_LEN here)."""
    return shared_stack["cog"]


GUIDED_ALONE: dict[str, str] = {}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_json_schema_output_parses_and_validates(cog, name: str) -> None:
    prompt, schema = SCHEMAS[name]
    doc = cog.predict({"prompt": prompt, "json_schema": json.dumps(schema), "max_tokens": 80, "temperature": 0})
    text = _output(doc)
    jsonschema.validate(json.loads(text), schema)
    assert doc["metrics"]["output_token_count"] < 80  # it ended on the end token, once the document was complete
    GUIDED_ALONE[name] = text


def test_json_schema_with_sampling_and_openai_wrapper_streams_valid_json(cog) -> None:
    """Over SSE, sampled (not greedy), with the schema in OpenAI's {"name", "schema", "strict"} wrapper."""
    prompt, schema = SCHEMAS["enum_integer_bounds"]
    wrapped = {"name": "sky", "strict": True, "schema": schema}
    events = list(cog.stream({"prompt": prompt, "json_schema": json.dumps(wrapped), "max_tokens": 60, "temperature": 0.8, "seed": 7}))
    assert events[-1][0] == "completed" and events[-1][1]["status"] == "succeeded", events[-1]
    text = "".join(data["chunk"] for name, data in events if name == "output")
    jsonschema.validate(json.loads(text), schema)


def test_response_format_json_object_gives_json(cog) -> None:
    doc = cog.predict({"prompt": "Reply with a JSON object with keys name and age for a person.", "response_format": "json_object",
                       "max_tokens": 60, "temperature": 0})  # fmt: skip
    assert isinstance(json.loads(_output(doc)), (dict, list))


def test_regex_output_matches_its_pattern(cog) -> None:
    doc = cog.predict({"prompt": "When did World War II end? Give the date.", "regex": DATE, "max_tokens": 20, "temperature": 0})
    assert re.fullmatch(DATE, _output(doc))


def test_grammar_output_follows_it(cog) -> None:
    doc = cog.predict({"prompt": "Is water wet?", "grammar": 'root ::= ("yes" | "no") "."', "max_tokens": 10, "temperature": 0})
    assert _output(doc) in ("yes.", "no.")


def test_min_tokens_and_stop_sequences_work_with_a_guide(cog) -> None:
    """min_tokens holds the end back only where the grammar may go on (TensorRT-LLM's masks: the guide's
    -inf, min length's -FLT_MAX); a stop sequence cuts the guided text exactly as an unguided one."""
    base = {"prompt": "Is water wet?", "grammar": 'root ::= ("yes" | "no") "."', "max_tokens": 10, "temperature": 0}
    alone = _output(cog.predict(base))
    assert _output(cog.predict({**base, "min_tokens": 8})) == alone
    digits = cog.predict({"prompt": "Say a number.", "regex": "[0-9]+", "max_tokens": 12, "min_tokens": 5, "temperature": 0})
    assert digits["metrics"]["output_token_count"] >= 5 and _output(digits).isdigit()
    prompt, schema = SCHEMAS["array"]
    full = GUIDED_ALONE.get("array") or _output(cog.predict({"prompt": prompt, "json_schema": json.dumps(schema), "max_tokens": 80, "temperature": 0}))
    cut = cog.predict({"prompt": prompt, "json_schema": json.dumps(schema), "max_tokens": 80, "temperature": 0, "stop_sequences": "banana"})
    assert _output(cut) == full[: full.index("banana")]


def test_guided_and_unguided_predictions_run_concurrently(cog, hf_model, hf_tokenizer) -> None:
    prompt, schema = SCHEMAS["array"]
    expected_guided = GUIDED_ALONE.get("array") or _output(cog.predict({"prompt": prompt, "json_schema": json.dumps(schema), "max_tokens": 80, "temperature": 0}))
    plain = "What is a cat?"
    expected_plain = _greedy(hf_model, hf_tokenizer, PromptTokenizer(hf_tokenizer).encode(plain).ids, 24)
    jobs = {
        "guided": {"prompt": prompt, "json_schema": json.dumps(schema), "max_tokens": 80, "temperature": 0},
        "plain": {"prompt": plain, "max_tokens": 24, "temperature": 0},
    }
    results: dict[str, dict[str, Any]] = {}
    spans: dict[str, tuple[float, float]] = {}

    def run(name: str) -> None:
        started = time.monotonic()
        results[name] = cog.predict(jobs[name])
        spans[name] = (started, time.monotonic())

    threads = [threading.Thread(target=run, args=(name,)) for name in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert _output(results["guided"]) == expected_guided
    jsonschema.validate(json.loads(_output(results["guided"])), schema)
    assert _output(results["plain"]) == expected_plain  # the guide's mask never reached the other request
    assert max(s for s, _ in spans.values()) < min(e for _, e in spans.values()), spans


@pytest.mark.parametrize(
    ("inputs", "fragments"),
    [
        ({"json_schema": '{"type": "objec"}'}, ["[invalid_input] json_schema is not a JSON Schema", 'Unsupported type "objec"']),
        ({"json_schema": "{not json"}, ["[invalid_input] json_schema is not valid JSON", "line 1 column 2"]),
        ({"regex": "[a-z"}, ["[invalid_input] regex is not a regular expression", "Unclosed '['"]),
        ({"grammar": "root ::= foo"}, ["[invalid_input] grammar is not an EBNF grammar", 'Rule "foo" is not defined']),
        ({"regex": "a", "grammar": 'root ::= "a"'}, ["regex and grammar are both set"]),
    ],
)
def test_a_bad_guide_is_refused_before_triton(cog, inputs: dict[str, str], fragments: list[str]) -> None:
    doc = cog.predict({"prompt": "Hi", "max_tokens": 8, **inputs})
    _failed(doc, *fragments)
    assert doc.get("output") in (None, []), "refused before any output"
    assert _output(cog.predict({"prompt": "Say hi.", "max_tokens": 3, "temperature": 0}))


def test_a_document_cut_by_max_tokens_fails_the_prediction(cog) -> None:
    prompt, schema = SCHEMAS["nested_object_number_bounds"]
    doc = cog.predict({"prompt": prompt, "json_schema": json.dumps(schema), "max_tokens": 6, "temperature": 0})
    _failed(doc, "[incomplete_output] the output is not a complete JSON document (asked for by json_schema)",
            "after 6 tokens", "max_tokens=6", "raise max_tokens")  # fmt: skip
    assert doc["metrics"]["output_token_count"] == 6


# --- conversations ---------------------------------------------------------------------------------


def test_a_three_turn_conversation_reaches_the_model_as_the_chat_templates_tokens(cog, hf_model, hf_tokenizer) -> None:
    """input_token_count is the length of apply_chat_template's ids, and the greedy answer is what
    transformers generates from exactly those ids."""
    ids = _template_ids(hf_tokenizer, THREE_TURNS)
    doc = cog.predict({"messages": json.dumps(THREE_TURNS), "max_tokens": 16, "temperature": 0})
    assert doc["metrics"]["input_token_count"] == len(ids)
    assert _output(doc) == _greedy(hf_model, hf_tokenizer, ids, 16)
    with_system = cog.predict({"messages": json.dumps(THREE_TURNS), "system_prompt": "Answer in one word.", "max_tokens": 8, "temperature": 0})
    system_ids = _template_ids(hf_tokenizer, [{"role": "system", "content": "Answer in one word."}, *THREE_TURNS])
    assert with_system["metrics"]["input_token_count"] == len(system_ids)
    assert _output(with_system) == _greedy(hf_model, hf_tokenizer, system_ids, 8)


def test_a_conversation_with_structured_output(cog) -> None:
    messages = [*THREE_TURNS[:2], {"role": "user", "content": "And 3+3? Answer as JSON."}]
    schema = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 100}}, "required": ["answer"]}
    doc = cog.predict({"messages": json.dumps(messages), "json_schema": json.dumps(schema), "max_tokens": 30, "temperature": 0})
    jsonschema.validate(json.loads(_output(doc)), schema)


@pytest.mark.parametrize(
    ("inputs", "fragments"),
    [
        ({"prompt": "Hi", "messages": json.dumps(THREE_TURNS)}, ["prompt and messages are both given", "exactly one"]),
        ({"max_tokens": 5}, ["give exactly one of prompt", "messages"]),
        ({"messages": '[{"role": "hacker", "content": "hi"}]'}, ["messages[0] has role 'hacker'", "allowed roles: assistant, system, user"]),
        ({"messages": json.dumps([{"role": "system", "content": "A"}, *THREE_TURNS]), "system_prompt": "B"}, ["give the system message once"]),
        ({"messages": json.dumps([{"role": "user", "content": "word " * 200}, {"role": "assistant", "content": "ok"},
                                  {"role": "user", "content": "word " * 200}])},
         ["the conversation is too long", "tokens (after the chat template)", f"maximum input length is {MAX_INPUT_LEN} tokens"]),
    ],
)
def test_bad_conversations_fail_clearly(cog, inputs: dict[str, Any], fragments: list[str]) -> None:
    doc = cog.predict(inputs)
    error = _failed(doc, *fragments)
    if "too long" in error:
        count = int(re.search(r"it has (\d+) tokens", error).group(1))  # type: ignore[union-attr]
        assert count > MAX_INPUT_LEN
