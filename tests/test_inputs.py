"""Tests of cog_triton.worker.inputs: validation of every prediction input, the token budget, and prompt
rendering with the real SmolLM2 tokenizer of the default model."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

from common.errors import InputError  # noqa: E402
from cog_triton.ipc import Guide
from cog_triton.worker.inputs import FLOAT32_TINY, check_text
from cog_triton.ipc import PredictInputs
from cog_triton.worker.inputs import validate_inputs
from cog_triton.streaming.token_budget import token_budget
from cog_triton.schema import input_specs  # noqa: E402
from cog_triton.worker.stop_sequences import MAX_STOP_SEQUENCE_LENGTH, MAX_STOP_SEQUENCES

CHECKPOINT = Path(__file__).resolve().parents[1] / "build" / "default_model" / "checkpoint"


def validate(**overrides: Any) -> PredictInputs:
    kwargs: dict[str, Any] = {"prompt": "Hello", "seed": 1}
    kwargs.update(overrides)
    return validate_inputs(**kwargs)


def rejected(**overrides: Any) -> str:
    with pytest.raises(InputError) as info:
        validate(**overrides)
    assert info.value.code == "invalid_input"
    return str(info.value)


# --- bad values: the message names the input, the value and what is allowed ------------------

MAX_SEED = 2**53 - 1
INT32_MAX = 2**31 - 1
INT_RANGE = {"max_tokens": f"1 to {INT32_MAX}", "min_tokens": f"-1 to {INT32_MAX}", "top_k": "-1 to 1024"}
FLOAT_RANGE = {
    "temperature": "0 to 5",
    "top_p": "0 to 1",
    "repetition_penalty": "0.01 to 10",
    "presence_penalty": "-2 to 2",
    "frequency_penalty": "-2 to 2",
}
SEED_RANGE = f"0 to {MAX_SEED}"

BAD_VALUES = [
    # (input, bad value, text showing the value, text showing what is allowed)
    ("max_tokens", 0, "max_tokens=0", INT_RANGE["max_tokens"]),
    ("max_tokens", -1, "max_tokens=-1", INT_RANGE["max_tokens"]),
    ("max_tokens", 1.5, "1.5", INT_RANGE["max_tokens"]),
    ("max_tokens", "10", "'10'", INT_RANGE["max_tokens"]),
    ("max_tokens", True, "True", INT_RANGE["max_tokens"]),
    ("max_tokens", INT32_MAX + 1, f"max_tokens={INT32_MAX + 1}", INT_RANGE["max_tokens"]),
    ("max_tokens", None, "None", INT_RANGE["max_tokens"]),
    ("max_tokens", float("nan"), "nan", INT_RANGE["max_tokens"]),
    ("min_tokens", -2, "min_tokens=-2", INT_RANGE["min_tokens"]),
    ("min_tokens", 0.5, "0.5", INT_RANGE["min_tokens"]),
    ("temperature", -0.1, "temperature=-0.1", FLOAT_RANGE["temperature"]),
    ("temperature", 5.1, "temperature=5.1", FLOAT_RANGE["temperature"]),
    ("temperature", 5.0000001, "temperature=5.0000001", FLOAT_RANGE["temperature"]),
    ("temperature", float("nan"), "nan", FLOAT_RANGE["temperature"]),
    ("temperature", float("inf"), "inf", FLOAT_RANGE["temperature"]),
    ("temperature", float("-inf"), "-inf", FLOAT_RANGE["temperature"]),
    ("temperature", "hot", "'hot'", FLOAT_RANGE["temperature"]),
    ("temperature", True, "True", FLOAT_RANGE["temperature"]),
    ("temperature", 10**400, "temperature=1000", FLOAT_RANGE["temperature"]),  # too big for a float
    ("top_p", 1.1, "top_p=1.1", FLOAT_RANGE["top_p"]),
    ("top_p", -0.5, "top_p=-0.5", FLOAT_RANGE["top_p"]),
    ("top_k", -2, "top_k=-2", INT_RANGE["top_k"]),
    # above TOP_K_MAX (1024): TensorRT-LLM would clamp it with only a log warning
    ("top_k", 1025, "top_k=1025", INT_RANGE["top_k"]),
    ("length_penalty", -0.1, "length_penalty=-0.1", "0 to 5"),
    ("length_penalty", 5.5, "length_penalty=5.5", "0 to 5"),
    ("max_new_tokens", 0, "max_new_tokens=0", f"1 to {INT32_MAX}"),
    ("min_new_tokens", -2, "min_new_tokens=-2", f"-1 to {INT32_MAX}"),
    ("top_k", 2.5, "2.5", INT_RANGE["top_k"]),
    ("repetition_penalty", 0, "repetition_penalty=0", FLOAT_RANGE["repetition_penalty"]),
    ("repetition_penalty", 0.00999, "repetition_penalty=0.00999", FLOAT_RANGE["repetition_penalty"]),
    ("repetition_penalty", 11, "repetition_penalty=11", FLOAT_RANGE["repetition_penalty"]),
    ("presence_penalty", -2.1, "presence_penalty=-2.1", FLOAT_RANGE["presence_penalty"]),
    ("presence_penalty", 2.1, "presence_penalty=2.1", FLOAT_RANGE["presence_penalty"]),
    ("frequency_penalty", -2.1, "frequency_penalty=-2.1", FLOAT_RANGE["frequency_penalty"]),
    ("frequency_penalty", 2.1, "frequency_penalty=2.1", FLOAT_RANGE["frequency_penalty"]),
    ("frequency_penalty", [1], "[1]", FLOAT_RANGE["frequency_penalty"]),
    ("seed", -1, "seed=-1", SEED_RANGE),
    ("seed", 2**53, f"seed={2**53}", SEED_RANGE),
    ("seed", "x", "'x'", SEED_RANGE),
    ("seed", True, "True", SEED_RANGE),
    ("seed", 1.5, "1.5", SEED_RANGE),
]


@pytest.mark.parametrize(("name", "value", "shown", "allowed"), BAD_VALUES, ids=lambda v: repr(v)[:20])
def test_bad_numeric_inputs(name: str, value: Any, shown: str, allowed: str) -> None:
    message = rejected(**{name: value})
    assert name in message
    assert shown in message
    assert allowed in message


def test_bad_value_is_shortened_in_the_message() -> None:
    message = rejected(temperature="x" * 10_000)
    assert "temperature" in message and "xxx" in message and len(message) < 300


@pytest.mark.parametrize(
    ("value", "shown"),
    [(5, "5"), (b"Hello", "b'Hello'"), (["Hello"], "['Hello']")],
)
def test_prompt_not_a_string(value: Any, shown: str) -> None:
    message = rejected(prompt=value)
    assert message.startswith("[invalid_input] prompt must be a string (or empty when messages is given)")
    assert f"got {shown}" in message


def test_prompt_none_is_an_empty_prompt() -> None:
    message = rejected(prompt=None)
    assert "prompt='' is empty" in message and "give exactly one of prompt" in message and "messages" in message


@pytest.mark.parametrize("value", ["", "   ", "\n\t "])
def test_prompt_empty_or_whitespace(value: str) -> None:
    message = rejected(prompt=value)
    assert f"prompt={value!r}" in message
    assert "empty or only whitespace" in message and "non-empty" in message


def test_prompt_too_long() -> None:
    message = rejected(prompt="a" * 1_000_001)
    assert "prompt has 1000001 characters" in message and "at most 1000000" in message


def test_system_prompt_not_a_string() -> None:
    message = rejected(system_prompt=42)
    assert "system_prompt" in message and "got 42" in message and "must be a string" in message


def test_prompt_template_without_prompt_placeholder() -> None:
    message = rejected(prompt_template="<s>[INST] {system_prompt} [/INST]")
    assert "prompt_template='<s>[INST] {system_prompt} [/INST]'" in message
    assert "must contain {prompt}" in message


def test_prompt_template_not_a_string() -> None:
    message = rejected(prompt_template=3)
    assert "prompt_template" in message and "got 3" in message and "{prompt}" in message


@pytest.mark.parametrize(("min_tokens", "max_tokens"), [(11, 10), (2, 1)])
def test_min_tokens_greater_than_max_tokens(min_tokens: int, max_tokens: int) -> None:
    message = rejected(min_tokens=min_tokens, max_tokens=max_tokens)
    assert f"min_tokens={min_tokens}" in message
    assert f"max_tokens={max_tokens}" in message
    assert "allowed: 0 to max_tokens" in message


@pytest.mark.parametrize(
    ("value", "fragments"),
    [
        (5, ["stop_sequences", "5", "int", "comma-separated"]),
        ({"a": 1}, ["stop_sequences", "{'a': 1}", "dict"]),
        ('["a", 1]', ["stop_sequences", "contains 1", "must be a string"]),
        (["a", None], ["stop_sequences", "contains None"]),
        ('["a",', ["stop_sequences", "'[\"a\",'", "not valid JSON"]),
        (",".join(f"s{i}" for i in range(MAX_STOP_SEQUENCES + 1)), ["stop_sequences", "17 distinct", "at most 16"]),
        ("x" * (MAX_STOP_SEQUENCE_LENGTH + 1), ["stop_sequences", "257 characters", "at most 256"]),
    ],
)
def test_bad_stop_sequences(value: Any, fragments: list[str]) -> None:
    message = rejected(stop_sequences=value)
    for fragment in fragments:
        assert fragment in message


# --- valid values ----------------------------------------------------------------------------


def test_defaults_are_valid_and_come_from_the_schema() -> None:
    inputs = validate_inputs(prompt="Hello")
    defaults = {name: spec.default for name, spec in input_specs().items() if spec.type in ("number", "integer")}
    defaults.pop("seed")
    assert defaults == {
        "temperature": 0.7,
        "top_p": 0.95,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "max_tokens": 512,
        "min_tokens": 0,
        "top_k": 0,
        "length_penalty": 1.0,
        "max_new_tokens": None,  # deprecated aliases: not given
        "min_new_tokens": None,
        "thinking_budget_tokens": 0,
    }
    for name, value in defaults.items():
        if name not in ("max_new_tokens", "min_new_tokens"):
            assert getattr(inputs, name) == value, name
    assert inputs.system_prompt == "" and inputs.prompt_template is None and inputs.stop_sequences == []


def test_valid_values_are_typed() -> None:
    inputs = validate(
        prompt="  Hi  ",
        system_prompt=None,
        prompt_template="   ",
        max_tokens=10.0,
        min_tokens=10,
        temperature=1,
        top_p=1,
        top_k=2.0,
        repetition_penalty=10,
        presence_penalty=-2,
        frequency_penalty=2,
        stop_sequences="<end>,User:",
        seed=MAX_SEED,
    )
    assert inputs.prompt == "  Hi  "  # kept as typed
    assert inputs.system_prompt == ""
    assert inputs.prompt_template is None  # blank template: the chat template is used
    assert inputs.max_tokens == 10 and type(inputs.max_tokens) is int
    assert inputs.min_tokens == 10
    assert inputs.top_k == 2 and type(inputs.top_k) is int
    for name, value in [
        ("temperature", 1.0),
        ("top_p", 1.0),
        ("repetition_penalty", 10.0),
        ("presence_penalty", -2.0),
        ("frequency_penalty", 2.0),
    ]:
        assert getattr(inputs, name) == value and type(getattr(inputs, name)) is float, name
    assert inputs.stop_sequences == ["<end>", "User:"]
    assert inputs.seed == MAX_SEED


@pytest.mark.parametrize(
    "overrides",
    [
        {"temperature": 0},
        {"temperature": 5},
        {"top_p": 1e-9},
        {"top_k": 1024},
        {"max_tokens": 1},
        {"max_tokens": 1_000_000, "min_tokens": 1_000_000},
        {"presence_penalty": -2.0, "frequency_penalty": 2.0},
        {"repetition_penalty": 0.01},
        {"top_p": 0},
        {"seed": 0},
        {"stop_sequences": '["a,b", "\\nUser:"]'},
        {"stop_sequences": ["[INST]"]},
        {"prompt_template": '{"a": 1} {prompt}'},
    ],
)
def test_boundary_values_pass(overrides: dict) -> None:
    inputs = validate(**overrides)
    for name, value in overrides.items():
        if name == "stop_sequences":
            continue
        assert getattr(inputs, name) == value


def test_stop_sequences_json_array_is_parsed() -> None:
    assert validate(stop_sequences='["a,b", "\\nUser:"]').stop_sequences == ["a,b", "\nUser:"]


@pytest.mark.parametrize("seed", [None, ""])
def test_missing_seed_is_drawn_within_range(seed: Any) -> None:
    seeds = {validate(seed=seed).seed for _ in range(50)}
    assert all(isinstance(s, int) and 0 <= s <= 2**31 - 1 <= MAX_SEED for s in seeds)
    assert len(seeds) > 1  # drawn afresh each time


# --- token_budget ----------------------------------------------------------------------------


def test_token_budget_prompt_longer_than_max_input_len() -> None:
    with pytest.raises(InputError) as info:
        token_budget(validate(), prompt_tokens=4097, max_input_len=4096, max_seq_len=8192)
    message = str(info.value)
    assert "4097 tokens" in message and "4096 tokens" in message and "shorten the prompt" in message


def test_token_budget_caps_max_tokens_by_max_seq_len() -> None:
    inputs = validate(max_tokens=512)
    assert token_budget(inputs, prompt_tokens=100, max_input_len=1000, max_seq_len=150) == 50
    assert token_budget(inputs, prompt_tokens=100, max_input_len=1000, max_seq_len=2000) == 512
    assert token_budget(inputs, prompt_tokens=100, max_input_len=1000, max_seq_len=612) == 512
    assert token_budget(inputs, prompt_tokens=100, max_input_len=1000, max_seq_len=611) == 511
    assert token_budget(inputs, prompt_tokens=0, max_input_len=1000, max_seq_len=1) == 1


def test_token_budget_no_room_to_generate() -> None:
    with pytest.raises(InputError) as info:
        token_budget(validate(), prompt_tokens=100, max_input_len=100, max_seq_len=100)
    message = str(info.value)
    assert "100 tokens" in message and "maximum sequence length of 100 tokens" in message


def test_token_budget_min_tokens_must_fit() -> None:
    inputs = validate(min_tokens=60, max_tokens=100)
    with pytest.raises(InputError) as info:
        token_budget(inputs, prompt_tokens=100, max_input_len=1000, max_seq_len=150)
    message = str(info.value)
    assert "min_tokens=60" in message and "100 tokens" in message and "150" in message and "at most 50" in message
    # Exactly fitting is fine.
    assert token_budget(validate(min_tokens=50, max_tokens=100), 100, 1000, 150) == 50


# --- one source of truth: the schema's bounds are exactly the ones enforced --------------------

NUMERIC = [(name, spec) for name, spec in input_specs().items() if spec.type in ("number", "integer")]


@pytest.mark.parametrize(("name", "spec"), NUMERIC, ids=[n for n, _ in NUMERIC])
def test_schema_bounds_are_the_enforced_bounds(name: str, spec) -> None:
    """Every bound in the generated Cog schema (from predict.py's literals) passes at the bound and
    fails just outside it: coglet's 422 check and ours agree, value for value."""
    assert spec.minimum is not None and spec.maximum is not None, f"{name} has no bounds in predict.py"
    step = 1 if spec.type == "integer" else max(abs(spec.minimum), abs(spec.maximum), 1) * 1e-9
    extra = {"max_tokens": spec.maximum} if name in ("min_tokens", "min_new_tokens") else {}
    for ok in (spec.minimum, spec.maximum):
        if name == "max_tokens" and ok < 1:
            continue
        validate(**{name: ok, **extra})
    for bad in (spec.minimum - step, spec.maximum + step):
        message = rejected(**{name: bad, **extra})
        assert name in message and spec.allowed() in message


def test_top_p_zero_means_greedy() -> None:
    assert validate(top_p=0, temperature=0.7).greedy
    assert validate(temperature=0).greedy and validate(top_k=1).greedy
    assert not validate(top_p=0.5, temperature=0.7, top_k=0).greedy


@pytest.mark.parametrize("name", ["temperature", "presence_penalty", "frequency_penalty"])
def test_values_float32_cannot_represent_are_refused(name: str) -> None:
    """repetition_penalty=1e-300 used to pass, become 0.0 in float32 and fail inside Triton: values
    are checked in the engine's dtype."""
    message = rejected(**{name: 1e-300})
    assert f"{name}=1e-300" in message and "float32" in message and "become 0" in message
    validate(**{name: FLOAT32_TINY})  # the smallest normal float32 is fine


@pytest.mark.parametrize(
    ("name", "limit"),
    [("prompt", 1_000_000), ("system_prompt", 1_000_000), ("prompt_template", 100_000), ("stop_sequences", 8192)],
)
def test_text_inputs_are_bounded_before_parsing(name: str, limit: int) -> None:
    assert input_specs()[name].max_length == limit
    value = "{prompt}" + "x" * (limit - 7)
    message = rejected(**{name: value})
    assert f"{name} has {limit + 1} characters; at most {limit} are allowed" in message


def test_unknown_input_is_refused_with_the_list_of_inputs() -> None:
    message = rejected(temprature=0.5)
    assert "unknown input(s) temprature" in message and "temperature" in message


def test_the_generator_holds_prompts_to_the_executors_limit_before_triton() -> None:
    """An engine whose max_input_len is above max_num_tokens: with chunked context off the executor takes
    at most min(max_seq_len - 1, max_num_tokens) prompt tokens (trtGptModel.h), so a longer prompt is refused
    here, naming both numbers and the rule, instead of failing in Triton; with chunked context on it fits.
    No Triton runs: prepare() only tokenizes and builds the request (the address is never dialled)."""
    from cog_triton.streaming.generation import build_generator
    from cog_triton.stream_config import GeneratorConfig
    from tensorrtllm_backend.engine import ModelLimits

    limits = ModelLimits(8, max_input_len=4000, max_seq_len=8192, max_num_tokens=64, packed_context_fmha=True)
    generator = build_generator(GeneratorConfig(tokenizer_dir=CHECKPOINT, limits=limits, grpc_address="127.0.0.1:9"))
    long_prompt = validate(prompt="word " * 100, prompt_template="{prompt}")
    with pytest.raises(InputError) as info:
        generator.prepare(long_prompt, "too-long")
    message = info.value.message
    assert "the prompt is too long: it has 10" in message and "maximum input length is 64 tokens" in message
    assert "min(max_seq_len - 1, max_num_tokens) = min(8191, 64)" in message
    assert generator.prepare(validate(prompt="word " * 40, prompt_template="{prompt}"), "fits").prompt_tokens <= 64
    import dataclasses

    chunked = build_generator(GeneratorConfig(tokenizer_dir=CHECKPOINT, grpc_address="127.0.0.1:9",
                                              limits=dataclasses.replace(limits, enable_chunked_context=True)))
    assert chunked.prepare(long_prompt, "chunked").prompt_tokens > 64


# --- replicate/cog-triton's inputs (predict.py @1434a90) ------------------------------------


@pytest.mark.parametrize(
    ("given", "max_tokens", "min_tokens"),
    [
        ({"max_new_tokens": 1000}, 1000, 0),  # max_tokens at its default: the alias applies
        ({"max_new_tokens": 1000, "max_tokens": 1000}, 1000, 0),  # equal: fine
        ({"min_new_tokens": 7}, 512, 7),
        ({"min_new_tokens": 7, "min_tokens": 7}, 512, 7),
        ({"min_new_tokens": 0, "min_tokens": 5}, 512, 5),  # 0 is "not given" there (if min_new_tokens:)
        ({"min_new_tokens": -1}, 512, 0),  # -1: off
        ({"min_tokens": -1}, 512, 0),
        ({"max_new_tokens": None, "min_new_tokens": None}, 512, 0),
    ],
)
def test_deprecated_aliases_take_over_like_replicates_predictor(given: dict, max_tokens: int, min_tokens: int) -> None:
    inputs = validate(**given)
    assert (inputs.max_tokens, inputs.min_tokens) == (max_tokens, min_tokens)


@pytest.mark.parametrize(
    ("given", "texts"),
    [
        ({"max_new_tokens": 1000, "max_tokens": 300}, ["max_new_tokens is a deprecated alias of max_tokens",
                                                     "max_tokens=300", "max_new_tokens=1000"]),
        ({"min_new_tokens": 4, "min_tokens": 2}, ["min_new_tokens is a deprecated alias of min_tokens",
                                                 "min_tokens=2", "min_new_tokens=4"]),
        ({"min_new_tokens": 4, "min_tokens": -1}, ["min_tokens=-1", "min_new_tokens=4"]),
    ],
)
def test_an_alias_and_its_input_with_different_values_is_an_error(given: dict, texts: list[str]) -> None:
    message = rejected(**given)
    assert all(text in message for text in texts), message


def test_minus_one_turns_top_k_off_and_other_inputs_are_carried() -> None:
    inputs = validate(top_k=-1, length_penalty=2.5, log_performance_metrics=True)
    assert inputs.top_k == 0 and inputs.length_penalty == 2.5 and inputs.log_performance_metrics is True
    assert validate().length_penalty == 1.0 and validate().log_performance_metrics is False
    assert "log_performance_metrics must be true or false" in rejected(log_performance_metrics="yes")


# --- messages, structured output, LoRA: each input reaches PredictInputs ---------------------


def rejected_message(**overrides: Any) -> str:
    """The whole message (without the "[invalid_input]" code) that a user gets for these inputs."""
    with pytest.raises(InputError) as info:
        validate(**overrides)
    return info.value.message


CONVERSATION = '[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, ' \
    '{"role": "assistant", "content": ""}, {"role": "user", "content": " Again "}]'


def test_messages_are_parsed_in_order_and_kept_as_given() -> None:
    inputs = validate(prompt="", messages=CONVERSATION)
    assert inputs.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": ""},  # an empty turn is allowed; only the role must be non-empty
        {"role": "user", "content": " Again "},
    ]
    assert inputs.prompt == "" and inputs.prompt_template is None
    assert validate().messages is None  # a prompt alone is no conversation
    assert validate(system_prompt=" Be brief. ").system_prompt == " Be brief. "  # kept as typed


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('[{"role": "user", "content": "hi"}',
         "messages is not valid JSON (Expecting ',' delimiter at line 1 column 35); "
         'give a JSON array such as [{"role": "user", "content": "Hi"}]'),
        ("{}", 'messages must be a non-empty JSON array of {"role", "content"} objects, got {}'),
        ("[]", 'messages must be a non-empty JSON array of {"role", "content"} objects, got []'),
        ('"Hi"', "messages must be a non-empty JSON array of {\"role\", \"content\"} objects, got 'Hi'"),
        ('[{"role": "user", "content": "a"}, 7]', "messages[1] must be an object with role and content, got 7"),
        ('[{"role": "", "content": "a"}]', "messages[0].role must be a non-empty string, got ''"),
        ('[{"role": " ", "content": "a"}]', "messages[0].role must be a non-empty string, got ' '"),
        ('[{"content": "a"}]', "messages[0].role must be a non-empty string, got None"),
        ('[{"role": 1, "content": "a"}]', "messages[0].role must be a non-empty string, got 1"),
        ('[{"role": "user"}]', "messages[0].content must be a string or a list of content parts, got None"),
        ('[{"role": "user", "content": ["a"]}]',
         "messages[0].content[0] must be an object with a type (text, image_url), got 'a'"),
        ('[{"role": "user", "content": "a"}, {"role": "user", "content": "b", "name": "x", "id": 1}]',
         "messages[1] has unknown key(s) id, name; each message has role and content (and an assistant message may "
         "have reasoning_content)"),
    ],
    ids=["not-json", "object", "empty", "string", "item-not-object", "empty-role", "blank-role", "no-role",
         "role-not-string", "no-content", "content-not-string", "unknown-keys"],
)
def test_bad_messages_are_refused_naming_the_item(text: str, message: str) -> None:
    assert rejected_message(prompt="", messages=text) == message


