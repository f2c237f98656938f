"""Tests of what a chat template says about reasoning (cog_triton.streaming.template_info) and how reasoning_effort
and chat_template_kwargs map onto it (cog_triton.reasoning.resolve), with the fixture tokenizer of each family's
format (tests/reasoning_fixtures.py) and the default model's own (SmolLM2: it does not think)."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

from common.errors import InputError  # noqa: E402
from cog_triton.reasoning import TemplateInfo, resolve  # noqa: E402
from cog_triton.streaming.template_info import generation_prompt_state, inspect_chat_template  # noqa: E402
from tests import reasoning_fixtures as rf  # noqa: E402

CHECKPOINT = Path(__file__).resolve().parents[1] / "build" / "default_model" / "checkpoint"


def info_of(name: str) -> TemplateInfo:
    return inspect_chat_template(rf.tokenizer(name))


def smollm2(template: str = ""):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(CHECKPOINT), local_files_only=True)
    if template:
        tok.chat_template = template
    return tok


# (fixture, levels, on/off switches, effort variable, where the generation prompt leaves the thinking, message key,
#  variables chat_template_kwargs may set, thinking format)
FAMILIES = [
    ("qwen3", ("", "none", "low", "medium", "high"), ("enable_thinking",), "", "none", "reasoning_content",
     {"enable_thinking"}, "tags"),
    ("deepseek_v31", ("", "none", "low", "medium", "high"), ("enable_thinking", "thinking"), "", "closed", "",
     {"enable_thinking", "thinking"}, "tags"),
    ("deepseek_r1", ("", "low", "medium", "high"), (), "", "open", "", set(), "tags"),
    ("glm45", ("", "none", "low", "medium", "high"), ("enable_thinking",), "", "none", "reasoning_content",
     {"enable_thinking"}, "tags"),
    ("gpt_oss", ("", "low", "medium", "high"), (), "reasoning_effort", "none", "thinking", {"reasoning_effort"},
     "harmony"),
    ("magistral", ("",), (), "", "none", "", set(), "tags"),
]


@pytest.mark.parametrize(("name", "levels", "on_off", "effort", "prompt", "key", "variables", "kind"), FAMILIES,
                         ids=[f[0] for f in FAMILIES])
def test_what_each_familys_template_and_tokenizer_say(name, levels, on_off, effort, prompt, key, variables,
                                                      kind) -> None:
    info = info_of(name)
    assert info.levels() == levels
    assert (info.on_off, info.effort, info.default_prompt, info.message_reasoning_key) == (on_off, effort, prompt, key)
    assert set(info.variables) == variables  # the template's own variables (set inside it) are not among them
    assert info.thinking is not None and info.thinking.kind == kind


def test_magistrals_markers_in_its_default_system_prompt_do_not_count_as_its_generation_prompt() -> None:
    """The default system prompt names [THINK] and [/THINK]: only what the generation prompt adds is read."""
    tok = rf.tokenizer("magistral")
    rendered = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    assert "[/THINK]" in rendered
    assert generation_prompt_state(tok, info_of("magistral").thinking, {}) == "none"


def test_the_generation_prompt_follows_the_switches() -> None:
    for name, off, on in (("qwen3", "closed", "none"), ("deepseek_v31", "closed", "open"), ("glm45", "closed", "none")):
        info = info_of(name)
        tok = rf.tokenizer(name)
        assert generation_prompt_state(tok, info.thinking, resolve(info, "none", {}).template_kwargs) == off, name
        assert generation_prompt_state(tok, info.thinking, resolve(info, "high", {}).template_kwargs) == on, name


def test_a_model_that_does_not_think() -> None:
    info = inspect_chat_template(smollm2())
    assert info.has_template and info.thinking is None and info.switches == () and info.levels() == ("", "none")
    assert resolve(info, "none", {}) == resolve(info, "none", {})
    none = resolve(info, "none", {})
    assert (none.template_kwargs, none.applied) == ({}, "none")
    assert resolve(info, "", {}).note == ""  # nothing to say in the log for a model that does not think
    with pytest.raises(InputError) as error:
        resolve(info, "high", {})
    assert error.value.message == (
        "reasoning_effort='high' cannot be expressed for this model: its chat template reads no reasoning switch and "
        "its tokenizer has no thinking markers: the model does not think; allowed: '', 'none'")


@pytest.mark.parametrize(("name", "effort", "kwargs", "applied", "note"), [
    ("qwen3", "none", {"enable_thinking": False}, "none", "reasoning_effort=none (enable_thinking=false)"),
    ("qwen3", "high", {"enable_thinking": True}, "on", "reasoning_effort=high applied as on (enable_thinking=true)"),
    ("qwen3", "", {}, "default", "reasoning_effort: the template's default"),
    ("deepseek_v31", "low", {"enable_thinking": True, "thinking": True}, "on",
     "reasoning_effort=low applied as on (enable_thinking=true, thinking=true)"),
    ("deepseek_r1", "medium", {}, "on", "reasoning_effort=medium applied as on"),
    ("gpt_oss", "low", {"reasoning_effort": "low"}, "low", "reasoning_effort=low (reasoning_effort=low)"),
])
def test_levels_map_onto_what_the_template_reads(name, effort, kwargs, applied, note) -> None:
    resolved = resolve(info_of(name), effort, {})
    assert (resolved.template_kwargs, resolved.applied, resolved.note) == (kwargs, applied, note)


@pytest.mark.parametrize(("name", "effort", "message"), [
    ("deepseek_r1", "none",
     "reasoning_effort='none' cannot be expressed for this model: its chat template opens the thinking (<think>) in "
     "every generation prompt and reads no switch to turn it off: the model always thinks; allowed: '', 'low', "
     "'medium', 'high'"),
    ("gpt_oss", "none",
     "reasoning_effort='none' cannot be expressed for this model: its chat template reads reasoning_effort, which "
     "takes low, medium, high, and has no switch that turns thinking off; allowed: '', 'low', 'medium', 'high'"),
    ("magistral", "low",
     "reasoning_effort='low' cannot be expressed for this model: its chat template reads no reasoning switch: "
     "whether the model thinks ([THINK] ... [/THINK] tags) is the model's own choice; allowed: ''"),
])
def test_a_level_the_template_cannot_express_is_refused_naming_those_it_can(name, effort, message) -> None:
    with pytest.raises(InputError) as error:
        resolve(info_of(name), effort, {})
    assert error.value.message == message


def test_chat_template_kwargs_reach_only_what_the_template_reads_and_nothing_our_inputs_set() -> None:
    tok = smollm2("{{ messages[0].content }}{% if date_string is defined %} on {{ date_string }}{% endif %}"
                  "{% if add_generation_prompt %} >{% endif %}")
    info = inspect_chat_template(tok)
    assert info.variables == {"date_string"}
    assert resolve(info, "", {"date_string": "26 Jul 2024"}).template_kwargs == {"date_string": "26 Jul 2024"}
    refusals = {
        "date": "chat_template_kwargs sets 'date', which this model's chat template does not read; the variables it "
                "reads: date_string",
        "add_generation_prompt": "chat_template_kwargs sets 'add_generation_prompt', which the predictor (always "
                                 "true) sets; leave it out",
        "messages": "chat_template_kwargs sets 'messages', which prompt or messages sets; leave it out",
    }
    for key, message in refusals.items():
        with pytest.raises(InputError) as error:
            resolve(info, "", {key: 1})
        assert error.value.message == message
    with pytest.raises(InputError) as error:
        resolve(info_of("qwen3"), "", {"enable_thinking": False})
    assert error.value.message == (
        "chat_template_kwargs sets 'enable_thinking', which reasoning_effort sets (none, low, medium, high; allowed "
        "for this model: '', 'none', 'low', 'medium', 'high'); give reasoning_effort instead")
    with pytest.raises(InputError) as error:
        resolve(info, "", {"date_string": "x"}, prompt_template=True)
    assert "chat_template_kwargs applies to the model's chat template, and prompt_template replaces it" in \
        error.value.message
    with pytest.raises(InputError) as error:
        resolve(TemplateInfo(has_template=False), "", {"date_string": "x"})
    assert "this model's tokenizer has no chat template" in error.value.message


def test_effort_levels_are_those_the_template_compares_its_variable_with() -> None:
    """A template that names its levels (here none and high) takes those; gpt-oss's prints its variable, so harmony's
    low, medium and high apply."""
    info = inspect_chat_template(smollm2(
        "{% if reasoning_effort is defined and reasoning_effort in ('none', 'high') %}{{ reasoning_effort }}"
        "{% elif reasoning_effort == 'minimal' %}m{% endif %}{{ messages[0].content }}"))
    assert (info.effort, info.effort_levels, info.levels()) == ("reasoning_effort", ("none", "high"), ("", "none",
                                                                                                       "high"))
    none = resolve(info, "none", {})
    assert (none.template_kwargs, none.applied) == ({"reasoning_effort": "none"}, "none")


def test_a_template_jinja_cannot_parse_reads_nothing_and_refuses_the_inputs() -> None:
    info = inspect_chat_template(smollm2("{% if %}"))
    assert info.has_template and info.error.startswith("TemplateSyntaxError") and info.variables == frozenset()
    with pytest.raises(InputError):
        resolve(info, "", {"x": 1})
    with pytest.raises(InputError):
        resolve(info, "high", {})


# --- the stream process's Generator: where a request's prompt leaves the thinking, and guides -----------------


def _generator(name: str = ""):
    """The Generator of fixture ``name`` (""): the default model's)."""
    from cog_triton.stream_config import GeneratorConfig
    from cog_triton.streaming.generation import build_generator
    from tensorrtllm_backend.engine import ModelLimits

    limits = ModelLimits(4, max_input_len=512, max_seq_len=1024)
    folder = rf.tokenizer_dir(name) if name else CHECKPOINT
    return build_generator(GeneratorConfig(tokenizer_dir=folder, limits=limits, grpc_address="127.0.0.1:9"),
                           tokenizer=rf.tokenizer(name) if name else smollm2())


