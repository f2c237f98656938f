"""cog_triton.streaming.coalesce.IntervalFlusher: the stream interval, on a clock the tests move by hand."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cog_triton.streaming import coalesce
from cog_triton.streaming.coalesce import IntervalFlusher


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class FakeLoop:
    """Records call_at timers instead of running them (the flusher's only use of its loop)."""

    def __init__(self) -> None:
        self.timers: list[Any] = []

    def call_at(self, when: float, callback: Any) -> Any:
        loop = self

        class Handle:
            cancelled = False

            def cancel(self) -> None:
                self.cancelled = True
                loop.timers.remove(entry)

        handle = Handle()
        entry = (when, callback, handle)
        self.timers.append(entry)
        return handle

    def fire(self) -> None:
        """Run the first timer as the loop would (it is gone from the schedule once it runs)."""
        when, callback, _ = self.timers.pop(0)
        callback()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(coalesce.time, "monotonic", fake.monotonic)
    return fake


def test_the_first_text_leaves_at_once_then_at_most_one_chunk_per_interval(clock: Clock) -> None:
    out: list[tuple[float, str]] = []
    loop = FakeLoop()
    flusher = IntervalFlusher(50, lambda text: out.append((clock.now, text)), loop)  # type: ignore[arg-type]
    flusher.push("A")
    assert out == [(1000.0, "A")] and loop.timers == []  # at once, no timer
    for i, text in enumerate(["b", "c", "d"]):
        clock.now += 0.01
        flusher.push(text)
    assert out == [(1000.0, "A")]  # held: 30 ms into a 50 ms interval
    assert [when for when, _, _ in loop.timers] == [pytest.approx(1000.05)]  # one timer for the held text
    clock.now = 1000.05
    flusher.push("e")  # due: everything held leaves as one chunk, and the timer goes
    assert out[-1] == (1000.05, "bcde") and loop.timers == []
    clock.now += 0.02
    flusher.push("f")
    assert out[-1][1] == "bcde" and len(loop.timers) == 1
    when = loop.timers[0][0]
    assert when == pytest.approx(1000.10)  # 50 ms after the last chunk, not after "f"
    clock.now = when
    loop.fire()  # no more deltas came: the timer sends what is held
    assert out[-1] == (pytest.approx(1000.10), "f") and loop.timers == []
    assert flusher.chunks == 3


def test_close_sends_what_is_held_and_nothing_is_lost(clock: Clock) -> None:
    out: list[str] = []
    loop = FakeLoop()
    flusher = IntervalFlusher(50, out.append, loop)  # type: ignore[arg-type]
    deltas = ["Hel", "lo", "", " wor", "ld", "!"]
    for delta in deltas:
        flusher.push(delta)
        clock.now += 0.001
    flusher.close()
    assert "".join(out) == "Hello world!" and out == ["Hel", "lo world!"]
    assert loop.timers == []  # the timer of the held text was cancelled
    flusher.close()  # twice: nothing more
    assert out == ["Hel", "lo world!"]


def test_interval_zero_sends_every_delta(clock: Clock) -> None:
    out: list[str] = []
    loop = FakeLoop()
    flusher = IntervalFlusher(0, out.append, loop)  # type: ignore[arg-type]
    for delta in ["a", "b", "c"]:
        flusher.push(delta)
    assert out == ["a", "b", "c"] and loop.timers == []


def test_a_negative_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval_ms must be >= 0"):
        IntervalFlusher(-1, print)


def test_on_a_real_loop_the_timer_sends_held_text() -> None:
    async def main() -> list[str]:
        out: list[str] = []
        flusher = IntervalFlusher(50, out.append)
        flusher.push("a")
        flusher.push("b")  # held
        assert out == ["a"]
        await asyncio.sleep(0.2)  # a generous wait: the timer is due after 50 ms
        return out

    assert asyncio.run(main()) == ["a", "b"]


# --- the interval under load (StreamLoad) -----------------------------------------------------------


def test_the_interval_grows_with_the_streams_beyond_those_the_base_serves_up_to_the_longest() -> None:
    load = coalesce.StreamLoad(50, 200, 64)
    seen = []
    for _ in range(300):
        load.started()
        seen.append((load.running, load.ms, load.seconds))
    values = {running: ms for running, ms, _ in seen}
    assert values[1] == values[64] == 50 and values[128] == 100 and values[256] == 200
    assert values[300] == 200  # capped at the longest
    assert all(seconds == ms / 1e3 for _, ms, seconds in seen)  # the clock's seconds follow the milliseconds
    for _ in range(200):
        load.ended()
    assert load.running == 100 and load.ms == round(50 * 100 / 64) == 78 and load.seconds == 0.078
    for _ in range(500):  # more ends than starts never go below none running
        load.ended()
    assert (load.running, load.ms, load.seconds) == (0, 50, 0.05)
    fixed = coalesce.StreamLoad(50, 200, 0)  # 0 streams: never grows
    for _ in range(1000):
        fixed.started()
    assert fixed.ms == 50 and coalesce.StreamLoad(50, 10, 4).max_ms == 50  # max below base: base


def test_a_flusher_on_a_load_spaces_its_chunks_by_the_interval_now(clock: Clock) -> None:
    loop = FakeLoop()
    load = coalesce.StreamLoad(50, 200, 2)
    chunks: list[tuple[float, str]] = []
    flusher = IntervalFlusher(load, lambda text: chunks.append((clock.now, text)), loop)  # type: ignore[arg-type]
    assert flusher.interval_ms == 50
    flusher.push("a")  # the first at once
    for _ in range(8):  # 8 streams over the 2 the base serves: 4 x 50 ms, capped at 200 ms
        load.started()
    assert flusher.interval_ms == 200
    clock.now += 0.06
    flusher.push("b")  # the 50 ms due when "a" left have passed: goes, and the next waits 200 ms
    clock.now += 0.1
    flusher.push("c")
    assert [text for _, text in chunks] == ["a", "b"] and loop.timers[0][0] == pytest.approx(clock.now - 0.1 + 0.2)


def test_the_interval_a_request_carries_is_whole_milliseconds_from_a_float_setting() -> None:
    """COG_TRITON_STREAM_INTERVAL_MS is a float setting (50.0 by default), and the PyTorch-backend model's
    stream_interval_ms is an INT32 tensor: the interval a request carries is an int at every load (a float there
    failed every PyTorch-backend setup with "required argument is not an integer" on a GPU host)."""
    import struct

    load = coalesce.StreamLoad(50.0, 200.0, 2)
    seen = [load.ms]
    for _ in range(6):
        load.started()
        seen.append(load.ms)
    for _ in range(6):
        load.ended()
        seen.append(load.ms)
    assert all(type(ms) is int for ms in seen), seen
    assert seen[:5] == [50, 50, 50, 75, 100] and max(seen) == 150 and seen[-1] == 50
    assert load.seconds == 0.05
    struct.pack("<i", load.ms)
