"""What the request path needs of the stream processes: one interface, :class:`PredictionStreams`.

:class:`cog_triton.worker.service.LLMService` talks only to this interface (open a prediction's stream, reconnect
after Triton restarted, health, stop), as vLLM's ``EngineCoreClient`` hides its transports from the API server.
:class:`cog_triton.worker.stream_pool.StreamPool` (stream processes that each hold gRPC streams to Triton) is its
one implementation; starting it is setup's (:func:`cog_triton.worker.launch.launch`). A second implementation
belongs here only for a real deployment mode (say, streams in this process on a small host), never as a test double.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Callable, Iterator, Optional, Protocol

from cog_triton.ipc import PredictInputs
from cog_triton.reasoning import TemplateInfo
from cog_triton.worker.metrics import MetricSink
from cog_triton.worker.supervisor import Health


class PredictionStreams(Protocol):
    """The stream processes as the request path sees them (see the module docstring)."""

    #: The chat template's facts (reasoning format, levels) once a stream process reported them; None before.
    template: Optional[TemplateInfo]

    async def open(self, inputs: PredictInputs, request_id: str, started_at: float,
                   metric: Optional[MetricSink] = None,
                   queued: Optional[Callable[[], AbstractContextManager[None]]] = None) -> Iterator[str]:
        """Start streaming ``inputs`` (``request_id``: Triton's; ``started_at``: ``time.monotonic()`` when the
        prediction began, seconds) and return the generator of its text chunks that coglet iterates. While no
        stream can take it, wait inside ``queued()``.

        Raises:
            InputError or another error of the request's preparation; StreamProcessError: the stream process
                ended before it accepted the request.
        """
        ...

    def reconnect(self) -> None:
        """Open new connections to Triton (after the supervisor restarted it)."""
        ...

    def health(self) -> Health:
        """Whether predictions can be streamed now, and why not."""
        ...

    def stop(self) -> None:
        """Stop the streams (shutdown); running predictions end."""
        ...


__all__ = ["PredictionStreams"]
