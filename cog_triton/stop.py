"""Stop sequences: cut the streamed text before the first occurrence of any of them.

:func:`parse_stop_sequences` turns the ``stop_sequences`` Cog input into a list;
:class:`StopSequenceMatcher` applies it to the stream of text deltas.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from common.errors import InputError

MAX_STOP_SEQUENCES = 16
"""At most this many (distinct, non-empty) stop sequences per prediction."""

MAX_STOP_SEQUENCE_LENGTH = 256
"""At most this many characters per stop sequence."""

_JSON_ARRAY_START = re.compile(r'\s*\[\s*["\]]')


class StopSequenceMatcher:
    """Holds back streamed text that may turn out to be the start of a stop sequence.

    Feed it the text deltas of a generation with :meth:`push`; emit what it returns. The
    concatenation of everything returned (by :meth:`push` and :meth:`finish`) is exactly the full
    text cut before the earliest occurrence of any stop sequence (the whole text when none occurs);
    the stop sequence itself is never returned. The result does not depend on how the text is split
    into pushes.

    Algorithm: keep the unreleased text in a buffer. A buffer position is *pending* if a stop
    sequence occurs there completely, or if the rest of the buffer from there is a proper prefix of
    a stop sequence (a partial match). Everything before the first pending position is released.
    If the first pending position holds a complete stop sequence, the generation has stopped there.
    Otherwise the partial match is held back until more text confirms or refutes it; so with stops
    ``"abcd"`` and ``"bc"`` and text ``"abc"``, ``"bc"`` only stops the stream once ``"abcd"`` is
    ruled out (the earliest occurrence wins, not the first to complete). The buffer holds less than
    ``max(len(stop))`` characters plus one push, so a push costs O(len(text) * number of stops *
    longest stop) character comparisons at worst.

    Units: all lengths are in characters (Python ``str`` code points).
    """

    def __init__(self, stop_sequences: Sequence[str]) -> None:
        """Create a matcher.

        Args:
            stop_sequences: the stop strings; empty strings are ignored, duplicates are fine. With
                none left, every push is passed through unchanged.

        Raises:
            TypeError: ``stop_sequences`` is a bare string or holds something that is not a string.
        """
        if isinstance(stop_sequences, (str, bytes)):
            raise TypeError("stop_sequences must be a sequence of strings, not a single string")
        stops: list[str] = []
        for stop in stop_sequences:
            if not isinstance(stop, str):
                raise TypeError(f"stop sequences must be strings, got {stop!r} ({type(stop).__name__})")
            if stop and stop not in stops:
                stops.append(stop)
        self._stops = tuple(stops)
        self._max_len = max((len(s) for s in stops), default=0)
        self._buffer = ""
        self._stopped = False
        self._finished = False

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        """The distinct, non-empty stop sequences in use."""
        return self._stops

    @property
    def stopped(self) -> bool:
        """True once a stop sequence has been found (by :meth:`push` or :meth:`finish`)."""
        return self._stopped

    def push(self, text: str) -> tuple[str, bool]:
        """Add streamed text; return ``(text safe to emit now, stopped)``.

        Args:
            text: the next text delta (may be empty).

        Returns:
            The releasable text (characters; possibly ``""``) and whether a stop sequence has been
            found. Once ``stopped`` is True, later pushes return ``("", True)``.

        Raises:
            TypeError: ``text`` is not a ``str``.
            RuntimeError: called after :meth:`finish`.
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if self._finished:
            raise RuntimeError("StopSequenceMatcher.push() called after finish()")
        if self._stopped:
            return "", True
        if not self._stops:
            return text, False
        if not text:
            return "", False
        self._buffer += text
        return self._release(final=False)

    def finish(self) -> str:
        """End of stream: return the held-back text (cut before a stop sequence if one is in it).

        Returns:
            The remaining characters to emit (``""`` after a stop). A second call returns ``""``.
        """
        if self._finished:
            return ""
        self._finished = True
        if self._stopped:
            return ""
        released, _ = self._release(final=True)
        return released

    def _release(self, final: bool) -> tuple[str, bool]:
        buf = self._buffer
        complete = -1  # earliest start of a complete stop sequence
        for stop in self._stops:
            end = len(buf) if complete < 0 else complete + len(stop) - 1
            i = buf.find(stop, 0, end)
            if i >= 0 and (complete < 0 or i < complete):
                complete = i
        partial = -1  # earliest start of a partial match (a proper prefix of a stop at the end)
        if not final:
            limit = len(buf) if complete < 0 else complete
            for start in range(max(0, len(buf) - self._max_len + 1), limit):
                tail = buf[start:]
                if any(len(stop) > len(tail) and stop.startswith(tail) for stop in self._stops):
                    partial = start
                    break
        if partial >= 0:
            self._buffer = buf[partial:]
            return buf[:partial], False
        if complete >= 0:
            self._buffer = ""
            self._stopped = True
            return buf[:complete], True
        self._buffer = ""
        return buf, False


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
