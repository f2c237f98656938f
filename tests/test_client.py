"""Tests of cog_triton.streaming.client against a real gRPC server that speaks Triton's ModelStreamInfer.

The server (grpc.aio, tritonclient's generated service definition) plays Triton's side of the
stream: a scenario per test decides what it sends for each request. Triton itself is exercised by
the integration tests; here every edge of the protocol can be produced on purpose.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterator, Optional

import grpc
import pytest
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from common.errors import InferenceError, TritonError
from cog_triton.streaming.client import GenerateChunk, GenerateRequest, LoraTensors, TritonClient, parse_response
from cog_triton.settings import REPO_ROOT
from tensorrtllm_backend.templates import fill_template, parse_model_config

I32 = struct.Struct("<i")


def response(ids: Optional[list[int]], final: bool = False, request_id: str = "", length: Optional[int] = None,
             names: tuple[str, ...] = ("output_ids", "sequence_length")) -> service_pb2.ModelStreamInferResponse:
    """A streamed response as Triton's gRPC frontend sends it (outputs as raw little-endian INT32)."""
    message = service_pb2.ModelStreamInferResponse()
    infer = message.infer_response
    infer.model_name = "ensemble_ids"
    infer.id = request_id
    if ids is not None:
        for name in names:
            out = infer.outputs.add()
            out.name = name
            out.datatype = "INT32"
            if name == "output_ids":
                out.shape.extend([1, 1, len(ids)])
                infer.raw_output_contents.append(struct.pack(f"<{len(ids)}i", *ids))
            else:
                out.shape.extend([1, 1])
                infer.raw_output_contents.append(I32.pack(len(ids) if length is None else length))
    infer.parameters["triton_final_response"].bool_param = final
    return message


def error(text: str) -> service_pb2.ModelStreamInferResponse:
    return service_pb2.ModelStreamInferResponse(error_message=text)


Scenario = Callable[[service_pb2.ModelInferRequest], AsyncIterator[service_pb2.ModelStreamInferResponse]]


@dataclass
class State:
    scenario: Optional[Scenario] = None
    requests: list[service_pb2.ModelInferRequest] = field(default_factory=list)
    abort: Optional[grpc.StatusCode] = None
    end_call_after_scenario: bool = False  # close the stream (OK status) once the scenario is done


class FakeTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, state: State) -> None:
        self.state = state

    async def ModelStreamInfer(self, request_iterator, context):  # noqa: N802 - gRPC naming
        async for request in request_iterator:
            self.state.requests.append(request)
            if self.state.abort is not None:
                await context.abort(self.state.abort, "the server went away")
            assert self.state.scenario is not None
            async for message in self.state.scenario(request):
                yield message
            if self.state.end_call_after_scenario:
                return


@dataclass
class Running:
    address: str
    state: State


@pytest.fixture
def triton() -> Iterator[Running]:
    """A gRPC server on a free port, in its own thread and event loop."""
    state = State()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def serve() -> None:
        server = grpc.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(FakeTriton(state), server)
        holder["port"] = server.add_insecure_port("127.0.0.1:0")
        holder["shutdown"] = asyncio.Event()
        await server.start()
        ready.set()
        await holder["shutdown"].wait()
        await server.stop(None)

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield Running(address=f"127.0.0.1:{holder['port']}", state=state)
    finally:
        loop.call_soon_threadsafe(holder["shutdown"].set)
        thread.join(timeout=10)


def collect(client: TritonClient, request: GenerateRequest) -> tuple[list[GenerateChunk], Optional[BaseException]]:
    """Run one generation; return the chunks received and the exception that ended it (if any)."""

    async def main() -> tuple[list[GenerateChunk], Optional[BaseException]]:
        chunks: list[GenerateChunk] = []
        failure: Optional[BaseException] = None
        try:
            async for chunk in client.generate_stream(request):
                chunks.append(chunk)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            failure = exc
        finally:
            await client.aclose()
        return chunks, failure

    return asyncio.run(main())


REQUEST = GenerateRequest(input_ids=[9, 8, 7], max_tokens=3, seed=7, request_id="cog-triton-1")


def tokens(*steps: list[int], end_final: bool = False) -> Scenario:
    async def scenario(request):
        for i, ids in enumerate(steps):
            yield response(ids, final=(i == len(steps) - 1 and not end_final), request_id=request.id)
        if end_final:
            yield response([], final=True, request_id=request.id)  # [1,1,0]: ended on the end token

    return scenario