def test_prompt_and_messages_together_or_with_a_template_are_refused() -> None:
    assert rejected_message(messages=CONVERSATION) == (
        "prompt and messages are both given; give exactly one: prompt for a single user turn, or messages for a "
        "whole conversation (add the prompt as the last user message)"
    )
    assert rejected_message(prompt="", messages=CONVERSATION, prompt_template="{prompt}") == (
        "prompt_template applies to prompt; messages are rendered with the model's chat template, so leave "
        "prompt_template empty (or send prompt instead of messages)"
    )
    # blank messages are "not given": the prompt is used
    assert validate(messages="  ").messages is None


def test_a_blank_prompt_is_shown_shortened_in_the_message() -> None:
    assert rejected_message(prompt=" " * 100) == (
        "prompt='" + " " * 36 + "... is empty or only whitespace, and so is messages; give exactly one of prompt "
        "(a non-empty text to respond to) or messages (a JSON array of role/content objects)"
    )


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("messages", "a JSON array of messages as a string (or empty)"),
        ("system_prompt", "a string (or empty)"),
        ("prompt_template", "a string containing {prompt} (or empty)"),
        ("json_schema", "a JSON Schema as a string (or empty)"),
        ("regex", "a regular expression as a string (or empty)"),
        ("grammar", "an EBNF grammar as a string (or empty)"),
        ("lora_weights", "a URL or hf:// reference (or empty)"),
    ],
)
def test_a_text_input_of_another_type_is_refused_saying_what_it_takes(name: str, expected: str) -> None:
    assert rejected_message(**{name: 5}) == f"{name} must be {expected}, got 5 (int)"


