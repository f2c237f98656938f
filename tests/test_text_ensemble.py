"""The text ``ensemble`` (triton_model_repo/ensemble): upstream's clients work against the image's Triton unchanged.

The request shapes are those TensorRT-LLM 1.2.1's client scripts build (NVIDIA/TensorRT-LLM
triton_backend/inflight_batcher_llm/client/end_to_end_grpc_client.py @2a9abd95, ``prepare_inputs``: every tensor
[1, 1] or [1, n], ``text_input`` BYTES, ``max_tokens`` INT32, ``stream``/``exclude_input_in_output`` BOOL,
``beam_width`` INT32, ``temperature`` FP32, ``stop_words``/``bad_words`` BYTES [1, n]; requests always over the gRPC
stream, ``stream`` false for a non-streaming answer; batched inputs as one request of [b, ...] tensors, its answers
told apart by ``batch_index``), and the HTTP generate forms of the backend's docs. They are written here from that
interface, not copied. Each text must equal what the predictor makes of the same greedy request: the ids of
``ensemble_ids`` (the predictor's model) for the same prompt ids, detokenized by the predictor's detokenizer.

The integration tests run once per backend (:data:`BACKENDS`), each in a real Triton rendered by the renderer: the
CPU reference model as ``tensorrt_llm`` (the C++ backend's tensors), and the PyTorch-backend model over the LLM API's
stand-in (benchmarks/llmapi_standin: the one mock, since TensorRT-LLM cannot run here; it generates with the real
checkpoint through transformers). Both answer the same contract; where the PyTorch backend refuses an input the C++
backend serves (``bad_words`` under its default sampler, ``beam_width`` > 1), the test checks the refusal names it.
"""

from __future__ import annotations

import json
import queue
import socket
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tensorrtllm_backend.engine import inspect_weights
from tensorrtllm_backend.templates import (
    TEXT_ENSEMBLE_LLM_INPUTS,
    RenderOptions,
    cut_text_ensemble_inputs,
    render_model_repository,
)
from tests.test_templates import TEMPLATE_DIR, checkpoint_info, engine_info, options

ROOT = Path(__file__).resolve().parents[1]
MODEL_FILE = ROOT / "triton_model_repo" / "ensemble" / "1" / "model.py"

#: TensorRT-LLM 1.2.1's ensemble inputs (name -> Triton dtype, dims without the batch dimension), from
#: triton_backend/all_models/inflight_batcher_llm/ensemble/config.pbtxt @2a9abd95, for those this image serves.
UPSTREAM_INPUTS = {
    "text_input": ("TYPE_STRING", [1]), "max_tokens": ("TYPE_INT32", [1]), "num_return_sequences": ("TYPE_INT32", [1]),
    "bad_words": ("TYPE_STRING", [-1]), "stop_words": ("TYPE_STRING", [-1]),
    "exclude_input_in_output": ("TYPE_BOOL", [1]), "end_id": ("TYPE_INT32", [1]), "pad_id": ("TYPE_INT32", [1]),
    "top_k": ("TYPE_INT32", [1]), "top_p": ("TYPE_FP32", [1]), "temperature": ("TYPE_FP32", [1]),
    "length_penalty": ("TYPE_FP32", [1]), "repetition_penalty": ("TYPE_FP32", [1]), "min_tokens": ("TYPE_INT32", [1]),
    "presence_penalty": ("TYPE_FP32", [1]), "frequency_penalty": ("TYPE_FP32", [1]), "seed": ("TYPE_UINT64", [1]),
    "return_log_probs": ("TYPE_BOOL", [1]), "beam_width": ("TYPE_INT32", [1]), "stream": ("TYPE_BOOL", [1]),
    "lora_task_id": ("TYPE_UINT64", [1]), "lora_weights": ("TYPE_FP32", [-1, -1]),
    "lora_config": ("TYPE_INT32", [-1, 3]),
    "guided_decoding_guide_type": ("TYPE_STRING", [1]), "guided_decoding_guide": ("TYPE_STRING", [1]),
}
UPSTREAM_OUTPUTS = {"text_output": ("TYPE_STRING", [-1]), "cum_log_probs": ("TYPE_FP32", [-1]),
                    "output_log_probs": ("TYPE_FP32", [-1, -1]), "batch_index": ("TYPE_INT32", [1]),
                    "sequence_index": ("TYPE_INT32", [1])}