# --- the request -------------------------------------------------------------------------------------


def tensor(request: service_pb2.ModelInferRequest, name: str) -> tuple[str, list[int], bytes]:
    names = [t.name for t in request.inputs]
    t = request.inputs[names.index(name)]
    return t.datatype, list(t.shape), request.raw_input_contents[names.index(name)]


# How each ensemble datatype's raw little-endian bytes decode (Triton's raw_input_contents).
DECODE = {"INT32": "i", "FP32": "f", "UINT64": "Q", "BOOL": "?"}


def sent_tensors(request: service_pb2.ModelInferRequest) -> dict[str, tuple[str, list[int], list[Any]]]:
    """Every input of ``request`` as name -> (datatype, shape, decoded values)."""
    out = {}
    for t, raw in zip(request.inputs, request.raw_input_contents, strict=True):
        fmt = DECODE[t.datatype]
        out[t.name] = (t.datatype, list(t.shape), list(struct.unpack(f"<{len(raw) // struct.calcsize(fmt)}{fmt}", raw)))
    return out


def ensemble_config() -> model_config_pb2.ModelConfig:
    text = (REPO_ROOT / "triton_model_repo" / "ensemble_ids" / "config.pbtxt").read_text()
    values = {"triton_max_batch_size": 8, "lora_weights_datatype": "TYPE_FP16"}
    return parse_model_config(fill_template(text, values, source="ensemble_ids"), source="ensemble_ids")


def test_the_request_carries_the_ensembles_tensors(triton: Running) -> None:
    """Every tensor sent, with its datatype, shape and value; each sampling value differs from the others
    and from its default, so a swapped, dropped or mistyped tensor (presence for frequency, top_k as FP32)
    fails."""
    triton.state.scenario = tokens([1])
    request = GenerateRequest(
        input_ids=[5, 6, 7], max_tokens=8, min_tokens=3, temperature=0.5, top_k=7, top_p=0.25,
        repetition_penalty=1.25, presence_penalty=0.75, frequency_penalty=-0.5, seed=2**40, request_id="abc",
    )
    collect(TritonClient(triton.address), request)
    [sent] = triton.state.requests
    assert sent.model_name == "ensemble_ids" and sent.id == "abc"
    assert sent_tensors(sent) == {
        "input_ids": ("INT32", [1, 3], [5, 6, 7]),
        "max_tokens": ("INT32", [1, 1], [8]),
        "min_tokens": ("INT32", [1, 1], [3]),
        "temperature": ("FP32", [1, 1], [0.5]),
        "top_k": ("INT32", [1, 1], [7]),
        "top_p": ("FP32", [1, 1], [0.25]),
        "repetition_penalty": ("FP32", [1, 1], [1.25]),
        "presence_penalty": ("FP32", [1, 1], [0.75]),
        "frequency_penalty": ("FP32", [1, 1], [-0.5]),
        "seed": ("UINT64", [1, 1], [2**40]),
        "stream": ("BOOL", [1, 1], [True]),
    }  # no stop_words: matched by the predictor, on the text
    assert sent.parameters["triton_enable_empty_final_response"].bool_param
    defaults = sent_tensors(GenerateRequest(input_ids=[1], max_tokens=1).to_grpc("ensemble_ids"))
    assert {name: value for name, (_, _, value) in defaults.items() if name not in ("input_ids", "max_tokens")} == {
        "temperature": [1.0], "top_k": [0], "top_p": [1.0], "repetition_penalty": [1.0], "presence_penalty": [0.0],
        "frequency_penalty": [0.0], "seed": [0], "stream": [True],
    }  # fmt: skip  (the neutral values: no penalty, no top-k/top-p filter)