@pytest.mark.parametrize("name", ["messages", "json_schema", "regex", "grammar", "lora_weights"])
def test_text_inputs_are_bounded_at_exactly_their_max_length(name: str) -> None:
    limit = input_specs()[name].max_length
    assert limit is not None
    assert rejected_message(**{name: " " * (limit + 1)}) == (
        f"{name} has {limit + 1} characters; at most {limit} are allowed"
    )
    inputs = validate(**{name: " " * limit})  # exactly the limit: accepted (blank, so "not given")
    assert inputs.messages is None and inputs.guide is None and inputs.lora is None


def test_check_text_says_a_string_unless_told_otherwise() -> None:
    with pytest.raises(InputError) as info:
        check_text("prompt", ["Hi"])
    assert info.value.message == "prompt must be a string, got ['Hi'] (list)"
    with pytest.raises(InputError):
        check_text("prompt", None, empty_ok=False)
    assert check_text("prompt", None) == ""


def test_a_long_prompt_template_without_placeholder_is_shown_by_its_first_80_characters() -> None:
    template = "".join(chr(ord("a") + i % 26) for i in range(100))
    assert rejected_message(prompt_template=template) == (
        f"prompt_template={template[:80]!r} must contain {{prompt}} (and may contain {{system_prompt}}); leave it "
        "empty to use the model's chat template"
    )


