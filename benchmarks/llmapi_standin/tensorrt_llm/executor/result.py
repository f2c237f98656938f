"""Streamed generation results of TensorRT-LLM 1.2.1's LLM API (stand-in).

Facts followed (NVIDIA/TensorRT-LLM ``tensorrt_llm/executor/result.py`` @a678b91a):

* ``CompletionOutput`` (slotted dataclass): ``index``, ``text``, ``token_ids`` (all generated so far),
  ``cumulative_logprob``, ``logprobs``, ``prompt_logprobs``, ``finish_reason`` (one of 'stop', 'length',
  'timeout', 'cancelled', set on the final response; 'cancelled' on any cancelled one), ``stop_reason``;
  properties ``length``, ``token_ids_diff`` (the ids added by the last response: ``_handle_sequence`` records
  the old length, then extends ``token_ids`` with the response's new ids when not beam searching),
  ``text_diff``, ``logprobs_diff``;
* ``GenerationResult``: ``request_id``, ``prompt_token_ids``, ``outputs``, ``finished`` (property);
  ``abort()`` asks the executor to abort the request and marks it; ``aborted()`` is a **method**; ``async for``
  gives the result object itself once per engine response (``__anext__`` awaits one response, handles it,
  returns ``self``; after the final one ``StopAsyncIteration``); ``await result`` / ``aresult()`` wait for the
  final one, ``result()`` does the same synchronously. The queue is an asyncio one when the result is made
  on a running event loop (``has_event_loop()``), so ``generate_async`` must be called on the loop that
  iterates it;
* a per-request error from the engine raises ``RequestError`` in the awaiting iteration
  (``executor/executor.py`` ``_handle_background_error``);
* PyTorch backend logprobs: one ``{token_id: Logprob}`` dict per generated token (``result.py`` PyTorch branch,
  index copy): the top ``logprobs`` tokens the sampler reports, in rank order (TorchSampler: the arg-max token,
  which is not the sampled one when sampling; TRTLLMSampler: the sampled token, rank 1), and
  ``cumulative_logprob`` the sum of the first entries' values.
"""

from __future__ import annotations

import asyncio
import queue
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .utils import RequestError


@dataclass(slots=True)
class Logprob:
    """A token's log-probability and its rank among the vocabulary."""

    logprob: float
    rank: Optional[int] = None


@dataclass(slots=True)
class CompletionOutput:
    """One sequence of a request (see the module docstring)."""

    index: int
    text: str = ""
    token_ids: Optional[List[int]] = field(default_factory=list)
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[list] = field(default_factory=list)
    prompt_logprobs: Optional[list] = field(default_factory=list)
    finish_reason: Optional[str] = None
    stop_reason: Optional[Any] = None
    _last_text_len: int = field(default=0, init=False, repr=False)
    _last_token_ids_len: int = field(default=0, init=False, repr=False)
    _last_logprobs_len: int = field(default=0, init=False, repr=False)

    @property
    def length(self) -> int:
        return len(self.token_ids)

    @property
    def text_diff(self) -> str:
        return self.text[self._last_text_len:]

    @property
    def token_ids_diff(self) -> List[int]:
        return self.token_ids[self._last_token_ids_len:]

    @property
    def logprobs_diff(self) -> list:
        return self.logprobs[self._last_logprobs_len:]


@dataclass(frozen=True)
class EngineResponse:
    """What the stand-in's engine sends a result per step: the new ids (streaming) or all of them (final of a
    non-streaming request), one ``{token id: log-prob}`` per token when asked (keyed as the sampler keys it: the
    sampled token, or under TorchSampler the arg-max token), and whether and why it finished; or an error."""

    tokens: List[int] = field(default_factory=list)
    logprobs: Optional[List[Dict[int, float]]] = None
    finished: bool = False
    finish_reason: Optional[str] = None
    stop_reason: Any = None
    error: Optional[str] = None


