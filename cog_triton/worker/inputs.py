"""Validation of prediction inputs (in the Cog worker; the prompt is rendered and tokenized by
:mod:`cog_triton.streaming.prompt`, in the stream processes).

Every input's type, default and bounds come from the predictor's Cog schema
(:mod:`cog_triton.schema`, generated from ``predict.py``'s literal ``Input(...)`` declarations), so
our validation and coglet's (HTTP 422, when the schema is bundled) apply the same values. This
module validates them again because ``predict()`` can be reached without coglet's validation (no
schema bundled, or a direct call), and adds what the schema cannot say: float32 representability
(the dtype of TensorRT-LLM's sampling tensors), min_tokens <= max_tokens, and the limits that
depend on the engine (max input/sequence length, :func:`cog_triton.streaming.token_budget.token_budget`).

:func:`validate_inputs` is driven by the schema: every input it declares is checked by its schema type, bounds,
length and choices (:func:`check_input`), unless it has a parser of its own (:data:`PARSERS`) or a rule that spans
several inputs takes it (:data:`RULES`), and lands in the :class:`cog_triton.ipc.PredictInputs` field of its name,
which is made from the same schema. Adding an input is its ``Input(...)`` in predict.py (and the schema regenerated);
its handling is a parser here only when its value needs more than its schema type says.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
from typing import Any, Callable, Mapping, Optional, Sequence

from common.errors import InputError
from cog_triton.ipc import PredictInputs
from cog_triton.reasoning import THINK_CLOSE, THINK_OPEN, TemplateInfo, resolve
from cog_triton.worker.guides import select_guide
from cog_triton.fetch.adapter_refs import parse_adapter_ref
from cog_triton.schema import InputSpec, input_specs
from cog_triton.worker.stop_sequences import parse_stop_sequences

#: The key of an assistant message's earlier thinking, as :func:`parse_messages` returns it (and as the input takes it:
#: vLLM's and DeepSeek's API name; :mod:`cog_triton.streaming.prompt` hands it to the template under the template's).
REASONING_KEY = "reasoning_content"

#: Smallest positive normal float32: a smaller non-zero value would reach the engine as 0 or a
#: denormal (TensorRT-LLM's temperature, top_p and penalties are FP32 tensors).
FLOAT32_TINY = 1.1754943508222875e-38


def _show(value: Any, limit: int = 80) -> str:
    """repr() of an input value, shortened for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _spec(name: str) -> InputSpec:
    return input_specs()[name]


def _check_range(spec: InputSpec, value: Any, shown: Any = None) -> None:
    if (spec.minimum is not None and value < spec.minimum) or (spec.maximum is not None and value > spec.maximum):
        raise InputError(f"{spec.name}={_show(value if shown is None else shown)} is out of range; allowed: {spec.allowed()}")


