"""Test helper: an async iterator of text handed to coglet through cog_triton.worker.cog_bridge.

The product's producer is a stream process (cog_triton.worker.stream_pool puts its text chunks on the prediction's
output); the bridge's own tests and toy predictors need a producer without Triton, so this one runs an
async iterator as a task on the running loop and puts its items on a output. The bridge's parts under test
(the output, the generator coglet iterates, the cancel hook) are the product's.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Iterator, Optional

from cog_triton.worker import cog_bridge


async def relay(source: AsyncIterator[str]) -> Iterator[str]:
    """Start consuming ``source`` on the running loop; return the generator coglet would iterate.

    The generator yields ``source``'s items, raises what ``source`` raised, and closing it (or coglet's
    cancel, through the cancel hook) cancels ``source``'s task.
    """
    loop = asyncio.get_running_loop()
    task: Optional[asyncio.Task[None]] = None

    def cancel_task() -> None:
        if task is not None and not task.done():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop is closed
                pass

    output = cog_bridge.PredictionOutput(cancel_task)

    async def pump() -> None:
        try:
            async for text in source:
                output.put(text)
            output.end()
        except asyncio.CancelledError:
            output.end()
            raise
        except BaseException as exc:  # noqa: BLE001 - handed to the generator, which re-raises it
            output.fail(exc)

    task = asyncio.create_task(pump())
    return cog_bridge.output_generator(output)
