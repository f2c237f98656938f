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

Token counts: :attr:`reasoning_tokens` counts every generated token up to and including the one that ends the
thinking (the markers, harmony's headers and control tokens), :attr:`num_tokens` every token; the answer's tokens
are the difference.

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

    @property
    def num_tokens(self) -> int:
        """Tokens pushed so far (markers and control tokens included)."""
        return self._tokens

    @property
    def reasoning_tokens(self) -> int:
        """Tokens of the thinking so far, from the first generated token through the one that ended it."""
        return self._reasoning

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

    def push(self, token_ids: Iterable[int]) -> str:
        """Append a response's generated ids; return the stream text that became stable."""
        ids = token_ids if isinstance(token_ids, list) else list(token_ids)
        if not ids:
            return ""
        if self._state == _ANSWER and self._markers.isdisjoint(ids):
            return self._say(ids)  # the answer: no marker to look for
        parts: list[str] = [self._open()] if self._prompt_opened and not self._opened else []
        run: list[int] = []
        for token in ids:
            if self._state == _START:
                self._state = _ANSWER
                if token == self._open_id:
                    self._state = _THINKING
                    parts.append(self._open())
                    self._tokens += 1
                    self._reasoning = self._tokens
                    continue
            if token not in self._markers:
                run.append(token)
                continue
            parts.append(self._flush(run))
            run = []
            self._tokens += 1
            if token == self._close_id and self._state == _THINKING:
                self._reasoning = self._tokens
                self._state = _ANSWER
                parts.append(self._close())
            elif self._state == _THINKING:
                self._reasoning = self._tokens  # a marker out of place inside the thinking: part of it, not shown
        parts.append(self._flush(run))
        return "".join(parts)

    def _flush(self, run: list[int]) -> str:
        if not run:
            return ""
        return self._think(run) if self._state == _THINKING else self._say(run)

    def finish(self) -> str:
        """The rest of the stream; a thinking block the model left open is closed."""
        parts = [self._open()] if self._prompt_opened and not self._opened else []
        parts.append(self._close())
        parts.append(self._finish_answer())
        self._state = _ANSWER
        return "".join(parts)


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
            return text
        if self._closed:
            return ""  # thinking after the answer began: counted, not shown
        text = self._open()
        if self._thinking_messages and self._include:
            text += self._end_thought() + "\n"
        self._thinking_messages += 1
        return text

    def push(self, token_ids: Iterable[int]) -> str:
        """Append a response's generated ids; return the stream text that became stable."""
        ids = token_ids if isinstance(token_ids, list) else list(token_ids)
        if not ids:
            return ""
        if self._state == self._MESSAGE and self._final and self._ends.isdisjoint(ids):
            return self._say(ids)  # the answer: no control token to look for
        parts: list[str] = []
        run: list[int] = []
        for token in ids:
            if self._state == self._MESSAGE:
                if token not in self._ends:
                    run.append(token)
                    continue
                parts.append(self._flush(run))
                run = []
                self._count_control()
                self._state = self._HEADER
                self._header = []
                if self._final:
                    parts.append(self._finish_answer())
                continue
            self._count_control()
            if token == self._fmt.message_id:
                parts.append(self._begin(_channel(self._tokenizer, self._fmt, self._header)))
            elif token == self._fmt.start_id:
                self._header = []
            else:
                self._header.append(token)
        parts.append(self._flush(run))
        return "".join(parts)

    def _count_control(self) -> None:
        """A header or control token: thinking until the answer begins, counted with it after."""
        self._tokens += 1
        if not self._closed:
            self._reasoning = self._tokens

    def _flush(self, run: list[int]) -> str:
        if not run:
            return ""
        if self._final:
            return self._say(run)
        if self._closed:  # a thinking message after the answer: counted, not shown
            self._tokens += len(run)
            return ""
        return self._think(run)

    def finish(self) -> str:
        """The rest of the stream; a thinking block the model left open is closed."""
        return self._close() + self._finish_answer()


def thinking_decoder(tokenizer: Any, fmt: ThinkingFormat, prompt: Any, include_reasoning: bool,
                     noop_ids: Optional[frozenset[int]] = None) -> _Sections:
    """The stream parser for ``fmt``: where the prompt leaves the thinking is ``prompt``, a
    :data:`~cog_triton.reasoning.PromptState` for "tags", the channel of a message it left open (or None) for
    "harmony"."""
    if fmt.kind == "harmony":
        return HarmonyThinking(tokenizer, fmt, prompt, include_reasoning, noop_ids)
    return TagThinking(tokenizer, fmt, prompt, include_reasoning, noop_ids)


__all__ = ("HarmonyThinking", "PROMPT_TAIL_TOKENS", "TagThinking", "harmony_prompt_channel", "prompt_state",
           "thinking_decoder")
