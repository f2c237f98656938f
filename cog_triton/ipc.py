"""The channel between the Cog worker and a stream process: typed messages in length-prefixed pickle frames.

One ``socketpair`` per stream process. A frame is a 4-byte little-endian length and that many bytes
of a pickle (protocol 5). Both ends are our own processes, started from the same interpreter, so
pickle carries our exception objects and dataclasses as they are.

Every message is a ``typing.NamedTuple``: named fields at both ends, and, being a tuple, cheap to
build and to pickle. Text, the only message sent per chunk, travels as ``(sid, text)`` pairs in a
:class:`Frame`'s ``texts`` list, so that pickle takes its fast path for plain tuples; the other events
(a few per prediction) are typed. Measured with ``timeit`` on the 2-core development machine (other work
running), one frame of 40 text chunks: the positional tuples used before, ``[(sid, TEXT, text), ...]``,
pickled in 1.4 µs and loaded in 1.7 µs (1,366 bytes); a :class:`Frame` of 40 pairs pickles in 2.5 µs and
loads in 2.3 µs (1,313 bytes); a frame of one chunk 1.1 and 0.9 µs (was 0.2 and 0.1): about 1 µs more per
frame, for the Frame itself, not per chunk. Forty NamedTuple text events instead would have cost 21 µs to
pickle and 8 µs to load (a ``__slots__`` class with ``__reduce__``: 11 and 6), each event taking pickle's
slow path. Serialization is not what limits this path (``marshal`` was no faster and carries no exceptions).

Commands, worker -> stream process (one per frame):

* :class:`Config` once, first: what :mod:`cog_triton.streamer` builds its generator from.
* :class:`Start`: prepare and stream a prediction's inputs.
* :class:`Cancel`: stop a stream (and tell Triton to stop the request when ``send_stop``).
* :class:`Stop`: tell Triton to stop a request another stream process left behind.
* :class:`Reconnect`: Triton was restarted: use a new gRPC channel from the next request on.

Events, stream process -> worker: one :class:`Frame` per turn of the process's event loop, holding many
streams' text (``texts``) and events (``events``). The worker handles a frame's texts before its events:
a stream's :class:`End` or :class:`Failed` is its last message, so its text, in this frame or an earlier
one, is always queued before its end.

* :class:`Ready` once: the process has loaded its tokenizer (or could not: ``error``).
* :class:`Accepted` / :class:`Rejected`: the prediction was prepared and sent to Triton, or refused (an
  input error, which predict() raises).
* :class:`FirstToken`: time from the prediction's start to its first token.
* :class:`End` / :class:`Failed`: the stream ended normally (finished or cut by a stop sequence), or failed.
* :class:`Cancelled`: a :class:`Cancel` stopped the stream after ``output_tokens`` tokens (the worker has
  forgotten the stream by then; it only counts them, :mod:`cog_triton.exporter`).
* :class:`Stats`: LoRA adapter counts since the last report; after a request with an adapter, never per token.
* :class:`Timings`: when the prediction's start passed through the process (only with COG_TRITON_TIMING_METRICS).
"""

from __future__ import annotations

import pickle
import socket
import struct
from typing import TYPE_CHECKING, Any, NamedTuple, Union

if TYPE_CHECKING:
    from cog_triton.generation import GeneratorConfig
    from cog_triton.inputs import PredictInputs

HEADER = struct.Struct("<I")
#: Largest frame accepted, bytes (a Start carries at most a few MB of inputs).
MAX_FRAME_BYTES = 256 << 20


# ------------------------------------------------------------------ commands (worker -> stream process)
class Config(NamedTuple):
    """What the stream process builds its :class:`cog_triton.generation.Generator` from; the first command."""

    generator: "GeneratorConfig"
    stream_interval_s: float
    #: Report when each phase of a prediction's start happened (:class:`Timings`; COG_TRITON_TIMING_METRICS).
    timing: bool = False
    #: The stream interval under load (:class:`cog_triton.coalesce.StreamLoad`): its longest, seconds, and the
    #: running streams of this process the base interval serves (0: it never grows).
    stream_interval_max_s: float = 0.0
    stream_interval_streams: float = 0.0


class Start(NamedTuple):
    """Prepare and stream ``inputs`` as stream ``sid``; ``started_at`` is the worker's ``time.monotonic()`` when
    the prediction began (the clock is the same in every process of the host)."""

    sid: int
    request_id: str
    inputs: "PredictInputs"
    started_at: float