class GenerationResult:
    """The future of one request (see the module docstring). Made by the LLM, fed by the engine."""

    def __init__(self, request_id: int, prompt_token_ids: List[int], sampling_params, streaming: bool,
                 engine: Any, tokenizer: Any = None) -> None:
        self._request_id = request_id
        self._prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self._streaming = streaming
        self._engine = weakref.ref(engine)
        self.tokenizer = tokenizer
        self._outputs = [CompletionOutput(0)]
        self._done = False
        self._aborted = False
        try:
            self._loop: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        if self._loop is not None:
            self._aqueue: Optional[asyncio.Queue] = asyncio.Queue()
            self._queue: Optional[queue.SimpleQueue] = None
        else:
            self._aqueue = None
            self._queue = queue.SimpleQueue()

    # -- engine side (any thread) ---------------------------------------------------------------
    def _deliver(self, response: EngineResponse) -> None:
        """Queue one engine response; called on the result's event loop (or any thread without one)."""
        if self._aqueue is not None:
            self._aqueue.put_nowait(response)
        else:
            self._queue.put(response)

    # -- user side ------------------------------------------------------------------------------
    @property
    def request_id(self) -> int:
        return self._request_id

    @property
    def prompt_token_ids(self) -> List[int]:
        return self._prompt_token_ids

    @property
    def outputs(self) -> List[CompletionOutput]:
        return self._outputs[: self.sampling_params.n]

    @property
    def finished(self) -> bool:
        return self._done

    def abort(self) -> None:
        """Ask the engine to abort this request (its last response comes with finish_reason 'cancelled')."""
        engine = self._engine()
        assert engine is not None, "The executor is not set for this result."
        engine.abort_request(self._request_id)
        self._aborted = True

    def aborted(self) -> bool:
        return self._aborted

    def _handle_response(self, response: EngineResponse) -> None:
        if response.error is not None:
            self._done = True
            raise RequestError(response.error)
        output = self._outputs[0]
        output._last_token_ids_len = len(output.token_ids)
        output.token_ids.extend(response.tokens)
        if response.logprobs is not None:
            output._last_logprobs_len = len(output.logprobs)
            output.logprobs += [{t: Logprob(lp, rank) for rank, (t, lp) in enumerate(entry.items(), 1)}
                                for entry in response.logprobs]
            output.cumulative_logprob = (output.cumulative_logprob or 0.0) + float(
                sum(next(iter(entry.values())) for entry in response.logprobs))
        if response.finish_reason == "cancelled":
            output.finish_reason = "cancelled"
        self._done = response.finished
        if self._done:
            output.finish_reason = response.finish_reason
            output.stop_reason = response.stop_reason
        if self.sampling_params.detokenize and self.tokenizer is not None:
            output._last_text_len = len(output.text)
            output.text = self.tokenizer.decode(output.token_ids,
                                                skip_special_tokens=self.sampling_params.skip_special_tokens)

    async def _aresult_step(self) -> None:
        assert self._aqueue is not None, (
            "The asyncio event loop was not present during initialization, so async operations are not available.")
        assert asyncio.get_running_loop() is self._loop, "iterate the result on the loop it was made on"
        self._handle_response(await self._aqueue.get())

    def __aiter__(self) -> "GenerationResult":
        return self

    async def __anext__(self) -> "GenerationResult":
        if self._done:
            raise StopAsyncIteration
        await self._aresult_step()
        return self

    async def aresult(self) -> "GenerationResult":
        while not self._done:
            await self._aresult_step()
        return self

    def __await__(self):
        return self.aresult().__await__()

    def result(self, timeout: Optional[float] = None) -> "GenerationResult":
        assert self._queue is not None, "made on an event loop: await it there"
        while not self._done:
            self._handle_response(self._queue.get(timeout=timeout))
        return self


__all__ = ["CompletionOutput", "EngineResponse", "GenerationResult", "Logprob"]
