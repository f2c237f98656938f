"""What a checkpoint's chat template and tokenizer say about reasoning (once per stream process, at its start).

:func:`inspect_chat_template` reads the template's source as Jinja parses it (its syntax tree, not its text: a
variable's name in a comment or a string is no use of it) and the tokenizer's vocabulary:

* **the variables it reads** (``jinja2.meta.find_undeclared_variables``, less the names it assigns itself and never
  tests for ``defined``), less what ``apply_chat_template`` passes
  itself (transformers 4.57.1 ``utils/chat_template_utils.py`` ``render_jinja_template``: ``messages``, ``tools``,
  ``documents``, ``add_generation_prompt``; the tokenizer's special tokens, ``tokenization_utils_base.py``
  ``apply_chat_template``: ``{**self.special_tokens_map, **kwargs}``; and the globals ``raise_exception`` and
  ``strftime_now``): what ``chat_template_kwargs`` may set;
* **its reasoning switches**: the variables of :data:`cog_triton.reasoning.ON_OFF_SWITCHES` and
  :data:`cog_triton.reasoning.EFFORT_SWITCHES` among them, and the levels the effort variable is compared with;
* **the message key** through which it reads an earlier turn's thinking (``message.reasoning_content``,
  ``message.thinking``; :data:`cog_triton.reasoning.MESSAGE_REASONING_KEYS`);
* **the thinking format**, from the tokenizer: harmony's control tokens (``<|start|>``, ``<|end|>``, ``<|message|>``,
  ``<|channel|>``, each one token: openai/gpt-oss), or a pair of markers that are one token each
  (:data:`MARKER_PAIRS`: ``<think>``/``</think>``, Mistral's ``[THINK]``/``[/THINK]``);
* **where its generation prompt leaves the thinking** by default: what the generation prompt adds to a one-turn
  conversation, tokenized, its last marker read (:func:`generation_prompt_state`): DeepSeek-R1's opens it.

Parsing uses a sandboxed environment like transformers' (``ImmutableSandboxedEnvironment`` with the
``loopcontrols`` extension and a ``{% generation %}`` block); rendering is always the tokenizer's own
``apply_chat_template``. A template Jinja cannot parse is reported (:attr:`TemplateInfo.error`) and treated as
reading nothing: a caller's ``reasoning_effort`` and ``chat_template_kwargs`` are then refused, never ignored.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Iterator, Mapping, Optional

from cog_triton.reasoning import (
    EFFORT_LEVELS,
    EFFORT_SWITCHES,
    MESSAGE_REASONING_KEYS,
    ON_OFF_SWITCHES,
    RENDERER_VARIABLES,
    PromptState,
    TemplateInfo,
    ThinkingFormat,
)
from common.errors import InputError
from cog_triton.streaming.thinking import harmony_prompt_channel, prompt_state

log = logging.getLogger(__name__)

#: Marker pairs that delimit thinking, in order of preference: DeepSeek-R1 and -V3.1, Qwen3, GLM-4.5, SmolLM3
#: (``<think>``); Mistral's Magistral (``[THINK]``, mistral-common ``SpecialTokens.begin_think``/``end_think``).
MARKER_PAIRS = (("<think>", "</think>"), ("[THINK]", "[/THINK]"))
#: Harmony's control tokens (openai/gpt-oss tokenizer; the harmony format's ``<|start|>{role}<|channel|>{channel}
#: <|message|>{text}<|end|>``, the last message of a turn ending with ``<|return|>`` or ``<|call|>``).
HARMONY_TOKENS = {"start_id": "<|start|>", "end_id": "<|end|>", "message_id": "<|message|>",
                  "channel_id": "<|channel|>", "return_id": "<|return|>", "call_id": "<|call|>",
                  "constrain_id": "<|constrain|>"}
#: What a harmony tokenizer must have for its output to be parsed as harmony.
HARMONY_REQUIRED = ("start_id", "end_id", "message_id", "channel_id")
#: Globals transformers adds to the templates' environment (``_compile_jinja_template``).
TRANSFORMERS_GLOBALS = frozenset({"raise_exception", "strftime_now"})
#: The conversation whose rendering tells where the generation prompt leaves the thinking.
PROBE = ({"role": "user", "content": "Hi"},)


def template_source(tokenizer: Any) -> Optional[str]:
    """The chat template ``apply_chat_template`` renders by default: the tokenizer's, or its "default" one of several
    (transformers picks that one when no tools are given)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):
        template = template.get("default")
    return template if isinstance(template, str) and template.strip() else None


