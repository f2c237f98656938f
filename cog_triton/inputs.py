"""Validation of prediction inputs and prompt formatting.

Cog's HTTP server validates inputs only when the image has an OpenAPI schema (``cog build``
writes it); this module validates every input itself, so a bad value always fails with a message
naming the input, the value and the allowed range. Limits that depend on the engine
(max input/sequence length) are checked in :meth:`PredictInputs.token_budget`.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from common.errors import InputError
from cog_triton.stop import parse_stop_sequences

MAX_SEED = 2**63 - 1
MAX_PROMPT_CHARS = 1_000_000

# name -> (default, minimum, maximum, description of exclusive bounds)
FLOAT_RANGES: dict[str, tuple[float, float, float, bool]] = {
    # (default, low, high, low_exclusive)
    "temperature": (0.7, 0.0, 5.0, False),
    "top_p": (0.95, 0.0, 1.0, True),
    "repetition_penalty": (1.0, 0.0, 10.0, True),
    "presence_penalty": (0.0, -2.0, 2.0, False),
    "frequency_penalty": (0.0, -2.0, 2.0, False),
}
INT_RANGES: dict[str, tuple[int, int, int]] = {
    "max_tokens": (512, 1, 1_000_000),
    "min_tokens": (0, 0, 1_000_000),
    "top_k": (0, 0, 1_000_000),
}


def _show(value: Any, limit: int = 80) -> str:
    """repr() of an input value, shortened for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_float(name: str, value: Any) -> float:
    _, low, high, low_exclusive = FLOAT_RANGES[name]
    allowed = f"{'(' if low_exclusive else '['}{low:g}, {high:g}]"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{name} must be a number in {allowed}, got {_show(value)}")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        raise InputError(f"{name}={_show(value)} is out of range; allowed: {allowed}") from None
    if not math.isfinite(number):
        raise InputError(f"{name} must be a finite number in {allowed}, got {value!r}")
    ok = (low < number if low_exclusive else low <= number) and number <= high
    if not ok:
        raise InputError(f"{name}={_show(value)} is out of range; allowed: {allowed}")
    return number


def _check_int(name: str, value: Any) -> int:
    _, low, high = INT_RANGES[name]
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise InputError(f"{name} must be an integer from {low} to {high}, got {_show(value)}")
    if not low <= value <= high:
        raise InputError(f"{name}={value} is out of range; allowed: {low} to {high}")
    return value


