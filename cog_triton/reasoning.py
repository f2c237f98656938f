"""Reasoning: what a checkpoint's chat template and tokenizer say about thinking, and how a prediction's
``reasoning_effort`` and ``chat_template_kwargs`` map onto them.

Shared by both processes. A stream process inspects its tokenizer once (:mod:`cog_triton.streaming.template_info`)
and reports the result, a :class:`TemplateInfo`, to the Cog worker in its :class:`cog_triton.ipc.Ready`; the worker
maps each prediction's inputs onto it (:func:`resolve`) before the prediction leaves for a stream process, so a
level the template cannot express is refused at once, and the prediction's log line and metrics say which level was
applied. The stream process then renders the chat template with the keyword arguments resolved here, and streams
the thinking in one convention whatever the model's own format (:mod:`cog_triton.streaming.thinking`).

**The levels.** ``reasoning_effort`` is ``""`` (the template's default), ``"none"``, ``"low"``, ``"medium"`` or
``"high"``. A template says what it can do by the variables it reads (found in its source, never by its name):

* an on/off switch (:data:`ON_OFF_SWITCHES`: ``enable_thinking`` for Qwen3, GLM-4.5 and SmolLM3, ``thinking`` for
  DeepSeek-V3.1): ``none`` sets it false, ``low``, ``medium`` and ``high`` set it true (applied as ``on``);
* an effort variable (:data:`EFFORT_SWITCHES`: ``reasoning_effort`` for gpt-oss): the level is passed as it is; the
  levels are those the template compares the variable with, else ``low``, ``medium`` and ``high`` (harmony's);
  ``none`` only when the template names it or also has an on/off switch;
* no switch, but thinking markers in the tokenizer: when the template's generation prompt opens the thinking itself
  (DeepSeek-R1), the model always thinks: ``low``, ``medium`` and ``high`` are accepted (applied as ``on``) and
  ``none`` is refused; otherwise the model decides (Magistral's default system prompt asks it to): only ``""``;
* neither: the model does not think: ``""`` and ``none`` (nothing to turn off).

A family that reuses a known variable therefore works without a change here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Optional

from common.errors import InputError

#: The values of the ``reasoning_effort`` input ("": the template's default).
REASONING_LEVELS = ("", "none", "low", "medium", "high")
#: The levels that turn thinking on.
EFFORT_LEVELS = ("low", "medium", "high")
#: Template variables that switch thinking on (true) or off (false), by the families that read them.
ON_OFF_SWITCHES: Mapping[str, str] = {
    "enable_thinking": "Qwen3, GLM-4.5, SmolLM3",
    "thinking": "DeepSeek-V3.1",
}
#: Template variables that take an effort level, by the families that read them.
EFFORT_SWITCHES: Mapping[str, str] = {"reasoning_effort": "gpt-oss"}
#: The stream convention: the thinking between these, then the answer.
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
#: Message keys through which an earlier assistant turn's thinking reaches a chat template, in order of preference
#: (Qwen3's and GLM-4.5's templates read ``reasoning_content``, gpt-oss's ``thinking``).
MESSAGE_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")

PromptState = Literal["open", "closed", "none"]


@dataclass(frozen=True)
class ThinkingFormat:
    """How a checkpoint's thinking appears in its generated tokens: token ids of its own tokenizer.

    Attributes:
        kind: "tags" (an opening and a closing marker around the thinking: ``<think>``/``</think>``, Mistral's
            ``[THINK]``/``[/THINK]``) or "harmony" (gpt-oss: messages on channels, ``<|channel|>analysis`` the
            thinking and ``<|channel|>final`` the answer).
        open_id / close_id: the markers' ids ("tags").
        open_text / close_text: the markers as the model writes them ("tags"; for logs and messages).
        start_id / end_id / message_id / channel_id / return_id / call_id / constrain_id: harmony's control
            tokens ``<|start|>``, ``<|end|>``, ``<|message|>``, ``<|channel|>``, ``<|return|>``, ``<|call|>``,
            ``<|constrain|>`` (-1 where the tokenizer has none).
    """

    kind: Literal["tags", "harmony"]
    open_id: int = -1
    close_id: int = -1
    open_text: str = ""
    close_text: str = ""
    start_id: int = -1
    end_id: int = -1
    message_id: int = -1
    channel_id: int = -1
    return_id: int = -1
    call_id: int = -1
    constrain_id: int = -1

    def describe(self) -> str:
        """The format in words, e.g. "<think> ... </think> tags" or "harmony channels"."""
        if self.kind == "harmony":
            return "harmony channels (<|channel|>analysis: thinking, <|channel|>final: the answer)"
        return f"{self.open_text} ... {self.close_text} tags"


@dataclass(frozen=True)
class TemplateInfo:
    """What one checkpoint's chat template and tokenizer say (found once per stream process).

    Attributes:
        has_template: the tokenizer has a chat template.
        variables: the variables the template reads that a caller may set through ``chat_template_kwargs`` (those
            ``apply_chat_template`` sets itself, the special tokens and the template's globals left out).
        on_off: the on/off reasoning switches it reads (:data:`ON_OFF_SWITCHES`).
        effort: the effort variable it reads (:data:`EFFORT_SWITCHES`), or "".
        effort_levels: the levels that variable takes.
        thinking: how the model's thinking appears in its tokens, or None (no markers in the tokenizer).
        default_prompt: where a conversation's generation prompt leaves the thinking with the template's defaults:
            "open" (the prompt opens it: DeepSeek-R1), "closed" (it closes an empty one), "none".
        message_reasoning_key: the message key through which the template reads an earlier assistant turn's
            thinking (:data:`MESSAGE_REASONING_KEYS`), or "" (it reads none: the thinking is left out of the turn).
        error: why the template could not be inspected ("" when it was).
    """

    has_template: bool = False
    variables: frozenset[str] = frozenset()
    on_off: tuple[str, ...] = ()
    effort: str = ""
    effort_levels: tuple[str, ...] = ()
    thinking: Optional[ThinkingFormat] = None
    default_prompt: PromptState = "none"
    message_reasoning_key: str = ""
    error: str = field(default="", compare=False)

    @property
    def switches(self) -> tuple[str, ...]:
        """Every reasoning variable the template reads (set only through ``reasoning_effort``)."""
        return self.on_off + ((self.effort,) if self.effort else ())

    @property
    def always_thinks(self) -> bool:
        """The template opens the thinking in the generation prompt and has no switch to stop it."""
        return not self.switches and self.thinking is not None and self.default_prompt == "open"

    def levels(self) -> tuple[str, ...]:
        """The ``reasoning_effort`` values this template can express (see the module docstring)."""
        if self.on_off:
            return REASONING_LEVELS
        if self.effort:
            none = ("none",) if "none" in self.effort_levels else ()
            return ("", *none, *(level for level in EFFORT_LEVELS if level in self.effort_levels))
        if self.thinking is None:
            return ("", "none")
        return ("", *EFFORT_LEVELS) if self.always_thinks else ("",)

    def why(self) -> str:
        """Why :meth:`levels` are what they are, in words (for refusals)."""
        if self.on_off and self.effort:
            return (f"its chat template reads {', '.join(self.on_off)} (thinking on or off) and {self.effort} "
                    f"({', '.join(self.effort_levels)})")
        if self.on_off:
            return (f"its chat template turns thinking on or off ({', '.join(self.on_off)}): none turns it off, "
                    "low, medium and high turn it on")
        if self.effort:
            return (f"its chat template reads {self.effort}, which takes {', '.join(self.effort_levels)}, and has no "
                    "switch that turns thinking off")
        if self.thinking is None:
            return ("its chat template reads no reasoning switch and its tokenizer has no thinking markers: the model "
                    "does not think")
        if self.always_thinks:
            return (f"its chat template opens the thinking ({self.thinking.open_text}) in every generation prompt and "
                    "reads no switch to turn it off: the model always thinks")
        return (f"its chat template reads no reasoning switch: whether the model thinks ({self.thinking.describe()}) "
                "is the model's own choice")


@dataclass(frozen=True)
class Resolved:
    """A prediction's reasoning inputs mapped onto the template (:func:`resolve`).

    Attributes:
        template_kwargs: the keyword arguments the chat template is rendered with (the reasoning switches, then
            the caller's ``chat_template_kwargs``).
        applied: the level applied: "default" (the template's own), "none", "low", "medium", "high", or "on"
            (a level on a template that only turns thinking on or off, or that always thinks).
        note: the level and what it set, for the prediction's log line, e.g. "reasoning_effort=high applied as on
            (enable_thinking=true)"; "" for a model that does not think and was asked nothing.
    """

    template_kwargs: dict[str, Any]
    applied: str
    note: str


def resolve(info: TemplateInfo, effort: str, template_kwargs: Mapping[str, Any], *,
            prompt_template: bool = False) -> Resolved:
    """Map ``reasoning_effort`` (``effort``) and ``chat_template_kwargs`` onto ``info``.

    ``prompt_template``: the prediction formats its prompt with a ``prompt_template`` instead of the chat template.

    Raises:
        InputError: a level the template cannot express (naming those it can and why), ``chat_template_kwargs``
            naming a variable the template does not read or one that ``reasoning_effort`` or the predictor sets,
            or either input with a ``prompt_template`` or without a chat template.
    """
    if prompt_template and (effort or template_kwargs):
        given = "reasoning_effort" if effort else "chat_template_kwargs"
        raise InputError(
            f"{given} applies to the model's chat template, and prompt_template replaces it; leave prompt_template "
            f"empty to use the chat template, or {given} empty"
        )
    if template_kwargs and not info.has_template:
        raise InputError("chat_template_kwargs was given, but this model's tokenizer has no chat template; leave it "
                         "empty")
    _check_template_kwargs(info, template_kwargs)
    levels = info.levels()
    if effort not in levels:
        raise InputError(
            f"reasoning_effort={effort!r} cannot be expressed for this model: {info.why()}; allowed: "
            + ", ".join(repr(level) for level in levels)
        )
    kwargs: dict[str, Any] = {}
    if effort == "":
        applied = "default"
    elif effort == "none":
        applied = "none"
        kwargs.update((name, False) for name in info.on_off)
        if info.effort and "none" in info.effort_levels:
            kwargs[info.effort] = "none"
    else:
        kwargs.update((name, True) for name in info.on_off)
        if info.effort:
            kwargs[info.effort] = effort
            applied = effort
        else:
            applied = "on"
    set_ = ", ".join(f"{name}={_jinja(value)}" for name, value in kwargs.items())
    if effort == "" and info.thinking is None and not info.switches:
        note = ""
    elif effort == "":
        note = "reasoning_effort: the template's default"
    elif effort == applied:
        note = f"reasoning_effort={effort}" + (f" ({set_})" if set_ else "")
    else:
        note = f"reasoning_effort={effort} applied as {applied}" + (f" ({set_})" if set_ else "")
    return Resolved({**kwargs, **template_kwargs}, applied, note)


def _jinja(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


#: Variables ``apply_chat_template`` passes itself (transformers 4.57.1 ``utils/chat_template_utils.py``
#: ``render_jinja_template``: messages, tools, documents, add_generation_prompt), with what sets them here.
RENDERER_VARIABLES: Mapping[str, str] = {
    "messages": "prompt or messages",
    "add_generation_prompt": "the predictor (always true)",
    "tools": "the predictor (no tools are passed)",
    "documents": "the predictor (no documents are passed)",
}


def _check_template_kwargs(info: TemplateInfo, template_kwargs: Mapping[str, Any]) -> None:
    for key in template_kwargs:
        if key in info.switches:
            raise InputError(
                f"chat_template_kwargs sets {key!r}, which reasoning_effort sets (none, low, medium, high; allowed "
                f"for this model: {', '.join(repr(level) for level in info.levels())}); give reasoning_effort instead"
            )
        if key in RENDERER_VARIABLES:
            raise InputError(f"chat_template_kwargs sets {key!r}, which {RENDERER_VARIABLES[key]} sets; leave it out")
        if key not in info.variables:
            reads = ", ".join(sorted(info.variables)) or "none besides what the predictor sets"
            raise InputError(
                f"chat_template_kwargs sets {key!r}, which this model's chat template does not read; the variables "
                f"it reads: {reads}"
            )


__all__ = (
    "EFFORT_LEVELS", "EFFORT_SWITCHES", "MESSAGE_REASONING_KEYS", "ON_OFF_SWITCHES", "REASONING_LEVELS",
    "RENDERER_VARIABLES", "Resolved", "THINK_CLOSE", "THINK_OPEN", "TemplateInfo", "ThinkingFormat", "resolve",
)