def test_each_tensor_sent_is_an_ensemble_input_of_its_type_wired_to_the_engine_input_of_its_meaning() -> None:
    """The names and datatypes the client sends are the ensemble's (triton_model_repo/ensemble/config.pbtxt),
    and the ensemble hands each sampling input to the tensorrt_llm input of the same meaning (inputs of
    triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt in TensorRT-LLM)."""
    ensemble = ensemble_config()
    declared = {t.name: t for t in ensemble.input}
    request = GenerateRequest(input_ids=[1, 2], max_tokens=3, min_tokens=1, length_penalty=2.0, guide_type="regex",
                              guide="a+", lora_task_id=4).to_grpc("ensemble_ids")
    for t in request.inputs:
        assert t.name in declared, t.name
        want = model_config_pb2.DataType.Name(declared[t.name].data_type).removeprefix("TYPE_")
        assert t.datatype == ("BYTES" if want == "STRING" else want), t.name
        dims = list(declared[t.name].dims)
        assert len(t.shape) == 1 + len(dims) and t.shape[0] == 1, t.name  # [batch, *dims]
        assert all(d in (-1, n) for d, n in zip(dims, t.shape[1:])), t.name
    (engine,) = [s for s in ensemble.ensemble_scheduling.step if s.model_name == "tensorrt_llm"]
    assert {key: engine.input_map[key] for key in (
        "runtime_top_k", "runtime_top_p", "temperature", "repetition_penalty", "presence_penalty",
        "frequency_penalty", "len_penalty", "min_tokens", "seed", "streaming")} == {
        "runtime_top_k": "top_k", "runtime_top_p": "top_p", "temperature": "temperature",
        "repetition_penalty": "repetition_penalty", "presence_penalty": "presence_penalty",
        "frequency_penalty": "frequency_penalty", "len_penalty": "length_penalty", "min_tokens": "min_tokens",
        "seed": "seed", "streaming": "stream",
    }  # fmt: skip


def test_unused_optional_tensors_are_left_out_and_guides_are_bytes_tensors() -> None:
    plain = GenerateRequest(input_ids=[1], max_tokens=4).to_grpc("ensemble_ids")
    names = {t.name for t in plain.inputs}
    assert "min_tokens" not in names and "guided_decoding_guide" not in names and plain.id == ""
    guided = GenerateRequest(input_ids=[1], max_tokens=4, guide_type="json_schema", guide='{"a": "é"}').to_grpc("e")
    datatype, shape, raw = tensor(guided, "guided_decoding_guide")
    assert (datatype, shape) == ("BYTES", [1, 1])
    assert raw == I32.pack(len('{"a": "é"}'.encode())) + '{"a": "é"}'.encode()  # Triton's length-prefixed BYTES
    assert tensor(guided, "guided_decoding_guide_type")[2] == I32.pack(11) + b"json_schema"


def test_an_adapter_folder_goes_as_lora_path_beside_its_task_id() -> None:
    """The PyTorch-backend model's adapter input: lora_path, a length-prefixed BYTES [1, 1] next to lora_task_id,
    instead of the converted tensors; an input of the ensemble rendered for that model, mapped to tensorrt_llm."""
    from tensorrtllm_backend.templates import forward_model_inputs

    request = GenerateRequest(input_ids=[1], max_tokens=2, lora_task_id=9, lora_path="/cache/adapters/é",
                              lora=LoraTensors("FP32", 1, 1, b"\0" * 4, b"\0" * 12)).to_grpc("ensemble_ids")
    names = [t.name for t in request.inputs]
    assert "lora_weights" not in names and "lora_config" not in names
    assert tensor(request, "lora_path") == ("BYTES", [1, 1], I32.pack(len("/cache/adapters/é".encode()))
                                            + "/cache/adapters/é".encode())
    assert tensor(request, "lora_task_id")[2] == struct.pack("<Q", 9)
    ensemble = ensemble_config()
    llm = model_config_pb2.ModelConfig()
    llm.input.add(name="lora_path", data_type=model_config_pb2.TYPE_STRING)
    forward_model_inputs(ensemble, llm)
    declared = {t.name: t for t in ensemble.input}
    assert model_config_pb2.DataType.Name(declared["lora_path"].data_type) == "TYPE_STRING"
    (engine,) = [s for s in ensemble.ensemble_scheduling.step if s.model_name == "tensorrt_llm"]
    assert engine.input_map["lora_path"] == "lora_path"
    without = GenerateRequest(input_ids=[1], max_tokens=2, lora_path="/x").to_grpc("ensemble_ids")
    assert "lora_path" not in {t.name for t in without.inputs}  # only with a task id, as the tensors


# --- responses ---------------------------------------------------------------------------------------


def test_a_stream_of_tokens_up_to_the_final_response(triton: Running) -> None:
    triton.state.scenario = tokens([100], [101, 102], [103])
    chunks, failure = collect(TritonClient(triton.address), REQUEST)
    assert failure is None
    assert [c.output_ids for c in chunks] == [[100], [101, 102], [103]]


