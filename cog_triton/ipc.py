"""The channel between the Cog worker and a stream process: length-prefixed pickle frames on a Unix socket.

One ``socketpair`` per stream process. A frame is a 4-byte little-endian length and that many bytes
of a pickle (protocol 5). Both ends are our own processes, started from the same interpreter, so
pickle carries our exception objects and dataclasses as they are. Serialization is not what limits
this path: pickling a frame of 40 text events takes about 1 µs, loading it about 1 µs (measured on
the 2-core development machine; ``marshal`` was no faster on such frames and carries no exceptions).

Commands, worker -> stream process (tuples, first item the kind):

* ``(CONFIG, dict)`` once, first: what :mod:`cog_triton.streamer` needs to build its generator.
* ``(START, sid, request_id, inputs, started_at)``: prepare and stream ``inputs``
  (:class:`cog_triton.inputs.PredictInputs`); ``started_at`` is the worker's ``time.monotonic()``
  when the prediction began (the clock is the same in every process of the host).
* ``(CANCEL, sid, send_stop)``: stop the stream (and tell Triton to stop the request when
  ``send_stop``).
* ``(STOP, request_id)``: tell Triton to stop a request another stream process left behind.
* ``(RECONNECT,)``: Triton was restarted: use a new gRPC channel from the next request on.

Events, stream process -> worker, sent as a list per frame (many streams' events in one frame):

* ``(sid, ACCEPTED, prompt_tokens)``: the request is prepared and sent; predict() returns.
* ``(sid, REJECTED, error)``: preparing it failed (an input error); predict() raises ``error``.
* ``(sid, TEXT, text)``: a chunk of text (joined over the stream interval).
* ``(sid, FIRST_TOKEN, seconds)``: time from ``started_at`` to the first token.
* ``(sid, END, output_tokens)``: the stream ended normally (finished or cut by a stop sequence).
* ``(sid, FAILED, error, output_tokens)``: the stream failed with ``error``.
* ``(sid, CANCELLED, output_tokens)``: a CANCEL stopped the stream after ``output_tokens`` tokens (the
  worker has forgotten the stream by then; it only counts them, :mod:`cog_triton.exporter`).
* ``(0, STATS, counts)``: LoRA adapter counts since the last STATS (``{name: increment}``,
  :meth:`cog_triton.lora.tasks.Adapters.take_counts`); sent after a request with an adapter, never per token.
* ``(0, READY, info)``: the process has loaded its tokenizer and connected; sent once.
"""

from __future__ import annotations

import pickle
import socket
import struct
from typing import Any

HEADER = struct.Struct("<I")
#: Largest frame accepted, bytes (a START carries at most a few MB of inputs).
MAX_FRAME_BYTES = 256 << 20

# commands
CONFIG, START, CANCEL, STOP, RECONNECT = "config", "start", "cancel", "stop", "reconnect"
# events (small ints: compared per chunk in the worker)
ACCEPTED, REJECTED, TEXT, FIRST_TOKEN, END, FAILED, READY, CANCELLED, STATS = range(9)


def encode(message: Any) -> bytes:
    """One frame: header + pickle of ``message``."""
    data = pickle.dumps(message, protocol=5)
    return HEADER.pack(len(data)) + data


class FrameReader:
    """Blocking reader of frames from a socket (for a thread).

    Raises (from :meth:`read`):
        EOFError: the other end closed the socket (or the process died).
        ValueError: a frame over :data:`MAX_FRAME_BYTES`.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._file = sock.makefile("rb", buffering=1 << 16)

    def read(self) -> Any:
        header = self._file.read(HEADER.size)
        if len(header) < HEADER.size:
            raise EOFError("the stream process closed its channel")
        (length,) = HEADER.unpack(header)
        if length > MAX_FRAME_BYTES:
            raise ValueError(f"frame of {length} bytes (at most {MAX_FRAME_BYTES})")
        data = self._file.read(length)
        if len(data) < length:
            raise EOFError("the stream process closed its channel inside a frame")
        return pickle.loads(data)

    def close(self) -> None:
        self._file.close()


__all__ = ("encode", "FrameReader", "HEADER", "MAX_FRAME_BYTES")
