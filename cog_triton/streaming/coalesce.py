"""The stream interval: per stream, text leaves at most every N milliseconds; the first text at once.

vLLM and SGLang call this ``--stream-interval`` (in tokens), trtllm-serve a streaming interval: a
stream's text deltas are joined and sent as one chunk per interval instead of one per token. Every
chunk costs the same in the Cog worker and in coglet whatever its length (a thread wake-up, one
output message, one SSE event), so at 100 tokens/s per stream a 50 ms interval divides that cost
by five. The first text of a stream is sent at once (time to first token is not delayed), and
what is held when the stream ends is sent before its end.

Setting: ``COG_TRITON_STREAM_INTERVAL_MS`` (0 = every delta as it comes). The default and the
figures behind it are in README.md (Performance).

Under load the interval grows (:class:`StreamLoad`): every chunk wakes one coglet thread in the Cog worker and
costs coglet an output message, all under the worker's one GIL, which new predictions need too (their time to
first token). Up to ``COG_TRITON_STREAM_INTERVAL_STREAMS`` running streams the interval is
``COG_TRITON_STREAM_INTERVAL_MS``; beyond, it grows in proportion to the streams, up to
``COG_TRITON_STREAM_INTERVAL_MAX_MS``, so the worker relays about as many chunks per second at 256 streams as at
that many. A stream's first text still goes at once.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Optional, Union


class StreamLoad:
    """The running streams of a process and the stream interval their number calls for (see the module docstring).

    The interval is carried in milliseconds from the setting to each request's ``stream_interval_ms``; ``seconds``
    is the same interval on the loop's clock, computed when the load changes (per stream's start and end), never
    per chunk.

    Args:
        base_ms: the interval up to ``streams`` running streams, milliseconds (0: every delta at once, whatever the
            load).
        max_ms: the longest interval, milliseconds (``base_ms`` or less: the interval never grows).
        streams: the streams ``base_ms`` serves; 0 turns growth off. A process that runs a share of the streams
            (one of several stream processes) passes its share.

    Attributes:
        running: streams running now (:meth:`started` / :meth:`ended`, one thread or loop).
        ms: the interval now, whole milliseconds, sent as a request's ``stream_interval_ms`` where the model takes it.
        seconds: ``ms`` on the loop's clock (seconds), read by each :class:`IntervalFlusher` when it emits.

    Raises:
        ValueError: ``base_ms`` or ``streams`` is negative.
    """

    __slots__ = ("base_ms", "max_ms", "streams", "running", "ms", "seconds")

    def __init__(self, base_ms: float, max_ms: float = 0, streams: float = 0.0) -> None:
        if base_ms < 0 or streams < 0:
            raise ValueError(f"base_ms and streams must be >= 0, got {base_ms}, {streams}")
        self.base_ms = base_ms
        self.max_ms = max(max_ms, base_ms)
        self.streams = streams
        self.running = 0
        self.ms = round(base_ms)  # an INT32 tensor (COG_TRITON_STREAM_INTERVAL_MS is a float setting)
        self.seconds = base_ms / 1e3

    def started(self) -> None:
        self.running += 1
        self._update()

    def ended(self) -> None:
        self.running = max(0, self.running - 1)
        self._update()

    def _update(self) -> None:
        if self.streams > 0 and self.running > self.streams:
            self.ms = round(min(self.max_ms, self.base_ms * self.running / self.streams))
            self.seconds = self.ms / 1e3
        else:
            self.ms = round(self.base_ms)
            self.seconds = self.base_ms / 1e3


class IntervalFlusher:
    """Joins one stream's text deltas and hands them to ``emit`` at most every ``interval_ms`` milliseconds.

    Runs on an asyncio loop (a timer sends text that is held when no more deltas come). Cost per
    delta: a clock read and a list append; per chunk: one ``emit`` call and at most one timer.

    Args:
        interval_ms: the stream interval, milliseconds (0 emits every delta at once), or a :class:`StreamLoad` whose
            interval is read at each emit (the interval then follows the load).
        emit: called with each chunk of text (never empty), in order.
        loop: the loop the stream runs on (default: the running loop).

    Raises:
        ValueError: a negative ``interval_ms``.
    """

    __slots__ = ("_load", "_emit", "_loop", "_held", "_next_at", "_timer", "chunks")

    def __init__(self, interval_ms: Union[int, StreamLoad], emit: Callable[[str], None],
                 loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
        if not isinstance(interval_ms, StreamLoad):
            if interval_ms < 0:
                raise ValueError(f"interval_ms must be >= 0, got {interval_ms}")
            interval_ms = StreamLoad(interval_ms)
        self._load = interval_ms
        self._emit = emit
        self._loop = loop
        self._held: list[str] = []
        self._next_at = float("-inf")  # the first text goes at once
        self._timer: Optional[asyncio.TimerHandle] = None
        self.chunks = 0  # chunks emitted

    @property
    def interval_ms(self) -> int:
        """The interval now, milliseconds."""
        return self._load.ms

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
        self._next_at = now + self._load.seconds
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.chunks += 1
        self._emit(text)


__all__ = ("IntervalFlusher", "StreamLoad")
