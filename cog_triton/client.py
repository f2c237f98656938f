"""Async client for Triton's generate extension: ``POST /v2/models/<model>/generate_stream`` (SSE).

Request body: the ensemble's inputs as JSON scalars/lists (tensor names of TensorRT-LLM 1.1.0's
inflight_batcher_llm ensemble: max_tokens, min_tokens, temperature, top_k, top_p,
repetition_penalty, presence_penalty, frequency_penalty, seed, stream; plus ``input_ids``, the
prompt tokenized by the predictor, see triton_model_repo/ensemble). Each SSE event carries one
response of the decoupled ``tensorrt_llm`` model as JSON: ``output_ids`` (INT32, the new tokens of
this response; ``[]`` in the final response of a request that ended on the end token, which the
engine does not return) and ``sequence_length`` (their count), or ``{"error": "..."}``. Triton
writes events as ``data: <json>`` + a blank line, with no ``event:`` or ``id:`` fields, and ends
the HTTP response after the final one (server src/http_server.cc, GenerateRequestClass).

Transport, chosen by measurement (every streamed token passes through here). CPU per event of the
client process and of tritonserver, 32 streams x 500 events from a Triton Python model on this
2-core machine, Triton 2.51, two runs each:

==============================================  ==============  ===============
client                                          client µs/event  tritonserver µs
==============================================  ==============  ===============
httpx + httpx-sse (the previous client)         56, 58          60, 73
httpx, lines split by hand                      32, 35          --
aiohttp + aiohttp-sse-client2                   22, 28          --
aiohttp + the SSE framing below                 20, 28          43, 58
tritonclient.grpc.aio ``stream_infer``          41, 48 (64, 58)  76, 79
==============================================  ==============  ===============

aiohttp with SSE framing over its stream reader is the cheapest on both sides of the socket (gRPC
costs Triton more per response than the HTTP frontend's JSON). aiohttp-sse-client2 parses as fast
but, as an EventSource, reconnects by sending the request again when a stream ends, which for a
POST would start a second generation, so the framing (the subset of the SSE format Triton writes:
``data:`` lines, comments, blank-line dispatch) is done here.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional

import aiohttp

from common.errors import InferenceError, TritonError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerateRequest:
    """One generation request to the ensemble. Token counts are in tokens.

    ``input_ids`` is the prompt (INT32 token ids). ``temperature`` 0 or ``top_k`` 1 means greedy
    decoding; ``top_k`` 0 means no top-k filter. Stop sequences are not sent: the predictor matches
    them on the text (the engine would match stop words over prompt and output tokens together,
    cpp/tensorrt_llm/kernels/stopCriteriaKernels.cu ``stopWordsCriterion``) and stops the request by id.
    """

    input_ids: list[int]
    max_tokens: int
    min_tokens: int = 0
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = 0
    stream: bool = True
    request_id: str = ""
    # Guided decoding (structured output): one of json, json_schema, regex, ebnf_grammar, and the
    # schema/regex/grammar ("" for json). Empty guide_type: unguided. See cog_triton/guided.py.
    guide_type: str = ""
    guide: str = ""

    def to_json(self) -> dict[str, Any]:
        """The JSON body for the generate extension; optional tensors are left out when unused."""
        body: dict[str, Any] = {
            "input_ids": self.input_ids,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "repetition_penalty": self.repetition_penalty,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "seed": self.seed,
            "stream": self.stream,
        }
        if self.min_tokens:
            body["min_tokens"] = self.min_tokens
        if self.request_id:
            body["id"] = self.request_id
        if self.guide_type:
            # TYPE_STRING [1] inputs of the ensemble, passed through to tensorrt_llm (utils.cc
            # getGuidedDecodingParamsFromTensors reads them); a json guide needs no guide string.
            body["guided_decoding_guide_type"] = self.guide_type
            if self.guide:
                body["guided_decoding_guide"] = self.guide
        return body


@dataclass(frozen=True)
class GenerateChunk:
    """One streamed response: the new token ids (INT32 values; empty in an end-token final)."""

    output_ids: list[int]


def _flatten(value: Any) -> list[int]:
    if isinstance(value, list):
        out: list[int] = []
        for item in value:
            out.extend(_flatten(item))
        return out
    return [int(value)]


def parse_event(data: str) -> GenerateChunk:
    """Parse one SSE ``data`` payload into a chunk.

    ``output_ids`` is cut to ``sequence_length`` when present (the backend pads beams with -1,
    model_instance_state.cc fillTritonResponse). A response with no new tokens (``[]``, sequence
    length 0) is a valid chunk: the C++ backend sends it last when a streamed request ends on the
    end token, which it never returns (llmRequest.cpp createResult; tests/test_conformance.py).

    Raises:
        InferenceError: the event carries ``error``, has no ``output_ids`` (an ensemble that returns
            only text, as upstream's does, cannot serve the predictor), or is not the expected JSON.
    """
    try:
        payload = json.loads(data)
    except json.JSONDecodeError:
        raise InferenceError(f"Triton sent an event that is not JSON: {data[:200]!r}") from None
    if not isinstance(payload, dict):
        raise InferenceError(f"Triton sent an unexpected event: {data[:200]!r}")
    if "error" in payload:
        raise InferenceError(f"Triton reported: {payload['error']}")
    ids = payload.get("output_ids")
    if ids is None:
        raise InferenceError(
            f"Triton sent an event without output_ids: {data[:200]!r}; the ensemble must return the "
            "tensorrt_llm model's output_ids (upstream's ensemble returns only text_output)"
        )
    try:
        if type(ids) is int:  # one token: Triton writes a [1, 1, 1] tensor as a bare number
            out = [ids]
        else:
            out = _flatten(ids)
        length = payload.get("sequence_length")
        if length is not None:
            n = length if type(length) is int else (_flatten(length) or [len(out)])[0]
            out = out[: max(0, n)]
    except (TypeError, ValueError):
        raise InferenceError(
            f"Triton sent output_ids/sequence_length that are not integers: {data[:200]!r}"
        ) from None
    return GenerateChunk(output_ids=out)


def _error_message(body: str) -> str:
    """The error text of a non-200 answer: JSON ``{"error": ...}``, an SSE ``data:`` event, or plain text."""
    text = body.strip()
    if text.startswith("data:"):
        text = text[5:].strip()
    try:
        payload = json.loads(text)
    except json.JSONDecodeError:
        return text
    return str(payload.get("error", text)) if isinstance(payload, dict) else text


class TritonClient:
    """Streams generations from a Triton model over HTTP (one aiohttp connection pool per event loop).

    Args:
        base_url: e.g. ``http://127.0.0.1:8000``.
        model: the model to call (``ensemble``).
        token_timeout_s: longest wait for the next event, seconds.
        connect_timeout_s: TCP connect timeout, seconds.
        max_connections: connection pool size (at least the predictor's concurrency).
    """

    def __init__(
        self,
        base_url: str,
        *,
        model: str = "ensemble",
        token_timeout_s: float = 120.0,
        connect_timeout_s: float = 5.0,
        max_connections: int = 64,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.token_timeout_s = token_timeout_s
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=token_timeout_s)
        self._max_connections = max_connections
        self._session: Optional[aiohttp.ClientSession] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def _http(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            # A ClientSession is bound to the event loop it was made on.
            connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0, ttl_dns_cache=None)
            self._session = aiohttp.ClientSession(
                self.base_url, connector=connector, timeout=self._timeout, auto_decompress=False,
                json_serialize=json.dumps,
            )
            self._loop = loop
        return self._session

    async def aclose(self) -> None:
        """Close the connection pool of the current event loop."""
        if self._session is not None and not self._session.closed and self._loop is asyncio.get_running_loop():
            await self._session.close()
        self._session = None

    def _failed(self, what: str, exc: BaseException) -> TritonError:
        return TritonError(f"{what} to Triton at {self.base_url} failed: {type(exc).__name__}: {exc}")

    async def stop(self, request_id: str, model: str = "tensorrt_llm") -> None:
        """Ask ``model`` to stop the running request ``request_id`` (TensorRT-LLM's ``stop`` input).

        Triton 2.51 does not pass a client disconnect on to the models of an ensemble, so an
        abandoned generation would run to ``max_tokens``; the TensorRT-LLM backend (and our CPU
        reference backend) instead stop a request when a second request with the same request id
        carries ``stop=true`` (model_instance_state.cc handleStopRequest). It answers one empty
        final response, for a known or an unknown id alike.

        Raises:
            InferenceError: Triton rejected the stop request.
            TritonError: the connection failed.
        """
        body = {"id": request_id, "input_lengths": 1, "request_output_len": 1, "stop": True}
        try:
            async with self._http().post(f"/v2/models/{model}/generate_stream", json=body) as response:
                text = (await response.read()).decode("utf-8", "replace")
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise TritonError(
                f"stop request to Triton failed: {type(exc).__name__}: {exc}"
            ) from None
        if response.status != 200 or '"error"' in text:
            raise InferenceError(f"Triton refused to stop request {request_id}: HTTP {response.status} {text[:300]}")

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Yield the chunks of one generation as Triton streams them.

        Raises:
            InferenceError: Triton rejected the request (HTTP status with its error text), sent
                an error event, answered something that is not an event stream, or sent no event
                within ``token_timeout_s`` seconds.
            TritonError: the connection failed or broke off (the caller checks whether Triton
                died and raises TritonDiedError then).
        """
        url = f"/v2/models/{self.model}/generate_stream"
        try:
            async with self._http().post(url, json=request.to_json(), headers={"Accept": "text/event-stream"}) as response:
                if response.status != 200:
                    body = (await response.read()).decode("utf-8", "replace")
                    raise InferenceError(f"Triton answered HTTP {response.status}: {_error_message(body)}")
                content_type = response.headers.get("Content-Type", "")
                if not content_type.startswith("text/event-stream"):
                    raise InferenceError(
                        f"Triton's response is not an event stream (Content-Type {content_type!r})"
                    )
                data: list[str] = []
                async for raw in response.content:  # one line at a time, with its line break
                    line = raw.decode("utf-8").rstrip("\r\n")
                    if line:
                        if line.startswith("data:"):
                            data.append(line[6:] if line.startswith("data: ") else line[5:])
                        continue  # comments (":"), and fields Triton does not send
                    if data:  # a blank line ends an event
                        payload = data[0] if len(data) == 1 else "\n".join(data)
                        data = []
                        if payload:  # an event with empty data carries nothing
                            yield parse_event(payload)
                if data and any(data):
                    yield parse_event("\n".join(data))
        except asyncio.TimeoutError:
            raise InferenceError(
                f"no token from Triton for {self.token_timeout_s:g} s (COG_TRITON_REQUEST_TIMEOUT_S)"
            ) from None
        except aiohttp.ClientError as exc:
            raise self._failed("connection", exc) from None
