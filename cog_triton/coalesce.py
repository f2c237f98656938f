"""The stream interval: per stream, text leaves at most every N milliseconds; the first text at once.

vLLM and SGLang call this ``--stream-interval`` (in tokens), trtllm-serve a streaming interval: a
stream's text deltas are joined and sent as one chunk per interval instead of one per token. Every
chunk costs the same in the Cog worker and in coglet whatever its length (a thread wake-up, one
output message, one SSE event), so at 100 tokens/s per stream a 50 ms interval divides that cost
by five. The first text of a stream is sent at once (time to first token is not delayed), and
what is held when the stream ends is sent before its end.

Setting: ``COG_TRITON_STREAM_INTERVAL_MS`` (0 = every delta as it comes). The default and the
figures behind it are in README.md (Performance).
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Optional


class IntervalFlusher:
    """Joins one stream's text deltas and hands them to ``emit`` at most every ``interval_s`` seconds.

    Runs on an asyncio loop (a timer sends text that is held when no more deltas come). Cost per
    delta: a clock read and a list append; per chunk: one ``emit`` call and at most one timer.

    Args:
        interval_s: the stream interval, seconds; 0 emits every delta at once.
        emit: called with each chunk of text (never empty), in order.
        loop: the loop the stream runs on (default: the running loop).
    """

    __slots__ = ("interval_s", "_emit", "_loop", "_held", "_next_at", "_timer", "chunks")

    def __init__(self, interval_s: float, emit: Callable[[str], None],
                 loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
        if interval_s < 0:
            raise ValueError(f"interval_s must be >= 0, got {interval_s}")
        self.interval_s = interval_s
        self._emit = emit
        self._loop = loop
        self._held: list[str] = []
        self._next_at = float("-inf")  # the first text goes at once
        self._timer: Optional[asyncio.TimerHandle] = None
        self.chunks = 0  # chunks emitted

    def push(self, text: str) -> None:
        """Add a delta: emit it (with anything held) if the interval has passed, else hold it."""
        if not text:
            return
        self._held.append(text)
        now = time.monotonic()
        if now >= self._next_at:
            self._flush(now)
        elif self._timer is None:
            loop = self._loop or asyncio.get_running_loop()
            self._loop = loop
            # time.monotonic and the loop's clock are the same clock (asyncio BaseEventLoop.time).
            self._timer = loop.call_at(self._next_at, self._on_timer)

    def close(self) -> None:
        """The stream ended: emit what is held."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._held:
            self._flush(time.monotonic())

    def _on_timer(self) -> None:
        self._timer = None
        if self._held:
            self._flush(time.monotonic())

    def _flush(self, now: float) -> None:
        held = self._held
        text = held[0] if len(held) == 1 else "".join(held)
        held.clear()
        self._next_at = now + self.interval_s
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.chunks += 1
        self._emit(text)


__all__ = ("IntervalFlusher",)