def _environment() -> Any:
    from jinja2 import nodes  # noqa: PLC0415 - jinja2 comes with transformers, imported where it is used
    from jinja2.ext import Extension, loopcontrols  # noqa: PLC0415
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415

    class GenerationBlocks(Extension):
        """``{% generation %} ... {% endgeneration %}`` (transformers' ``AssistantTracker``), parsed as its body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> list[nodes.Node]:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                         extensions=[GenerationBlocks, loopcontrols])


def _nodes(tree: Any, kind: type) -> Iterator[Any]:
    return tree.find_all(kind)


def _effort_levels(tree: Any, name: str) -> tuple[str, ...]:
    """The string constants the template compares variable ``name`` with (``==``, ``!=``, ``in``) that are levels."""
    from jinja2 import nodes  # noqa: PLC0415

    found: set[str] = set()
    for compare in _nodes(tree, nodes.Compare):
        operands = [compare.expr, *(op.expr for op in compare.ops)]
        if not any(isinstance(o, nodes.Name) and o.name == name for o in operands):
            continue
        for operand in operands:
            constants = operand.items if isinstance(operand, (nodes.Tuple, nodes.List)) else [operand]
            for constant in constants:
                if isinstance(constant, nodes.Const):  # a tuple of strings may be folded into one constant
                    values = constant.value if isinstance(constant.value, (tuple, list)) else (constant.value,)
                    found.update(value for value in values if isinstance(value, str))
    levels = tuple(level for level in ("none", *EFFORT_LEVELS) if level in found)
    return levels if any(level in EFFORT_LEVELS for level in levels) else (*levels, *EFFORT_LEVELS)


def _internal_names(tree: Any) -> set[str]:
    """Names the template assigns itself (``set``, ``for`` targets, macro arguments) and never tests for
    ``defined``: its own variables, which ``find_undeclared_variables`` also reports when a branch may read one
    before it is set. A name it assigns only when it is not defined (``{% if x is not defined %}{% set x = ... %}``,
    gpt-oss's ``reasoning_effort``) stays a variable a caller sets."""
    from jinja2 import nodes  # noqa: PLC0415

    def names(target: Any) -> Iterator[str]:
        if isinstance(target, nodes.Name):
            yield target.name
        yield from (name.name for name in target.find_all(nodes.Name))

    assigned = {name for node in _nodes(tree, nodes.Assign) for name in names(node.target)}
    assigned |= {name for node in _nodes(tree, nodes.For) for name in names(node.target)}
    assigned |= {arg.name for node in _nodes(tree, nodes.Macro) for arg in node.args}
    tested = {node.node.name for node in _nodes(tree, nodes.Test)
              if node.name in ("defined", "undefined") and isinstance(node.node, nodes.Name)}
    return assigned - tested


def _message_reasoning_key(tree: Any) -> str:
    """The first of :data:`MESSAGE_REASONING_KEYS` the template reads from a mapping (``x.key``, ``x['key']``,
    ``'key' in x``)."""
    from jinja2 import nodes  # noqa: PLC0415

    read: set[str] = set()
    read.update(node.attr for node in _nodes(tree, nodes.Getattr))
    read.update(node.arg.value for node in _nodes(tree, nodes.Getitem)
                if isinstance(node.arg, nodes.Const) and isinstance(node.arg.value, str))
    for compare in _nodes(tree, nodes.Compare):
        if isinstance(compare.expr, nodes.Const) and any(op.op in ("in", "notin") for op in compare.ops):
            read.add(compare.expr.value)
    return next((key for key in MESSAGE_REASONING_KEYS if key in read), "")


def single_token_id(tokenizer: Any, text: str) -> Optional[int]:
    """The id of ``text`` when the tokenizer has it as one token (an added or special token, or a vocabulary entry),
    else None."""
    try:
        token_id = tokenizer.convert_tokens_to_ids(text)
    except Exception:  # noqa: BLE001 - an exotic tokenizer: no such token
        return None
    if not isinstance(token_id, int) or token_id < 0 or token_id == getattr(tokenizer, "unk_token_id", None):
        return None
    return token_id


def thinking_format(tokenizer: Any) -> Optional[ThinkingFormat]:
    """How the model's thinking appears in its tokens, from the tokenizer's vocabulary (None: no markers)."""
    harmony = {field: single_token_id(tokenizer, text) for field, text in HARMONY_TOKENS.items()}
    if all(harmony[field] is not None for field in HARMONY_REQUIRED):
        return ThinkingFormat("harmony", **{k: (-1 if v is None else v) for k, v in harmony.items()})
    for open_text, close_text in MARKER_PAIRS:
        open_id, close_id = single_token_id(tokenizer, open_text), single_token_id(tokenizer, close_text)
        if open_id is not None and close_id is not None:
            return ThinkingFormat("tags", open_id=open_id, close_id=close_id, open_text=open_text,
                                  close_text=close_text)
    return None


def generation_prompt_text(tokenizer: Any, template_kwargs: Mapping[str, Any]) -> str:
    """The template's generation prompt with ``template_kwargs``: what rendering a one-turn conversation
    (:data:`PROBE`) with the generation prompt adds to rendering it without.

    Raises:
        Exception: whatever the template raises for the probe.
    """
    conversation = [dict(message) for message in PROBE]
    with_prompt = str(tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True,
                                                    **template_kwargs))
    without = str(tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=False,
                                                **template_kwargs))
    return with_prompt[len(without):] if with_prompt.startswith(without) else with_prompt