@pytest.mark.parametrize(
    ("given", "guide"),
    [
        ({"json_schema": '{"type": "object", "properties": {"a": {"type": "integer"}}}'},
         Guide("json_schema", '{"type":"object","properties":{"a":{"type":"integer"}}}', "json_schema")),
        ({"response_format": "json_object"}, Guide("json", "", "response_format")),
        ({"regex": "[0-9]+"}, Guide("regex", "[0-9]+", "regex")),
        ({"grammar": 'root ::= "yes" | "no"'}, Guide("ebnf_grammar", 'root ::= "yes" | "no"', "grammar")),
        ({"response_format": "text"}, None),
        ({}, None),
    ],
    ids=["json_schema", "json_object", "regex", "grammar", "text", "none"],
)
def test_structured_output_inputs_become_the_guide(given: dict, guide: Optional[Guide]) -> None:
    assert validate(**given).guide == guide


@pytest.mark.parametrize("value", ["yaml", "", "JSON_OBJECT", 5, None])
def test_response_format_outside_its_choices_is_refused(value: Any) -> None:
    assert rejected_message(response_format=value) == (
        f"response_format={value!r} is not allowed; allowed: one of 'text', 'json_object'"
    )


def test_lora_weights_become_the_adapter_reference() -> None:
    ref = validate(lora_weights=" hf://owner/adapter@v1 ").lora
    assert ref is not None and (ref.kind, ref.repo_id, ref.revision) == ("hf", "owner/adapter", "v1")
    url = validate(lora_weights="https://example.com/a.tar?sig=secret").lora
    assert url is not None and url.kind == "url" and url.source == "https://example.com/a.tar?sig=secret"
    assert validate().lora is None and validate(lora_weights="  ").lora is None


