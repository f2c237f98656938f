"""The ``stop_sequences`` input: parsed and checked in the Cog worker (the stream processes apply the list:
:class:`cog_triton.streaming.stop.StopSequenceMatcher`).
"""

from __future__ import annotations

import json
import re

from common.errors import InputError

MAX_STOP_SEQUENCES = 16
"""At most this many (distinct, non-empty) stop sequences per prediction."""

MAX_STOP_SEQUENCE_LENGTH = 256
"""At most this many characters per stop sequence."""

_JSON_ARRAY_START = re.compile(r'\s*\[\s*["\]]')


def parse_stop_sequences(value: str | list[str] | None) -> list[str]:
    """Parse the ``stop_sequences`` Cog input into a list of stop strings.

    Accepted forms:

    * ``None`` or ``""``: no stop sequences (``[]``).
    * A comma-separated string, the Replicate convention: ``"<end>,User:"`` ->
      ``["<end>", "User:"]``. Items are taken verbatim (spaces around commas are kept, so
      ``"a, b"`` gives ``"a"`` and ``" b"``); empty items are dropped.
    * A JSON array of strings, for sequences that contain a comma or need escapes such as
      ``"\\n"``: ``'["a,b", "\\nUser:"]'``. A string is read as JSON when it starts (after
      whitespace) with ``[`` followed by ``"`` or ``]``; so ``"[INST]"`` stays a plain stop
      sequence.
    * A list of strings (used as is).

    Empty strings are dropped and duplicates removed (first occurrence kept).

    Returns:
        The stop sequences, in input order.

    Raises:
        InputError: the JSON is unparsable, an item is not a string,
            there are more than :data:`MAX_STOP_SEQUENCES` (16) sequences, or one is longer than
            :data:`MAX_STOP_SEQUENCE_LENGTH` (256) characters. The message names the input, the
            value and what is allowed.
    """
    if value is None:
        return []
    if isinstance(value, str):
        if _JSON_ARRAY_START.match(value):
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError as exc:
                raise InputError(
                    f"stop_sequences: {_show(value)} starts like a JSON array but is not valid JSON "
                    f"({exc.msg} at character {exc.pos}); pass a JSON array of strings such as "
                    '\'["a,b", "User:"]\' or a comma-separated string such as "<end>,User:"'
                ) from None
            # JSON text that starts with "[" can only parse to an array: no check for other types needed
            items = parsed
        else:
            items = value.split(",")
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise InputError(
            f"stop_sequences: got {_show(value)} of type {type(value).__name__}; pass a comma-separated "
            'string such as "<end>,User:", a JSON array of strings, or nothing'
        )

    stops: list[str] = []
    seen: set[str] = set()  # linear in the number of items, whatever their count
    for item in items:
        if not isinstance(item, str):
            raise InputError(
                f"stop_sequences: {_show(value)} contains {_show(item)} ({type(item).__name__}); "
                "every stop sequence must be a string"
            )
        if not item or item in seen:
            continue
        if len(item) > MAX_STOP_SEQUENCE_LENGTH:
            raise InputError(
                f"stop_sequences: the stop sequence {_show(item)} is {len(item)} characters long; "
                f"at most {MAX_STOP_SEQUENCE_LENGTH} characters are allowed per stop sequence"
            )
        stops.append(item)
        seen.add(item)
    if len(stops) > MAX_STOP_SEQUENCES:
        raise InputError(
            f"stop_sequences: {_show(value)} holds {len(stops)} distinct stop sequences; at most "
            f"{MAX_STOP_SEQUENCES} are allowed"
        )
    return stops


def _show(value: object, limit: int = 120) -> str:
    """repr() of an input value, shortened for error messages."""
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text
