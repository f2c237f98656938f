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


# --- the thinking apart from the answer (stop sequences, guides) and a thinking budget --------------------------


@pytest.mark.parametrize("step", [1, 3, 100])
def test_push_parts_gives_the_thinking_and_the_answer_apart_in_stream_order(step: int) -> None:
    """The thinking's part (with the convention's markers) and the answer's, whatever the responses' sizes: joined
    they are the stream, and the answer's part is the answer alone."""
    for decoder, tok, text, answer in (
        (tags("qwen3"), rf.tokenizer("qwen3"), QWEN_OUTPUT, "The answer is 4 😀."),
        (harmony(), rf.tokenizer("gpt_oss"), HARMONY, "2 + 2 = 4."),
    ):
        ids = rf.ids(tok, text)
        parts = [decoder.push_parts(ids[i:i + step]) for i in range(0, len(ids), step)] + [decoder.finish_parts()]
        thinking = "".join(think for think, _ in parts)
        assert "".join(said for _, said in parts) == answer
        assert thinking.startswith("<think>") and thinking.endswith("</think>") and answer not in thinking
        said_first = next(i for i, (_, said) in enumerate(parts) if said)
        assert all(not think for think, _ in parts[said_first + 1:])  # no thinking text after the answer began
        assert decoder.ended_by_marker


def test_a_thinking_the_stream_closed_or_that_never_began_did_not_end_by_its_marker() -> None:
    tok = rf.tokenizer("qwen3")
    cut = tags("qwen3")
    stream(cut, rf.ids(tok, "<think>Still going"))
    none = tags("qwen3")
    stream(none, rf.ids(tok, "Just the answer."))
    spelled = tags("qwen3")  # the closing marker written with ordinary tokens: not the marker
    stream(spelled, [fmt_of("qwen3").open_id, *rf.ids(tok, "hm</"), *rf.ids(tok, "think>"), *rf.ids(tok, "{}")])
    assert not cut.ended_by_marker and not none.ended_by_marker and not spelled.ended_by_marker


def _budgeted(decoder, ids: list[int], budget: int) -> tuple[str, list[int], tuple | None]:
    """push_within_budget over ``ids`` in one response: (the text, the ids kept, the forced ending)."""
    from cog_triton.streaming.thinking_generation import push_within_budget

    kept: list[int] = []
    think, said, forced = push_within_budget(decoder, ids, budget, kept)
    return think + said, kept, forced


@pytest.mark.parametrize("budget", [2, 3, 7])
def test_a_budget_ends_a_tag_thinking_with_its_closing_marker_within_the_budget(budget: int) -> None:
    """A thought longer than the budget: the first budget - 1 tokens are kept (the opening marker among them), then
    the closing marker ends it, so the thinking is exactly the budget; pushed, the ending closes the block once."""
    tok = rf.tokenizer("qwen3")
    fmt = fmt_of("qwen3")
    ids = [fmt.open_id, *rf.ids(tok, " one two three four five six seven eight")]
    decoder = tags("qwen3")
    text, kept, forced = _budgeted(decoder, ids, budget)
    assert kept == ids[:budget - 1] and forced == (0, [fmt.close_id])
    assert decoder.thinking_open and decoder.reasoning_tokens == budget - 1
    think, said = decoder.push_parts(forced[1])
    assert not decoder.thinking_open and decoder.reasoning_tokens == budget and decoder.ended_by_marker
    answer = decoder.push_parts(rf.ids(tok, "\n\nDone."))
    assert text + think + "".join(answer) + decoder.finish() == \
        "<think>" + tok.decode(ids[1:budget - 1]) + "</think>Done."


def test_a_thinking_that_ends_within_its_budget_is_left_alone() -> None:
    tok = rf.tokenizer("qwen3")
    ids = rf.ids(tok, "<think>Short.</think>\n\nThe answer, longer than the budget.")
    close = ids.index(fmt_of("qwen3").close_id)
    for budget in (close + 1, close + 50):  # the model's own closing marker may be the budget's last token
        decoder = tags("qwen3")
        text, kept, forced = _budgeted(decoder, ids, budget)
        assert forced is None and text == "<think>Short.</think>The answer, longer than the budget."
        assert decoder.reasoning_tokens == close + 1 and kept == ids[:close + 1]
    answer_first = tags("qwen3")  # no block: the budget never applies
    assert _budgeted(answer_first, rf.ids(tok, "No thinking at all."), 2)[2] is None
    opened = tags("deepseek_r1", prompt="open")  # the prompt opened it: every token counts
    r1 = rf.ids(rf.tokenizer("deepseek_r1"), "a b c d")
    assert _budgeted(opened, r1, 3)[1:] == (r1[:2], (0, [fmt_of("deepseek_r1").close_id]))


def test_a_budget_ends_a_harmony_thinking_message_with_the_final_channels_header() -> None:
    tok = rf.tokenizer("gpt_oss")
    fmt = fmt_of("gpt_oss")
    decoder = harmony()
    most = decoder.forced_end_max
    ids = rf.ids(tok, "<|channel|>analysis<|message|>" + " think" * 30)
    budget = most + 5
    text, kept, forced = _budgeted(decoder, ids, budget)
    assert kept == ids[:5] and forced is not None
    drop, ending = forced
    assert drop == 0 and tok.decode(ending, skip_special_tokens=False) == \
        "<|end|><|start|>assistant<|channel|>final<|message|>"
    think, _ = decoder.push_parts(ending)
    assert text + think == "<think> think think</think>" and not decoder.thinking_open
    assert decoder.reasoning_tokens == 5 + len(ending) <= budget
    assert decoder.push(rf.ids(tok, "4.")) == "4."


@pytest.mark.parametrize(("before", "kept_text", "ending"), [
    ("", "", "<|channel|>final<|message|>"),  # the model's first header, begun: dropped
    ("<|channel|>analysis<|message|>x<|end|>", "<|channel|>analysis<|message|>x<|end|>",
     "<|start|>assistant<|channel|>final<|message|>"),
    ("<|channel|>analysis<|message|>x<|end|><|start|>", "<|channel|>analysis<|message|>x<|end|><|start|>",
     "assistant<|channel|>final<|message|>"),
])
def test_a_budget_that_runs_out_in_a_harmony_header_drops_it(before: str, kept_text: str, ending: str) -> None:
    """A header the model had begun (never shown) is dropped and the final channel's header written in its place,
    so the continued output is well-formed harmony; the counts leave the dropped tokens out."""
    tok = rf.tokenizer("gpt_oss")
    decoder = harmony()
    begun = "assistant<|channel|>anal" if before.endswith("<|start|>") else "<|channel|>anal"
    head = rf.ids(tok, before) + rf.ids(tok, begun)
    decoder.push(head)
    drop, ids = decoder.force_end()
    assert tok.decode(head[:len(head) - drop], skip_special_tokens=False) == kept_text
    assert tok.decode(ids, skip_special_tokens=False) == ending
    assert decoder.num_tokens == len(head) - drop
    decoder.push(ids)
    assert not decoder.thinking_open and decoder.push(rf.ids(tok, "A.")) == "A."