def test_unknown_inputs_are_listed_with_every_input() -> None:
    assert rejected_message(temprature=1, topk=2) == (
        "unknown input(s) temprature, topk; the inputs are: " + ", ".join(input_specs())
    )


def test_an_out_of_range_number_is_shown_as_given() -> None:
    """The value in the message is the one the user sent (11), not its float conversion (11.0)."""
    assert rejected_message(repetition_penalty=11) == "repetition_penalty=11 is out of range; allowed: 0.01 to 10"
    assert rejected_message(top_k=1025) == "top_k=1025 is out of range; allowed: -1 to 1024"


def test_a_non_boolean_is_shown_in_the_message() -> None:
    assert rejected_message(log_performance_metrics="yes") == "log_performance_metrics must be true or false, got 'yes'"


@pytest.mark.parametrize("extra", [0, 1, 2])
def test_a_shown_value_is_cut_to_80_characters(extra: int) -> None:
    """_show keeps a repr of up to 80 characters whole and cuts a longer one to 77 and "..."."""
    value = "x" * (78 + extra)  # its repr has 80 + extra characters
    shown = repr(value) if extra == 0 else repr(value)[:77] + "..."
    assert rejected_message(temperature=value) == f"temperature must be a number from 0 to 5, got {shown}"


def test_a_drawn_seed_spans_the_31_bit_range() -> None:
    """Drawn seeds are uniform over 0 .. 2**31 - 1: 200 of them all below 2**30 has probability 2**-200."""
    seeds = [validate(seed=None).seed for _ in range(200)]
    assert max(seeds) >= 2**30 and max(seeds) <= 2**31 - 1 and min(seeds) >= 0


