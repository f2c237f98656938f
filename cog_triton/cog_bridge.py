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

So ``predict()`` returns the generator made by :func:`open_stream`, and :func:`install_cancel_hook`
wraps ``concurrent.futures.Future.cancel`` so that a cancel of a finished predict future whose
result is one of our generators cancels that stream (the async task on the event loop, which
then tells Triton to stop). Any other future behaves exactly as before.

Per streamed item the generator blocks on one thread-safe queue; when several text deltas are
already waiting it yields them as one string, so under load there are fewer coglet crossings and
at light load nothing changes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import weakref
from typing import AsyncIterator, Callable, Iterator, Optional

log = logging.getLogger(__name__)

_DONE = object()


class StreamHandle:
    """The async side of one streamed prediction: the task that feeds the queue, and its cancellation."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: "queue.SimpleQueue[object]" = queue.SimpleQueue()
        self.task: Optional[asyncio.Task[None]] = None
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        """Cancel the stream from any thread: the task is cancelled on its loop and the generator ends."""
        if self.cancelled.is_set():
            return
        self.cancelled.set()
        task = self.task
        if task is not None and not task.done():
            try:
                self.loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop is closed
                pass
        self.queue.put(_DONE)


# generator -> its handle, for the cancel hook; entries vanish with the generator
_STREAMS: "weakref.WeakKeyDictionary[Iterator[str], StreamHandle]" = weakref.WeakKeyDictionary()


async def open_stream(source: AsyncIterator[str]) -> Iterator[str]:
    """Start consuming ``source`` on the running loop; return the sync generator coglet will iterate.

    Args:
        source: the async iterator of text deltas (its exceptions are re-raised by the generator,
            so the prediction fails with them; its ``finally`` runs when the stream is cancelled).

    Returns:
        A generator (``types.GeneratorType``, as coglet requires) of text deltas. Iterating it
        blocks the calling thread (coglet's slot thread) until text is available; several waiting
        deltas are joined into one item. Closing it early cancels ``source``.
    """
    handle = StreamHandle(asyncio.get_running_loop())

    async def pump() -> None:
        put = handle.queue.put
        try:
            async for text in source:
                if text:
                    put(text)
            put(_DONE)
        except asyncio.CancelledError:
            put(_DONE)
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the generator, which re-raises it
            put(exc)

    handle.task = asyncio.create_task(pump())
    generator = _drain(handle)
    _STREAMS[generator] = handle
    return generator


def _drain(handle: StreamHandle) -> Iterator[str]:
    get, get_nowait = handle.queue.get, handle.queue.get_nowait
    try:
        while True:
            item = get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
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
            yield parts[0] if len(parts) == 1 else "".join(parts)  # type: ignore[misc]
            if end is _DONE:
                return
            if isinstance(end, BaseException):
                raise end
    finally:
        if not handle.cancelled.is_set() and handle.task is not None and not handle.task.done():
            handle.cancel()  # closed early (GeneratorExit): stop the producer too


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
                        handle = _STREAMS.get(self.result(timeout=0))
                    except TypeError:  # a result that cannot be weakly referenced: not ours
                        handle = None
                    if handle is not None:
                        log.info("prediction cancelled: stopping its stream")
                        handle.cancel()
            except Exception:  # noqa: BLE001 - never break a cancel() call
                log.exception("cancel hook failed")
            return original(self)

        cancel.__wrapped__ = original  # type: ignore[attr-defined]
        concurrent.futures.Future.cancel = cancel  # type: ignore[method-assign]
        _installed = True
