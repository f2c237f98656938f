"""Tests of cog_triton.streaming.thinking: every family's thinking streamed in one convention, ``<think>THINKING
</think>ANSWER``, from its token ids, with fixture tokenizers of each format (tests/reasoning_fixtures.py: SmolLM2's
tokenizer with the family's markers added)."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

from cog_triton.reasoning import ThinkingFormat  # noqa: E402
from cog_triton.streaming.detokenizer import IncrementalDetokenizer  # noqa: E402
from cog_triton.streaming.template_info import thinking_format  # noqa: E402
from cog_triton.streaming.thinking import (  # noqa: E402
    HarmonyThinking,
    TagThinking,
    harmony_prompt_channel,
    prompt_state,
    thinking_decoder,
)
from tests import reasoning_fixtures as rf  # noqa: E402


def fmt_of(name: str) -> ThinkingFormat:
    found = thinking_format(rf.tokenizer(name))
    assert found is not None
    return found


def stream(decoder, ids: list[int], step: int = 1) -> str:
    """The decoder's text for ``ids`` pushed ``step`` at a time, then finished."""
    parts = [decoder.push(ids[i:i + step]) for i in range(0, len(ids), step)]
    return "".join(parts) + decoder.finish()


def tags(name: str, prompt: str = "none", include: bool = True) -> TagThinking:
    return TagThinking(rf.tokenizer(name), fmt_of(name), prompt, include)  # type: ignore[arg-type]


# --- tags -------------------------------------------------------------------------------------------------------

QWEN_OUTPUT = "<think>\nTwo plus two: 4 😀.\n</think>\n\nThe answer is 4 😀."


@pytest.mark.parametrize("step", [1, 2, 3, 100])
def test_a_model_that_opens_its_thinking_streams_it_between_the_markers_then_the_answer(step: int) -> None:
    """Qwen3 writes <think> itself: the thinking as written, then the answer without the whitespace the model puts
    after </think>; the same text however the ids arrive (one per response, or several)."""
    tok = rf.tokenizer("qwen3")
    ids = rf.ids(tok, QWEN_OUTPUT)
    decoder = tags("qwen3")
    assert stream(decoder, ids, step) == "<think>\nTwo plus two: 4 😀.\n</think>The answer is 4 😀."
    close = ids.index(fmt_of("qwen3").close_id)
    assert decoder.reasoning_tokens == close + 1 and decoder.num_tokens == len(ids)


def test_without_the_thinking_the_stream_is_the_answer_alone() -> None:
    tok = rf.tokenizer("qwen3")
    decoder = tags("qwen3", include=False)
    assert stream(decoder, rf.ids(tok, QWEN_OUTPUT)) == "The answer is 4 😀."
    assert decoder.reasoning_tokens == rf.ids(tok, QWEN_OUTPUT).index(fmt_of("qwen3").close_id) + 1


def test_an_opening_marker_in_the_prompt_starts_the_stream_inside_the_thinking() -> None:
    """DeepSeek-R1's prompt ends with <think>\\n: the model writes no opening marker, the stream has one anyway."""
    tok = rf.tokenizer("deepseek_r1")
    ids = rf.ids(tok, "Hmm, 2+2.\n</think>\n\n4")
    decoder = tags("deepseek_r1", prompt="open")
    assert stream(decoder, ids) == "<think>Hmm, 2+2.\n</think>4"
    assert decoder.reasoning_tokens == ids.index(fmt_of("deepseek_r1").close_id) + 1
    assert stream(tags("deepseek_r1", prompt="open", include=False), ids) == "4"


def test_a_prompt_that_closed_the_thinking_leaves_the_answer_and_markers_out_of_place_are_dropped() -> None:
    """A template that turns thinking off renders an empty block (Qwen3's <think>\\n\\n</think>\\n\\n): all the model
    writes is the answer, and a marker it writes anyway is left out (the stream has at most one block, first)."""
    tok = rf.tokenizer("qwen3")
    decoder = tags("qwen3", prompt="closed")
    assert stream(decoder, rf.ids(tok, "Four.<think>x</think> Yes.")) == "Four.x Yes."
    assert decoder.reasoning_tokens == 0


def test_a_model_that_does_not_open_a_block_writes_only_the_answer_untouched() -> None:
    tok = rf.tokenizer("qwen3")
    text = "  Four, and </think> is left out."
    decoder = tags("qwen3")
    assert stream(decoder, rf.ids(tok, text)) == "  Four, and  is left out."
    assert decoder.reasoning_tokens == 0


def test_thinking_the_tokens_ran_out_in_is_closed_at_the_end() -> None:
    tok = rf.tokenizer("qwen3")
    assert stream(tags("qwen3"), rf.ids(tok, "<think>Still going")) == "<think>Still going</think>"
    assert stream(tags("qwen3", include=False), rf.ids(tok, "<think>Still going")) == ""
    assert stream(tags("deepseek_r1", prompt="open"), []) == "<think></think>"


