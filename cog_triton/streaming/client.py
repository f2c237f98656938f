"""Async client for the ensemble's decoupled stream, over Triton's gRPC ``ModelStreamInfer``.

Request: the ensemble's inputs as tensors, shape [1, 1] for scalars, names of TensorRT-LLM 1.1.0's
inflight_batcher_llm ensemble (max_tokens, min_tokens, temperature, top_k, top_p,
repetition_penalty, presence_penalty, frequency_penalty, seed, stream, guided_decoding_guide_type,
guided_decoding_guide) plus ``input_ids`` INT32 [1, n], the prompt tokenized by the predictor (see
triton_model_repo/ensemble). Each response is one response of the decoupled ``tensorrt_llm``:
``output_ids`` INT32 [1, 1, k] (the new tokens; k = 0 in the last response of a request that ended
on the end token, which the engine does not return) and ``sequence_length`` INT32 [1, 1] = k. The
request asks for ``triton_enable_empty_final_response``, so every response carries
``triton_final_response``, and the last one says true (server src/grpc/stream_infer_handler.cc).

LoRA (TensorRT-LLM 1.1.0's inflight_batcher_llm ``ensemble`` and ``tensorrt_llm`` config.pbtxt, which the
ensemble passes through): ``lora_task_id`` UINT64 [1, 1]; with the adapter's weights, also
``lora_weights`` [1, rows, width] in the model's dtype (FP16, BF16, or FP32 for the CPU reference model)
and ``lora_config`` INT32 [1, rows, 3] (module id, layer, rank per row), as made by
:mod:`cog_triton.streaming.lora.convert`. The backend caches a task's weights, so later requests send only the id.
The PyTorch-backend model (triton_model_repo/tensorrt_llm_pytorch) takes the adapter's PEFT folder instead:
``lora_path`` BYTES [1, 1] with the ``lora_task_id`` (the LLM API loads folders, ``LoRARequest``, and caches an
adapter under its id), sent with every request of the adapter.

Images (the PyTorch-backend model only): a request with ``text_input`` goes to the ``tensorrt_llm`` model itself,
not the ensemble (:data:`IMAGE_MODEL`). TensorRT-LLM 1.2.1's LLM API takes images only with the prompt as text,
which the model's input processor tokenizes and expands (triton_model_repo/tensorrt_llm_pytorch/1/translate.py has
the sources), so the ensemble's ``preprocessing`` step has nothing to do for it. Such a request carries that model's
own tensor names (``request_output_len``, ``runtime_top_k``, ``streaming``, ... as the ensemble maps them, and
``end_id`` / ``pad_id``, which ``preprocessing`` would have filled in), ``input_lengths`` 0 (no ids),
``text_input`` BYTES [1, 1] and ``image_bytes`` BYTES [1, n] (one encoded image file each), and asks for
``prompt_tokens`` and ``image_tokens`` beside the ids: every response of it carries the prompt's length as the LLM
made it and how many of those tokens the images fill (:func:`parse_image_response`, :class:`CountedChunk`). A text
request is built and read exactly as before.

Why gRPC and not the HTTP generate extension. Measured on this machine (scripts/benchmark,
token-rate stand-in engine, 128 streams through Cog): with HTTP ``generate_stream``, 107–215 of
256 predictions ended early, the text an exact prefix of what the engine sent, while the engine had
sent all 256 tokens and the HTTP response ended cleanly after about 240 events. Triton's HTTP
frontend hands each response to its event thread with ``evthr_defer`` and ignores its result
(src/http_server.cc, ``GenerateRequestClass::InferResponseComplete``; libevhtp's ``evthr_defer``
returns an error instead of queueing when its command socket is full); a dropped chunk callback
leaves its buffer queued, and the final callback sends one buffer and ends the response, so the
last responses of a request are lost when the event thread falls behind. The stream carries no
end marker, so a client cannot tell. Over gRPC every response is queued on the stream in order and
the final one is marked, so a stream that ends without it is an error, never a shorter answer.

CPU per streamed token of the client (this process) and of tritonserver was also measured, 32
streams x 500 responses from a Triton Python model, Triton 2.51 (µs per event, two runs):
httpx + httpx-sse 56, 58 (server 60, 73); aiohttp with SSE framing 20, 28 (server 43, 58);
tritonclient.grpc.aio ``stream_infer`` 41, 48 (server 76, 79). gRPC costs more per token on both
sides, but it is the transport that delivers every token. Among gRPC clients (32 streams x 256
responses paced at 10 ms from a grpc.aio server, client CPU µs per response, two runs): one
grpc.aio call per request, as here, 84, 79; one multiplexed grpc.aio call for all requests with a
reader task dispatching by id 127, 143; the synchronous API with a thread per request 155, 159.
Responses are read straight from the protobuf (no ``InferResult``/numpy per token).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from dataclasses import dataclass
from typing import AsyncIterator, Optional

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from common.errors import InferenceError, TritonError

log = logging.getLogger(__name__)

_INT32 = struct.Struct("<i")

#: Most bytes one request may carry (LoRA weights travel with the first request of an adapter; gRPC's own
#: ceiling is 2 GiB). Triton's gRPC server accepts messages up to INT32_MAX bytes.
MAX_REQUEST_BYTES = 1 << 30

#: The model an image request goes to directly (see the module docstring).
IMAGE_MODEL = "tensorrt_llm"
#: The outputs an image request asks for.
IMAGE_OUTPUTS = ("output_ids", "sequence_length", "prompt_tokens", "image_tokens")

#: gRPC channel options. Triton is local, so reconnecting is cheap: gRPC's default reconnect backoff
#: (1 s, growing to 120 s, during which every call fails at once with UNAVAILABLE) is cut to 0.1-1 s.
#: After a restart of Triton the channel is replaced outright (:meth:`TritonClient.reset`), and each
#: channel has its own subchannel pool: by default gRPC shares subchannels between channels to the
#: same address, so a new channel would inherit the old one's backoff.
CHANNEL_OPTIONS = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", MAX_REQUEST_BYTES),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


@dataclass(frozen=True, eq=False)
class LoraTensors:
    """An adapter's ``lora_weights`` and ``lora_config`` as raw little-endian bytes (see the module docstring).

    Attributes:
        datatype: the protocol dtype of ``weights``: "FP16", "BF16" or "FP32".
        rows: module-layer rows; width: values per row (the widest row; shorter ones are zero-padded).
        weights: rows x width values. config: rows x 3 INT32 values.
    """

    datatype: str
    rows: int
    width: int
    weights: bytes
    config: bytes

    @property
    def nbytes(self) -> int:
        """Bytes the two tensors add to a request."""
        return len(self.weights) + len(self.config)


@dataclass(frozen=True)
class GenerateRequest:
    """One generation request to the ensemble. Token counts are in tokens.

    ``input_ids`` is the prompt (INT32 token ids). ``temperature`` 0 or ``top_k`` 1 means greedy
    decoding; ``top_k`` 0 means no top-k filter. Stop sequences are not sent: the predictor matches
    them on the text (the engine would match stop words over prompt and output tokens together,
    cpp/tensorrt_llm/kernels/stopCriteriaKernels.cu ``stopWordsCriterion``) and stops the request by id.
    ``guide_type``/``guide``: TensorRT-LLM guided decoding (json, json_schema, regex, ebnf_grammar).
    ``lora_task_id``: the adapter's task (None: the base model); ``lora``: its tensors, sent when the
    backend may not hold the task (see :mod:`cog_triton.streaming.lora.tasks`); ``lora_path``: its folder instead, for the
    PyTorch-backend model. ``stream_interval_ms``: the PyTorch-backend model's own input (its responses joined per
    interval, the first at once); None: not sent (the C++ backend's models have no such input).
    ``text_input``: an image request's prompt as text (``input_ids`` then empty), with ``image_bytes`` (encoded image
    files) and the ``end_id`` / ``pad_id`` the ensemble's preprocessing would fill in: sent to :data:`IMAGE_MODEL`
    (see the module docstring).
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
    length_penalty: Optional[float] = None
    seed: Optional[int] = 0  # None: not sent (a sampler that takes no seed)
    stream: bool = True
    request_id: str = ""
    guide_type: str = ""
    guide: str = ""
    lora_task_id: Optional[int] = None
    lora: Optional[LoraTensors] = None
    lora_path: Optional[str] = None
    stream_interval_ms: Optional[int] = None
    text_input: Optional[str] = None
    image_bytes: tuple[bytes, ...] = ()
    end_id: Optional[int] = None
    pad_id: Optional[int] = None

    def to_grpc(self, model: str) -> service_pb2.ModelInferRequest:
        """The ``ModelInferRequest`` for ``model``; optional tensors are left out when unused. An image request
        (``text_input``) is for :data:`IMAGE_MODEL`, whatever ``model`` says (:meth:`image_request`)."""
        if self.text_input is not None:
            return self.image_request()
        request = service_pb2.ModelInferRequest(model_name=model, id=self.request_id)
        _add(request, "input_ids", "INT32", [1, len(self.input_ids)], struct.pack(f"<{len(self.input_ids)}i", *self.input_ids))
        _add(request, "max_tokens", "INT32", [1, 1], _INT32.pack(self.max_tokens))
        _add(request, "temperature", "FP32", [1, 1], struct.pack("<f", self.temperature))
        _add(request, "top_k", "INT32", [1, 1], _INT32.pack(self.top_k))
        _add(request, "top_p", "FP32", [1, 1], struct.pack("<f", self.top_p))
        _add(request, "repetition_penalty", "FP32", [1, 1], struct.pack("<f", self.repetition_penalty))
        _add(request, "presence_penalty", "FP32", [1, 1], struct.pack("<f", self.presence_penalty))
        _add(request, "frequency_penalty", "FP32", [1, 1], struct.pack("<f", self.frequency_penalty))
        if self.seed is not None:
            _add(request, "seed", "UINT64", [1, 1], struct.pack("<Q", self.seed))
        _add(request, "stream", "BOOL", [1, 1], b"\x01" if self.stream else b"\x00")
        if self.min_tokens:
            _add(request, "min_tokens", "INT32", [1, 1], _INT32.pack(self.min_tokens))
        if self.stream_interval_ms is not None:
            _add(request, "stream_interval_ms", "INT32", [1, 1], _INT32.pack(self.stream_interval_ms))
        if self.length_penalty is not None:  # the ensemble maps it to tensorrt_llm's len_penalty (beam search only)
            _add(request, "length_penalty", "FP32", [1, 1], struct.pack("<f", self.length_penalty))
        if self.guide_type:
            _add(request, "guided_decoding_guide_type", "BYTES", [1, 1], _bytes_tensor(self.guide_type))
            if self.guide:  # "json" takes no guide (utils.cc getGuidedDecodingParamsFromTensors)
                _add(request, "guided_decoding_guide", "BYTES", [1, 1], _bytes_tensor(self.guide))
        if self.lora_task_id is not None:  # utils.cc getLoraConfigFromTensors reads the three only with an id
            _add(request, "lora_task_id", "UINT64", [1, 1], struct.pack("<Q", self.lora_task_id))
            if self.lora_path is not None:
                _add(request, "lora_path", "BYTES", [1, 1], _bytes_tensor(self.lora_path))
            elif self.lora is not None:
                lora = self.lora
                _add(request, "lora_weights", lora.datatype, [1, lora.rows, lora.width], lora.weights)
                _add(request, "lora_config", "INT32", [1, lora.rows, 3], lora.config)
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        return request

    def image_request(self) -> service_pb2.ModelInferRequest:
        """The ``ModelInferRequest`` of an image request, in :data:`IMAGE_MODEL`'s own tensor names (the ensemble's
        maps: triton_model_repo/ensemble/config.pbtxt), asking for :data:`IMAGE_OUTPUTS`.

        Raises:
            ValueError: no ``text_input``, no image, or no ``end_id``.
        """
        if self.text_input is None or not self.image_bytes or self.end_id is None:
            raise ValueError("an image request needs text_input, image_bytes and end_id")
        request = service_pb2.ModelInferRequest(model_name=IMAGE_MODEL, id=self.request_id)
        _add(request, "input_lengths", "INT32", [1, 1], _INT32.pack(0))
        _add(request, "request_output_len", "INT32", [1, 1], _INT32.pack(self.max_tokens))
        _add(request, "end_id", "INT32", [1, 1], _INT32.pack(self.end_id))
        _add(request, "pad_id", "INT32", [1, 1], _INT32.pack(self.end_id if self.pad_id is None else self.pad_id))
        _add(request, "temperature", "FP32", [1, 1], struct.pack("<f", self.temperature))
        _add(request, "runtime_top_k", "INT32", [1, 1], _INT32.pack(self.top_k))
        _add(request, "runtime_top_p", "FP32", [1, 1], struct.pack("<f", self.top_p))
        _add(request, "repetition_penalty", "FP32", [1, 1], struct.pack("<f", self.repetition_penalty))
        _add(request, "presence_penalty", "FP32", [1, 1], struct.pack("<f", self.presence_penalty))
        _add(request, "frequency_penalty", "FP32", [1, 1], struct.pack("<f", self.frequency_penalty))
        if self.seed is not None:
            _add(request, "seed", "UINT64", [1, 1], struct.pack("<Q", self.seed))
        _add(request, "streaming", "BOOL", [1, 1], b"\x01" if self.stream else b"\x00")
        if self.min_tokens:
            _add(request, "min_tokens", "INT32", [1, 1], _INT32.pack(self.min_tokens))
        if self.stream_interval_ms is not None:
            _add(request, "stream_interval_ms", "INT32", [1, 1], _INT32.pack(self.stream_interval_ms))
        if self.length_penalty is not None:
            _add(request, "len_penalty", "FP32", [1, 1], struct.pack("<f", self.length_penalty))
        if self.guide_type:
            _add(request, "guided_decoding_guide_type", "BYTES", [1, 1], _bytes_tensor(self.guide_type))
            if self.guide:
                _add(request, "guided_decoding_guide", "BYTES", [1, 1], _bytes_tensor(self.guide))
        if self.lora_task_id is not None:
            _add(request, "lora_task_id", "UINT64", [1, 1], struct.pack("<Q", self.lora_task_id))
            if self.lora_path is not None:
                _add(request, "lora_path", "BYTES", [1, 1], _bytes_tensor(self.lora_path))
        _add(request, "text_input", "BYTES", [1, 1], _bytes_tensor(self.text_input))
        _add(request, "image_bytes", "BYTES", [1, len(self.image_bytes)],
             b"".join(_INT32.pack(len(data)) + data for data in self.image_bytes))
        for name in IMAGE_OUTPUTS:
            request.outputs.add().name = name
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        return request