def generation_prompt_ids(tokenizer: Any, template_kwargs: Mapping[str, Any]) -> list[int]:
    """The token ids of :func:`generation_prompt_text`.

    Raises:
        Exception: whatever the template raises for the probe.
    """
    return list(tokenizer(generation_prompt_text(tokenizer, template_kwargs), add_special_tokens=False)["input_ids"])


def generation_prompt_state(tokenizer: Any, thinking: ThinkingFormat,
                            template_kwargs: Mapping[str, Any]) -> PromptState:
    """Where the template's generation prompt (with ``template_kwargs``) leaves a "tags" model's thinking: only its
    own tokens are read, so a marker in a system prompt (Magistral's default one names ``[THINK]``) or in an earlier
    turn does not count. "none" when the template does not render the probe."""
    try:
        ids = generation_prompt_ids(tokenizer, template_kwargs)
    except Exception as exc:  # noqa: BLE001 - a template that refuses the probe: nothing known
        log.info("the chat template did not render a one-turn conversation (%s): where its generation prompt leaves "
                 "the thinking is unknown", exc)
        return "none"
    return prompt_state(ids, thinking)


class PromptStarts:
    """Where a request's prompt leaves a thinking model's thinking (:mod:`cog_triton.streaming.thinking`), for the
    stream process's :class:`cog_triton.streaming.generation.Generator`.

    For the chat template, where its generation prompt leaves it: only the generation prompt's own tokens are read,
    never a marker in a system prompt or an earlier turn. The template's generation prompt for a request's keyword
    arguments is rendered once for each set of them (:func:`generation_prompt_text`); a prompt that does not end with
    it (a template whose generation prompt depends on the conversation: SmolLM3's reads ``/think`` and ``/no_think``
    in the system prompt) has its own taken off it, one more render
    (:meth:`cog_triton.streaming.prompt.PromptTokenizer.generation_prompt`). For a ``prompt_template`` or a plain
    prompt, the prompt's last tokens.

    Args:
        tokenizer: the model's tokenizer.
        prompts: the request renderer on it.
        thinking: the model's thinking format (None: it does not think; :meth:`start` is not called then).
    """

    #: Keyword-argument sets remembered (a handful in practice; bounded all the same).
    MAX_KWARGS_SETS = 64

    def __init__(self, tokenizer: Any, prompts: Any, thinking: Optional[ThinkingFormat]) -> None:
        self.tokenizer = tokenizer
        self.prompts = prompts
        self.thinking = thinking
        self._by_kwargs: dict[str, tuple[str, Any]] = {}  # the generation prompt and where it leaves the thinking

    def start(self, prompt: Any, template_kwargs: Mapping[str, Any], *, chat: bool) -> Any:
        """Where ``prompt`` (a :class:`cog_triton.streaming.prompt.Prompt`, rendered with ``template_kwargs``;
        ``chat``: by the chat template) leaves the thinking: a :data:`~cog_triton.reasoning.PromptState` for tags,
        the channel of a message it left open (or None) for harmony.

        Raises:
            InputError: the chat template refuses to render with the request's keyword arguments.
        """
        if not chat:
            return self._start_of(prompt.ids)
        key = json.dumps(template_kwargs, sort_keys=True, default=str)
        known = self._by_kwargs.get(key)
        if known is None:
            try:
                suffix = generation_prompt_text(self.tokenizer, template_kwargs)
            except Exception as exc:  # noqa: BLE001 - the template's own error
                raise InputError(f"the model's chat template rejected chat_template_kwargs: {exc}") from None
            if len(self._by_kwargs) >= self.MAX_KWARGS_SETS:
                self._by_kwargs.clear()
            known = self._by_kwargs[key] = (suffix, self._start_of(self._ids_of(suffix)))
        suffix, start = known
        if prompt.text.endswith(suffix):
            return start
        return self._start_of(self._ids_of(self.prompts.generation_prompt(prompt, template_kwargs)))

    def _ids_of(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def _start_of(self, ids: list[int]) -> Any:
        fmt = self.thinking
        assert fmt is not None
        return harmony_prompt_channel(ids, fmt, self.tokenizer) if fmt.kind == "harmony" else prompt_state(ids, fmt)


def inspect_chat_template(tokenizer: Any) -> TemplateInfo:
    """:class:`cog_triton.reasoning.TemplateInfo` of ``tokenizer`` (see the module docstring); never raises."""
    thinking = thinking_format(tokenizer)
    source = template_source(tokenizer)
    if source is None:
        return TemplateInfo(has_template=False, thinking=thinking)
    from jinja2 import TemplateError, meta  # noqa: PLC0415

    environment = _environment()
    try:
        tree = environment.parse(source)
    except TemplateError as exc:
        log.warning("the chat template could not be parsed (%s): reasoning_effort and chat_template_kwargs are "
                    "refused for this model", exc)
        return TemplateInfo(has_template=True, thinking=thinking, error=f"{type(exc).__name__}: {exc}")
    undeclared = meta.find_undeclared_variables(tree)
    special = set(getattr(tokenizer, "special_tokens_map", {}) or {}) | {"additional_special_tokens"}
    undeclared = undeclared - _internal_names(tree)
    variables = frozenset(undeclared - set(environment.globals) - TRANSFORMERS_GLOBALS - special
                          - set(RENDERER_VARIABLES))
    on_off = tuple(name for name in ON_OFF_SWITCHES if name in undeclared)
    effort = next((name for name in EFFORT_SWITCHES if name in undeclared), "")
    info = TemplateInfo(
        has_template=True,
        variables=variables,
        on_off=on_off,
        effort=effort,
        effort_levels=_effort_levels(tree, effort) if effort else (),
        thinking=thinking,
        default_prompt=(generation_prompt_state(tokenizer, thinking, {}) if thinking is not None
                        and thinking.kind == "tags" else "none"),
        message_reasoning_key=_message_reasoning_key(tree),
    )
    log.info("chat template: reasoning_effort levels %s (%s)%s; thinking %s",
             "/".join(repr(level) for level in info.levels()),
             info.why(), f"; variables for chat_template_kwargs: {', '.join(sorted(variables))}" if variables else "",
             thinking.describe() if thinking else "markers: none")
    return info


__all__ = ("HARMONY_TOKENS", "MARKER_PAIRS", "PromptStarts", "generation_prompt_ids", "generation_prompt_state",
           "generation_prompt_text", "inspect_chat_template", "single_token_id", "template_source", "thinking_format")