@pytest.mark.parametrize(("name", "text"), [
    ("glm45", "<think>Special markers.</think>\nGLM answer."),
    ("magistral", "[THINK]Mistral thinks.[/THINK]Magistral answer."),
])
def test_special_marker_tokens_are_found_by_id(name: str, text: str) -> None:
    """GLM-4.5's <think> and Magistral's [THINK] are special tokens: decoding with special tokens skipped, as the
    stream does, loses them and runs the thinking into the answer; parsed by their ids they are the convention."""
    tok = rf.tokenizer(name)
    ids = rf.ids(tok, text)
    plain = IncrementalDetokenizer(tok)
    assert stream(plain, ids) == text.replace("[THINK]", "").replace("[/THINK]", "").replace("<think>", "").replace(
        "</think>", "")  # what the stream was before: no markers
    thought, answer = text.split(fmt_of(name).close_text)
    assert stream(tags(name), ids) == "<think>" + thought.split(fmt_of(name).open_text)[1] + "</think>" + \
        answer.lstrip()


# --- harmony ----------------------------------------------------------------------------------------------------

HARMONY = ("<|channel|>analysis<|message|>User asks 2+2. Answer 4.<|end|>"
           "<|start|>assistant<|channel|>final<|message|>2 + 2 = 4.")


def harmony(include: bool = True, channel=None) -> HarmonyThinking:
    return HarmonyThinking(rf.tokenizer("gpt_oss"), fmt_of("gpt_oss"), channel, include)


@pytest.mark.parametrize("step", [1, 4, 100])
def test_harmony_channels_become_the_convention(step: int) -> None:
    """gpt-oss's analysis channel is the thinking and its final channel the answer; decoded with special tokens
    skipped, as before, the channel names ran into the text."""
    tok = rf.tokenizer("gpt_oss")
    ids = rf.ids(tok, HARMONY)
    assert stream(IncrementalDetokenizer(tok), ids) == "analysisUser asks 2+2. Answer 4.assistantfinal2 + 2 = 4."
    decoder = harmony()
    assert stream(decoder, ids, step) == "<think>User asks 2+2. Answer 4.</think>2 + 2 = 4."
    final_message = len(ids) - len(rf.ids(tok, "2 + 2 = 4."))
    assert decoder.reasoning_tokens == final_message and decoder.num_tokens == len(ids)
    assert stream(harmony(include=False), ids, step) == "2 + 2 = 4."


def test_several_thinking_messages_and_channels_are_one_block() -> None:
    """Analysis and commentary messages are all thinking, joined by a line break, in one block."""
    tok = rf.tokenizer("gpt_oss")
    text = ("<|channel|>analysis<|message|>First.<|end|><|start|>assistant<|channel|>commentary to=fn "
            "<|constrain|>json<|message|>{}<|end|><|start|>assistant<|channel|>final<|message|>Done.")
    assert stream(harmony(), rf.ids(tok, text)) == "<think>First.\n{}</think>Done."


def test_harmony_thinking_cut_short_is_closed_and_a_forced_final_channel_is_the_answer() -> None:
    tok = rf.tokenizer("gpt_oss")
    assert stream(harmony(), rf.ids(tok, "<|channel|>analysis<|message|>Still")) == "<think>Still</think>"
    fmt = fmt_of("gpt_oss")
    prompt = rf.ids(tok, "<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>")
    assert harmony_prompt_channel(prompt, fmt, tok) == "final"
    assert harmony_prompt_channel(rf.ids(tok, "<|start|>user<|message|>Hi<|end|><|start|>assistant"), fmt, tok) is None
    decoder = thinking_decoder(tok, fmt, "final", True)
    assert stream(decoder, rf.ids(tok, "Just this.")) == "Just this." and decoder.reasoning_tokens == 0


def test_harmony_thinking_after_the_answer_is_counted_not_shown() -> None:
    tok = rf.tokenizer("gpt_oss")
    text = "<|channel|>final<|message|>A.<|end|><|start|>assistant<|channel|>analysis<|message|>late<|end|>"
    decoder = harmony()
    assert stream(decoder, rf.ids(tok, text)) == "A."
    assert decoder.num_tokens == len(rf.ids(tok, text))


# --- where the prompt leaves the thinking ----------------------------------------------------------------------


def test_prompt_state_reads_the_last_marker_of_the_prompts_tail() -> None:
    tok = rf.tokenizer("qwen3")
    fmt = fmt_of("qwen3")
    assert prompt_state(rf.ids(tok, "<|im_start|>assistant\n<think>\n"), fmt) == "open"
    assert prompt_state(rf.ids(tok, "<|im_start|>assistant\n<think>\n\n</think>\n\n"), fmt) == "closed"
    assert prompt_state(rf.ids(tok, "<|im_start|>assistant\n"), fmt) == "none"
    far = rf.ids(tok, "<think>") + rf.ids(tok, " word" * 100)
    assert prompt_state(far, fmt) == "none"  # a marker further back belongs to an earlier turn