def _add(request: service_pb2.ModelInferRequest, name: str, datatype: str, shape: list[int], raw: bytes) -> None:
    tensor = request.inputs.add()
    tensor.name = name
    tensor.datatype = datatype
    tensor.shape.extend(shape)
    request.raw_input_contents.append(raw)


def _bytes_tensor(text: str) -> bytes:
    """One BYTES element as Triton's raw format: a 4-byte little-endian length, then the bytes."""
    data = text.encode("utf-8")
    return _INT32.pack(len(data)) + data


@dataclass(frozen=True)
class GenerateChunk:
    """One streamed response: the new token ids (INT32 values; empty in an end-token final)."""

    output_ids: list[int]


@dataclass(frozen=True)
class CountedChunk(GenerateChunk):
    """A response of an image request: the new ids, and the prompt's tokens as the LLM made them and how many of
    those the images fill (``prompt_tokens``, ``image_tokens``; tokens)."""

    prompt_tokens: int = 0
    image_tokens: int = 0


def parse_image_response(response: service_pb2.ModelInferResponse) -> tuple[GenerateChunk, bool]:
    """:func:`parse_response` of an image request's response: a :class:`CountedChunk` when it carries the counts
    (the empty final response carries none).

    Raises:
        InferenceError: see :func:`parse_response`; or a count that is not one INT32 value.
    """
    chunk, final = parse_response(response)
    names = [output.name for output in response.outputs]
    if "prompt_tokens" not in names or "image_tokens" not in names:
        return chunk, final
    counts = []
    for name in ("prompt_tokens", "image_tokens"):
        raw = response.raw_output_contents[names.index(name)]
        if len(raw) != 4:
            raise InferenceError(f"Triton sent {name} of {len(raw)} bytes, not one INT32 value")
        counts.append(_INT32.unpack(raw)[0])
    return CountedChunk(chunk.output_ids, prompt_tokens=counts[0], image_tokens=counts[1]), final


