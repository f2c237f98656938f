"""In-flight batching for the reference ``tensorrt_llm`` model: :class:`Scheduler` runs up to
``max_active`` :class:`Job` s one step each in turn, queues the rest (FIFO, bounded as the executor's
``maxQueueSize``), stops a request by its Triton request id, notices client cancellation, and sends each
job's responses to a :class:`ResponseSink` (in Triton, ``model.py``'s ``TritonSink``).
"""

from __future__ import annotations

import threading
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, List, Optional, Protocol

from .generation import TokenGenerator
from .parsing import QueueFullError


class ResponseSink(Protocol):
    """Where a job's responses go. In Triton this is a response sender (:class:`model.TritonSink`)."""

    def send_tokens(self, tokens: List[int], log_probs: Optional[List[float]], cum_log_prob: Optional[float],
                    final: bool) -> None: ...

    def send_error(self, message: str) -> None: ...

    def is_cancelled(self) -> bool: ...


@dataclass
class Job:
    """A queued or running request.

    Attributes:
        generation: its decoding state (any :class:`TokenGenerator`).
        sink: where responses go.
        streaming: one response per step with the new tokens (True), or one at the end (False).
        prefix_ids: prepended to the non-streaming output (the prompt unless
            exclude_input_in_output). Never streamed.
        request_id: Triton's request id. A later request with ``stop`` true and the same id stops it.
        stop_requested: set by such a stop request; the scheduler ends the job at its next turn.
        sent: tokens already streamed.
    """

    generation: TokenGenerator
    sink: ResponseSink
    streaming: bool = False
    prefix_ids: List[int] = field(default_factory=list)
    request_id: str = ""
    stop_requested: bool = False
    sent: int = 0
    on_done: Optional[Callable[[], None]] = None  # called once when the job leaves the scheduler

    def done(self) -> None:
        callback, self.on_done = self.on_done, None
        if callback is not None:
            callback()