class Cancel(NamedTuple):
    """Stop stream ``sid``; ``send_stop``: also tell Triton to stop its request (False: Triton is being restarted)."""

    sid: int
    send_stop: bool


class Stop(NamedTuple):
    """Tell Triton to stop ``request_id``, a request another stream process left behind."""

    request_id: str


class Reconnect(NamedTuple):
    """Triton was restarted: use a new gRPC channel from the next request on."""


Command = Union[Config, Start, Cancel, Stop, Reconnect]


# -------------------------------------------------------------------- events (stream process -> worker)
class Ready(NamedTuple):
    """The process is ready (``load_s``: seconds to load its tokenizer), or could not start (``error``)."""

    pid: int
    load_s: float = 0.0
    error: str = ""


class Accepted(NamedTuple):
    """Stream ``sid`` was prepared and sent to Triton; its prompt is ``prompt_tokens`` tokens."""

    sid: int
    prompt_tokens: int


class Rejected(NamedTuple):
    """Preparing stream ``sid`` failed with ``error`` (an input error): predict() raises it."""

    sid: int
    error: BaseException


class FirstToken(NamedTuple):
    """Stream ``sid``'s first token came ``seconds`` after :attr:`Start.started_at`."""

    sid: int
    seconds: float


class End(NamedTuple):
    """Stream ``sid`` ended normally after ``output_tokens`` tokens (finished, or cut by a stop sequence)."""

    sid: int
    output_tokens: int


class Failed(NamedTuple):
    """Stream ``sid`` failed with ``error`` after ``output_tokens`` tokens."""

    sid: int
    error: BaseException
    output_tokens: int


class Cancelled(NamedTuple):
    """A :class:`Cancel` stopped stream ``sid`` after ``output_tokens`` tokens."""

    sid: int
    output_tokens: int


class Stats(NamedTuple):
    """LoRA adapter counts since the last report (``{name: increment}``,
    :meth:`cog_triton.lora.tasks.Adapters.take_counts`)."""

    counts: dict[str, int]


class Timings(NamedTuple):
    """When stream ``sid``'s start passed through its stream process (``time.monotonic()``, the host's clock):
    its Start read, its prompt prepared (and the request sent to Triton), its first text handed to the frame.
    Sent once, with the first text, only when :attr:`Config.timing` is on."""

    sid: int
    received_at: float
    prepared_at: float
    first_text_at: float


Event = Union[Ready, Accepted, Rejected, FirstToken, End, Failed, Cancelled, Stats, Timings]


class Frame(NamedTuple):
    """What one turn of a stream process's loop sends: text chunks (``(sid, text)`` pairs, in order) and events
    (in order). The worker handles the texts first (see the module docstring)."""

    texts: list[tuple[int, str]]
    events: list[Event]


def encode(message: Union[Command, Frame]) -> bytes:
    """One frame: header + pickle of ``message``."""
    data = pickle.dumps(message, protocol=5)
    return HEADER.pack(len(data)) + data


def decode(data: bytes) -> Any:
    """The message of a frame's body (what :func:`encode` pickled)."""
    return pickle.loads(data)


class FrameReader:
    """Blocking reader of frames from a socket (for a thread).

    Raises (from :meth:`read`):
        EOFError: the other end closed the socket (or the process died).
        ValueError: a frame over :data:`MAX_FRAME_BYTES`.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._file = sock.makefile("rb", buffering=1 << 16)

    def read(self) -> Any:
        """The next message (a :class:`Frame` from a stream process)."""
        header = self._file.read(HEADER.size)
        if len(header) < HEADER.size:
            raise EOFError("the stream process closed its channel")
        (length,) = HEADER.unpack(header)
        if length > MAX_FRAME_BYTES:
            raise ValueError(f"frame of {length} bytes (at most {MAX_FRAME_BYTES})")
        data = self._file.read(length)
        if len(data) < length:
            raise EOFError("the stream process closed its channel inside a frame")
        return decode(data)

    def close(self) -> None:
        self._file.close()


__all__ = (
    "Accepted", "Cancel", "Cancelled", "Command", "Config", "End", "Event", "Failed", "FirstToken", "Frame",
    "FrameReader", "HEADER", "MAX_FRAME_BYTES", "Ready", "Reconnect", "Rejected", "Start", "Stats", "Stop",
    "decode", "encode",
)
