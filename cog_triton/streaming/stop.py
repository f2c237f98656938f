"""Stop sequences: cut the streamed text before the first occurrence of any of them.

:class:`StopSequenceMatcher` applies a prediction's stop sequences to its stream of text deltas (in a stream
process); the ``stop_sequences`` input is parsed and checked in the Cog worker
(:mod:`cog_triton.worker.stop_sequences`).
"""

from __future__ import annotations

from collections.abc import Sequence


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
