"""Streaming a prediction through coglet (cog 0.23.1): an async text stream handed over as a sync generator.

Facts from coglet 0.23.1's source (replicate/cog 6110c912, ``crates/coglet-python/src/``), each
reproduced against the installed coglet by ``tests/test_cog_bridge.py``:

* ``COG_MAX_CONCURRENCY > 1`` requires an ``async`` predict (``worker_bridge.rs``; setup fails
  otherwise).
* An ``async def predict`` that *yields* is run through ``_collect_async_gen``
  (``predictor.rs``): every item is collected first and all ``output`` events arrive when the
  generation has ended, so nothing streams.
* An ``async def predict`` that *returns a generator* is streamed: ``process_async_result`` sees
  a ``types.GeneratorType`` and iterates it in the prediction's slot thread, one output message
  per yielded item (``process_generator_output``).
* Cancelling an async prediction calls ``cancel()`` on the ``concurrent.futures.Future`` of the
  predict coroutine (``worker_bridge.rs``, ``cancel`` -> ``cancel_async_future``). Once the
  coroutine has returned the generator that future is done, so the cancel reaches nothing: the
  generator would run to its end and the prediction would only then report "canceled".

So ``predict()`` returns the generator made by :func:`output_generator`, and :func:`install_cancel_hook`
wraps ``concurrent.futures.Future.cancel`` so that a cancel of a finished predict future whose
result is one of our generators cancels that stream (:meth:`PredictionOutput.cancel`: its stream
process is told to stop it, and Triton to stop the request). Any other future behaves exactly as before.

Per streamed item the generator blocks on one thread-safe queue (``queue.SimpleQueue``: a C lock,
the GIL released while waiting); the items are text chunks already joined over the stream interval
(:mod:`cog_triton.streaming.coalesce`), and when several are waiting they are yielded as one string. Each
item costs coglet one output message (``send_output_item``: JSON encoding and an IPC write) and the
slot thread one wake-up, so fewer, larger items are what keeps the worker's GIL free.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import threading
import weakref
from typing import Callable, Iterator, Optional

from cog_triton.fetch.redaction import redact_error

log = logging.getLogger(__name__)

_DONE = object()


class PredictionOutput:
    """The Cog worker's side of one streamed prediction: the queue its text arrives on, and its cancel.

    Args:
        on_cancel: called once, from the cancelling thread, when the prediction is cancelled or its
            generator closed early (stops the producer: the prediction's stream in its stream process).

    Attributes:
        on_done: set by :func:`on_end`: called once by the generator, in the thread iterating it, when it
            stops: ``on_done(error, cancelled)`` (``error``: what it raised, else None; ``cancelled``: the
            stream was cancelled or the generator closed early).
        on_first: called once by the generator, in the thread iterating it, before its first item.
    """

    __slots__ = ("queue", "cancelled", "ended", "on_done", "on_first", "_on_cancel", "__weakref__")

    def __init__(self, on_cancel: Optional[Callable[[], None]] = None) -> None:
        self.queue: "queue.SimpleQueue[object]" = queue.SimpleQueue()
        self.cancelled = threading.Event()
        self.ended = False  # end() or fail() was called: the producer is done
        self.on_done: Optional[Callable[[Optional[BaseException], bool], None]] = None
        #: Called once, in the thread iterating the generator, just before it yields its first item (timing).
        self.on_first: Optional[Callable[[], None]] = None
        self._on_cancel = on_cancel

    def put(self, text: str) -> None:
        """A text chunk for the generator (from any thread)."""
        self.queue.put(text)

    def end(self) -> None:
        """The stream ended: the generator returns after the text already put."""
        self.ended = True
        self.queue.put(_DONE)

    def fail(self, error: BaseException) -> None:
        """The stream failed: the generator raises ``error`` after the text already put, its message redacted
        (:func:`cog_triton.fetch.redaction.redact_error`: it reaches the caller and coglet's log)."""
        self.ended = True
        self.queue.put(redact_error(error))

    def rebind_cancel(self, on_cancel: Optional[Callable[[], None]]) -> None:
        """Have a later cancel call ``on_cancel`` instead (the prediction was sent again: its new producer); None: a
        cancel only ends the generator (no producer right now)."""
        self._on_cancel = on_cancel

    def cancel(self) -> None:
        """Cancel the stream from any thread: the producer is stopped and the generator ends."""
        if self.cancelled.is_set():
            return
        self.cancelled.set()
        if self._on_cancel is not None:
            try:
                self._on_cancel()
            except Exception:  # noqa: BLE001 - the generator must still end
                log.exception("cancelling a stream failed")
        self.queue.put(_DONE)


# generator -> its output, for the cancel hook; entries vanish with the generator
_OUTPUTS: "weakref.WeakKeyDictionary[Iterator[str], PredictionOutput]" = weakref.WeakKeyDictionary()


def output_generator(output: PredictionOutput) -> Iterator[str]:
    """The sync generator coglet iterates for ``output`` (registered for the cancel hook).

    Returns:
        A generator (``types.GeneratorType``, as coglet requires) of text chunks. Iterating it
        blocks the calling thread (coglet's slot thread) until text is available; chunks already
        waiting are joined into one item. It raises what :meth:`PredictionOutput.fail` was given.
        Closing it early cancels the stream.
    """
    generator = _drain(output)
    _OUTPUTS[generator] = output
    return generator


def then(generator: Iterator[str], at_end: Callable[[], None]) -> Iterator[str]:
    """``generator``'s items, then ``at_end()`` in the iterating thread once it ends, fails or is closed.

    The new generator is registered with ``generator``'s output, so that coglet's cancel of a
    prediction that returned it still reaches the stream (the cancel hook looks the returned object up).
    """
    output = _OUTPUTS.get(generator)

    def chained() -> Iterator[str]:
        try:
            yield from generator
        finally:
            at_end()

    out = chained()
    if output is not None:
        _OUTPUTS[out] = output
    return out


def on_end(generator: Iterator[str], callback: Callable[[Optional[BaseException], bool], None]) -> bool:
    """Have ``callback(error, cancelled)`` called once when ``generator`` (one of :func:`output_generator`'s or
    :func:`then`'s) stops: run to its end (None, False), raised ``error`` (error, ...), or was cancelled or closed
    early (None, True). It runs in the thread that iterates the generator, after its last item; nothing is added
    per item. Returns False (and sets nothing) when ``generator`` is not one of ours."""
    try:
        output = _OUTPUTS.get(generator)
    except TypeError:  # cannot be weakly referenced: not one of ours
        return False
    if output is None:
        return False
    output.on_done = callback
    return True


def _drain(output: PredictionOutput) -> Iterator[str]:
    get, get_nowait = output.queue.get, output.queue.get_nowait
    error: Optional[BaseException] = None
    first = output.on_first
    try:
        while True:
            item = get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                error = item
                raise item
            parts = [item]
            end: object = None
            while True:  # coalesce what is already waiting
                try:
                    more = get_nowait()
                except queue.Empty:
                    break
                if isinstance(more, str):
                    parts.append(more)
                else:
                    end = more
                    break
            if first is not None:
                first, call = None, first
                try:
                    call()
                except Exception:  # noqa: BLE001 - bookkeeping must not break the stream
                    log.exception("the first-item callback failed")
            yield parts[0] if len(parts) == 1 else "".join(parts)  # type: ignore[misc]
            if end is _DONE:
                return
            if isinstance(end, BaseException):
                error = end
                raise end
    finally:
        if not output.ended and not output.cancelled.is_set():
            output.cancel()  # closed early (GeneratorExit): stop the producer too
        done = output.on_done
        if done is not None:
            output.on_done = None
            try:
                done(error, output.cancelled.is_set())
            except Exception:  # noqa: BLE001 - the stream's end must not fail for its bookkeeping
                log.exception("the end-of-stream callback failed")


_installed = False
_install_lock = threading.Lock()


def install_cancel_hook() -> None:
    """Make coglet's cancel of a returned stream reach it (idempotent; see the module docstring)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        original: Callable[[concurrent.futures.Future], bool] = concurrent.futures.Future.cancel

        def cancel(self: concurrent.futures.Future) -> bool:  # type: ignore[type-arg]
            try:
                if self.done() and not self.cancelled() and self.exception(timeout=0) is None:
                    try:
                        output = _OUTPUTS.get(self.result(timeout=0))
                    except TypeError:  # a result that cannot be weakly referenced: not ours
                        output = None
                    if output is not None:
                        log.info("prediction cancelled: stopping its stream")
                        output.cancel()
            except Exception:  # noqa: BLE001 - never break a cancel() call
                log.exception("cancel hook failed")
            return original(self)

        cancel.__wrapped__ = original  # type: ignore[attr-defined]
        concurrent.futures.Future.cancel = cancel  # type: ignore[method-assign]
        _installed = True
