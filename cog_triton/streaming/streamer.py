"""A stream process: the per-token work of predictions, outside the Cog worker's interpreter.

The Cog worker (coglet's Python process, where ``predict()`` runs) has one GIL, and coglet gives
every running prediction its own thread there. When the worker also received every token over
gRPC, parsed and detokenized it and woke that prediction's thread for it, it was the ceiling of a
many-core GPU host: about 6,000 tokens/s whatever the engine made (README, Performance). So the
per-token work runs here, in a few processes the worker starts (``COG_TRITON_STREAM_PROCESSES``):
each receives and parses the ensemble's gRPC stream, detokenizes, cuts stop sequences, checks
guided output, and sends the worker text chunks joined over the stream interval
(:mod:`cog_triton.streaming.coalesce`), many streams' chunks in one frame (:mod:`cog_triton.ipc`). The same
split as vLLM's engine-core / API-server processes and SGLang's detokenizer manager.

Run by :class:`cog_triton.worker.stream_pool.StreamPool` as ``python -m cog_triton.streaming.streamer FD``, FD being
its end of a Unix socket pair. It reads a :class:`cog_triton.ipc.Config` command, builds its
:class:`cog_triton.streaming.generation.Generator` (tokenizer, gRPC client, guide checker), answers
:class:`cog_triton.ipc.Ready`, then serves the worker's commands (:mod:`cog_triton.ipc`) until the worker
closes the socket. When the worker dies, even by
SIGKILL, the kernel closes its end, this process reads end-of-file and exits (no PR_SET_PDEATHSIG:
that signal follows the *thread* that started the process, and a restart may come from a short-lived one).

Threads: the event loop (gRPC streams, commands, sending events), one thread that renders and
tokenizes prompts (a Hugging Face fast tokenizer is not safe to call from several threads at once), and up to
one per prediction slot that resolve LoRA adapters (download, conversion: up to the adapter deadline), so that an
adapter's download never holds up another request's prompt, nor the loop, nor another request's adapter.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

from common.errors import CogTritonError
from cog_triton import ipc
from cog_triton.streaming.coalesce import IntervalFlusher, StreamLoad
from cog_triton.streaming.generation import Generator, RequestState, build_generator
from cog_triton.stream_config import GeneratorConfig
from cog_triton.ipc import PredictInputs

log = logging.getLogger("cog_triton.streaming.streamer")

#: Inputs up to this many characters, without a guide, are prepared on the event loop: rendering and
#: tokenizing a short prompt takes tens of microseconds, less than the two thread hand-offs of the
#: prepare thread, and under a burst of arrivals those hand-offs were on every prediction's path to
#: its first token. Longer inputs (up to megabytes) and guides (xgrammar compiles them: milliseconds
#: and more) go to the prepare thread so that they never stall the streams of this process.
INLINE_PREPARE_CHARS = 4096
#: Threads per stream process that download and convert LoRA adapters, unless the adapter limits say how many
#: (:attr:`cog_triton.streaming.lora.store.StoreLimits.fetches`: one per prediction slot).
ADAPTER_THREADS = 4


def _inline(inputs: PredictInputs) -> bool:
    if inputs.guide is not None or inputs.image_input:  # (an adapter is resolved before, on the adapter threads)
        return False
    size = len(inputs.prompt) + len(inputs.system_prompt) + len(inputs.prompt_template or "")
    for message in inputs.messages or ():
        if not isinstance(message["content"], str):
            return False  # parts: images are read and checked there
        size += len(message["content"]) + len(message["role"]) + len(message.get("reasoning_content", ""))
    return size <= INLINE_PREPARE_CHARS


def _portable(exc: BaseException) -> BaseException:
    """``exc`` as the worker will raise it: our own errors as they are, anything else as a RuntimeError
    naming its type (it may not survive pickling)."""
    if isinstance(exc, CogTritonError):
        return exc
    return RuntimeError(f"{type(exc).__name__} in the stream process: {exc}")


class PredictionRunner:
    """Serves one worker over ``sock`` (see the module docstring)."""

    def __init__(self, sock: socket.socket, name: str = "stream") -> None:
        self.sock = sock
        self.name = name
        self.generator: Optional[Generator] = None
        self.load = StreamLoad(0)  # this process's streams and the interval they call for (ipc.Config)
        self.timing = False  # ipc.Config.timing: send each prediction's Timings
        self._requests: dict[int, RequestState] = {}  # by sid, from its Start until its task ends
        self._texts: list[tuple[int, str]] = []  # the next frame's text chunks
        self._events: list[ipc.Event] = []  # and its events
        self._flush_due = False
        self._writer: Optional[asyncio.StreamWriter] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._prepare_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="streamer-prepare")
        self._adapter_pool = ThreadPoolExecutor(max_workers=ADAPTER_THREADS, thread_name_prefix="streamer-adapter")
        # a prediction's images are read, fetched and decoded here, not on the one prepare thread (ipc.Config sizes it)
        self._image_pool = ThreadPoolExecutor(max_workers=ADAPTER_THREADS, thread_name_prefix="streamer-images")
        self.served = 0

    def _adapter_threads(self, config: GeneratorConfig) -> None:
        """One adapter thread per prediction this process can have (``StoreLimits.fetches``: the prediction slots),
        so that a request's adapter never waits for a thread that slow sources hold; threads start as needed. The
        same for images (``ImageLimits.fetches``): a slow image URL, held until its deadline, or a large image holds
        only its own prediction."""
        limits = config.adapter_limits
        if limits is not None and limits.fetches != ADAPTER_THREADS:
            self._adapter_pool.shutdown(wait=False)
            self._adapter_pool = ThreadPoolExecutor(max_workers=max(1, limits.fetches),
                                                    thread_name_prefix="streamer-adapter")
        if config.image_limits.fetches != ADAPTER_THREADS:
            self._image_pool.shutdown(wait=False)
            self._image_pool = ThreadPoolExecutor(max_workers=max(1, config.image_limits.fetches),
                                                  thread_name_prefix="streamer-images")

    # ------------------------------------------------------------------ events out
    def _send(self, event: ipc.Event) -> None:
        """Queue an event; everything queued in one turn of the loop leaves in one frame."""
        if not self._flush_due:
            self._flush_soon()
        self._events.append(event)

    def _send_text(self, sid: int, text: str) -> None:
        """Queue a text chunk of stream ``sid`` (per chunk: a flag test and an append)."""
        if not self._flush_due:
            self._flush_soon()
        self._texts.append((sid, text))

    def _flush_soon(self) -> None:
        assert self._loop is not None
        self._flush_due = True
        self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        frame = ipc.Frame(self._texts, self._events)
        self._texts, self._events, self._flush_due = [], [], False
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(ipc.encode(frame))

    # ---------------------------------------------------------------------- serve
    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        reader, self._writer = await asyncio.open_unix_connection(sock=self.sock)
        config = await self._read(reader)
        if not isinstance(config, ipc.Config):
            raise RuntimeError(f"expected a Config command first, got {type(config).__name__}")
        started = time.monotonic()
        generator_config: GeneratorConfig = config.generator
        self._adapter_threads(generator_config)
        self.load = StreamLoad(config.stream_interval_ms, config.stream_interval_max_ms,
                               float(config.stream_interval_streams))
        self.timing = bool(config.timing)
        try:
            self.generator = build_generator(generator_config)
        except Exception as exc:  # noqa: BLE001 - reported to the worker, whose setup fails with it
            log.exception("%s could not start", self.name)
            self._send(ipc.Ready(os.getpid(), error=f"{type(exc).__name__}: {exc}"))
            await asyncio.sleep(0)  # let the frame leave
            await self._writer.drain()
            return
        watchdog = asyncio.create_task(self.generator.watchdog())
        self._send(ipc.Ready(os.getpid(), load_s=round(time.monotonic() - started, 3),
                             template=self.generator.template))
        log.info("%s ready (pid %d) in %.1f s", self.name, os.getpid(), time.monotonic() - started)
        try:
            while True:
                try:
                    command = await self._read(reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    log.info("%s: the worker closed the channel; exiting after %d streams", self.name, self.served)
                    return
                self._dispatch(command)
        finally:
            watchdog.cancel()
            for state in list(self._requests.values()):
                state.cancel()
            self._prepare_pool.shutdown(wait=False, cancel_futures=True)
            self._adapter_pool.shutdown(wait=False, cancel_futures=True)
            self._image_pool.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    async def _read(reader: asyncio.StreamReader) -> ipc.Command:
        header = await reader.readexactly(ipc.HEADER.size)
        (length,) = ipc.HEADER.unpack(header)
        if length > ipc.MAX_FRAME_BYTES:
            raise ValueError(f"frame of {length} bytes (at most {ipc.MAX_FRAME_BYTES})")
        return ipc.decode(await reader.readexactly(length))  # type: ignore[no-any-return]

    def _dispatch(self, command: ipc.Command) -> None:
        generator = self.generator
        assert generator is not None
        match command:
            case ipc.Start(sid, request_id, inputs, started_at):
                state = RequestState()
                state.task = asyncio.create_task(self._serve_prediction(sid, request_id, inputs, started_at, state))
                self._requests[sid] = state
                state.task.add_done_callback(lambda _t, sid=sid: self._requests.pop(sid, None))
            case ipc.Cancel(sid, send_stop_request):
                state = self._requests.get(sid)
                if state is not None:
                    state.cancel(send_stop_request=send_stop_request)
            case ipc.StopRequest(request_id):
                generator.send_stop_request_in_background(request_id)
            case ipc.Reconnect():
                generator.triton_restarted()
            case _:
                log.error("%s: unknown command %r", self.name, type(command).__name__)

    def _timed_push(self, sid: int, push: Callable[[str], None], received_at: float,
                    prepared_at: float) -> Callable[[str], None]:
        """``push``, which also sends the prediction's :class:`~cog_triton.ipc.Timings` with its first text."""

        def first(text: str) -> None:
            nonlocal current
            push(text)
            self._send(ipc.Timings(sid, received_at, prepared_at, time.monotonic()))
            current = push

        current = first
        return lambda text: current(text)

    def _report_lora(self) -> None:
        """Send the worker this process's LoRA adapter counts since the last report (one Stats event, only when
        something happened; after requests with an adapter, never per token)."""
        adapters = self.generator.adapters if self.generator is not None else None
        if adapters is None:
            return
        counts = adapters.take_counts()
        if counts:
            self._send(ipc.Stats(counts))

    async def _serve_prediction(self, sid: int, request_id: str, inputs: PredictInputs, started_at: float,
                                state: RequestState) -> None:
        generator = self.generator
        assert generator is not None
        loop = asyncio.get_running_loop()
        received_at = time.monotonic() if self.timing else 0.0
        try:
            adapter = None
            if inputs.lora is not None:
                adapter = await loop.run_in_executor(self._adapter_pool, generator.resolve_adapter, inputs.lora)
            interval_ms = self.load.ms  # the model joins this request's responses over the interval now due
            if inputs.image_count:  # read, fetched and decoded on a thread of their own, then prepared as usual
                images = await loop.run_in_executor(self._image_pool, generator.images.load, inputs)
                prepared = await loop.run_in_executor(
                    self._prepare_pool, generator.prepare, inputs, request_id, adapter, images, interval_ms
                )
            elif _inline(inputs):
                # the adapter resolved above, once
                prepared = generator.prepare(inputs, request_id, adapter, None, interval_ms)
            else:
                prepared = await loop.run_in_executor(
                    self._prepare_pool, generator.prepare, inputs, request_id, adapter, None, interval_ms
                )
        except asyncio.CancelledError:
            return
        except Exception as exc:  # noqa: BLE001 - an input error (or a bug): predict() raises it
            self._send(ipc.Rejected(sid, _portable(exc)))
            if inputs.lora is not None:
                self._report_lora()
            return
        self._send(ipc.Accepted(sid, prepared.prompt_tokens))
        if inputs.lora is not None:
            self._report_lora()
        send, send_text = self._send, self._send_text
        flusher = IntervalFlusher(self.load, lambda text: send_text(sid, text), loop)
        push = flusher.push
        if self.timing:
            push = self._timed_push(sid, push, received_at, time.monotonic())
        self.served += 1
        self.load.started()
        try:
            counts = None
            if prepared.images:
                def counts(prompt: int, image: int, images: int = prepared.images) -> None:
                    state.prompt_tokens = prompt
                    send(ipc.ImageCounts(sid, images, prompt, image))
            async for text in generator.text_deltas(
                inputs, prepared, state, on_first_token=lambda t: send(ipc.FirstToken(sid, t - started_at)),
                on_counts=counts,
            ):
                push(text)
        except asyncio.CancelledError:
            # The worker cancelled it and no longer listens for its text; it counts the tokens made.
            send(ipc.Cancelled(sid, state.output_tokens, state.reasoning_tokens))
            return
        except Exception as exc:  # noqa: BLE001 - reported to the worker, which fails the prediction with it
            flusher.close()  # what was generated before the failure still reaches the user
            send(ipc.Failed(sid, _portable(exc), state.output_tokens, state.reasoning_tokens))
            return
        finally:
            self.load.ended()
            log.info(
                "generated %d tokens%s for a %s-token prompt%s in %.2f s%s",
                state.output_tokens, _thinking_note(state) if prepared.thinking else "",
                state.prompt_tokens if prepared.images else prepared.prompt_tokens,
                f" with {prepared.images} image(s)" if prepared.images else "", time.monotonic() - started_at,
                " (stop sequence)" if state.cut_by_stop_sequence else "",
            )
            if inputs.lora is not None:
                self._report_lora()  # a request sent again after the engine's cache miss counts there
        flusher.close()
        send(ipc.End(sid, state.output_tokens, state.reasoning_tokens,
                     state.thinking_budget_reached if inputs.thinking_budget_tokens else None))


def _thinking_note(state: RequestState) -> str:
    """The log line's count of a prediction's thinking tokens."""
    budget = ", ended by its budget" if state.thinking_budget_reached else ""
    return f" ({state.reasoning_tokens} thinking{budget})"


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m cog_triton.streaming.streamer FD NAME", file=sys.stderr)
        return 2
    name = args[1]
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s %(levelname)s {name}: %(message)s")
    sock = socket.socket(fileno=int(args[0]))
    try:
        asyncio.run(PredictionRunner(sock, name).run())
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