class Scheduler:
    """In-flight batching on one background thread, with the executor's queue and stop semantics.

    At most ``max_active`` jobs are active; the others wait in FIFO order and are never rejected,
    unless ``max_queue_size`` > 0 and the waiting (not-yet-scheduled) jobs would exceed it
    (``Executor::Impl::enqueueRequests``, executorImpl.cpp @b35ac1b6: "Maximum queue size of %d has
    been reached, please try again later"; active jobs do not count). Each loop iteration admits
    waiting jobs into free slots, then runs ONE step for each active job in turn (round robin).

    A job ends with one FINAL response that is never an error unless generation raised:
    streaming - the tokens not yet sent (possibly none); non-streaming - prefix + all tokens. That
    holds for the end token, length, stop words, a ``stop`` request and a client cancel alike
    (``terminateCancelledRequests`` then ``createResult``, executorImpl.cpp / llmRequest.cpp).

    ``request_stop(id)`` stops the latest job submitted with that request id, queued or running
    (backend ``mTritonRequestIdToRequestIds``: a later request with the same id replaces the entry,
    which is dropped when that request ends).
    """

    def __init__(self, max_active: int, max_queue_size: int = 0,
                 log: Callable[[str, str], None] = lambda level, msg: None) -> None:
        if max_active < 1:
            raise ValueError(f"max_active must be >= 1, got {max_active}")
        self.max_active = max_active
        self.max_queue_size = max_queue_size
        self._log = log
        self._cond = threading.Condition()
        self._waiting: Deque[Job] = deque()
        self._active: List[Job] = []
        self._by_id: Dict[str, Job] = {}
        self._closing = False
        self._thread: Optional[threading.Thread] = None

    # -- API used by the model (any thread) -------------------------------------------------------
    def start(self) -> None:
        """Start the scheduler thread (daemon)."""
        self._thread = threading.Thread(target=self._loop, name="reference-llm-scheduler", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job (FIFO); it becomes active at once when a slot is free and nobody waits.

        Raises:
            QueueFullError: ``max_queue_size`` > 0 and that many jobs already wait.
            RuntimeError: the scheduler is shutting down.
        """
        with self._cond:
            if self._closing:
                raise RuntimeError("the model is shutting down")
            if not self._waiting and len(self._active) < self.max_active:
                self._active.append(job)
            else:
                if self.max_queue_size > 0 and len(self._waiting) + 1 > self.max_queue_size:
                    raise QueueFullError(
                        f"Maximum queue size of {self.max_queue_size} has been reached, please try again later"
                    )
                self._waiting.append(job)
            if job.request_id:
                self._by_id[job.request_id] = job
            self._cond.notify()

    def request_stop(self, request_id: str) -> bool:
        """Ask the job last submitted with this request id to stop. Returns whether one was found."""
        with self._cond:
            job = self._by_id.get(request_id) if request_id else None
            if job is None:
                return False
            job.stop_requested = True
            self._cond.notify()
            return True

    def counts(self) -> tuple[int, int]:
        """(active, waiting) job counts."""
        with self._cond:
            return len(self._active), len(self._waiting)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop the thread. Jobs still queued or running get an error response."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._cond:
            left = list(self._active) + list(self._waiting)
            self._active.clear()
            self._waiting.clear()
            self._by_id.clear()
        for job in left:
            job.generation.finish("error")
            job.done()
            self._safe(job, lambda j=job: j.sink.send_error("the model was unloaded before the request finished"))

    # -- scheduler thread -------------------------------------------------------------------------
    def _safe(self, job: Job, fn: Callable[[], None]) -> bool:
        try:
            fn()
            return True
        except Exception as exc:  # noqa: BLE001 - a broken sender must not kill the loop
            self._log("warn", f"could not send a response for request {job.request_id!r}: {exc}")
            return False

    def _log_probs(self, job: Job, start: int, end: int):
        gen = job.generation
        if not gen.params.return_log_probs:
            return None, None
        return list(gen.log_probs[start:end]), float(sum(gen.log_probs[:end]))

    def _finish(self, job: Job) -> None:
        """Send the FINAL response of a job whose generation has ended (not for errors)."""
        gen = job.generation
        if job.streaming:
            new = list(gen.tokens[job.sent:])
            lp, cum = self._log_probs(job, job.sent, len(gen.tokens))
            job.sent = len(gen.tokens)
            self._safe(job, lambda: job.sink.send_tokens(new, lp, cum, True))
            return
        tokens = list(job.prefix_ids) + list(gen.tokens)
        lp, cum = self._log_probs(job, 0, len(gen.tokens))
        self._safe(job, lambda: job.sink.send_tokens(tokens, lp, cum, True))

    def _run_one(self, job: Job) -> bool:
        """One turn of one job. Returns True while the job stays active."""
        gen = job.generation
        try:
            if job.sink.is_cancelled():
                gen.finish("cancelled")
                self._log("info", f"request {job.request_id!r} cancelled by the client after {len(gen.tokens)} tokens")
                self._finish(job)
                return False
            if job.stop_requested:
                gen.finish("stopped")
                self._finish(job)
                return False
            gen.step()
            if gen.finished:
                self._finish(job)
                return False
            if job.streaming and len(gen.tokens) > job.sent:
                start, job.sent = job.sent, len(gen.tokens)
                new = list(gen.tokens[start:])
                lp, cum = self._log_probs(job, start, len(gen.tokens))
                if not self._safe(job, lambda: job.sink.send_tokens(new, lp, cum, False)):
                    gen.finish("cancelled")
                    return False
            return True
        except Exception as exc:  # noqa: BLE001 - one request's failure must not end the others
            gen.finish("error")
            self._log("error", f"request {job.request_id!r} failed: {traceback.format_exc()}")
            message = f"generation failed: {type(exc).__name__}: {exc}"
            self._safe(job, lambda: job.sink.send_error(message))
            return False

    def _retire(self, job: Job) -> None:
        with self._cond:
            if job in self._active:
                self._active.remove(job)
            if job.request_id and self._by_id.get(job.request_id) is job:
                del self._by_id[job.request_id]
        job.done()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closing and not self._active and not self._waiting:
                    self._cond.wait()
                if self._closing:
                    return
                while self._waiting and len(self._active) < self.max_active:
                    self._active.append(self._waiting.popleft())
                turn = list(self._active)
            for job in turn:
                try:
                    keep = self._run_one(job)
                except Exception:  # noqa: BLE001 - never let the thread die
                    keep = False
                    self._log("error", traceback.format_exc())
                if not keep:
                    self._retire(job)
                if self._closing:
                    break