def parse_response(response: service_pb2.ModelInferResponse) -> tuple[GenerateChunk, bool]:
    """The chunk in one streamed response, and whether it is the request's final response.

    ``output_ids`` is cut to ``sequence_length`` (the backend pads beams with -1,
    model_instance_state.cc fillTritonResponse). A response with no new tokens is valid: the C++
    backend sends it last when a streamed request ends on the end token (llmRequest.cpp
    createResult; tests/test_conformance.py); an empty final response (no tensors) too.

    Raises:
        InferenceError: a response with tensors but no ``output_ids`` (an ensemble that returns only
            text, as upstream's does, cannot serve the predictor), or malformed tensors.
    """
    final = response.parameters["triton_final_response"].bool_param
    names = [output.name for output in response.outputs]
    if not names:
        return GenerateChunk([]), final  # the empty final response
    try:
        raw = response.raw_output_contents[names.index("output_ids")]
    except (ValueError, IndexError):
        raise InferenceError(
            f"Triton sent a response without output_ids (outputs: {', '.join(names)}); the ensemble must return "
            "the tensorrt_llm model's output_ids (upstream's ensemble returns only text_output)"
        ) from None
    if len(raw) % 4:
        raise InferenceError(f"Triton sent output_ids of {len(raw)} bytes, not INT32 values")
    ids = [_INT32.unpack(raw)[0]] if len(raw) == 4 else list(memoryview(raw).cast("i"))
    if "sequence_length" in names:
        length = response.raw_output_contents[names.index("sequence_length")]
        if len(length) >= 4:
            ids = ids[: max(0, _INT32.unpack_from(length)[0])]
    return GenerateChunk(ids), final