def test_the_token_budget_messages_name_the_conversation_and_the_limit() -> None:
    chat = validate(prompt="", messages=CONVERSATION)
    with pytest.raises(InputError) as info:
        token_budget(chat, prompt_tokens=101, max_input_len=100, max_seq_len=200, limit_reason="max_num_tokens")
    assert info.value.message == (
        "the conversation is too long: it has 101 tokens (after the chat template), and the model's maximum input "
        "length is 100 tokens (max_num_tokens); shorten the conversation"
    )
    with pytest.raises(InputError) as info:
        token_budget(validate(), prompt_tokens=101, max_input_len=100, max_seq_len=200)
    assert info.value.message == (
        "the prompt is too long: it has 101 tokens (after formatting), and the model's maximum input length is 100 "
        "tokens; shorten the prompt"
    )
    with pytest.raises(InputError) as info:
        token_budget(chat, prompt_tokens=100, max_input_len=100, max_seq_len=100)
    assert info.value.message.startswith("the conversation has 100 tokens, which leaves no room")


# --- the schema drives validation and PredictInputs (issue 50, step 0) ------------------------------------------


def _with_input(**prop: Any) -> dict:
    """The committed schema with one more input, ``widgets``, declared last (as predict.py would add it)."""
    import copy
    import json

    from cog_triton.schema import SCHEMA_PATH

    schema = json.loads(SCHEMA_PATH.read_text())
    body = copy.deepcopy(schema)
    props = body["components"]["schemas"]["Input"]["properties"]
    props["widgets"] = {"x-order": max(p["x-order"] for p in props.values()) + 1, "title": "Widgets", **prop}
    return body


def test_predict_inputs_has_a_field_per_input_with_its_schema_default() -> None:
    import dataclasses

    from cog_triton.ipc import CARRIED_AS, DERIVED_FIELDS, FOLDED_INPUTS, PredictInputs as Carried

    fields = {f.name: f for f in dataclasses.fields(Carried)}
    specs = input_specs()
    assert list(fields) == [n for n in specs if n not in FOLDED_INPUTS] + [n for n, _, _ in DERIVED_FIELDS]
    bare = Carried()
    for name, spec in specs.items():
        if name not in FOLDED_INPUTS and name not in CARRIED_AS:
            assert getattr(bare, name) == spec.default, name
    assert (bare.messages, bare.prompt_template, bare.stop_sequences) == (None, None, [])
    assert type(bare.temperature) is float and type(bare.repetition_penalty) is float  # a number is a float


def test_every_folded_input_is_taken_by_a_rule() -> None:
    """An input without a field of its own must be read by a rule, or its value would be lost."""
    from cog_triton.ipc import FOLDED_INPUTS
    from cog_triton.worker.inputs import RULE_INPUTS

    assert set(FOLDED_INPUTS) <= RULE_INPUTS
    assert set(FOLDED_INPUTS) <= set(input_specs())


