"""One stream convention for every model that thinks: the thinking between ``<think>`` and ``</think>``, then the
answer.

A stream process decodes a prediction's generated ids with one of these instead of a bare
:class:`cog_triton.streaming.detokenizer.IncrementalDetokenizer` when the checkpoint has a thinking format
(:class:`cog_triton.reasoning.ThinkingFormat`, found from its tokenizer). Both split the ids by the checkpoint's own
marker or control token ids, never by text, decode each part with an incremental detokenizer of its own, and emit:

    <think>THINKING</think>ANSWER

whatever the model writes:

* **tags** (:class:`TagThinking`): ``<think>``/``</think>`` (DeepSeek, Qwen3, GLM-4.5, SmolLM3; plain added tokens
  for some, special tokens for others) or Mistral's ``[THINK]``/``[/THINK]`` (special: decoding with special tokens
  skipped, as the stream does, would have dropped them and run the thinking into the answer). When the prompt
  already opened the thinking (DeepSeek-R1's template ends the generation prompt with ``<think>\\n``), the model
  writes no opening marker: the stream begins with one all the same. When the prompt closed it (a template that
  turns thinking off renders an empty block), everything is the answer.
* **harmony** (:class:`HarmonyThinking`, gpt-oss): messages ``<|channel|>NAME<|message|>TEXT<|end|>`` after the
  prompt's ``<|start|>assistant``; every channel but ``final`` (``analysis``, ``commentary``) is thinking, ``final``
  is the answer. The control tokens are special, so decoding with them skipped ran the channel names into the text
  ("analysis...assistantfinal..."). Consecutive thinking messages are joined with a line break.

Rules common to both: the stream has at most one thinking block, at its start; a block the model did not close
(its tokens ran out) is closed at the end, so the markers always pair; markers the model writes anywhere else are
left out; the answer's leading whitespace after a thinking block is left out (Qwen3 writes ``</think>\\n\\n``, so
the answer reads the same with thinking on or off). With ``include_reasoning`` false the thinking is not decoded at
all and nothing of the block is emitted: the stream is the answer alone.

Token counts: :attr:`_Sections.reasoning_tokens` counts every generated token up to and including the one that ends
the thinking (the markers, harmony's headers and control tokens), :attr:`_Sections.num_tokens` every token; the
answer's tokens are the difference.

``push_parts`` returns a response's text as (thinking, answer), the thinking's part first (the convention's markers
belong to it), so that the caller matches stop sequences and checks a guide in the answer alone
(:mod:`cog_triton.streaming.thinking_generation`); ``push`` joins them. For a thinking budget, ``must_end`` says
whether a token would take the thinking past the budget, and ``force_end`` gives the ids that end the thinking there
(``</think>``; harmony's end of message and final channel header), which are then pushed like the model's own.

Cost per token (only predictions on a model that thinks use these): in the answer, one set-disjointness test of a
response's ids against the markers, then the same detokenizer push as without reasoning.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

from cog_triton.reasoning import THINK_CLOSE, THINK_OPEN, PromptState, ThinkingFormat
from cog_triton.streaming.detokenizer import IncrementalDetokenizer

#: How many of a prompt's last tokens are searched for the marker that ends it (a generation prompt is a few tokens;
#: a marker further back belongs to an earlier turn). TensorRT-LLM's own reasoning parser reads the prompt's tail the
#: same way (tensorrt_llm/llmapi/reasoning_parser.py ``resolve_prefilled_thinking``, main @033a9d09).
PROMPT_TAIL_TOKENS = 64

_START, _THINKING, _ANSWER = 0, 1, 2
_NOTHING = ("", "")
#: Tokens that end a "tags" model's thinking when its budget runs out: the closing marker.
FORCED_TAG_TOKENS = 1


def prompt_state(ids: Sequence[int], fmt: ThinkingFormat) -> PromptState:
    """Where a prompt (its token ids) leaves a "tags" model's thinking: "open" (its last marker opens it),
    "closed" (its last marker closes it) or "none" (no marker in its last :data:`PROMPT_TAIL_TOKENS` tokens)."""
    for token in reversed(ids[-PROMPT_TAIL_TOKENS:]):
        if token == fmt.open_id:
            return "open"
        if token == fmt.close_id:
            return "closed"
    return "none"


def harmony_prompt_channel(ids: Sequence[int], fmt: ThinkingFormat, tokenizer: Any) -> Optional[str]:
    """The channel a harmony prompt leaves a message open on (its last ``<|start|>`` is followed by a header ending
    in ``<|message|>``: the prompt forced the first message), or None (the model writes its header: the usual
    ``<|start|>assistant``)."""
    tail = list(ids[-PROMPT_TAIL_TOKENS:])
    for index in range(len(tail) - 1, -1, -1):
        if tail[index] == fmt.start_id:
            header = tail[index + 1:]
            if fmt.message_id in header:
                return _channel(tokenizer, fmt, header[: header.index(fmt.message_id)])
            return None
    return None


def _channel(tokenizer: Any, fmt: ThinkingFormat, header: Sequence[int]) -> str:
    """The channel a harmony header names (``assistant<|channel|>analysis``, ``<|channel|>commentary to=fn
    <|constrain|>json``): the first word after ``<|channel|>``; "" when it names none."""
    if fmt.channel_id not in header:
        return ""
    after = list(header[list(header).index(fmt.channel_id) + 1:])
    if fmt.constrain_id in after:
        after = after[: after.index(fmt.constrain_id)]
    words = tokenizer.decode(after, skip_special_tokens=True).split()
    return words[0] if words else ""


class _Sections:
    """What both parsers share: the counts, the optional thinking decoder, the answer decoder and its leading
    whitespace."""

    def __init__(self, tokenizer: Any, include_reasoning: bool, noop_ids: Optional[frozenset[int]]) -> None:
        self._tokenizer = tokenizer
        self._noop_ids = noop_ids
        self._include = include_reasoning
        self._thought: Optional[IncrementalDetokenizer] = None  # the thinking being decoded (include_reasoning)
        self._answer: Optional[IncrementalDetokenizer] = None
        self._trim_answer = False  # after a thinking block, until the answer's first non-space character
        self._tokens = 0
        self._reasoning = 0
        self._opened = False  # the stream's <think> was emitted (or would have been: include_reasoning false)
        self._closed = False  # and its </think>
        self._ended_by_marker = False  # the thinking ended at a marker token (the model's, or one a budget forced)

    @property
    def num_tokens(self) -> int:
        """Tokens pushed so far (markers and control tokens included)."""
        return self._tokens

    @property
    def reasoning_tokens(self) -> int:
        """Tokens of the thinking so far, from the first generated token through the one that ended it."""
        return self._reasoning

    @property
    def ended_by_marker(self) -> bool:
        """The thinking ended at its closing marker token (harmony: the final channel's header), the model's own or
        one a thinking budget forced; False while it runs, when it never began, or when the stream closed it."""
        return self._ended_by_marker

    def push_parts(self, token_ids: Iterable[int]) -> tuple[str, str]:  # pragma: no cover - each format has its own
        raise NotImplementedError

    def finish_parts(self) -> tuple[str, str]:  # pragma: no cover - each format has its own
        raise NotImplementedError

    def push(self, token_ids: Iterable[int]) -> str:
        """Append a response's generated ids; return the stream text that became stable."""
        think, answer = self.push_parts(token_ids)
        return think + answer

    def finish(self) -> str:
        """The rest of the stream; a thinking block the model left open is closed."""
        think, answer = self.finish_parts()
        return think + answer

    def _open(self) -> str:
        """Start the stream's thinking block (once)."""
        if self._opened:
            return ""
        self._opened = True
        return THINK_OPEN if self._include else ""

    def _think(self, ids: list[int]) -> str:
        """Thinking tokens: counted, and decoded when the thinking is streamed."""
        self._tokens += len(ids)
        self._reasoning = self._tokens
        if not self._include:
            return ""
        if self._thought is None:
            self._thought = IncrementalDetokenizer(self._tokenizer, noop_ids=self._noop_ids)
        return self._thought.push(ids)

    def _end_thought(self) -> str:
        """The rest of one thinking part (a harmony message; the whole block for tags)."""
        thought, self._thought = self._thought, None
        return thought.finish() if thought is not None else ""

    def _close(self) -> str:
        """End the stream's thinking block (once): its last text and ``</think>``."""
        if not self._opened or self._closed:
            return ""
        self._closed = True
        self._trim_answer = True
        rest = self._end_thought()
        return rest + THINK_CLOSE if self._include else ""

    def _say(self, ids: Sequence[int]) -> str:
        """Answer tokens: counted and decoded."""
        self._tokens += len(ids)
        if self._answer is None:
            self._answer = IncrementalDetokenizer(self._tokenizer, noop_ids=self._noop_ids)
        return self._trimmed(self._answer.push(ids))

    def _trimmed(self, text: str) -> str:
        if self._trim_answer and text:
            text = text.lstrip()
            self._trim_answer = not text
        return text

    def _finish_answer(self) -> str:
        answer, self._answer = self._answer, None
        return self._trimmed(answer.finish()) if answer is not None else ""


class TagThinking(_Sections):
    """Thinking between two marker tokens (see the module docstring).

    Args:
        tokenizer: the model's Hugging Face tokenizer.
        fmt: its "tags" :class:`~cog_triton.reasoning.ThinkingFormat`.
        prompt: where the prompt left the thinking (:func:`prompt_state`): "open" (the model continues inside the
            block), "closed" (the answer only), "none" (the model may open a block with its first token).
        include_reasoning: emit the thinking; False: the answer alone.
        noop_ids: :func:`cog_triton.streaming.detokenizer.find_noop_ids` of the tokenizer (None: found per part).
    """

    def __init__(self, tokenizer: Any, fmt: ThinkingFormat, prompt: PromptState, include_reasoning: bool,
                 noop_ids: Optional[frozenset[int]] = None) -> None:
        super().__init__(tokenizer, include_reasoning, noop_ids)
        self._open_id, self._close_id = fmt.open_id, fmt.close_id
        self._markers = frozenset((fmt.open_id, fmt.close_id))
        self._state = {"open": _THINKING, "closed": _ANSWER, "none": _START}[prompt]
        self._prompt_opened = prompt == "open"

    def push_parts(self, token_ids: Iterable[int]) -> tuple[str, str]:
        """Append a response's generated ids; return the stream text that became stable as (thinking, answer): the
        thinking's part (the markers of the convention included) comes first in the stream, then the answer's."""
        ids = token_ids if isinstance(token_ids, list) else list(token_ids)
        if not ids:
            return _NOTHING
        if self._state == _ANSWER and self._markers.isdisjoint(ids):
            return "", self._say(ids)  # the answer: no marker to look for
        think: list[str] = [self._open()] if self._prompt_opened and not self._opened else []
        answer: list[str] = []
        run: list[int] = []
        for token in ids:
            if self._state == _START:
                self._state = _ANSWER
                if token == self._open_id:
                    self._state = _THINKING
                    think.append(self._open())
                    self._tokens += 1
                    self._reasoning = self._tokens
                    continue
            if token not in self._markers:
                run.append(token)
                continue
            self._flush(run, think, answer)
            run = []
            self._tokens += 1
            if token == self._close_id and self._state == _THINKING:
                self._reasoning = self._tokens
                self._state = _ANSWER
                self._ended_by_marker = True
                think.append(self._close())
            elif self._state == _THINKING:
                self._reasoning = self._tokens  # a marker out of place inside the thinking: part of it, not shown
        self._flush(run, think, answer)
        return "".join(think), "".join(answer)

    def _flush(self, run: list[int], think: list[str], answer: list[str]) -> None:
        if run:
            if self._state == _THINKING:
                think.append(self._think(run))
            else:
                answer.append(self._say(run))

    @property
    def thinking_open(self) -> bool:
        """The thinking has not ended: the model is in its block, or may still open one with its next token."""
        return self._state != _ANSWER

    def must_end(self, token: int, budget_tokens: int) -> bool:
        """Whether the thinking must be ended before ``token`` (not yet pushed) to stay within ``budget_tokens``
        thinking tokens, its closing marker (:meth:`force_end`) included. The model's own closing marker, or a first
        token that does not open a block, never must."""
        if self._state == _START:
            return token == self._open_id and 1 + FORCED_TAG_TOKENS > budget_tokens
        return self._state == _THINKING and token != self._close_id and \
            self._reasoning + 1 + FORCED_TAG_TOKENS > budget_tokens

    #: The most tokens :meth:`force_end` appends.
    forced_end_max = FORCED_TAG_TOKENS

    def force_end(self) -> tuple[int, list[int]]:
        """End the thinking here (a thinking budget ran out): ``(0, [closing marker])``, the ids that continue the
        model's output so that it writes its answer next; push them (:meth:`push_parts`) to close the block."""
        return 0, [self._close_id]

    def finish_parts(self) -> tuple[str, str]:
        """The rest of the stream as (thinking, answer); a thinking block the model left open is closed."""
        think = self._open() if self._prompt_opened and not self._opened else ""
        think += self._close()
        self._state = _ANSWER
        return think, self._finish_answer()


class HarmonyThinking(_Sections):
    """gpt-oss's harmony messages (see the module docstring).

    Args:
        tokenizer: the model's Hugging Face tokenizer.
        fmt: its "harmony" :class:`~cog_triton.reasoning.ThinkingFormat`.
        channel: the channel of a message the prompt left open (:func:`harmony_prompt_channel`), or None (the model
            begins with a message header).
        include_reasoning: emit the thinking; False: the answer alone.
        noop_ids: :func:`cog_triton.streaming.detokenizer.find_noop_ids` of the tokenizer (None: found per part).
    """

    _HEADER, _MESSAGE = 0, 1

    def __init__(self, tokenizer: Any, fmt: ThinkingFormat, channel: Optional[str], include_reasoning: bool,
                 noop_ids: Optional[frozenset[int]] = None) -> None:
        super().__init__(tokenizer, include_reasoning, noop_ids)
        self._fmt = fmt
        self._ends = frozenset(t for t in (fmt.end_id, fmt.return_id, fmt.call_id, fmt.start_id) if t >= 0)
        self._header: list[int] = []
        self._header_after = "prompt"  # what the header being read follows: the prompt, an <|end|>, a <|start|>
        self._words: Optional[tuple[list[int], list[int]]] = None
        self._thinking_messages = 0
        self._final = False  # the current message is on the final channel
        self._state = self._HEADER
        if channel is not None:
            self._begin(channel)

    def _begin(self, channel: str) -> str:
        """A message on ``channel`` begins: thinking unless it is the final channel."""
        self._state = self._MESSAGE
        self._final = channel == "final"
        if self._final:
            text = self._close()
            self._closed = True  # the answer began: later thinking is not shown
            self._ended_by_marker = True
            return text
        if self._closed:
            return ""  # thinking after the answer began: counted, not shown
        text = self._open()
        if self._thinking_messages and self._include:
            text += self._end_thought() + "\n"
        self._thinking_messages += 1
        return text

    def push_parts(self, token_ids: Iterable[int]) -> tuple[str, str]:
        """Append a response's generated ids; return the stream text that became stable as (thinking, answer): the
        thinking's part (the markers of the convention included) comes first in the stream, then the answer's."""
        ids = token_ids if isinstance(token_ids, list) else list(token_ids)
        if not ids:
            return _NOTHING
        if self._state == self._MESSAGE and self._final and self._ends.isdisjoint(ids):
            return "", self._say(ids)  # the answer: no control token to look for
        think: list[str] = []
        answer: list[str] = []
        run: list[int] = []
        for token in ids:
            if self._state == self._MESSAGE:
                if token not in self._ends:
                    run.append(token)
                    continue
                self._flush(run, think, answer)
                run = []
                self._count_control()
                self._state = self._HEADER
                self._header = []
                self._header_after = "start" if token == self._fmt.start_id else "end"
                if self._final:
                    answer.append(self._finish_answer())
                continue
            self._count_control()
            if token == self._fmt.message_id:
                think.append(self._begin(_channel(self._tokenizer, self._fmt, self._header)))
            elif token == self._fmt.start_id:
                self._header = []
                self._header_after = "start"
            else:
                self._header.append(token)
        self._flush(run, think, answer)
        return "".join(think), "".join(answer)

    def _count_control(self) -> None:
        """A header or control token: thinking until the answer begins, counted with it after."""
        self._tokens += 1
        if not self._closed:
            self._reasoning = self._tokens

    def _flush(self, run: list[int], think: list[str], answer: list[str]) -> None:
        if not run:
            return
        if self._final:
            answer.append(self._say(run))
        elif self._closed:  # a thinking message after the answer: counted, not shown
            self._tokens += len(run)
        else:
            think.append(self._think(run))

    def finish_parts(self) -> tuple[str, str]:
        """The rest of the stream as (thinking, answer); a thinking block the model left open is closed."""
        return self._close(), self._finish_answer()

    @property
    def thinking_open(self) -> bool:
        """The answer (the final channel) has not begun."""
        return not self._closed

    def _forced_words(self) -> tuple[list[int], list[int]]:
        """The ids of ``assistant`` and of ``final`` (the role and channel of the answer's header), found once."""
        if self._words is None:
            self._words = harmony_forced_words(self._tokenizer)
        return self._words

    @property
    def forced_end_max(self) -> int:
        """The most tokens :meth:`force_end` appends: ``<|end|><|start|>assistant<|channel|>final<|message|>``."""
        role, final = self._forced_words()
        return 4 + len(role) + len(final)

    def must_end(self, token: int, budget_tokens: int) -> bool:
        """Whether the thinking must be ended before ``token`` (not yet pushed) to stay within ``budget_tokens``
        thinking tokens, its forced ending (:meth:`force_end`, at most :attr:`forced_end_max` tokens) included."""
        return not self._closed and self._reasoning + 1 + self.forced_end_max > budget_tokens

    def force_end(self) -> tuple[int, list[int]]:
        """End the thinking here (a thinking budget ran out): ``(drop, ids)``: drop the last ``drop`` generated ids
        (a message header the model had begun, never shown) and continue with ``ids``, which end the message and
        open the final channel, so that the model writes its answer next; push them (:meth:`push_parts`) to close
        the block."""
        fmt = self._fmt
        role, final = self._forced_words()
        header = [fmt.channel_id, *final, fmt.message_id]
        if self._state == self._MESSAGE:
            return 0, [fmt.end_id, fmt.start_id, *role, *header]
        drop = len(self._header)
        self._tokens -= drop
        self._reasoning = self._tokens
        self._header = []
        if self._header_after == "end":
            return drop, [fmt.start_id, *role, *header]
        if self._header_after == "start":
            return drop, [*role, *header]
        return drop, header  # the prompt's own <|start|>assistant

def harmony_forced_words(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The token ids of ``assistant`` and ``final``: the role and the channel of the header a thinking budget writes to
    open a harmony model's answer."""
    role, final = (list(tokenizer(word, add_special_tokens=False)["input_ids"]) for word in ("assistant", "final"))
    return role, final


def harmony_forced_end_max(tokenizer: Any) -> int:
    """The most tokens a thinking budget adds to end a harmony model's thinking:
    ``<|end|><|start|>assistant<|channel|>final<|message|>``."""
    role, final = harmony_forced_words(tokenizer)
    return 4 + len(role) + len(final)


def thinking_decoder(tokenizer: Any, fmt: ThinkingFormat, prompt: Any, include_reasoning: bool,
                     noop_ids: Optional[frozenset[int]] = None) -> _Sections:
    """The stream parser for ``fmt``: where the prompt leaves the thinking is ``prompt``, a
    :data:`~cog_triton.reasoning.PromptState` for "tags", the channel of a message it left open (or None) for
    "harmony"."""
    if fmt.kind == "harmony":
        return HarmonyThinking(tokenizer, fmt, prompt, include_reasoning, noop_ids)
    return TagThinking(tokenizer, fmt, prompt, include_reasoning, noop_ids)


__all__ = ("FORCED_TAG_TOKENS", "HarmonyThinking", "PROMPT_TAIL_TOKENS", "TagThinking", "harmony_forced_end_max",
           "harmony_forced_words", "harmony_prompt_channel", "prompt_state",
           "thinking_decoder")