@dataclass(frozen=True)
class PredictInputs:
    """Validated prediction inputs. Construct with :meth:`validate`.

    Token counts are in tokens; ``seed`` is the seed actually used (drawn when the user gave none).
    """

    prompt: str
    system_prompt: str = ""
    prompt_template: Optional[str] = None
    max_tokens: int = 512
    min_tokens: int = 0
    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop_sequences: list[str] = field(default_factory=list)
    seed: int = 0

    @classmethod
    def validate(
        cls,
        *,
        prompt: Any,
        system_prompt: Any = "",
        prompt_template: Any = None,
        max_tokens: Any = 512,
        min_tokens: Any = 0,
        temperature: Any = 0.7,
        top_p: Any = 0.95,
        top_k: Any = 0,
        repetition_penalty: Any = 1.0,
        presence_penalty: Any = 0.0,
        frequency_penalty: Any = 0.0,
        stop_sequences: Any = None,
        seed: Any = None,
    ) -> "PredictInputs":
        """Check every input; return the validated, typed inputs.

        Raises:
            InputError: the first invalid input, naming it, its value and the allowed values.
        """
        if not isinstance(prompt, str):
            raise InputError(f"prompt must be a non-empty string, got {_show(prompt)} ({type(prompt).__name__})")
        if not prompt.strip():
            raise InputError(f"prompt={_show(prompt, 40)} is empty or only whitespace; give a non-empty text to respond to")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise InputError(f"prompt has {len(prompt)} characters; at most {MAX_PROMPT_CHARS} are allowed")
        if system_prompt is None:
            system_prompt = ""
        if not isinstance(system_prompt, str):
            raise InputError(
                f"system_prompt must be a string (or empty), got {_show(system_prompt)} ({type(system_prompt).__name__})"
            )
        if prompt_template is not None and not isinstance(prompt_template, str):
            raise InputError(
                f"prompt_template must be a string containing {{prompt}} (or empty), got {_show(prompt_template)} "
                f"({type(prompt_template).__name__})"
            )
        if prompt_template is not None and prompt_template.strip() == "":
            prompt_template = None
        if prompt_template is not None and "{prompt}" not in prompt_template:
            raise InputError(
                f"prompt_template={prompt_template[:80]!r} must contain {{prompt}} "
                "(and may contain {system_prompt}); leave it empty to use the model's chat template"
            )
        max_tokens = _check_int("max_tokens", max_tokens)
        min_tokens = _check_int("min_tokens", min_tokens)
        if min_tokens > max_tokens:
            raise InputError(f"min_tokens={min_tokens} is greater than max_tokens={max_tokens}; allowed: 0 to max_tokens")
        if seed is None or seed == "":
            seed = random.SystemRandom().randint(0, 2**31 - 1)
        elif isinstance(seed, bool) or not isinstance(seed, int):
            raise InputError(f"seed must be an integer from 0 to {MAX_SEED}, or empty for a random seed; got {_show(seed)}")
        elif not 0 <= seed <= MAX_SEED:
            raise InputError(f"seed={seed} is out of range; allowed: 0 to {MAX_SEED}, or empty for a random seed")
        return cls(
            prompt=prompt,
            system_prompt=system_prompt,
            prompt_template=prompt_template,
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            temperature=_check_float("temperature", temperature),
            top_p=_check_float("top_p", top_p),
            top_k=_check_int("top_k", top_k),
            repetition_penalty=_check_float("repetition_penalty", repetition_penalty),
            presence_penalty=_check_float("presence_penalty", presence_penalty),
            frequency_penalty=_check_float("frequency_penalty", frequency_penalty),
            stop_sequences=parse_stop_sequences(stop_sequences),
            seed=seed,
        )

    def token_budget(self, prompt_tokens: int, max_input_len: int, max_seq_len: int) -> int:
        """Tokens to request: ``max_tokens`` capped by what the engine's max_seq_len leaves.

        Raises:
            InputError: the prompt exceeds ``max_input_len``, leaves no room to generate, or
                ``min_tokens`` does not fit; the message gives both numbers.
        """
        if prompt_tokens > max_input_len:
            raise InputError(
                f"the prompt is too long: it has {prompt_tokens} tokens (after formatting), "
                f"and the model's maximum input length is {max_input_len} tokens; shorten the prompt"
            )
        room = max_seq_len - prompt_tokens
        if room < 1:
            raise InputError(
                f"the prompt has {prompt_tokens} tokens, which leaves no room to generate within the "
                f"model's maximum sequence length of {max_seq_len} tokens"
            )
        if self.min_tokens > room:
            raise InputError(
                f"min_tokens={self.min_tokens} does not fit: the prompt has {prompt_tokens} tokens and the "
                f"maximum sequence length is {max_seq_len}, so at most {room} tokens can be generated"
            )
        return min(self.max_tokens, room)


def render_prompt(
    tokenizer: Any, prompt: str, system_prompt: str = "", prompt_template: Optional[str] = None
) -> str:
    """Format the prompt text sent to the model.

    With ``prompt_template``: ``{system_prompt}`` and ``{prompt}`` are replaced literally (other
    braces are kept). Without: the tokenizer's chat template (system message only when
    ``system_prompt`` is non-empty, generation prompt added); if the tokenizer has none, the
    system prompt and prompt joined by a blank line.

    Raises:
        InputError: the chat template fails to render (e.g. it rejects a system message).
    """
    if prompt_template is not None:
        # One pass, so that a "{prompt}" inside the system prompt's text stays as typed.
        values = {"system_prompt": system_prompt, "prompt": prompt}
        return re.sub(r"\{(system_prompt|prompt)\}", lambda m: values[m.group(1)], prompt_template)
    if getattr(tokenizer, "chat_template", None):
        messages: list[dict[str, str]] = []
        if system_prompt:
            messages.append({"role": "system", "content": system_prompt})
        messages.append({"role": "user", "content": prompt})
        try:
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # jinja errors raised by the template itself
            raise InputError(f"the model's chat template rejected the messages: {exc}") from None
    return f"{system_prompt}\n\n{prompt}" if system_prompt else prompt


def chat_template_adds_bos(tokenizer: Any) -> bool:
    """True when the chat template's output already starts with the BOS token text."""
    bos = getattr(tokenizer, "bos_token", None)
    if not bos or not getattr(tokenizer, "chat_template", None):
        return False
    try:
        text = render_prompt(tokenizer, "hi")
    except InputError:
        return False
    return text.startswith(bos)


def default_inputs() -> dict[str, Any]:
    """The default value of every optional numeric input.

    predict.py repeats these as literals (``cog build`` reads its Input defaults statically);
    tests/test_packaging.py keeps the two equal.
    """
    values: dict[str, Any] = {name: spec[0] for name, spec in FLOAT_RANGES.items()}
    values.update({name: spec[0] for name, spec in INT_RANGES.items()})
    return values


__all__: Sequence[str] = ("PredictInputs", "render_prompt", "chat_template_adds_bos", "default_inputs")