def load_model_module():
    """The model's module, loaded outside Triton (pb_utils None); its hiding of torch (a None in sys.modules, meant
    for its own stub) is undone for this process."""
    import importlib.util  # noqa: PLC0415
    import sys  # noqa: PLC0415

    had_torch = "torch" in sys.modules
    spec = importlib.util.spec_from_file_location("text_ensemble_model", MODEL_FILE)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    finally:
        if not had_torch and sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return module


# ------------------------------------------------------------------------------------------------
# Fast: the contract as rendered, and the incremental decoding
# ------------------------------------------------------------------------------------------------

def _dtype_name(value: int) -> str:
    from tritonclient.grpc import model_config_pb2  # noqa: PLC0415

    return model_config_pb2.DataType.Name(value)


def test_the_engine_render_has_upstreams_tensors(tmp_path: Path) -> None:
    rendered = render_model_repository(options(tmp_path), engine_info(tmp_path))
    ensemble = rendered["ensemble"]
    assert ensemble.backend == "python" and ensemble.model_transaction_policy.decoupled
    inputs = {t.name: (_dtype_name(t.data_type), list(t.dims)) for t in ensemble.input}
    outputs = {t.name: (_dtype_name(t.data_type), list(t.dims)) for t in ensemble.output}
    lora = inputs.pop("lora_weights")
    assert lora[1] == [-1, -1]
    assert inputs == {k: v for k, v in UPSTREAM_INPUTS.items() if k != "lora_weights"}
    assert outputs == UPSTREAM_OUTPUTS
    required = {t.name for t in ensemble.input if not t.optional}
    assert required == {"text_input", "max_tokens"}  # as upstream
    llm_inputs = {t.name for t in rendered["tensorrt_llm"].input}
    assert set(TEXT_ENSEMBLE_LLM_INPUTS.values()) <= llm_inputs  # every input it forwards, the C++ model takes


def test_the_reference_render_refuses_what_its_model_does_not_take(tmp_path: Path) -> None:
    rendered = render_model_repository(options(tmp_path), checkpoint_info(tmp_path))
    names = {t.name for t in rendered["ensemble"].input}
    assert "num_return_sequences" not in names and "beam_width" in names
    llm_inputs = {t.name for t in rendered["tensorrt_llm"].input}
    assert {TEXT_ENSEMBLE_LLM_INPUTS[n] for n in names if n in TEXT_ENSEMBLE_LLM_INPUTS} <= llm_inputs
    pytorch = render_model_repository(options(tmp_path / "p", llm_args={"model": "/w"}), checkpoint_info(tmp_path))
    py_names = {t.name for t in pytorch["ensemble"].input}
    assert "num_return_sequences" not in py_names
    assert {TEXT_ENSEMBLE_LLM_INPUTS[n] for n in py_names if n in TEXT_ENSEMBLE_LLM_INPUTS} <= {
        t.name for t in pytorch["tensorrt_llm"].input}


def test_cut_inputs_names_what_it_removed(tmp_path: Path) -> None:
    rendered = render_model_repository(options(tmp_path), engine_info(tmp_path))
    llm = rendered["tensorrt_llm"]
    kept = [t for t in llm.input if t.name not in ("num_return_sequences", "seed")]
    del llm.input[:]
    llm.input.extend(kept)
    assert sorted(cut_text_ensemble_inputs(rendered["ensemble"], llm)) == ["num_return_sequences", "seed"]


def test_the_setting_leaves_the_text_ensemble_out(tmp_path: Path) -> None:
    rendered = render_model_repository(options(tmp_path, text_ensemble=False), engine_info(tmp_path))
    assert set(rendered) == {"tensorrt_llm", "preprocessing", "ensemble_ids"}
    assert not (tmp_path / "model_repository" / "ensemble").exists()


def test_the_model_forwards_what_the_renderer_checks() -> None:
    assert load_model_module().LLM_INPUTS == TEXT_ENSEMBLE_LLM_INPUTS


