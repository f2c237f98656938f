"""A prediction on a model that thinks: its guide constrains the answer, its stop sequences match in the answer, and
its thinking budget ends the thinking (in a stream process, for :class:`cog_triton.streaming.generation.Generator`).

Per request (:func:`plan_thinking`, called by ``Generator.prepare`` once it knows where the prompt leaves the
thinking):

* **A guide** (``json_schema``, ``response_format``, ``regex``, ``grammar``) is sent as one EBNF grammar: what the model
  writes before its answer, then the guide (:func:`cog_triton.streaming.guided.thinking_head`,
  :meth:`cog_triton.streaming.guided.GuideChecker.thinking_guide`). Where the prompt closed the thinking (thinking
  off) the guide is sent as it is, as for a model that does not think. A format whose markers a grammar cannot write
  (:meth:`~cog_triton.streaming.guided.GuideChecker.unwritable_markers`) is refused, naming reasoning_effort=none
  where the template can turn the thinking off.
* **A thinking budget** (``thinking_budget_tokens`` > 0) is planned (:class:`ThinkingBudget`), or refused where it
  cannot apply: a model that does not think, a prediction whose thinking is off, a budget smaller than the tokens the
  thinking takes at least, or an answer request that would not fit the model's input length.

Per token (:func:`thinking_deltas`): the stream parser of :mod:`cog_triton.streaming.thinking` splits each response's
ids into thinking and answer; the thinking goes out as it is (the convention's ``<think>``/``</think>`` included),
the answer through the stop-sequence matcher. So a stop sequence matches in the answer only: a word of the thinking
never cuts the stream (vLLM and SGLang match stop strings on the whole text, thinking included).

**The thinking budget: which route, and why.** The thinking is generated in the prediction's one request, as without a
budget; the stream process counts the thinking's tokens (the parser's count, the markers included: what
``reasoning_token_count`` reports). When one more thinking token would leave no room within the budget for the tokens
that end the thinking, the request is stopped (Triton's stop request, as for a stop sequence), the ending is added
(``</think>``; for harmony ``<|end|><|start|>assistant<|channel|>final<|message|>``, a header the model had begun
dropped), and a second request continues: its prompt is the first one's prompt, the thinking and the ending, so the
model writes its answer next; its ``max_tokens`` is what the thinking left of the prediction's. Both requests are read
through the same stream parser, so the caller sees one stream with one ``</think>``. This is the two-request route of
issue 51 with one change: the first request is not limited to the budget and not stopped at the closing marker, so a
model that ends its thinking within the budget is served by one request, as without a budget (with ``max_tokens`` =
the budget and a stop at the marker, every prediction would need a second request). It was chosen over per-step
logits processors and a character-bounded grammar because it is the same on both backends and counts tokens
exactly: the LLM API's logits processors are the PyTorch backend's alone (the C++ backend takes none per request), and
a grammar bounds characters, not tokens, recompiles for each budget and needs guided decoding on. Its cost, only for a
thought that reaches its budget: the first request runs on for the steps Triton's stop request takes to arrive (those
tokens are dropped), and the second request prefills the prompt and the thinking again, cheaply where the engine
reuses KV-cache blocks of a common prefix (``COG_TRITON_ENABLE_KV_CACHE_REUSE``, on by default: the C++ backend's
``enable_kv_cache_reuse``, the PyTorch backend's ``kv_cache_config.enable_block_reuse``). The continuation is in token
ids, never a re-rendered chat template, so every format that ends its thinking with marker tokens continues after a
forced end; a model without thinking markers does not think, and a budget is refused for it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Optional

from common.errors import IncompleteOutputError, InputError
from cog_triton.ipc import Guide, PredictInputs, answer_request_id
from cog_triton.reasoning import ThinkingFormat
from cog_triton.streaming.guided import after_thinking_head, thinking_head
from cog_triton.streaming.image_requests import counted
from cog_triton.streaming.stop import StopSequenceMatcher
from cog_triton.streaming.thinking import FORCED_TAG_TOKENS, harmony_forced_end_max, thinking_decoder

if TYPE_CHECKING:
    from cog_triton.streaming.generation import Generator, Prepared, RequestState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ThinkingBudget:
    """A prediction's thinking budget, planned by :func:`plan_thinking`.

    Attributes:
        tokens: ``thinking_budget_tokens``: the most tokens of thinking, the markers and the ending a budget adds
            included (as ``reasoning_token_count`` counts them).
        answer_guide: the request fields of the guide the answer request carries (after a forced end the answer
            follows at once: whitespace then the guide for tags, the guide alone after harmony's final header);
            empty without a guide.
    """

    tokens: int
    answer_guide: dict[str, str]


def plan_thinking(gen: "Generator", inputs: PredictInputs, start: Any, prompt_tokens: int,
                  max_tokens: int) -> tuple[dict[str, str], Optional[ThinkingBudget]]:
    """The guide fields of the request of a prediction on a model that thinks, and its thinking budget (None: none).

    Args:
        gen: the stream process's generator (its tokenizer, template, guide checker, limits).
        inputs: the prediction's inputs.
        start: where its prompt leaves the thinking (:class:`cog_triton.streaming.template_info.PromptStarts`).
        prompt_tokens: its prompt's length, tokens.
        max_tokens: the tokens its request asks for (``max_tokens`` capped by the model's sequence length).

    Raises:
        InputError: the guide does not compile, guided decoding is off, the format's markers cannot be written by a
            grammar, or the budget cannot apply (see the module docstring).
    """
    fmt = gen.template.thinking
    assert fmt is not None
    guide = inputs.guide
    fields: dict[str, str] = {}
    head = thinking_head(fmt, start) if guide is not None else None
    if guide is not None:
        if head is None:  # the prompt closed the thinking: the output is the answer from its first token
            fields = gen._guide_fields(guide)
        else:
            fields = _wire(_thinking_guide(gen, inputs, guide, fmt, head))
    budget_tokens = inputs.thinking_budget_tokens
    if not budget_tokens:
        return fields, None
    _check_budget(gen, fmt, start, budget_tokens, prompt_tokens, max_tokens)
    answer: dict[str, str] = {}
    if guide is not None:
        after = after_thinking_head(fmt)
        answer = gen._guide_fields(guide) if after is None else _wire(_thinking_guide(gen, inputs, guide, fmt, after))
    return fields, ThinkingBudget(budget_tokens, answer)


def _wire(guide: Guide) -> dict[str, str]:
    return {"guide_type": guide.guide_type, "guide": guide.guide}


def _thinking_guide(gen: "Generator", inputs: PredictInputs, guide: Guide, fmt: ThinkingFormat, head: str) -> Guide:
    """``guide`` after ``head``, checked and compiled.

    Raises:
        InputError: guided decoding is off, the guide does not compile, or a grammar cannot write the markers.
    """
    gen._guide_fields(guide)  # guided decoding off, or the guide's own errors: as for any model
    checker = gen.guides
    assert checker is not None
    unwritable = checker.unwritable_markers(fmt)
    if unwritable:
        instead = ("use reasoning_effort=none to turn the thinking off, or leave " if "none" in gen.template.levels()
                   else "leave ")
        raise InputError(
            f"{guide.source} asks for structured output, which must let this model's thinking through first, and a "
            f"guided-decoding grammar cannot write its thinking markers ({', '.join(unwritable)}: their text in "
            f"xgrammar's vocabulary is not their own); {instead}{guide.source} empty"
        )
    return checker.thinking_guide(guide, head)


def _check_budget(gen: "Generator", fmt: ThinkingFormat, start: Any, budget_tokens: int, prompt_tokens: int,
                  max_tokens: int) -> None:
    """Refuse a budget that cannot apply to this prediction (see the module docstring).

    Raises:
        InputError: naming the budget, why, and what is allowed.
    """
    given = f"thinking_budget_tokens={budget_tokens}"
    if (fmt.kind == "harmony" and start == "final") or (fmt.kind == "tags" and start == "closed"):
        instead = " (reasoning_effort=none turns it off)" if "none" in gen.template.levels() else ""
        raise InputError(f"{given} bounds the thinking, and this prediction's prompt turns the thinking off"
                         f"{instead}; give 0, or let the model think")
    if fmt.kind == "harmony":
        least = harmony_forced_end_max(gen.tokenizer)
        what = "ending a harmony thinking message and opening the final channel"
    elif start == "open":
        least, what = FORCED_TAG_TOKENS, f"the closing marker {fmt.close_text}"
    else:
        least, what = 1 + FORCED_TAG_TOKENS, f"the markers {fmt.open_text} and {fmt.close_text}"
    if budget_tokens < least:
        raise InputError(f"{given} is too small for this model: its thinking takes at least {least} tokens ({what}); "
                         f"give 0 (no budget) or at least {least}")
    limit = gen.limits.executor_max_input_len()
    if budget_tokens < max_tokens and prompt_tokens + budget_tokens > limit:
        raise InputError(
            f"{given} cannot be applied to this prompt: after a thinking cut at the budget the model continues from "
            f"its prompt and its thinking, {prompt_tokens} + {budget_tokens} tokens, and the model's maximum input "
            f"length is {limit} tokens; give at most {max(limit - prompt_tokens, 0)}, or 0"
        )


def _answer_request(gen: "Generator", prepared: "Prepared", budget: ThinkingBudget,
                    continuation: list[int]) -> Optional["Prepared"]:
    """The request that continues a prediction whose thinking its budget ended: the first request's prompt, the
    thinking and its forced ending (``continuation``), for the tokens left; None when none are left."""
    first = prepared.request
    room = first.max_tokens - len(continuation)
    if room < 1:
        return None
    adapter = prepared.adapter
    held = adapter is not None and gen.adapters is not None and adapter.task_id in gen.adapters.held
    request = dataclasses.replace(
        first,
        input_ids=[*first.input_ids, *continuation],
        max_tokens=room,
        min_tokens=max(first.min_tokens - len(continuation), 0),
        request_id=answer_request_id(first.request_id),
        guide_type=budget.answer_guide.get("guide_type", ""),
        guide=budget.answer_guide.get("guide", ""),
        lora=None if held else first.lora,
    )
    return dataclasses.replace(prepared, request=request)


# Why one function: it is one stream's per-token loop (the hot path), with the budget's second request continuing the
# same decoder and stop matcher; split into generators, each token would cross one more generator layer.
async def thinking_deltas(gen: "Generator", inputs: PredictInputs, prepared: "Prepared", state: "RequestState",
                          on_first_token: Optional[Callable[[float], None]] = None,
                          on_counts: Optional[Callable[[int, int], None]] = None) -> AsyncIterator[str]:
    """:meth:`cog_triton.streaming.generation.Generator.text_deltas` for a model that thinks (see the module
    docstring): the stream convention, stop sequences in the answer, the guided answer checked, the budget applied.

    Raises:
        As ``text_deltas``; IncompleteOutputError: a guided answer is not a complete document of its guide.
    """
    task = asyncio.current_task()
    assert task is not None
    if state.task is None:
        state.task = task
    state.last_response_at = time.monotonic()
    gen._running.add(state)
    fmt = gen.template.thinking
    assert fmt is not None
    detok = thinking_decoder(gen.tokenizer, fmt, prepared.thinking_start, inputs.include_reasoning, gen.noop_ids)
    stops = StopSequenceMatcher(inputs.stop_sequences)
    answer: Optional[list[str]] = [] if inputs.guide is not None else None  # what the caller gets, to check
    budget: Optional[ThinkingBudget] = prepared.budget
    kept: list[int] = []  # the first request's ids so far, while a budget may still end its thinking
    current = prepared
    received = 0  # tokens the current request generated
    engine_done = False
    try:
        while True:
            forced: Optional[tuple[int, list[int]]] = None
            responses = (gen.client.generate_stream(current.request) if current.adapter is None
                         else gen._responses(current))
            if current.images:  # a request with images (never given a budget: Generator.prepare) reads its counts
                responses = counted(responses, on_counts)
            try:
                async for chunk in responses:
                    state.last_response_at = now = time.monotonic()
                    ids = chunk.output_ids
                    if not ids:
                        continue  # the last response of a request that ended on the end token
                    received += len(ids)
                    if state.first_token_at is None:
                        state.first_token_at = now
                        if on_first_token is not None:
                            on_first_token(now)
                    if budget is not None and detok.thinking_open:
                        think, said, forced = push_within_budget(detok, ids, budget.tokens, kept)
                    else:
                        think, said = detok.push_parts(ids)
                    state.output_tokens = detok.num_tokens
                    text, stopped = stops.push(said) if said else ("", False)
                    if answer is not None and text:
                        answer.append(text)
                    if think or text:
                        yield think + text
                    if stopped:
                        state.cut_by_stop_sequence = True
                        return
                    if forced is not None:
                        break
            finally:
                if forced is not None:
                    await responses.aclose()  # type: ignore[attr-defined]  # the gRPC stream of the first request
            if forced is None:
                break
            # The budget ran out: stop the first request, end the thinking, continue with the answer request.
            assert budget is not None
            gen.send_stop_request_in_background(current.request.request_id)
            drop, ending = forced
            if drop:
                del kept[len(kept) - drop:]
            think, _ = detok.push_parts(ending)
            state.output_tokens = detok.num_tokens
            state.thinking_budget_reached = True
            log.info("Triton request %s: the thinking reached its budget of %d tokens; the answer is request %s",
                     current.request.request_id, budget.tokens, answer_request_id(current.request.request_id))
            if think:
                yield think
            following = _answer_request(gen, prepared, budget, [*kept, *ending])
            budget = None
            if following is None:
                break  # max_tokens was all thinking
            current, received = following, 0
        engine_done = True
        think, said = detok.finish_parts()
        text, stopped = stops.push(said) if said else ("", False)
        rest = "" if stopped else stops.finish()
        if answer is not None:
            answer.extend((text, rest))
        if think or text or rest:
            yield think + text + rest
        if stopped:
            state.cut_by_stop_sequence = True
            return
        if answer is not None:
            await asyncio.to_thread(check_guided_answer, gen, inputs, current.request, "".join(answer),
                                    detok.ended_by_marker, received, detok.reasoning_tokens, detok.num_tokens)
        state.finished = True
    except asyncio.CancelledError:
        if state.error is None:
            raise  # cancelled by the caller
        task.uncancel()
        raise state.error from None
    finally:
        gen._running.discard(state)
        state.output_tokens = detok.num_tokens
        state.reasoning_tokens = detok.reasoning_tokens
        if not engine_done and state.send_stop_request:
            # Cancelled, cut by a stop sequence, or failed: make Triton stop generating too.
            gen.send_stop_request_in_background(current.request.request_id)


def push_within_budget(detok: Any, ids: list[int], budget_tokens: int,
                 kept: list[int]) -> tuple[str, str, Optional[tuple[int, list[int]]]]:
    """Push ``ids`` one at a time while the thinking runs, until the budget would be exceeded: (thinking text, answer
    text, the forced ending ``(drop, ids)`` or None). ``kept`` collects the ids pushed while the thinking runs."""
    thinks: list[str] = []
    says: list[str] = []
    for index, token in enumerate(ids):
        if not detok.thinking_open:  # the model ended its thinking in time: the rest as usual
            think, said = detok.push_parts(ids[index:])
            thinks.append(think)
            says.append(said)
            break
        if detok.must_end(token, budget_tokens):
            return "".join(thinks), "".join(says), detok.force_end()
        think, said = detok.push_parts([token])
        kept.append(token)
        thinks.append(think)
        says.append(said)
    return "".join(thinks), "".join(says), None


def check_guided_answer(gen: "Generator", inputs: PredictInputs, request: Any, text: str, ended_by_marker: bool,
                        received: int, reasoning_tokens: int, output_tokens: int) -> None:
    """Fail a guided prediction on a model that thinks whose answer (``text``, what the caller got after the thinking)
    is not a complete document of its guide.

    Args:
        gen: the generator (its guide checker).
        inputs: the prediction's inputs (its guide).
        request: the last request sent (its ``max_tokens``).
        text: the answer as streamed.
        ended_by_marker: the thinking ended at a marker token (:attr:`cog_triton.streaming.thinking`).
        received: tokens the last request generated.
        reasoning_tokens / output_tokens: the prediction's counts.

    Raises:
        IncompleteOutputError: the answer stopped at the token limit before it was complete, or it cannot be told from
            the thinking (the model wrote a marker's text with ordinary tokens, which the grammar cannot tell from the
            marker token).
    """
    guide = inputs.guide
    assert guide is not None and gen.guides is not None
    if gen.guides.accepts_text(guide, text):
        return
    if received >= request.max_tokens:
        limit = f"max_tokens={inputs.max_tokens}"
        if request.max_tokens + output_tokens - received < inputs.max_tokens:
            limit += ", capped by the model's maximum sequence length"
        thought = (f" ({reasoning_tokens} of them thinking" +
                   (", which thinking_budget_tokens bounds)" if inputs.thinking_budget_tokens
                    else "; thinking_budget_tokens bounds it)"))
        raise IncompleteOutputError(
            f"the answer is not a complete {guide.document} (asked for by {guide.source}): generation stopped after "
            f"{output_tokens} tokens{thought} at the token limit ({limit}) before it was complete; raise max_tokens or "
            "ask for a shorter answer"
        )
    where = ("" if ended_by_marker else
             ": the model wrote the end of its thinking as ordinary text, not as its marker token, so the thinking "
             "could not be told from the answer")
    raise IncompleteOutputError(
        f"the answer is not a complete {guide.document} (asked for by {guide.source}){where}; the engine's grammar "
        "was satisfied, but the answer after the thinking was not; try again (with another seed), or set "
        "reasoning_effort=none where the model can turn its thinking off"
    )


__all__ = ("ThinkingBudget", "check_guided_answer", "plan_thinking", "push_within_budget", "thinking_deltas")