class TritonClient:
    """Streams generations from a Triton model over gRPC (one channel per event loop).

    Args:
        address: Triton's gRPC endpoint, ``host:port``.
        model: the model to call (``ensemble_ids``, the ids ensemble; see triton_model_repo/ensemble_ids).
        token_timeout_s: longest wait for the next response, seconds (enforced by the caller's
            supervisor, see :attr:`token_timeout_s`; nothing per token here).
        connect_timeout_s: how long a request waits for the connection, seconds.
    """

    def __init__(
        self,
        address: str,
        *,
        model: str = "ensemble_ids",
        token_timeout_s: float = 120.0,
        connect_timeout_s: float = 5.0,
    ) -> None:
        self.address = address
        self.model = model
        self.token_timeout_s = token_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._channel: Optional[grpc.aio.Channel] = None
        self._stub: Optional[service_pb2_grpc.GRPCInferenceServiceStub] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._stale = False
        self._closing: set[asyncio.Task[None]] = set()

    def reset(self) -> None:
        """Use a new channel from the next call on (from any thread): Triton was restarted, and the old
        channel may sit in gRPC's reconnect backoff, failing calls at once. Running calls keep theirs."""
        self._stale = True

    def _grpc(self) -> service_pb2_grpc.GRPCInferenceServiceStub:
        loop = asyncio.get_running_loop()
        if self._stub is None or self._loop is not loop or self._stale:
            old = self._channel
            if old is not None and self._loop is loop:
                task = loop.create_task(old.close(grace=None))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
            self._stale = False
            # A grpc.aio channel is bound to the event loop it was made on.
            self._channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
            self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
            self._loop = loop
        return self._stub

    async def aclose(self) -> None:
        """Close the channel of the current event loop."""
        if self._channel is not None and self._loop is asyncio.get_running_loop():
            await self._channel.close()
        self._channel = self._stub = None

    def _failed(self, exc: grpc.aio.AioRpcError) -> TritonError:
        return TritonError(f"connection to Triton at {self.address} failed: {exc.code().name}: {exc.details()}")

    async def _stream(self, request: service_pb2.ModelInferRequest) -> AsyncIterator[service_pb2.ModelInferResponse]:
        """The responses of one request on its own bidirectional stream, up to its final one."""
        done = asyncio.Event()

        async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
            yield request
            await done.wait()  # keep the stream open until the final response

        call = self._grpc().ModelStreamInfer(requests())
        try:
            async for message in call:
                if message.error_message:
                    raise InferenceError(f"Triton reported: {message.error_message}")
                yield message.infer_response
                if message.infer_response.parameters["triton_final_response"].bool_param:
                    return
        finally:
            done.set()
            call.cancel()  # after the final response this only releases the stream

    async def send_stop_request(self, request_id: str, model: str = "tensorrt_llm") -> None:
        """Ask ``model`` to stop the running request ``request_id`` (TensorRT-LLM's ``stop`` input).

        Cancelling the ensemble's gRPC stream cancels the ensemble request, and Triton's ensemble
        scheduler passes that on to a composing model's request only when it schedules that step
        (triton-inference-server/core src/ensemble_scheduler/ensemble_scheduler.cc ``ScheduleSteps``,
        core PR #263; server issue #6739: the step already running did not see the cancellation, the
        next one did). ``tensorrt_llm`` is scheduled right after ``preprocessing``, so a generation
        already running is not told and would run to ``max_tokens``. This stop request is what
        ends it: the TensorRT-LLM backend (and our CPU reference backend) stop a request when a
        second request with the same request id carries ``stop=true`` (model_instance_state.cc
        handleStopRequest). It answers one empty final response, for a known or an unknown id alike.

        Raises:
            InferenceError: Triton rejected the stop request.
            TritonError: the connection failed.
        """
        request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
        _add(request, "input_lengths", "INT32", [1, 1], _INT32.pack(1))
        _add(request, "request_output_len", "INT32", [1, 1], _INT32.pack(1))
        _add(request, "stop", "BOOL", [1, 1], b"\x01")
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        try:
            async with asyncio.timeout(self.connect_timeout_s + 5.0):
                async for _ in self._stream(request):
                    pass
        except InferenceError as exc:
            raise InferenceError(f"Triton refused to stop request {request_id}: {exc.message}") from None
        except grpc.aio.AioRpcError as exc:
            raise TritonError(f"stop request to Triton failed: {exc.code().name}: {exc.details()}") from None
        except TimeoutError:
            raise TritonError(f"stop request to Triton got no answer in {self.connect_timeout_s + 5.0:g} s") from None

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Yield the chunks of one generation as Triton streams them, up to the final response.

        Raises:
            InferenceError: Triton rejected the request or reported an error on the stream.
            TritonError: the connection failed, broke off, or ended without the final response
                (the caller checks whether Triton died and raises TritonDiedError then).
        """
        parse = parse_response if request.text_input is None else parse_image_response
        try:
            async for response in self._stream(request.to_grpc(self.model)):
                chunk, final = parse(response)
                yield chunk
                if final:
                    return
        except grpc.aio.AioRpcError as exc:
            raise self._failed(exc) from None
        raise TritonError(f"Triton's stream at {self.address} ended without the final response")