@pytest.mark.parametrize(
    ("prop", "good", "bad", "message"),
    [
        ({"type": "integer", "default": 2, "minimum": 0, "maximum": 5}, 3, 9,
         "widgets=9 is out of range; allowed: 0 to 5"),
        ({"type": "number", "default": 0.5, "minimum": 0, "maximum": 1}, 1, 1.5,
         "widgets=1.5 is out of range; allowed: 0 to 1"),
        ({"type": "boolean", "default": True}, False, "no", "widgets must be true or false, got 'no'"),
        ({"type": "string", "default": "", "maxLength": 3}, "abc", "abcd",
         "widgets has 4 characters; at most 3 are allowed"),
    ],
    ids=["integer", "number", "boolean", "string"],
)
def test_an_input_declared_only_in_the_schema_is_checked_by_its_type_and_carried(monkeypatch, prop, good, bad,
                                                                                  message) -> None:
    """What adding an Input(...) to predict.py (and regenerating the schema) gives without code: its check by type,
    bounds and length, with the same messages as every other input, and a field of its name in PredictInputs."""
    from cog_triton.ipc import predict_inputs_class
    from cog_triton.schema import parse_input_specs
    from cog_triton.worker import inputs as module

    specs = parse_input_specs(_with_input(**prop))
    monkeypatch.setattr(module, "input_specs", lambda: specs)
    monkeypatch.setattr(module, "PredictInputs", predict_inputs_class(specs))
    assert validate(widgets=good).widgets == good
    assert validate().widgets == prop["default"]
    assert rejected_message(widgets=bad) == message


# --- reasoning inputs, content parts, earlier thinking (issue 50) -----------------------------------------------


def test_reasoning_inputs_reach_predict_inputs_with_their_defaults() -> None:
    inputs = validate()
    assert (inputs.reasoning_effort, inputs.include_reasoning, inputs.chat_template_kwargs,
            inputs.thinking_budget_tokens) == ("", True, {}, 0)
    assert (inputs.template_kwargs, inputs.reasoning_applied, inputs.reasoning_note) == ({}, "", "")
    given = validate(reasoning_effort="high", include_reasoning=False, chat_template_kwargs=' {"date_string": "x"} ')
    assert (given.reasoning_effort, given.include_reasoning, given.chat_template_kwargs) == (
        "high", False, {"date_string": "x"})


@pytest.mark.parametrize(("given", "message"), [
    ({"reasoning_effort": "max"}, "reasoning_effort='max' is not allowed; allowed: one of '', 'none', 'low', 'medium', "
                                  "'high'"),
    ({"reasoning_effort": None}, "reasoning_effort=None is not allowed; allowed: one of '', 'none', 'low', 'medium', "
                                 "'high'"),
    ({"include_reasoning": "no"}, "include_reasoning must be true or false, got 'no'"),
    ({"chat_template_kwargs": "[1]"}, "chat_template_kwargs must be a JSON object of template variables, got [1]"),
    ({"chat_template_kwargs": "{x"}, 'chat_template_kwargs is not valid JSON (Expecting property name enclosed in '
                                     'double quotes at line 1 column 2); give a JSON object such as {"date_string": '
                                     '"26 Jul 2024"}'),
    ({"chat_template_kwargs": 5}, 'chat_template_kwargs must be a JSON object as a string, e.g. {"x": 1} (or empty), '
                                  "got 5 (int)"),
    ({"thinking_budget_tokens": -1}, "thinking_budget_tokens=-1 is out of range; allowed: 0 to 2147483647"),
])
def test_bad_reasoning_inputs_are_refused_saying_what_is_allowed(given: dict, message: str) -> None:
    assert rejected_message(**given) == message


def test_thinking_budget_tokens_is_carried_as_given() -> None:
    """Whether a budget applies depends on the model and the prompt: the stream process decides
    (tests/test_thinking_generation.py); here it is an integer in its bounds."""
    assert validate(thinking_budget_tokens=0).thinking_budget_tokens == 0
    assert validate(thinking_budget_tokens=256).thinking_budget_tokens == 256


def test_content_may_be_a_list_of_text_parts() -> None:
    """OpenAI-style content parts: text parts are joined with a line break (as vLLM does for a template that renders
    content as a string); another part type is refused, naming the types taken."""
    import json as _json

    messages = [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}]
    assert validate(prompt="", messages=_json.dumps(messages)).messages == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi\nthere"}]
    audio = [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]
    assert rejected_message(prompt="", messages=_json.dumps(audio)) == (
        "messages[0].content[0] has type 'input_audio'; the content part types taken: text, image_url")
    bad = [{"role": "user", "content": [{"type": "text", "text": 3}]}]
    assert rejected_message(prompt="", messages=_json.dumps(bad)) == (
        "messages[0].content[0].text must be a string, got 3")
    extra = [{"role": "user", "content": [{"type": "text", "text": "a", "cache": 1}]}]
    assert rejected_message(prompt="", messages=_json.dumps(extra)) == (
        "messages[0].content[0] has unknown key(s) cache; a text part has type and text")


def test_an_assistant_turns_thinking_is_taken_as_reasoning_content_or_as_the_stream_gave_it() -> None:
    """The stream's own convention can be sent back as it came: a leading <think>...</think> in an assistant
    message's content is its thinking; reasoning_content (vLLM's and DeepSeek's name) says the same."""
    import json as _json

    def parsed(*messages: dict) -> list:
        return validate(prompt="", messages=_json.dumps([{"role": "user", "content": "2+2?"}, *messages,
                                                         {"role": "user", "content": "And 3+3?"}])).messages[1:-1]

    streamed = {"role": "assistant", "content": "<think>Add them.</think>\n\nIt is 4."}
    assert parsed(streamed) == [{"role": "assistant", "content": "It is 4.", "reasoning_content": "Add them."}]
    given = {"role": "assistant", "content": "It is 4.", "reasoning_content": "Add them."}
    assert parsed(given) == [given]
    plain = {"role": "assistant", "content": "I use <think> tags."}  # no closing tag: just text
    assert parsed(plain) == [plain]
    both = {"role": "assistant", "content": "<think>a</think>b", "reasoning_content": "a"}
    assert rejected_message(prompt="", messages=_json.dumps([both])) == (
        "messages[0] has both reasoning_content and a <think> block in its content; give the thinking once")
    user = {"role": "user", "content": "x", "reasoning_content": "y"}
    assert rejected_message(prompt="", messages=_json.dumps([user])) == (
        "messages[0] has reasoning_content, which only an assistant message carries (its thinking before the answer)")
    user_tags = {"role": "user", "content": "<think>mine</think> x"}  # user text: left as it is
    assert validate(prompt="", messages=_json.dumps([user_tags])).messages == [user_tags]