def _inputs(**given):
    import dataclasses

    from cog_triton.worker.inputs import validate_inputs

    template = given.pop("template", None)
    inputs = validate_inputs(prompt="Q", seed=1, **given)
    if template is not None:
        resolved = resolve(template, inputs.reasoning_effort, inputs.chat_template_kwargs,
                           prompt_template=inputs.prompt_template is not None)
        inputs = dataclasses.replace(inputs, template_kwargs=resolved.template_kwargs)
    return inputs


def test_prepare_finds_where_each_requests_prompt_leaves_the_thinking() -> None:
    """No request is sent (the address is never dialled): prepare() renders, tokenizes and reads the prompt."""
    qwen = _generator("qwen3")
    assert qwen.prepare(_inputs(), "a").thinking_start == "none"  # the model may open a block
    off = qwen.prepare(_inputs(reasoning_effort="none", template=qwen.template), "b")
    assert (off.thinking, off.thinking_start) == (True, "closed")
    by_hand = qwen.prepare(_inputs(prompt_template="User: {prompt}\nAssistant: <think>\n"), "c")
    assert by_hand.thinking_start == "open"  # a prompt_template's own tail
    assert _generator("deepseek_r1").prepare(_inputs(), "d").thinking_start == "open"
    assert _generator("gpt_oss").prepare(_inputs(), "e").thinking_start is None  # harmony: the model's header first
    assert _generator().prepare(_inputs(), "f").thinking is False  # a model that does not think: as before


