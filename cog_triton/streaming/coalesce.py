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

    Args:
        base_s: the interval up to ``streams`` running streams, seconds (0: every delta at once, whatever the load).
        max_s: the longest interval, seconds (``base_s`` or less: the interval never grows).
        streams: the streams ``base_s`` serves; 0 turns growth off. A process that runs a share of the streams
            (one of several stream processes) passes its share.

    Attributes:
        running: streams running now (:meth:`started` / :meth:`ended`, one thread or loop).
        seconds: the interval now, seconds, read by each :class:`IntervalFlusher` when it emits.
    """

    __slots__ = ("base_s", "max_s", "streams", "running", "seconds")

    def __init__(self, base_s: float, max_s: float = 0.0, streams: float = 0.0) -> None:
        if base_s < 0 or streams < 0:
            raise ValueError(f"base_s and streams must be >= 0, got {base_s}, {streams}")
        self.base_s = base_s
        self.max_s = max(max_s, base_s)
        self.streams = streams
        self.running = 0
        self.seconds = base_s

    def started(self) -> None:
        self.running += 1
        self._update()

    def ended(self) -> None:
        self.running = max(0, self.running - 1)
        self._update()

    def _update(self) -> None:
        if self.streams > 0 and self.running > self.streams:
            self.seconds = min(self.max_s, self.base_s * self.running / self.streams)
        else:
            self.seconds = self.base_s


class IntervalFlusher:
    """Joins one stream's text deltas and hands them to ``emit`` at most every ``interval_s`` seconds.

    Runs on an asyncio loop (a timer sends text that is held when no more deltas come). Cost per
    delta: a clock read and a list append; per chunk: one ``emit`` call and at most one timer.

    Args:
        interval_s: the stream interval, seconds (0 emits every delta at once), or a :class:`StreamLoad` whose
            ``seconds`` is read at each emit (the interval then follows the load).
        emit: called with each chunk of text (never empty), in order.
        loop: the loop the stream runs on (default: the running loop).
    """

    __slots__ = ("_load", "_emit", "_loop", "_held", "_next_at", "_timer", "chunks")

    def __init__(self, interval_s: Union[float, StreamLoad], emit: Callable[[str], None],
                 loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
        if not isinstance(interval_s, StreamLoad):
            if interval_s < 0:
                raise ValueError(f"interval_s must be >= 0, got {interval_s}")
            interval_s = StreamLoad(float(interval_s))
        self._load = interval_s
        self._emit = emit
        self._loop = loop
        self._held: list[str] = []
        self._next_at = float("-inf")  # the first text goes at once
        self._timer: Optional[asyncio.TimerHandle] = None
        self.chunks = 0  # chunks emitted

    @property
    def interval_s(self) -> float:
        """The interval now, seconds."""
        return self._load.seconds

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