def test_the_end_token_final_is_an_empty_chunk(triton: Running) -> None:
    """The C++ backend never returns the end token: a request that ends on it gets a last response
    with output_ids [1,1,0] (llmRequest.cpp createResult; tests/test_conformance.py)."""
    triton.state.scenario = tokens([100], [101], end_final=True)
    chunks, failure = collect(TritonClient(triton.address), REQUEST)
    assert failure is None and [c.output_ids for c in chunks] == [[100], [101], []]


def test_output_ids_are_cut_to_sequence_length() -> None:
    chunk, final = parse_response(response([5, 6, -1, -1], final=True, length=2).infer_response)
    assert chunk.output_ids == [5, 6] and final
    empty, final = parse_response(service_pb2.ModelInferResponse())  # an empty final response: no tensors
    assert empty.output_ids == [] and not final


def test_a_response_without_output_ids_is_an_error_not_an_empty_chunk() -> None:
    """Upstream's ensemble returns only text_output: the predictor must not take that for success."""
    message = response([1], names=("text_output",)).infer_response
    with pytest.raises(InferenceError) as info:
        parse_response(message)
    assert "without output_ids" in str(info.value) and "text_output" in str(info.value)


def test_an_error_on_the_stream_is_reported_with_its_text(triton: Running) -> None:
    async def scenario(request):
        yield response([100], request_id=request.id)
        yield error("in ensemble 'ensemble', Encountered an error in forward function: out of memory")

    triton.state.scenario = scenario
    chunks, failure = collect(TritonClient(triton.address), REQUEST)
    assert [c.output_ids for c in chunks] == [[100]]
    assert isinstance(failure, InferenceError)
    assert failure.message == "Triton reported: in ensemble 'ensemble', Encountered an error in forward function: out of memory"


def test_a_stream_that_ends_without_its_final_response_is_an_error_not_a_shorter_answer(triton: Running) -> None:
    """Over HTTP a cut stream looked like a complete one (see the module docstring of the client)."""

    async def scenario(request):
        yield response([100], request_id=request.id)
        yield response([101], request_id=request.id)  # and then the server closes the call

    triton.state.scenario = scenario
    triton.state.end_call_after_scenario = True
    chunks, failure = collect(TritonClient(triton.address), REQUEST)
    assert [c.output_ids for c in chunks] == [[100], [101]]
    assert type(failure) is TritonError and "ended without the final response" in failure.message


def test_the_server_going_away_mid_stream_is_a_connection_failure(triton: Running) -> None:
    triton.state.abort = grpc.StatusCode.UNAVAILABLE
    triton.state.scenario = tokens([1])
    _, failure = collect(TritonClient(triton.address), REQUEST)
    assert type(failure) is TritonError
    assert failure.message.startswith(f"connection to Triton at {triton.address} failed: UNAVAILABLE")


def test_connection_refused() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        _, failure = collect(TritonClient(f"127.0.0.1:{port}"), REQUEST)
    assert type(failure) is TritonError
    assert f"connection to Triton at 127.0.0.1:{port} failed: UNAVAILABLE" in failure.message


def test_the_client_survives_a_new_event_loop(triton: Running) -> None:
    triton.state.scenario = tokens([100])
    client = TritonClient(triton.address)

    async def once(close: bool) -> list[GenerateChunk]:
        chunks = [chunk async for chunk in client.generate_stream(REQUEST)]
        if close:
            await client.aclose()
        return chunks

    # Two asyncio.run calls: the channel of the first (closed) loop is not reused.
    assert asyncio.run(once(close=False)) == [GenerateChunk([100])]
    assert asyncio.run(once(close=True)) == [GenerateChunk([100])]
    assert len(triton.state.requests) == 2


def test_stop_sends_tensorrt_llms_stop_request(triton: Running) -> None:
    async def scenario(request):
        yield service_pb2.ModelStreamInferResponse(
            infer_response=service_pb2.ModelInferResponse(id=request.id, parameters={
                "triton_final_response": service_pb2.InferParameter(bool_param=True)}))

    triton.state.scenario = scenario
    client = TritonClient(triton.address)

    async def run() -> None:
        try:
            await client.send_stop_request("cog-triton-42")
        finally:
            await client.aclose()

    asyncio.run(run())
    [sent] = triton.state.requests
    assert sent.model_name == "tensorrt_llm" and sent.id == "cog-triton-42"
    assert tensor(sent, "stop") == ("BOOL", [1, 1], b"\x01")
    assert {t.name for t in sent.inputs} == {"stop", "input_lengths", "request_output_len"}


