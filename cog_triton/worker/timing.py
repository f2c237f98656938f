"""The timing metric (``COG_TRITON_TIMING_METRICS``, for ``scripts/benchmark``): when each step of a prediction's start
happened, recorded once per prediction as one metric, so that the time to first token can be split into its phases.

One :class:`StartTiming` per prediction; the Cog worker's code calls it once per step (the Start sent, the stream
process's steps arriving, the first text relayed and yielded), and it records the metric when it has every step.
The stream process's side is its :class:`cog_triton.ipc.Timings` event (sent with the first text). With the setting
off, :data:`OFF` stands in: the same calls do nothing, and the receiver thread does not look at it per text chunk.
"""

from __future__ import annotations

import time
from typing import Callable, Union

#: The metric's name: one dict per prediction, recorded once its first text was yielded to coglet, of when each step
#: of its start happened, in seconds since predict() began, plus that beginning as time.monotonic() (the host's
#: clock; the client's too on the same host). One metric, so one message to coglet.
TIMING_METRIC = "timing"
#: Its keys, in the order of the steps (the first token itself is time_to_first_token_s).
TIMING_STEPS = (
    "run_at_monotonic",  # predict() began
    "start_sent_s",  # inputs checked, the Start about to be sent to a stream process
    "start_received_s",  # the stream process read the Start
    "prepared_s",  # prompt rendered and tokenized, the request sent to Triton
    "first_text_sent_s",  # the first text handed to the stream process's frame
    "first_text_relayed_s",  # the worker's receiver put it on the prediction's queue
    "first_text_yielded_s",  # coglet's thread took it from the generator
)

Record = Callable[[str, Union[int, float, dict]], None]


class StartTiming:
    """One prediction's steps (see the module docstring). Steps come from up to three threads (the worker's loop, the
    receiver, coglet's); each adds its step and then looks whether all are there, so at least one sees them all
    (recording twice is harmless: the same dict).

    Args:
        started_at: ``time.monotonic()`` when predict() began.
        record: the prediction's metric sink.
    """

    __slots__ = ("started_at", "steps", "_record")

    def __init__(self, started_at: float, record: Record) -> None:
        self.started_at = started_at
        self.steps: dict[str, float] = {"run_at_monotonic": started_at}
        self._record = record

    def start_sent(self) -> None:
        """The Start is about to be sent (taken before the send: the stream process's 'received' can never come
        first)."""
        self.steps["start_sent_s"] = time.monotonic() - self.started_at

    def stream_process(self, received_at: float, prepared_at: float, first_text_at: float) -> None:
        """The stream process's steps (its :class:`cog_triton.ipc.Timings`, monotonic instants)."""
        start = self.started_at
        self.steps.update(start_received_s=received_at - start, prepared_s=prepared_at - start,
                          first_text_sent_s=first_text_at - start)
        self._record_when_complete()

    def relayed(self) -> None:
        """The receiver put a text chunk on the prediction's queue (the first one counts)."""
        if "first_text_relayed_s" not in self.steps:
            self.steps["first_text_relayed_s"] = time.monotonic() - self.started_at

    def yielded(self) -> None:
        """coglet's thread took the first text from the generator."""
        self.steps["first_text_yielded_s"] = time.monotonic() - self.started_at
        self._record_when_complete()

    def _record_when_complete(self) -> None:
        steps = self.steps
        if "first_text_yielded_s" in steps and "prepared_s" in steps:
            self._record(TIMING_METRIC, dict(steps))


class TimingOff:
    """:class:`StartTiming`'s calls, doing nothing (the setting is off)."""

    __slots__ = ()

    def start_sent(self) -> None:
        pass

    def stream_process(self, received_at: float, prepared_at: float, first_text_at: float) -> None:
        pass

    def relayed(self) -> None:
        pass

    def yielded(self) -> None:
        pass


OFF = TimingOff()


__all__ = ("OFF", "StartTiming", "TIMING_METRIC", "TIMING_STEPS", "TimingOff")
