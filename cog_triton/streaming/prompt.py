"""The prompt's token ids: rendered once, tokenized once, by the predictor.

The predictor sends token ids to the ensemble (``input_ids``), so the prompt is tokenized exactly
once, here, and two decisions are made per request rather than once per service:

* **Special tokens the template adds (BOS).** With the tokenizer's chat template, the text is
  tokenized as ``apply_chat_template(..., tokenize=True)`` does it: ``add_special_tokens=False``,
  since the template writes BOS itself where the model wants it (Llama 2/3, Mistral). With a
  ``prompt_template`` or a plain prompt, the tokenizer adds its special tokens (BOS for Llama-style
  tokenizers) unless the text already starts with the BOS token. ``COG_TRITON_ADD_SPECIAL_TOKENS``
  forces one choice for every request.
* **Special-token text in user input stays text.** A user who types ``<|im_start|>system`` into a
  prompt must not open a system turn. Wherever user text (prompt, system prompt) contains the
  string of a special token, that text is tokenized with ``split_special_tokens=True`` and the
  template around it as usual; ``COG_TRITON_SPECIAL_TOKENS_IN_USER_TEXT=true`` restores the old
  behaviour (special-token strings become control tokens). Without such strings, the ids are exactly
  those of tokenizing the whole rendered text. Where the chat template put each user text is found by
  rendering the conversation again with markers in place of the contents, never by searching for the
  text: the template may write the same string itself (SmolLM2's default system turn ends with
  ``<|im_end|>``).

**Conversations** (:meth:`PromptTokenizer.encode_messages`) are rendered with the chat template and
tokenized the same way; every message's content is user text. Roles are checked against the ones the
template accepts (:attr:`PromptTokenizer.roles`): the conventional ``system``/``user``/``assistant``
(less ``system`` when the template refuses a system message) plus every role the template's source
compares ``role`` with (``tool``, ``ipython``, ...). Whatever else the template enforces (alternation,
a first user turn) it reports itself, by raising, and that message is passed on.

**Earlier thinking.** An assistant message may carry the thinking that preceded it
(``reasoning_content``, :func:`cog_triton.worker.inputs.parse_messages`). It reaches the template under the key
the template reads (:attr:`cog_triton.reasoning.TemplateInfo.message_reasoning_key`: Qwen3's and GLM-4.5's read
``reasoning_content``, gpt-oss's ``thinking``), and the template decides what to render (most drop it from
earlier turns); a template that reads no such key never sees it. Its text is user text like the content.
(transformers 5 fills ``reasoning_content`` and ``thinking`` from each other itself,
``utils/chat_template_utils.py`` ``_alias_reasoning_fields``; 4.57.1, the image's, does not: there this mapping
is what lets gpt-oss's template see it.)

**Template variables.** Every render of a request passes its keyword arguments
(:attr:`cog_triton.ipc.PredictInputs.template_kwargs`: the reasoning switches and the caller's
``chat_template_kwargs``, resolved in the worker) to ``apply_chat_template``.

Raises :class:`common.errors.InputError` for what the user can fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from common.errors import InputError

#: Roles of Hugging Face's chat format that chat templates are written for.
CONVENTIONAL_ROLES = ("system", "user", "assistant")
#: The message key that carries an assistant turn's earlier thinking into the renderer (the parsed ``messages``).
REASONING_KEY = "reasoning_content"
#: The texts of a message that are user text (kept as text when they hold special-token strings).
USER_TEXT_KEYS = ("content", REASONING_KEY)
# role literals in a template's source: message['role'] == 'tool', message.role != "system", 'user' == m['role']
_ROLE_NAME = r"""['"]([A-Za-z_][\w-]{0,31})['"]"""
_ROLE_REF = r"""(?:\[\s*['"]role['"]\s*\]|\.role\b|\brole\b)"""
_ROLE_LITERALS = (
    re.compile(_ROLE_REF + r"\s*(?:==|!=)\s*" + _ROLE_NAME),
    re.compile(_ROLE_NAME + r"\s*(?:==|!=)\s*\w+\s*" + _ROLE_REF),
)


# A message's text while locating it in the rendered conversation: private-use characters no tokenizer
# or template writes, around the text's index (PromptTokenizer._template_spans).
_MARK = "\ue000{}\ue001"
_MARK_RE = re.compile("\ue000([0-9]+)\ue001")


def template_roles(template: Any) -> set[str]:
    """Role names a chat template's source compares ``role`` with (a dict of templates: all of them)."""
    sources = template.values() if isinstance(template, Mapping) else [template or ""]
    roles: set[str] = set()
    for source in sources:
        for pattern in _ROLE_LITERALS:
            roles.update(match.group(1) for match in pattern.finditer(str(source)))
    return roles


@dataclass(frozen=True)
class Prompt:
    """A rendered and tokenized prompt.

    Attributes:
        text: the prompt text as rendered (template applied).
        ids: the token ids sent to the engine (INT32 values).
        add_special_tokens: whether the tokenizer's special tokens (BOS) were added.
        escaped: whether some user text was tokenized with its special-token strings kept as text.
        conversation: the messages the chat template rendered (as it read them); empty when it was not used.
    """

    text: str
    ids: list[int]
    add_special_tokens: bool
    escaped: bool = False
    conversation: Sequence[Mapping[str, Any]] = ()


class PromptTokenizer:
    """Renders a request's prompt and tokenizes it (see the module docstring for the rules).

    Args:
        tokenizer: a Hugging Face tokenizer (fast or slow).
        add_special_tokens: force adding (True) or not adding (False) the tokenizer's special tokens
            for every request; None decides per request.
        special_tokens_in_user_text: True parses special-token strings in user text as control tokens.
        reasoning_key: the message key the chat template reads an earlier turn's thinking from
            (:attr:`cog_triton.reasoning.TemplateInfo.message_reasoning_key`); "": it reads none, and the
            thinking is left out of the conversation it renders.
    """

    def __init__(
        self, tokenizer: Any, *, add_special_tokens: Optional[bool] = None, special_tokens_in_user_text: bool = False,
        reasoning_key: str = "",
    ) -> None:
        self.tokenizer = tokenizer
        self.forced_special = add_special_tokens
        self.parse_user_special = special_tokens_in_user_text
        self.reasoning_key = reasoning_key
        self.has_chat_template = bool(getattr(tokenizer, "chat_template", None))
        self.bos_text: str = getattr(tokenizer, "bos_token", None) or ""
        names: set[str] = set(getattr(tokenizer, "all_special_tokens", ()) or ())
        for token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
            if getattr(token, "special", False):
                names.add(str(token.content))
        self.special_strings = tuple(sorted((n for n in names if n), key=len, reverse=True))
        self._special_re = re.compile("|".join(re.escape(s) for s in self.special_strings)) if names else None
        self.roles: frozenset[str] = frozenset()
        self.system_refused = ""  # the template's error for a system message, when it refuses one
        if self.has_chat_template:
            roles = set(CONVENTIONAL_ROLES) | template_roles(tokenizer.chat_template)
            try:
                self._apply_template([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
            except Exception as exc:  # noqa: BLE001 - the template's own raise_exception
                roles.discard("system")
                self.system_refused = str(exc)
            self.roles = frozenset(roles)

    def _apply_template(self, messages: Sequence[Mapping[str, Any]], kwargs: Optional[Mapping[str, Any]] = None) -> str:
        return str(self.tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True,
                                                      **(kwargs or {})))

    def _for_template(self, message: Mapping[str, Any]) -> dict[str, Any]:
        """``message`` as the chat template reads it: its earlier thinking under the template's key, or left out."""
        if REASONING_KEY not in message:
            return dict(message)
        out = {key: value for key, value in message.items() if key != REASONING_KEY}
        if self.reasoning_key:
            out[self.reasoning_key] = message[REASONING_KEY]
        return out

    @staticmethod
    def _one_turn(prompt: str, system_prompt: str) -> list[dict[str, str]]:
        """The conversation a ``prompt`` (and ``system_prompt``) is rendered as with the chat template."""
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        return [*messages, {"role": "user", "content": prompt}]

    # ------------------------------------------------------------------------------- rendering
    def render(self, prompt: str, system_prompt: str = "", template: Optional[str] = None,
               template_kwargs: Optional[Mapping[str, Any]] = None) -> tuple[str, bool, list[tuple[int, int]]]:
        """(text, whether the chat template was used, spans of user text in it as (start, end) characters).

        The spans are exact for ``template`` and plain prompts; for the chat template they are found
        only when needed (see :meth:`encode` and :meth:`_template_spans`), so here they are empty.
        ``template_kwargs``: the chat template's keyword arguments.

        Raises:
            InputError: the chat template fails to render (e.g. it rejects a system message).
        """
        if template is not None:
            values = {"system_prompt": system_prompt, "prompt": prompt}
            parts: list[str] = []
            spans: list[tuple[int, int]] = []
            pos = 0
            length = 0
            for match in re.finditer(r"\{(system_prompt|prompt)\}", template):
                literal = template[pos : match.start()]
                parts.append(literal)
                length += len(literal)
                value = values[match.group(1)]
                spans.append((length, length + len(value)))
                parts.append(value)
                length += len(value)
                pos = match.end()
            parts.append(template[pos:])
            return "".join(parts), False, spans
        if self.has_chat_template:
            try:
                text = self._apply_template(self._one_turn(prompt, system_prompt), template_kwargs)
            except Exception as exc:  # jinja errors raised by the template itself
                raise InputError(f"the model's chat template rejected the messages: {exc}") from None
            return text, True, []
        if system_prompt:
            return f"{system_prompt}\n\n{prompt}", False, [(0, len(system_prompt)), (len(system_prompt) + 2, len(system_prompt) + 2 + len(prompt))]
        return prompt, False, [(0, len(prompt))]

    def render_messages(
        self, messages: Sequence[Mapping[str, Any]], system_prompt: str = "",
        template_kwargs: Optional[Mapping[str, Any]] = None,
    ) -> tuple[str, list[dict[str, Any]]]:
        """(text, the conversation rendered): ``messages`` with ``system_prompt`` as a first system
        message when given, through the chat template with the generation prompt added (and ``template_kwargs``);
        an earlier turn's thinking under the template's key (:meth:`_for_template`).

        Raises:
            InputError: the tokenizer has no chat template; system_prompt given while messages start
                with a system message; a role the template does not accept; or the template refuses
                the conversation (its message is included).
        """
        if not self.has_chat_template:
            raise InputError(
                "messages need a chat template, and this model's tokenizer has none; send prompt instead "
                "(with prompt_template to format it)"
            )
        conversation = [self._for_template(m) for m in messages]
        if system_prompt:
            if conversation and conversation[0].get("role") == "system":
                raise InputError(
                    "system_prompt is given and messages start with a system message: give the system message "
                    "once, either in system_prompt or as the first message"
                )
            conversation.insert(0, {"role": "system", "content": system_prompt})
        for index, message in enumerate(conversation):
            role = message.get("role")
            if role not in self.roles:
                offset = 1 if system_prompt else 0
                where = "system_prompt" if system_prompt and index == 0 else f"messages[{index - offset}]"
                extra = f" (the template refuses a system message: {self.system_refused})" if role == "system" else ""
                raise InputError(
                    f"{where} has role {role!r}, which this model's chat template does not accept{extra}; "
                    f"allowed roles: {', '.join(sorted(self.roles))}"
                )
        try:
            text = self._apply_template(conversation, template_kwargs)
        except Exception as exc:  # jinja errors raised by the template itself (alternation, ...)
            raise InputError(f"the model's chat template rejected the messages: {exc}") from None
        return text, conversation

    def encode_messages(self, messages: Sequence[Mapping[str, Any]], system_prompt: str = "",
                        template_kwargs: Optional[Mapping[str, Any]] = None) -> Prompt:
        """Render and tokenize a conversation (see :meth:`render_messages`).

        The ids are those of ``apply_chat_template(conversation, add_generation_prompt=True,
        tokenize=True)``, except that special-token strings inside any message's texts stay text.

        Raises:
            InputError: see :meth:`render_messages`; or content with special-token strings that
                cannot be located in the rendered text.
        """
        text, conversation = self.render_messages(messages, system_prompt, template_kwargs)
        add = self.forced_special if self.forced_special is not None else False
        texts = [str(m[key]) for m in conversation for key in self._text_keys() if key in m]
        return self._encode_rendered(text, add, texts, conversation=conversation, template_kwargs=template_kwargs)

    def _text_keys(self) -> tuple[str, ...]:
        """The keys of a message (as the template reads it) whose values are user text."""
        return ("content", self.reasoning_key) if self.reasoning_key else ("content",)

    # ------------------------------------------------------------------------------ tokenizing
    def encode(self, prompt: str, system_prompt: str = "", template: Optional[str] = None,
               template_kwargs: Optional[Mapping[str, Any]] = None) -> Prompt:
        """Render and tokenize one request's prompt (``template_kwargs``: the chat template's keyword arguments).

        Raises:
            InputError: the chat template fails, or user text with special-token strings cannot be
                located in what the chat template rendered (so it cannot be kept as text).
        """
        text, chat, spans = self.render(prompt, system_prompt, template, template_kwargs)
        if self.forced_special is not None:
            add = self.forced_special
        elif chat:
            add = False  # as apply_chat_template(tokenize=True): the template writes its own BOS
        else:
            add = not (self.bos_text and text.startswith(self.bos_text))
        if chat:
            conversation = self._one_turn(prompt, system_prompt)
            return self._encode_rendered(text, add, [system_prompt, prompt], conversation=conversation,
                                         template_kwargs=template_kwargs)
        return self._encode_rendered(text, add, [system_prompt, prompt], spans=spans)

    def _encode_rendered(
        self, text: str, add: bool, user_texts: list[str], spans: Optional[list[tuple[int, int]]] = None,
        conversation: Sequence[Mapping[str, Any]] = (), template_kwargs: Optional[Mapping[str, Any]] = None,
    ) -> Prompt:
        """Tokenize rendered ``text``; ``user_texts`` keep special-token strings as text. ``spans``: where
        they are in ``text``; or ``conversation``, the messages the chat template rendered ``text`` from (with
        ``template_kwargs``)."""
        risky = (
            not self.parse_user_special
            and self._special_re is not None
            and any(self._special_re.search(t) for t in user_texts)
        )
        if not risky:
            return Prompt(text=text, ids=self._ids(text, add), add_special_tokens=add, conversation=conversation)
        if spans is None:
            spans = self._template_spans(text, conversation, template_kwargs)
        return Prompt(text=text, ids=self._segmented(text, spans, add), add_special_tokens=add, escaped=True,
                      conversation=conversation)

    def generation_prompt(self, prompt: Prompt, template_kwargs: Optional[Mapping[str, Any]] = None) -> str:
        """What the chat template's generation prompt added to ``prompt`` (rendered from its conversation with
        ``template_kwargs``): the conversation rendered without it, taken off the prompt's text; "" when the
        template renders the conversation otherwise without it (or was not used).

        Raises:
            InputError: the chat template refuses the conversation without a generation prompt.
        """
        if not prompt.conversation:
            return ""
        try:
            without = str(self.tokenizer.apply_chat_template(list(prompt.conversation), tokenize=False,
                                                             add_generation_prompt=False, **(template_kwargs or {})))
        except Exception as exc:  # jinja errors raised by the template itself
            raise InputError(f"the model's chat template rejected the messages: {exc}") from None
        return prompt.text[len(without):] if prompt.text.startswith(without) else ""

    def _ids(self, text: str, add: bool, split_special: bool = False) -> list[int]:
        kwargs: dict[str, Any] = {"add_special_tokens": add}
        if split_special:
            kwargs["split_special_tokens"] = True
        return list(self.tokenizer(text, **kwargs)["input_ids"])

    def _template_spans(self, text: str, conversation: Sequence[Mapping[str, Any]],
                        template_kwargs: Optional[Mapping[str, Any]] = None) -> list[tuple[int, int]]:
        """Where each message's texts (its content, and the earlier thinking the template reads) are in ``text``, the
        chat template's rendering of ``conversation`` (with ``template_kwargs``), as (start, end) characters.

        The template renders the conversation again with every text replaced by a marker (private-use
        characters and the text's index); putting the texts back in the markers' places must give
        ``text`` exactly, with the texts as given or as the template trims them. That places each
        text where the template put it, not at an equal string the template writes itself (SmolLM2's
        default system turn ends with ``<|im_end|>``: a user's ``<|im_end|>`` is not that one). A text the template
        leaves out (an earlier turn's thinking, for most) has no marker in the rendering and no span.

        Raises:
            InputError: the template changes a text in another way (upper-cases it, or renders
                something else for it), so its special-token strings cannot be kept as text.
        """
        keys = self._text_keys()
        texts: list[str] = []
        marked: list[dict[str, Any]] = []
        for message in conversation:
            copy = dict(message)
            for key in keys:
                if key in copy:
                    copy[key] = _MARK.format(len(texts))
                    texts.append(str(message[key]))
            marked.append(copy)
        try:
            rendered = self._apply_template(marked, template_kwargs)
        except Exception:  # noqa: BLE001 - a template that refuses markers cannot place the contents
            raise self._unplaceable(conversation) from None
        for trimmed in (False, True):
            parts: list[str] = []
            spans: list[tuple[int, int]] = []
            length = pos = 0
            for match in _MARK_RE.finditer(rendered):
                content = texts[int(match.group(1))]
                if trimmed:
                    content = content.strip()
                parts += [rendered[pos : match.start()], content]
                length += match.start() - pos
                spans.append((length, length + len(content)))
                length += len(content)
                pos = match.end()
            parts.append(rendered[pos:])
            if spans and "".join(parts) == text:
                return spans
        raise self._unplaceable(conversation)

    def _unplaceable(self, conversation: Sequence[Mapping[str, Any]]) -> InputError:
        """The error for texts the chat template does not render as given (see :meth:`_template_spans`)."""
        # Only risky texts get here, so one of them holds a special string (and the pattern exists).
        texts = (str(m[key]) for m in conversation for key in self._text_keys() if key in m)
        found = next(filter(None, (self._special_re.search(text) for text in texts)))
        return InputError(
            f"the input contains the special token {found.group(0)!r}, and the chat template changes the text "
            "around it, so it cannot be kept as plain text; remove it, or set "
            "COG_TRITON_SPECIAL_TOKENS_IN_USER_TEXT=true to let user text contain control tokens"
        )

    def _segmented(self, text: str, spans: list[tuple[int, int]], add: bool) -> list[int]:
        ids: list[int] = []
        if add:
            ids.extend(self._ids("", True))  # the special tokens the tokenizer adds around a text (BOS)
        pos = 0
        for start, end in sorted(spans):
            if start > pos:
                ids.extend(self._ids(text[pos:start], False))
            if end > start:
                ids.extend(self._ids(text[start:end], False, split_special=True))
            pos = max(pos, end)
        if pos < len(text):
            ids.extend(self._ids(text[pos:], False))
        return ids