def test_engine_errors_name_the_inputs_as_the_client_sent_them() -> None:
    module = load_model_module()
    said = "bad_words_list cannot be applied here: leave it out; runtime_top_k and bad_words_list"
    assert module._client_names(said) == (f"{said} (tensorrt_llm's bad_words_list is this request's bad_words; "
                                          "tensorrt_llm's runtime_top_k is this request's top_k)")
    assert module._client_names("temperature is -1; streaming") == "temperature is -1; streaming"  # same names
    assert set(module.CLIENT_NAMES.values()) <= set(UPSTREAM_INPUTS)


@pytest.mark.parametrize("text", ["Hello, world! Héllo wörld.", "日本語のテキスト 🤖🎉 end",
                                  "  two  spaces\n\nnew lines"])
def test_incremental_text_is_one_decode_and_never_half_a_character(hf_tokenizer, text: str) -> None:
    ids = hf_tokenizer.encode(text, add_special_tokens=False)
    incremental = load_model_module().IncrementalText(hf_tokenizer)
    deltas = [incremental.push([i]) for i in ids]
    rest = incremental.finish()
    assert "".join(deltas) + rest == hf_tokenizer.decode(ids, skip_special_tokens=True) == text
    assert not any("\ufffd" in d for d in deltas)
    per_token = [hf_tokenizer.decode([i]) for i in ids]  # what upstream's postprocessing emits while streaming
    if "🤖" in text:
        assert any("\ufffd" in t for t in per_token)  # the byte-level BPE splits the emoji: the case is exercised


# ------------------------------------------------------------------------------------------------
# Integration: upstream's request shapes against a real Triton
# ------------------------------------------------------------------------------------------------

PROMPT = "The capital of France is"
CHAT = ("<|im_start|>user\nAnswer with one word: is water wet?<|im_end|>\n<|im_start|>assistant\n")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


#: The two ``tensorrt_llm`` models the text ensemble runs over: the CPU reference model (the C++ backend's tensors and
#: behaviour) and the PyTorch-backend model over TensorRT-LLM 1.2.1's LLM API (its stand-in, benchmarks/llmapi_standin,
#: the one mock: it runs the real SmolLM2 with transformers on the CPU), each rendered by the renderer.
BACKENDS = ("reference", "pytorch")


@pytest.fixture(scope="module", params=BACKENDS)
def triton(request, tmp_path_factory, checkpoint_dir):
    """One Triton per backend for the module: the rendered repository (``ensemble``, ``ensemble_ids``,
    ``preprocessing``, ``tensorrt_llm``). The PyTorch-backend one has guided decoding (xgrammar) in its LLM
    arguments, so the JSON-guide test runs on both; its stub finds the stand-in through the overlay virtualenv
    (tests/llmapi_overlay.py), as tests/test_pytorch_integration.py starts it."""
    from tensorrtllm_backend.server import LaunchConfig, TritonServer, locate_tritonserver  # noqa: PLC0415
    from tests.llmapi_overlay import overlay_venv, render_pytorch_repository, standin_installation  # noqa: PLC0415
    from tests.proc import stop_at_once  # noqa: PLC0415

    backend = request.param
    tmp = tmp_path_factory.mktemp(f"text_ensemble_{backend}")
    installation = locate_tritonserver(work_dir=tmp / "work")
    if backend == "pytorch":
        render_pytorch_repository(tmp / "repo", checkpoint_dir, guided_decoding=True, llm_args={
            "model": str(checkpoint_dir), "max_batch_size": 4, "guided_decoding_backend": "xgrammar"})
        installation = standin_installation(installation, overlay_venv(tmp / "overlay"))
    else:
        render_model_repository(RenderOptions(template_dir=TEMPLATE_DIR, model_repo_dir=tmp / "repo",
                                              triton_max_batch_size=4), inspect_weights(checkpoint_dir))
    http, grpc, metrics = _free_ports(3)
    server = TritonServer(installation,
                          LaunchConfig(model_repo=tmp / "repo", http_port=http, grpc_port=grpc, metrics_port=metrics),
                          log_file=tmp / "triton.log")
    server.start()
    try:
        server.wait_ready(180)
        yield {"backend": backend, "url": server.url, "grpc": f"127.0.0.1:{grpc}"}
    finally:
        stop_at_once(server)