def test_stop_refused_and_stop_against_a_closed_port(triton: Running) -> None:
    async def refuse(request):
        yield error("Trying to stop a request but request ID is not provided")

    triton.state.scenario = refuse
    client = TritonClient(triton.address)

    async def run(c: TritonClient) -> None:
        try:
            await c.send_stop_request("x")
        finally:
            await c.aclose()

    with pytest.raises(InferenceError, match="refused to stop request x"):
        asyncio.run(run(client))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(TritonError, match="stop request to Triton failed"):
        asyncio.run(run(TritonClient(f"127.0.0.1:{port}", connect_timeout_s=1.0)))


def test_length_penalty_is_sent_as_the_ensemble_input_that_maps_to_len_penalty() -> None:
    """replicate/cog-triton sends length_penalty to its ensemble; ours maps the ensemble input
    length_penalty to tensorrt_llm's len_penalty (triton_model_repo/ensemble/config.pbtxt)."""
    request = GenerateRequest(input_ids=[1, 2], max_tokens=3, length_penalty=2.5).to_grpc("ensemble_ids")
    names = [tensor.name for tensor in request.inputs]
    index = names.index("length_penalty")
    assert request.inputs[index].datatype == "FP32" and list(request.inputs[index].shape) == [1, 1]
    assert struct.unpack("<f", request.raw_input_contents[index]) == (2.5,)
    assert "length_penalty" not in [t.name for t in GenerateRequest(input_ids=[1], max_tokens=1).to_grpc("e").inputs]
    ensemble = (REPO_ROOT / "triton_model_repo" / "ensemble_ids" / "config.pbtxt").read_text()
    assert 'input_map { key: "len_penalty" value: "length_penalty" }' in ensemble


# ------------------------------------------------------------------------------------------------ image requests
def pytorch_model_config() -> model_config_pb2.ModelConfig:
    text = (REPO_ROOT / "triton_model_repo" / "tensorrt_llm_pytorch" / "config.pbtxt").read_text()
    values = {"triton_max_batch_size": 8, "lora_weights_datatype": "TYPE_FP16", "decoupled_mode": True,
              "max_queue_delay_microseconds": 0, "exclude_input_in_output": True, "cancellation_check_period_ms": "",
              "guided_decoding_backend": "", "images": True, "unanswered_stop_timeout_ms": "", "max_adapters_per_llm": "",
              "adapter_snapshot_dir": ""}
    return parse_model_config(fill_template(text, values, source="tensorrt_llm"), source="tensorrt_llm")


IMAGE = GenerateRequest(input_ids=[], max_tokens=8, min_tokens=2, temperature=0.5, top_k=7, top_p=0.25,
                        repetition_penalty=1.25, presence_penalty=0.75, frequency_penalty=-0.5, seed=9,
                        length_penalty=1.5, request_id="img", text_input="<start_of_image>What is it?",
                        image_bytes=(b"\x89PNG-a", b"JFIF-bb"), end_id=2, pad_id=3, stream_interval_ms=20,
                        guide_type="regex", guide="a+")


def test_an_image_request_goes_to_the_model_itself_in_its_tensor_names() -> None:
    """Each sampling value reaches the tensorrt_llm input the ensemble maps the text request's to; the prompt is
    text_input, the files image_bytes (Triton's length-prefixed BYTES), input_lengths 0, and end_id / pad_id are
    sent (preprocessing fills them for a text request)."""
    request = IMAGE.to_grpc("ensemble_ids")
    assert request.model_name == "tensorrt_llm" and request.id == "img"
    assert [o.name for o in request.outputs] == ["output_ids", "sequence_length", "prompt_tokens", "image_tokens"]
    declared = {t.name: t for t in pytorch_model_config().input}
    for t in request.inputs:
        assert t.name in declared, t.name
        want = model_config_pb2.DataType.Name(declared[t.name].data_type).removeprefix("TYPE_")
        assert t.datatype == ("BYTES" if want == "STRING" else want), t.name
    numbers = {name: value for name, value in (
        (t.name, sent) for t in request.inputs if t.datatype != "BYTES"
        for sent in [sent_tensors_of(request)[t.name]])}
    text = GenerateRequest(input_ids=[1], max_tokens=8, min_tokens=2, temperature=0.5, top_k=7, top_p=0.25,
                           repetition_penalty=1.25, presence_penalty=0.75, frequency_penalty=-0.5, seed=9,
                           length_penalty=1.5, stream_interval_ms=20).to_grpc("ensemble_ids")
    (engine,) = [s for s in ensemble_config().ensemble_scheduling.step if s.model_name == "tensorrt_llm"]
    mapped = {engine.input_map[name]: name for name in engine.input_map}
    for ensemble_name, value in sent_tensors_of(text).items():
        if ensemble_name in ("input_ids", "max_tokens"):
            continue
        assert numbers[mapped.get(ensemble_name, ensemble_name)] == value, ensemble_name
    assert numbers["request_output_len"][2] == [8] and numbers["input_lengths"][2] == [0]
    assert numbers["end_id"][2] == [2] and numbers["pad_id"][2] == [3]
    assert tensor(request, "text_input") == ("BYTES", [1, 1], I32.pack(27) + b"<start_of_image>What is it?")
    assert tensor(request, "image_bytes") == ("BYTES", [1, 2], I32.pack(6) + b"\x89PNG-a" + I32.pack(7) + b"JFIF-bb")
    assert "input_ids" not in {t.name for t in request.inputs}


