"""The floor path of ``scripts/benchmark``: a bare predictor under coglet, with no Triton and no tokenizer.

It streams what the product streams, at the same rate and through the same Cog-side machinery, with
none of the product's own work: each prediction emits ``n`` one-character "tokens", one per step of
``step_ms`` (the stand-in engine's rate), through the product's stream interval
(:class:`cog_triton.streaming.coalesce.IntervalFlusher`, ``COG_TRITON_STREAM_INTERVAL_MS``, growing under load as the
product's does: :class:`cog_triton.streaming.coalesce.StreamLoad`, ``COG_TRITON_STREAM_INTERVAL_STREAMS`` and
``COG_TRITON_STREAM_INTERVAL_MAX_MS``, the product's defaults when unset) and its bridge to
coglet (:mod:`cog_triton.worker.cog_bridge`). One task steps every running prediction, as the stand-in's
clock does, so the per-token work here is a list append. What this path carries is what coglet and
the bridge carry: the product can come close to it, not above it, at the same stream interval.

Never part of the image: ``scripts/benchmark`` runs it under its own Cog HTTP server
(``benchmarks/harness.py``, path ``floor``).
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Iterator, Optional

import cog
from cog import BasePredictor, ConcatenateIterator, Input

from cog_triton.worker import cog_bridge
from cog_triton.streaming.coalesce import IntervalFlusher, StreamLoad
from cog_triton.settings import StreamSettings
from cog_triton.worker.metrics import record_time_to_first_token

cog_bridge.install_cancel_hook()
#: The characters a prediction cycles through (its expected text: :func:`expected_text`).
ALPHABET = "abcdefghijklmnopqrstuvwxyz"


def expected_text(n: int) -> str:
    """The text a prediction of ``n`` tokens streams."""
    return "".join(ALPHABET[i % len(ALPHABET)] for i in range(n))


class _Stream:
    __slots__ = ("n", "sent", "flusher", "output", "scope", "started", "first")

    def __init__(self, n: int, flusher: IntervalFlusher, output: cog_bridge.PredictionOutput, scope, started: float):
        self.n, self.sent, self.flusher, self.output, self.scope = n, 0, flusher, output, scope
        self.started, self.first = started, True


class _Clock:
    """One step every ``step_s`` for every running prediction (one asyncio task for all of them)."""

    def __init__(self, load: StreamLoad) -> None:
        self.load = load
        self.streams: dict[int, list[_Stream]] = {}  # step in µs -> streams
        self.tasks: dict[int, asyncio.Task[None]] = {}

    def add(self, step_us: int, stream: _Stream) -> None:
        self.streams.setdefault(step_us, []).append(stream)
        if step_us not in self.tasks or self.tasks[step_us].done():
            self.tasks[step_us] = asyncio.get_running_loop().create_task(self._run(step_us))

    async def _run(self, step_us: int) -> None:
        step_s = step_us / 1e6
        streams = self.streams[step_us]
        next_at = time.monotonic()
        while streams:
            next_at += step_s
            delay = next_at - time.monotonic()
            await asyncio.sleep(delay if delay > 0 else 0)
            if delay <= 0:
                next_at = time.monotonic()
            done = []
            for stream in streams:
                if stream.output.cancelled.is_set():
                    self.load.ended()
                    done.append(stream)
                    continue
                stream.flusher.push(ALPHABET[stream.sent % len(ALPHABET)])
                stream.sent += 1
                if stream.first:
                    stream.first = False
                    record_time_to_first_token(stream.scope.record_metric, time.monotonic() - stream.started)
                if stream.sent >= stream.n:
                    stream.flusher.close()
                    stream.scope.record_metric("output_token_count", stream.n)
                    stream.output.end()
                    self.load.ended()
                    done.append(stream)
            for stream in done:
                streams.remove(stream)


class Predictor(BasePredictor):
    def setup(self) -> None:
        fields = StreamSettings.model_fields  # a field's variable: COG_TRITON_ + its alias (stream_interval_ms)
        value = lambda name: float(os.environ.get(f"COG_TRITON_{fields[name].validation_alias.upper()}",  # noqa: E731
                                                  fields[name].default))
        self.load = StreamLoad(int(value("interval_ms")), int(value("interval_max_ms")), value("interval_streams"))
        self.clock: Optional[_Clock] = None

    @cog.streaming
    async def predict(
        self,
        n: int = Input(description="Tokens (characters) to stream.", default=256, ge=1, le=100000),
        step_ms: float = Input(description="Milliseconds per token.", default=10.0, ge=0.1, le=10000),
    ) -> ConcatenateIterator[str]:
        started = time.monotonic()
        if self.clock is None:
            self.clock = _Clock(self.load)
        scope = cog.current_scope()
        output = cog_bridge.PredictionOutput()
        flusher = IntervalFlusher(self.load, output.put, asyncio.get_running_loop())
        self.load.started()  # ended by the clock, on this loop, when the stream has all its tokens
        generator: Iterator[str] = cog_bridge.output_generator(output)
        scope.record_metric("input_token_count", 0)
        # when predict() began (the product's timing metric has it too): the TTFT phases' "coglet to predict()"
        scope.record_metric("timing", {"run_at_monotonic": started})
        self.clock.add(int(round(step_ms * 1000)), _Stream(n, flusher, output, scope, started))
        return generator