def predictor_text(triton, hf_tokenizer, prompt: str, max_tokens: int, **extra) -> str:
    """What the predictor makes of a greedy request: ``ensemble_ids``'s ids for the prompt's ids, through the
    predictor's incremental detokenizer (cog_triton/streaming/detokenizer.py)."""
    from cog_triton.streaming.detokenizer import IncrementalDetokenizer  # noqa: PLC0415

    ids = hf_tokenizer.encode(prompt)  # as preprocessing tokenizes text_input (add_special_tokens true)
    body = {"input_ids": ids, "max_tokens": max_tokens, "top_k": 1, "stream": True, **extra}
    detok = IncrementalDetokenizer(hf_tokenizer)
    text = []
    with httpx.stream("POST", f"{triton['url']}/v2/models/ensemble_ids/generate_stream", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                assert "error" not in event, event
                ids = np.array(event["output_ids"], dtype=np.int64).reshape(-1)  # a scalar for one id
                text.append(detok.push(ids[: int(np.array(event["sequence_length"]).reshape(-1)[0])].tolist()))
    return "".join(text) + detok.finish()


def upstream_inputs(prompts: list[str], max_tokens: int, streaming: bool, **extra):
    """The tensors upstream's ``prepare_inputs`` builds (batched: one row per prompt), greedy via top_k 1; an
    ``extra`` value None leaves that input out."""
    import tritonclient.grpc as grpcclient  # noqa: PLC0415
    from tritonclient.utils import np_to_triton_dtype  # noqa: PLC0415

    b = len(prompts)
    arrays = {
        "text_input": np.array([[p] for p in prompts], dtype=object),
        "max_tokens": np.full((b, 1), max_tokens, np.int32),
        "stream": np.full((b, 1), streaming, bool),
        "beam_width": np.ones((b, 1), np.int32),
        "temperature": np.ones((b, 1), np.float32),
        "top_k": np.ones((b, 1), np.int32),
        "exclude_input_in_output": np.ones((b, 1), bool),
    }
    for name, value in extra.items():
        if value is None:  # left out
            arrays.pop(name)
            continue
        arrays[name] = value if isinstance(value, np.ndarray) else np.array([value] * b)
    tensors = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def grpc_stream(triton, inputs, outputs=("text_output",), request_id: str = "1", timeout_s: float = 60.0):
    """Send one request as upstream's client does (start_stream, async_stream_infer, stop_stream) and return the
    results (InferResult or the error) in the order they came."""
    import tritonclient.grpc as grpcclient  # noqa: PLC0415

    client = grpcclient.InferenceServerClient(triton["grpc"])
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put(error if error else result),
                        stream_timeout=timeout_s)
    client.async_stream_infer("ensemble", inputs, outputs=[grpcclient.InferRequestedOutput(n) for n in outputs],
                              request_id=request_id)
    client.stop_stream()  # waits for the server to end the stream, as upstream's client
    client.close()
    results = []
    while not got.empty():
        results.append(got.get())
    return results


def texts_by_row(results, streaming: bool) -> dict[int, str]:
    out: dict[int, str] = {}
    for result in results:
        assert not isinstance(result, Exception), result
        row = result.as_numpy("batch_index")
        row = 0 if row is None else int(row[0][0])
        text = result.as_numpy("text_output")[0].decode("utf-8")
        out[row] = out.get(row, "") + text if streaming else text
    return out


pytestmark_integration = pytest.mark.integration


@pytestmark_integration
@pytest.mark.parametrize("streaming", [True, False], ids=["grpc_streaming", "grpc_non_streaming"])
def test_grpc_text_equals_the_predictors(triton, hf_tokenizer, streaming: bool) -> None:
    expected = predictor_text(triton, hf_tokenizer, CHAT, 48)
    results = grpc_stream(triton, upstream_inputs([CHAT], 48, streaming))
    assert texts_by_row(results, streaming) == {0: expected}
    assert len(results) == (1 if not streaming else len(results))
    if streaming:
        assert len(results) > 1 and all(r.as_numpy("text_output")[0] for r in results)