def test_a_guide_without_guided_decoding_is_refused_for_a_model_that_thinks_as_for_any() -> None:
    """Guided decoding is off here: a guide fails on that, whatever the thinking (what a model that thinks does
    with a guide is in tests/test_thinking_generation.py)."""
    qwen = _generator("qwen3")
    for name, given in (("qwen3", {}), ("qwen3", {"reasoning_effort": "none", "template": qwen.template}),
                        ("deepseek_r1", {}), ("gpt_oss", {})):
        with pytest.raises(InputError) as error:
            _generator(name).prepare(_inputs(response_format="json_object", **given), "h")
        assert "guided decoding is off for this model" in error.value.message


def test_a_generation_prompt_that_depends_on_the_conversation_is_read_from_the_request() -> None:
    """SmolLM3's template reads /think and /no_think in the system prompt: the one-turn probe's generation prompt is
    not this request's, so the request's own is taken off its prompt and read."""
    import copy

    from cog_triton.stream_config import GeneratorConfig
    from cog_triton.streaming.generation import build_generator
    from tensorrtllm_backend.engine import ModelLimits

    tok = copy.deepcopy(rf.tokenizer("qwen3"))
    tok.chat_template = (
        "{%- set flags = messages[0].content if messages[0].role == 'system' else '' %}"
        "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
        "{%- if '/no_think' in flags %}{{ '<think>\\n\\n</think>\\n' }}{%- elif '/open' in flags %}{{ '<think>\\n' }}"
        "{%- endif %}{%- endif %}")
    generator = build_generator(GeneratorConfig(tokenizer_dir=rf.tokenizer_dir("qwen3"), grpc_address="127.0.0.1:9",
                                                limits=ModelLimits(4, max_input_len=512, max_seq_len=1024)),
                                tokenizer=tok)
    assert generator.prepare(_inputs(), "a").thinking_start == "none"
    assert generator.prepare(_inputs(system_prompt="Be brief. /no_think"), "b").thinking_start == "closed"
    assert generator.prepare(_inputs(system_prompt="/open"), "c").thinking_start == "open"