def check_number(name: str, value: Any) -> float:
    """Validate a ``number`` input against its schema bounds and float32; return it as a float.

    Raises:
        InputError: not a number, not finite, out of range, or a non-zero value that float32
            cannot represent (it would reach the engine as 0).
    """
    spec = _spec(name)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{name} must be a number from {spec.allowed()}, got {_show(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        raise InputError(f"{name}={_show(value)} is out of range; allowed: {spec.allowed()}") from None
    if not math.isfinite(number):
        raise InputError(f"{name} must be a finite number from {spec.allowed()}, got {value!r}")
    _check_range(spec, number, value)
    if number != 0.0 and abs(number) < FLOAT32_TINY:
        raise InputError(
            f"{name}={number!r} cannot be represented in float32, the dtype TensorRT-LLM uses for it: it would "
            f"become 0; use 0 or a magnitude of at least {FLOAT32_TINY:.3g}"
        )
    return number


def check_integer(name: str, value: Any) -> int:
    """Validate an ``integer`` input against its schema bounds; return it.

    Raises:
        InputError: not an integer (a float with an integral value is accepted), or out of range.
    """
    spec = _spec(name)
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise InputError(f"{name} must be an integer from {spec.allowed()}, got {_show(value)}")
    _check_range(spec, value)
    return value


def check_text(name: str, value: Any, *, empty_ok: bool = True, expected: str = "a string") -> str:
    """Validate a ``string`` input: its type and its schema ``maxLength`` (characters), before any parsing.

    Raises:
        InputError: not a string, or longer than allowed.
    """
    if value is None and empty_ok:
        return ""
    if not isinstance(value, str):
        raise InputError(f"{name} must be {expected}, got {_show(value)} ({type(value).__name__})")
    limit = _spec(name).max_length
    if limit is not None and len(value) > limit:
        raise InputError(f"{name} has {len(value)} characters; at most {limit} are allowed")
    return value


def _text_part(where: str, part: Mapping[str, Any]) -> str:
    """A ``{"type": "text", "text": ...}`` content part: its text."""
    extra = sorted(set(part) - {"type", "text"})
    if extra:
        raise InputError(f"{where} has unknown key(s) {', '.join(extra)}; a text part has type and text")
    text = part.get("text")
    if not isinstance(text, str):
        raise InputError(f"{where}.text must be a string, got {_show(text)}")
    return text


#: ``image_url.detail`` values taken: the model's processor decides the resolution, so only "auto" means what it says.
IMAGE_DETAILS = ("auto",)


def _image_url_part(where: str, part: Mapping[str, Any]) -> dict[str, str]:
    """A ``{"type": "image_url", "image_url": {"url": ..., "detail": "auto"}}`` content part (an https or http URL, or
    a ``data:image/...;base64,...`` URI): the part as the conversation carries it, ``{"type": "image", "url"}`` (the
    chat format's image part; fetched and checked in a stream process, :mod:`cog_triton.streaming.images`)."""
    image = part.get("image_url")
    if set(part) - {"type", "image_url"} or not isinstance(image, dict) or set(image) - {"url", "detail"}:
        raise InputError(f"{where} must be {{\"type\": \"image_url\", \"image_url\": {{\"url\": <string>}}}}, got "
                         f"{_show(part)}")
    url = image.get("url")
    if not isinstance(url, str) or not url.lower().startswith(("https://", "http://", "data:")):
        raise InputError(f"{where}.image_url.url must be an https URL or a data URI (data:image/<type>;base64,...), "
                         f"got {_show(url)}")
    detail = image.get("detail", "auto")
    if detail not in IMAGE_DETAILS:
        raise InputError(f"{where}.image_url.detail={_show(detail)} is not taken: the model's processor decides the "
                         "resolution; leave it out or give \"auto\"")
    return {"type": "image", "url": url}


#: The content parts a message's ``content`` may list, by their OpenAI ``type``: type -> the part's parser, which
#: checks it (``where`` names it in errors, e.g. ``messages[2].content[0]``) and returns its text, or, for a part that
#: is not text, the part as the conversation carries it (an image: ``{"type": "image", "url"}``). vLLM and
#: trtllm-serve take the same parts, and join a message's text parts with a line break for a template that renders
#: content as a string (vllm-project/vllm ``vllm/entrypoints/chat_utils.py``, ``_parse_chat_message_content_parts``),
#: as :func:`parse_messages` does; a message with an image keeps its parts as a list (:func:`_content`).
CONTENT_PARTS: dict[str, Callable[[str, Mapping[str, Any]], Any]] = {"text": _text_part, "image_url": _image_url_part}
#: The keys a message may have (``reasoning_content``: an assistant turn's earlier thinking).
MESSAGE_KEYS = ("role", "content", REASONING_KEY)


def _content(where: str, content: Any) -> Any:
    """A message's ``content``: a string, or a list of content parts (:data:`CONTENT_PARTS`): their texts joined when
    they are all text, else the list as ``{"type": "text", "text"}`` and ``{"type": "image", "url"}`` parts in order
    (placed by the chat template, :mod:`cog_triton.streaming.image_prompt`)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InputError(f"{where} must be a string or a list of content parts, got {_show(content)}")
    parsed: list[Any] = []
    for index, part in enumerate(content):
        at = f"{where}[{index}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if not isinstance(part, dict) or not isinstance(kind, str):
            raise InputError(f"{at} must be an object with a type ({', '.join(CONTENT_PARTS)}), got {_show(part)}")
        if kind not in CONTENT_PARTS:
            raise InputError(f"{at} has type {kind!r}; the content part types taken: {', '.join(CONTENT_PARTS)}")
        parsed.append(CONTENT_PARTS[kind](at, part))
    if all(isinstance(text, str) for text in parsed):
        return "\n".join(parsed)
    return [{"type": "text", "text": item} if isinstance(item, str) else item for item in parsed]


def _earlier_thinking(where: str, role: str, content: str, reasoning: Any) -> tuple[str, Optional[str]]:
    """An assistant message's (answer, thinking): ``reasoning_content``, or the content's leading
    ``<think>...</think>`` block (the stream convention, so that a streamed answer can be sent back as it came)."""
    if reasoning is not None:
        if role != "assistant":
            raise InputError(f"{where} has reasoning_content, which only an assistant message carries (its "
                             "thinking before the answer)")
        if not isinstance(reasoning, str):
            raise InputError(f"{where}.reasoning_content must be a string, got {_show(reasoning)}")
    if role != "assistant":
        return content, None
    stripped = content.lstrip()
    if stripped.startswith(THINK_OPEN) and THINK_CLOSE in stripped:
        if reasoning is not None:
            raise InputError(f"{where} has both reasoning_content and a {THINK_OPEN} block in its content; give the "
                             "thinking once")
        thought, _, answer = stripped[len(THINK_OPEN):].partition(THINK_CLOSE)
        return answer.lstrip(), thought
    return content, reasoning


def parse_messages(text: str) -> list[dict[str, Any]]:
    """Parse the ``messages`` input: a JSON array of ``{"role": str, "content": str or [content parts]}`` objects;
    an assistant message may carry its earlier thinking, as ``reasoning_content`` or as a leading
    ``<think>...</think>`` in its content (how the output streams it).

    Returns:
        The messages as ``{"role", "content"}`` dicts (the content one string, its text parts joined with a line
        break; a user message with images keeps its parts as a list, :func:`_content`), with ``reasoning_content``
        where an assistant message carried thinking (the chat template decides what to render of it:
        :mod:`cog_triton.streaming.prompt`).

    Only the structure is checked here; which roles the model's chat template accepts is checked by
    :class:`cog_triton.streaming.prompt.PromptTokenizer`.

    Raises:
        InputError: not JSON, not a non-empty array, or an item without a string role and content
            (the message names the item's index and, for a content part, the part's), or an image part outside a
            user message.
    """
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            f"messages is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); give a JSON array "
            'such as [{"role": "user", "content": "Hi"}]'
        ) from None
    if not isinstance(value, list) or not value:
        raise InputError(
            f"messages must be a non-empty JSON array of {{\"role\", \"content\"}} objects, got {_show(value)}"
        )
    messages: list[dict[str, Any]] = []
    for index, item in enumerate(value):
        if not isinstance(item, dict):
            raise InputError(f"messages[{index}] must be an object with role and content, got {_show(item)}")
        role = item.get("role")
        if not isinstance(role, str) or not role.strip():
            raise InputError(f"messages[{index}].role must be a non-empty string, got {_show(role)}")
        extra = sorted(set(item) - set(MESSAGE_KEYS))
        if extra:
            raise InputError(
                f"messages[{index}] has unknown key(s) {', '.join(extra)}; each message has role and content (and an "
                "assistant message may have reasoning_content)"
            )
        content = _content(f"messages[{index}].content", item.get("content"))
        if isinstance(content, list) and role != "user":
            number = next(n for n, part in enumerate(content) if part["type"] != "text")
            raise InputError(f"messages[{index}].content[{number}] is an image in a {role!r} message; images go in "
                             "user messages")
        content, reasoning = _earlier_thinking(f"messages[{index}]", role, content, item.get(REASONING_KEY))
        message = {"role": role, "content": content}
        if reasoning is not None:
            message[REASONING_KEY] = reasoning
        messages.append(message)
    return messages


def parse_image_input(value: Any) -> tuple[str, ...]:
    """``image_input`` -> the paths of its files, in order.

    Cog downloads the URLs given to a ``list[Path]`` input (and decodes data URIs) into files before ``predict()``
    runs, so each item is such a file (a ``pathlib.Path``). coglet 0.23.1 passes anything else on as it came
    (tests/test_coglet_path_inputs.py): a path on the server or a ``file://`` URL as a plain string, and the URLs of a
    list that mixes URLs with such strings undownloaded (``URLPath``). Those are refused: a caller's string must not
    make the server read its own files.

    Raises:
        InputError: not a list, or an item that is not a file Cog received (naming the item).
    """
    if value is None or value == "":
        return ()
    if not isinstance(value, (list, tuple)):
        raise InputError(f"image_input must be a list of images (files or URLs), got {_show(value)}")
    paths = []
    for index, item in enumerate(value):
        where = f"image_input[{index}]"
        if type(item).__name__ == "URLPath":  # cog.types.URLPath: a URL Cog did not download
            raise InputError(f"{where} ({_show(str(item))}) was not downloaded: Cog downloads the URLs of image_input "
                             "only when every item is a URL or a file upload; give each image as one of those")
        if isinstance(item, os.PathLike):
            if not os.path.isfile(item):
                raise InputError(f"{where} is not a file Cog received ({_show(str(item))} does not exist)")
            paths.append(os.fspath(item))
        elif isinstance(item, str):
            raise InputError(f"{where}={_show(item)} is not an image Cog received: give an https URL, a data URI or "
                             "a file upload (a path on the server is not taken)")
        else:
            raise InputError(f"{where} must be an image file or URL, got {_show(item)} ({type(item).__name__})")
    return tuple(paths)


def _choice(name: str, value: Any) -> str:
    """Validate a ``choices=`` input against the schema's choices."""
    spec = _spec(name)
    if not isinstance(value, str) or (spec.choices is not None and value not in spec.choices):
        raise InputError(f"{name}={_show(value)} is not allowed; allowed: {spec.allowed()}")
    return value


def check_boolean(name: str, value: Any) -> bool:
    """Validate a ``boolean`` input (JSON true/false; Python bool).

    Raises:
        InputError: not a bool.
    """
    if not isinstance(value, bool):
        raise InputError(f"{name} must be true or false, got {_show(value)}")
    return value


def _resolve_alias(name: str, value: int, alias: str, alias_value: Any, unset: tuple[Any, ...]) -> int:
    """``value`` of input ``name``, replaced by the deprecated alias ``alias`` when it is given.

    replicate/cog-triton ``predict.py`` (@1434a90): ``max_new_tokens``/``min_new_tokens`` take over
    ``max_tokens``/``min_tokens`` when those are at their default (coglet fills in a default before
    predict() runs, so a default cannot be told from an omitted input) or equal; anything else is an
    error there ("Can't set both ..."), and here. ``unset`` are the alias values that mean "not given"
    (None; and 0 for min_new_tokens, which replicate's ``if min_new_tokens:`` skips).

    Raises:
        InputError: both are given with different values; the message names both.
    """
    if alias_value in unset:
        return value
    alias_value = check_integer(alias, alias_value)
    if value not in (default_of(name), alias_value):
        raise InputError(
            f"{alias} is a deprecated alias of {name}; give only one of them ({name}={value}, "
            f"{alias}={alias_value}); {name} is preferred"
        )
    return alias_value


def default_of(name: str) -> Any:
    """The schema default of input ``name`` (None when it has none)."""
    return _spec(name).default


Getter = Callable[[str], Any]


def _prompt_inputs(get: Getter) -> dict[str, Any]:
    """``prompt``, ``messages`` (parsed), ``system_prompt`` and ``prompt_template`` (None when empty), checked in that
    order: exactly one of prompt and messages, and a template only with a prompt, containing ``{prompt}``."""
    prompt = check_text("prompt", get("prompt"), expected="a string (or empty when messages is given)")
    messages_text = check_text(
        "messages", get("messages"), expected="a JSON array of messages as a string (or empty)"
    )
    if prompt.strip() and messages_text.strip():
        raise InputError(
            "prompt and messages are both given; give exactly one: prompt for a single user turn, or messages "
            "for a whole conversation (add the prompt as the last user message)"
        )
    if not prompt.strip() and not messages_text.strip():
        raise InputError(
            f"prompt={_show(prompt, 40)} is empty or only whitespace, and so is messages; give exactly one of "
            "prompt (a non-empty text to respond to) or messages (a JSON array of role/content objects)"
        )
    messages = parse_messages(messages_text) if messages_text.strip() else None
    system_prompt = check_text("system_prompt", get("system_prompt"), expected="a string (or empty)")
    prompt_template: Optional[str] = check_text(
        "prompt_template", get("prompt_template"), expected="a string containing {prompt} (or empty)"
    )
    if not (prompt_template or "").strip():
        prompt_template = None
    elif messages is not None:
        raise InputError(
            "prompt_template applies to prompt; messages are rendered with the model's chat template, so leave "
            "prompt_template empty (or send prompt instead of messages)"
        )
    elif "{prompt}" not in prompt_template:  # type: ignore[operator]
        raise InputError(
            f"prompt_template={prompt_template[:80]!r} must contain {{prompt}} "  # type: ignore[index]
            "(and may contain {system_prompt}); leave it empty to use the model's chat template"
        )
    return {"prompt": prompt, "messages": messages, "system_prompt": system_prompt, "prompt_template": prompt_template}


def _token_counts(get: Getter) -> dict[str, Any]:
    """``max_tokens`` and ``min_tokens`` (their replicate/cog-triton aliases resolved; -1 is "off" for min_tokens, as
    replicate/cog-triton's predict.py ``_process_args`` has it), min_tokens at most max_tokens."""
    max_tokens = check_integer("max_tokens", get("max_tokens"))
    max_tokens = _resolve_alias("max_tokens", max_tokens, "max_new_tokens", get("max_new_tokens"), (None,))
    min_tokens = check_integer("min_tokens", get("min_tokens"))
    min_tokens = _resolve_alias("min_tokens", min_tokens, "min_new_tokens", get("min_new_tokens"), (None, 0))
    min_tokens = max(min_tokens, 0)
    if min_tokens > max_tokens:
        raise InputError(f"min_tokens={min_tokens} is greater than max_tokens={max_tokens}; allowed: 0 to max_tokens")
    return {"max_tokens": max_tokens, "min_tokens": min_tokens}


def _seed(get: Getter) -> dict[str, Any]:
    """The seed and whether the user gave it (none given: one drawn, 0 to 2**31 - 1)."""
    seed = get("seed")
    if seed is None or seed == "":
        return {"seed": random.SystemRandom().randint(0, 2**31 - 1), "seed_given": False}
    try:
        return {"seed": check_integer("seed", seed), "seed_given": True}
    except InputError as exc:
        raise InputError(f"{exc.message}, or empty for a random seed") from None


def _stop_sequences_size(get: Getter) -> dict[str, Any]:
    """stop_sequences given as text is bounded before anything else is done with it (it is parsed in its turn)."""
    value = get("stop_sequences")
    if isinstance(value, str):
        check_text("stop_sequences", value)
    return {}


def _guide(get: Getter) -> dict[str, Any]:
    """The structured-output inputs -> one guide (:func:`cog_triton.worker.guides.select_guide`)."""
    return {"guide": select_guide(
        json_schema=check_text("json_schema", get("json_schema"), expected="a JSON Schema as a string (or empty)"),
        response_format=_choice("response_format", get("response_format")),
        regex=check_text("regex", get("regex"), expected="a regular expression as a string (or empty)"),
        grammar=check_text("grammar", get("grammar"), expected="an EBNF grammar as a string (or empty)"),
    )}


def _lora(get: Getter) -> dict[str, Any]:
    """lora_weights -> the adapter it names (None: the base model)."""
    return {"lora": parse_adapter_ref(
        check_text("lora_weights", get("lora_weights"), expected="a URL or hf:// reference (or empty)")
    )}


#: Rules over several inputs, run first and in this order (so the first error a request with several bad inputs gets
#: is the same as before the schema drove validation): (the inputs it takes, the rule). Each returns the fields it
#: made; the inputs it takes get no check of their own (``stop_sequences``' size check takes none: it is parsed in
#: its turn, below).
RULES: tuple[tuple[tuple[str, ...], Callable[[Getter], dict[str, Any]]], ...] = (
    (("prompt", "messages", "system_prompt", "prompt_template"), _prompt_inputs),
    (("max_tokens", "max_new_tokens", "min_tokens", "min_new_tokens"), _token_counts),
    (("seed",), _seed),
    ((), _stop_sequences_size),
    (("json_schema", "response_format", "regex", "grammar"), _guide),
    (("lora_weights",), _lora),
)
#: The inputs the rules take.
RULE_INPUTS = frozenset(name for names, _ in RULES for name in names)

def parse_template_kwargs(value: Any) -> dict[str, Any]:
    """The ``chat_template_kwargs`` input: a JSON object as text ("" or blank: none) -> the dict. Which keys the
    model's chat template takes is checked against it (:func:`cog_triton.reasoning.resolve`, in the service).

    Raises:
        InputError: not a string, too long, not JSON, or not an object.
    """
    text = check_text("chat_template_kwargs", value, expected='a JSON object as a string, e.g. {"x": 1} (or empty)')
    if not text.strip():
        return {}
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"chat_template_kwargs is not valid JSON ({exc.msg} at line {exc.lineno} column "
                         f"{exc.colno}); give a JSON object such as {{\"date_string\": \"26 Jul 2024\"}}") from None
    if not isinstance(parsed, dict):
        raise InputError(f"chat_template_kwargs must be a JSON object of template variables, got {_show(parsed)}")
    return parsed


#: Inputs whose value needs more than their schema type says: name -> parser of the value as given (it checks it).
PARSERS: dict[str, Callable[[Any], Any]] = {
    # -1 means "off" like 0 (replicate/cog-triton predict.py: "if top_k < 0: top_k = 0")
    "top_k": lambda value: max(check_integer("top_k", value), 0),
    # text or a list (a direct call); its size was checked first
    "stop_sequences": parse_stop_sequences,
    "chat_template_kwargs": parse_template_kwargs,
    # the files Cog received, as paths (their contents are read and checked in a stream process)
    "image_input": parse_image_input,
}


def check_input(spec: InputSpec, value: Any) -> Any:
    """Check one input's value by its schema type, bounds, length and choices (what coglet's schema check does);
    return it typed (a number as a float, null as None where the input is nullable).

    Raises:
        InputError: the value is not of the input's type, or outside its bounds, length or choices.
        ValueError: the schema gives the input a type this function does not check (a new kind of input).
    """
    if value is None and spec.nullable:
        return None
    if spec.choices is not None:
        return _choice(spec.name, value)
    if spec.type == "string":
        return check_text(spec.name, value)
    if spec.type == "integer":
        return check_integer(spec.name, value)
    if spec.type == "number":
        return check_number(spec.name, value)
    if spec.type == "boolean":
        return check_boolean(spec.name, value)
    raise ValueError(f"input {spec.name} has schema type {spec.type!r}, which validation does not check")


def validate_inputs(**values: Any) -> PredictInputs:
    """Check every input; return the validated, typed inputs.

    First the :data:`RULES` over several inputs, in their order; then every other input the schema declares, in
    declaration order, by its parser (:data:`PARSERS`) or its schema type (:func:`check_input`).

    Args:
        values: the predict() inputs by name; a missing one takes the schema default.

    ``lora_weights`` with images (``image_input`` or image parts of ``messages``) is refused: TensorRT-LLM 1.2.1's
    image models do not, or cannot be shown to, apply an adapter to their language model. Qwen2-VL's and
    Qwen2.5-VL's ``Qwen2VLModelBase.forward`` calls its language model without the request's ``lora_params``
    (``_torch/models/modeling_qwen2vl.py``, the 1.2-era index copy 2926488359, as at 000a01de); Gemma 3's
    ``Gemma3VLM.forward`` passes them (``modeling_gemma3vl.py`` @0f8dcd9d), but the HF adapter loader takes any
    ``<prefix>.<layer>.<module>.lora_A.weight`` key as that layer of the language model whatever its prefix
    (``lora_manager.py`` ``HF_LORA_PATTERN``, ``iterate_hf_lora``), so an adapter that also targets the vision
    tower's layers would be read into the language model's, and the v1.2.1 commit itself is not in the public
    source index (docs/deploy.md, "Which inputs combine").

    Raises:
        InputError: an unknown input, or the first invalid one (in the order above), naming it, its value and the
            allowed values; ``lora_weights`` with images.
    """
    specs = input_specs()
    unknown = sorted(set(values) - set(specs))
    if unknown:
        raise InputError(f"unknown input(s) {', '.join(unknown)}; the inputs are: {', '.join(specs)}")
    get: Getter = lambda name: values.get(name, specs[name].default)  # noqa: E731
    fields: dict[str, Any] = {}
    for _, rule in RULES:
        fields.update(rule(get))
    for name, default, parse, spec in _checks(specs):
        value = values.get(name, default)
        if parse is not None:
            fields[name] = parse(value)
        elif value == default and type(value) is type(default):
            # The schema's default, as coglet fills it in for every input a request leaves out: valid as it is, and
            # what checking it would return.
            fields[name] = value
        else:
            fields[name] = check_input(spec, value)
    inputs = PredictInputs(**fields)
    if inputs.lora is not None and inputs.image_count:  # lora first: a prediction without an adapter pays nothing
        raise InputError(
            f"lora_weights cannot be applied to a prediction with images ({inputs.image_count} given): this server's "
            "TensorRT-LLM (1.2.1) does not apply an adapter to an image model's language model for such a request; "
            "give lora_weights with a text prediction, or the images without lora_weights")
    return inputs


_plan: tuple[Any, tuple[tuple[str, Any, Optional[Callable[[Any], Any]], InputSpec], ...]] = (None, ())


def _checks(specs: Mapping[str, InputSpec]) -> tuple[tuple[str, Any, Optional[Callable[[Any], Any]], InputSpec], ...]:
    """The inputs :func:`validate_inputs` checks one by one, in declaration order: (name, default, parser or None,
    spec) for each input no rule takes (worked out once per schema: it is on every prediction's path)."""
    global _plan
    if _plan[0] is not specs:
        _plan = (specs, tuple((name, spec.default, PARSERS.get(name), spec) for name, spec in specs.items()
                              if name not in RULE_INPUTS))
    return _plan[1]


def resolve_reasoning(inputs: PredictInputs, template: TemplateInfo) -> PredictInputs:
    """``inputs`` with their reasoning resolved against the model's chat template (:func:`cog_triton.reasoning.resolve`,
    the template as a stream process found it): the template's keyword arguments and the level applied.

    Raises:
        InputError: see :func:`cog_triton.reasoning.resolve`.
    """
    resolved = resolve(template, inputs.reasoning_effort, inputs.chat_template_kwargs,
                       prompt_template=inputs.prompt_template is not None)
    return dataclasses.replace(inputs, template_kwargs=resolved.template_kwargs, reasoning_applied=resolved.applied,
                               reasoning_note=resolved.note)


__all__: Sequence[str] = (
    "CONTENT_PARTS", "PARSERS", "RULES", "RULE_INPUTS", "check_boolean", "check_input", "check_number",
    "check_integer", "check_text", "parse_image_input", "parse_messages",
    "parse_template_kwargs", "resolve_reasoning", "validate_inputs",
)