@pytestmark_integration
def test_the_clients_default_request_decodes_greedily(triton, hf_tokenizer) -> None:
    """Upstream's client by default sends temperature 1.0 and neither top_k nor top_p: TensorRT-LLM then decodes
    greedily (top_k 0 with top_p unset is arg-max), on both backends, so the text is the predictor's greedy one."""
    expected = predictor_text(triton, hf_tokenizer, CHAT, 16)
    results = grpc_stream(triton, upstream_inputs([CHAT], 16, True, top_k=None))
    assert texts_by_row(results, True) == {0: expected}


@pytestmark_integration
def test_http_generate_and_generate_stream_equal_the_predictors(triton, hf_tokenizer) -> None:
    expected = predictor_text(triton, hf_tokenizer, PROMPT, 24)
    body = {"text_input": PROMPT, "max_tokens": 24, "top_k": 1, "bad_words": "", "stop_words": ""}
    answer = httpx.post(f"{triton['url']}/v2/models/ensemble/generate", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["text_output"] == expected
    events = []
    with httpx.stream("POST", f"{triton['url']}/v2/models/ensemble/generate_stream", json={**body, "stream": True},
                      timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert all("error" not in e for e in events), events
    assert len(events) > 1 and "".join(e["text_output"] for e in events) == expected


def refusal(results) -> str:
    """The one error a refused request gets (an exception from the stream, nothing before it)."""
    assert len(results) == 1 and isinstance(results[0], Exception), results
    return str(results[0])


@pytestmark_integration
def test_stop_words_as_upstream_sends_them(triton, hf_tokenizer) -> None:
    """``stop_words`` BYTES [1, n] (upstream's client: ``np.array([stop_words], dtype=object)``) end the text at the
    word, with the word, as the predictor's route ends it, on both backends."""
    words = {"stop_words": [".", " Paris"]}
    expected = predictor_text(triton, hf_tokenizer, PROMPT, 24, **words)
    extra = {k: np.array([v], dtype=object) for k, v in words.items()}
    for streaming in (True, False):
        text = texts_by_row(grpc_stream(triton, upstream_inputs([PROMPT], 24, streaming, **extra)), streaming)[0]
        assert text == expected and text.endswith((".", " Paris"))
    plain = predictor_text(triton, hf_tokenizer, PROMPT, 24)
    assert plain.startswith(expected) and len(plain) > len(expected)  # the words cut the answer: they reached it


@pytestmark_integration
def test_bad_words_as_upstream_sends_them(triton, hf_tokenizer) -> None:
    """``bad_words`` BYTES [1, n]: the C++ backend applies them; the PyTorch backend's default sampler (TensorRT-LLM
    1.2.1's TorchSampler) ignores them, so the request is refused by name, at once, as on the predictor's route
    (triton_model_repo/tensorrt_llm_pytorch/1/samplers.py), never answered as if they had been applied."""
    words = {"stop_words": ["."], "bad_words": [" Paris"]}
    extra = {k: np.array([v], dtype=object) for k, v in words.items()}
    results = grpc_stream(triton, upstream_inputs([PROMPT], 24, True, **extra), timeout_s=30)
    plain = predictor_text(triton, hf_tokenizer, PROMPT, 24)
    assert " Paris" in plain
    if triton["backend"] == "pytorch":
        message = refusal(results)
        assert "cannot be applied here" in message and "this request's bad_words" in message, message
        body = {"input_ids": hf_tokenizer.encode(PROMPT), "max_tokens": 24, "top_k": 1, **words}
        ids_route = httpx.post(f"{triton['url']}/v2/models/ensemble_ids/generate", json=body, timeout=30)
        assert ids_route.status_code == 400 and "bad_words" in ids_route.text
        return
    expected = predictor_text(triton, hf_tokenizer, PROMPT, 24, **words)
    text = texts_by_row(results, True)[0]
    assert text == expected and "Paris" not in text
    assert text != plain  # the words changed the answer: they reached the engine


@pytestmark_integration
def test_exclude_input_in_output_false_gives_the_prompt_too(triton, hf_tokenizer) -> None:
    """Not streaming with ``exclude_input_in_output`` false: the engine returns the prompt's ids too, and the text
    is their one decode with the generated ones (upstream's postprocessing decodes the same ids)."""
    expected = predictor_text(triton, hf_tokenizer, PROMPT, 8)
    inputs = upstream_inputs([PROMPT], 8, False, exclude_input_in_output=np.array([[False]]))
    text = texts_by_row(grpc_stream(triton, inputs), False)[0]
    assert text.startswith(PROMPT) and text.endswith(expected)
    prompt_ids = hf_tokenizer.encode(PROMPT)
    assert text == hf_tokenizer.decode(prompt_ids + hf_tokenizer.encode(expected, add_special_tokens=False),
                                       skip_special_tokens=True)


@pytestmark_integration
def test_batched_inputs_answer_per_row_with_batch_index(triton, hf_tokenizer) -> None:
    prompts = [PROMPT, CHAT]
    expected = {i: predictor_text(triton, hf_tokenizer, p, 16) for i, p in enumerate(prompts)}
    for streaming in (True, False):
        results = grpc_stream(triton, upstream_inputs(prompts, 16, streaming), outputs=("text_output", "batch_index"))
        assert texts_by_row(results, streaming) == expected
        if not streaming:
            assert len(results) == 2


@pytestmark_integration
def test_log_probs_come_with_each_text(triton, hf_tokenizer) -> None:
    results = grpc_stream(triton, upstream_inputs([PROMPT], 8, True, return_log_probs=np.array([[True]])),
                          outputs=("text_output", "cum_log_probs", "output_log_probs"))
    assert results and all(r.as_numpy("cum_log_probs") is not None for r in results)
    cums = [float(r.as_numpy("cum_log_probs").reshape(-1)[0]) for r in results]
    assert all(c <= 0 for c in cums) and cums == sorted(cums, reverse=True)


@pytestmark_integration
def test_a_json_guide_gives_a_json_text(triton) -> None:
    extra = {"guided_decoding_guide_type": np.array([["json"]], dtype=object),
             "guided_decoding_guide": np.array([[""]], dtype=object)}
    text = texts_by_row(grpc_stream(triton, upstream_inputs([CHAT], 64, True, **extra)), True)[0]
    json.loads(text)


@pytestmark_integration
@pytest.mark.parametrize("name,array", [
    ("num_return_sequences", np.array([[2]], np.int32)),  # the reference model has no num_return_sequences
    ("decoder_text_input", np.array([["x"]], dtype=object)),  # upstream's, for encoder-decoder engines
])
def test_an_input_not_served_is_refused_by_name(triton, name: str, array) -> None:
    started = time.monotonic()
    results = grpc_stream(triton, upstream_inputs([PROMPT], 8, False, **{name: array}), timeout_s=30)
    assert len(results) == 1 and isinstance(results[0], Exception)
    assert f"unexpected inference input '{name}'" in str(results[0])
    assert time.monotonic() - started < 30  # answered, not timed out


@pytestmark_integration
@pytest.mark.parametrize("triton", ["pytorch"], indirect=True)  # the C++ backend serves beams
@pytest.mark.parametrize("streaming", [True, False], ids=["streaming", "non_streaming"])
def test_beam_search_on_the_pytorch_backend_is_refused_by_name(triton, streaming: bool) -> None:
    """``beam_width`` 2, as upstream's client sends it ([1, 1] INT32): the PyTorch-backend model takes no beam search
    (this image sets no ``max_beam_width``; see triton_model_repo/tensorrt_llm_pytorch/1/parsing.py), and the text
    ensemble passes its error on as the request's one answer, naming the input, instead of waiting."""
    started = time.monotonic()
    inputs = upstream_inputs([PROMPT], 8, streaming, beam_width=np.array([[2]], np.int32))
    message = refusal(grpc_stream(triton, inputs, timeout_s=30))
    assert "beam_width must be 1" in message and "got 2" in message, message
    assert time.monotonic() - started < 30  # answered, not timed out


@pytestmark_integration
def test_the_end_token_response_ends_the_text(triton, hf_tokenizer) -> None:
    """A request that ends on the end token gets a last engine response without ids (output_ids [1, 1, 0]):
    upstream's postprocessing failed on its reshape; here the text ends and the stream is final."""
    expected = predictor_text(triton, hf_tokenizer, CHAT, 200)
    ids = hf_tokenizer.encode(expected, add_special_tokens=False)
    assert len(ids) < 200  # ended on the end token, not on max_tokens
    results = grpc_stream(triton, upstream_inputs([CHAT], 200, True))
    assert texts_by_row(results, True) == {0: expected}