@pytest.mark.parametrize(("name", "value", "message"), [
    ("log_performance_metrics", 0, "log_performance_metrics must be true or false, got 0"),
    ("include_reasoning", 1, "include_reasoning must be true or false, got 1"),
    ("frequency_penalty", False, "frequency_penalty must be a number from -2 to 2, got False"),
])
def test_a_value_equal_to_the_default_but_of_another_type_is_still_checked(name: str, value: Any, message: str) -> None:
    """Validation takes an input at its schema default without checking it again (it is valid): only the default
    itself, not a value of another type that compares equal to it."""
    assert rejected_message(**{name: value}) == message
    assert getattr(validate(), name) == input_specs()[name].default


# ------------------------------------------------------------------------------------------------ images
def test_image_input_is_the_paths_of_the_files_cog_received(tmp_path: Path) -> None:
    first, second = tmp_path / "a.png", tmp_path / "b.jpg"
    first.write_bytes(b"x")
    second.write_bytes(b"y")
    inputs = validate(image_input=[first, second])
    assert inputs.image_input == (str(first), str(second)) and inputs.image_count == 2
    assert validate().image_input == () and validate().image_count == 0
    assert validate(image_input=None).image_input == ()


def test_image_input_refuses_what_cog_passes_on_undownloaded(tmp_path: Path) -> None:
    """coglet 0.23.1 hands a path on the server (or a file:// URL) over as a string, and the URLs of a list mixing
    them undownloaded (tests/test_coglet_path_inputs.py): none of them is read."""
    class URLPath(type(Path())):  # cog.types.URLPath, as coglet leaves it
        pass

    assert "image_input[0]='/etc/hostname' is not an image Cog received" in rejected(image_input=["/etc/hostname"])
    assert "is not an image Cog received" in rejected(image_input=["file:///etc/hostname"])
    undownloaded = rejected(image_input=[URLPath("https://example.com/a.png")])
    assert "image_input[0]" in undownloaded and "was not downloaded" in undownloaded
    assert "is not a file Cog received" in rejected(image_input=[tmp_path / "gone.png"])
    assert "image_input must be a list of images" in rejected(image_input="https://example.com/a.png")
    assert "image_input[0] must be an image file or URL, got 3 (int)" in rejected(image_input=[3])


def test_message_parts_text_only_become_text_and_image_parts_stay_in_order() -> None:
    import json

    text_only = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert validate(prompt="", messages=json.dumps(text_only)).messages == [{"role": "user", "content": "a\nb"}]
    parts = [{"role": "system", "content": "Be brief."},
             {"role": "user", "content": [{"type": "text", "text": "Compare"},
                                          {"type": "image_url", "image_url": {"url": "https://example.com/1.png"}},
                                          {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA",
                                                                              "detail": "auto"}}]}]
    inputs = validate(prompt="", messages=json.dumps(parts))
    assert inputs.messages[1]["content"] == [{"type": "text", "text": "Compare"},
                                             {"type": "image", "url": "https://example.com/1.png"},
                                             {"type": "image", "url": "data:image/png;base64,AAAA"}]
    assert inputs.image_count == 2


@pytest.mark.parametrize("content, phrase", [
    (5, "messages[0].content must be a string or a list of content parts, got 5"),
    ([{"type": "audio"}], "messages[0].content[0] has type 'audio'; the content part types taken: text, image_url"),
    ([{"type": "text", "text": 1}], "messages[0].content[0].text must be a string, got 1"),
    ([{"type": "image_url", "image_url": "https://x/a.png"}], 'must be {"type": "image_url", "image_url": {"url"'),
    ([{"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}], "must be an https URL or a data URI"),
    ([{"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "high"}}],
     "detail='high' is not taken"),
])
def test_bad_message_parts_are_refused_naming_the_part(content: Any, phrase: str) -> None:
    import json

    assert phrase in rejected(prompt="", messages=json.dumps([{"role": "user", "content": content}]))


def test_images_go_in_user_messages() -> None:
    import json

    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "https://x/a.png"}}]}]
    assert "messages[1].content[0] is an image in a 'assistant' message" in rejected(prompt="",
                                                                                    messages=json.dumps(messages))


def test_lora_weights_with_images_are_refused_naming_what_is_allowed(tmp_path: Path) -> None:
    """TensorRT-LLM 1.2.1's image models do not (Qwen2-VL) or cannot be shown to (Gemma 3) apply an adapter to their
    language model (cog_triton/worker/inputs.py validate_inputs has the sources): the combination is refused here,
    before the adapter is downloaded or an image read; either alone is taken."""
    import json

    image = tmp_path / "a.png"
    image.write_bytes(b"x")
    adapter = "https://example.com/adapter.tar.gz"
    for given in ({"image_input": [image]},
                  {"prompt": "", "messages": json.dumps([{"role": "user", "content": [
                      {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]}])}):
        message = rejected(lora_weights=adapter, **given)
        assert "lora_weights cannot be applied to a prediction with images (1 given)" in message, message
        assert "give lora_weights with a text prediction, or the images without lora_weights" in message
        assert validate(**given).image_count == 1 and validate(**given).lora is None
    assert validate(lora_weights=adapter).lora is not None