def sent_tensors_of(request: service_pb2.ModelInferRequest) -> dict[str, tuple[str, list[int], list[Any]]]:
    return {name: value for name, value in (
        (t.name, (t.datatype, list(t.shape), list(struct.unpack(
            f"<{len(raw) // struct.calcsize(DECODE[t.datatype])}{DECODE[t.datatype]}", raw))))
        for t, raw in zip(request.inputs, request.raw_input_contents, strict=True) if t.datatype != "BYTES")}


def test_a_text_request_asks_for_no_outputs_and_keeps_the_ensemble() -> None:
    request = GenerateRequest(input_ids=[1], max_tokens=2).to_grpc("ensemble_ids")
    assert request.model_name == "ensemble_ids" and list(request.outputs) == []
    assert {"text_input", "image_bytes", "end_id", "pad_id"}.isdisjoint(t.name for t in request.inputs)


def test_an_image_request_needs_its_parts() -> None:
    for missing in ({"image_bytes": ()}, {"end_id": None}):
        fields = {"image_bytes": (b"i",), "end_id": 2, **missing}
        with pytest.raises(ValueError, match="an image request needs text_input, image_bytes and end_id"):
            GenerateRequest(input_ids=[], max_tokens=1, text_input="x", **fields).to_grpc("ensemble_ids")


def counted(ids: list[int], prompt: int, image: int, final: bool = False) -> service_pb2.ModelStreamInferResponse:
    message = response(ids, final=final)
    for name, value in (("prompt_tokens", prompt), ("image_tokens", image)):
        out = message.infer_response.outputs.add()
        out.name, out.datatype = name, "INT32"
        out.shape.extend([1, 1])
        message.infer_response.raw_output_contents.append(I32.pack(value))
    return message


def test_an_image_requests_stream_carries_the_counts(triton: Running) -> None:
    async def scenario(request):
        yield counted([5, 6], 40, 8)
        yield counted([7], 40, 8, final=True)

    triton.state.scenario = scenario
    chunks, failure = collect(TritonClient(triton.address), IMAGE)
    assert failure is None
    assert [(c.output_ids, c.prompt_tokens, c.image_tokens) for c in chunks] == [([5, 6], 40, 8), ([7], 40, 8)]
    (sent,) = triton.state.requests
    assert sent.model_name == "tensorrt_llm"


def test_counts_are_read_only_for_image_requests() -> None:
    from cog_triton.streaming.client import CountedChunk, parse_image_response

    chunk, final = parse_response(counted([5], 40, 8).infer_response)
    assert type(chunk) is GenerateChunk  # a text request's parse reads ids only
    chunk, final = parse_image_response(counted([5], 40, 8, final=True).infer_response)
    assert isinstance(chunk, CountedChunk) and (chunk.prompt_tokens, chunk.image_tokens, final) == (40, 8, True)
    empty, final = parse_image_response(response(None, final=True).infer_response)
    assert type(empty) is GenerateChunk and empty.output_ids == [] and final
    bad = counted([5], 40, 8).infer_response
    bad.raw_output_contents[2] = b"\x00\x00"
    with pytest.raises(InferenceError, match="prompt_tokens of 2 bytes"):
        parse_image_response(bad)
