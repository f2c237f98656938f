"""Conformance of the ``tensorrt_llm`` models with the C++ ``tensorrtllm`` backend's contract.

Two implementations serve ``tensorrt_llm`` besides the C++ backend, and each test runs against both unless
marked otherwise (the ``server`` fixture is parametrized: one real ``tritonserver``, the nvidia-pytriton bundle,
per implementation, over HTTP ``generate_stream`` / ``generate`` and gRPC):

* ``reference``: the CPU reference model (triton_model_repo/tensorrt_llm_reference), which stands in for
  TensorRT-LLM 1.1.0's C++ Triton backend on machines without a GPU;
* ``pytorch``: the PyTorch-backend model (triton_model_repo/tensorrt_llm_pytorch) over TensorRT-LLM 1.2.1's LLM
  API, here its stand-in (benchmarks/llmapi_standin, the one mock: TensorRT-LLM cannot run here; tests/
  test_llmapi_standin.py checks it against the upstream facts), reached by Triton's stub through an overlay
  virtualenv (tests/llmapi_overlay.py).

Where the PyTorch backend differs observably and the model cannot show the C++ behaviour, the test is marked
for one implementation with the reason and the source: the queue limit (5: the C++ executor's ``maxQueueSize``;
``TorchLlmArgs`` has no queue limit, llmapi/llm_args.py @7b437aaa), the executor's maximum input length (8b:
``TrtGptModel``; the PyTorch backend refuses prompts above ``max_num_tokens`` in ``LLM._check_arguments``,
llmapi/llm.py @4c05a748) and the ``max_seq_len`` reduction's warning (the LLM API's ``_deduce_max_tokens``,
executor/base_worker.py @7b437aaa, words it differently). Guided output, LoRA and cancellation run on both:
LoRA adapters reach the reference model as the C++ backend's converted tensors, the PyTorch one as a folder
(``lora_path``), as the predictor sends them to each.
(``/v2/models/<m>/infer`` answers 501 "HTTP end point doesn't support models with decoupled
transaction policy" in Triton 2.51, so non-streaming requests go through ``generate``.)

Sources: "backend" is NVIDIA/TensorRT-LLM ``triton_backend/inflight_batcher_llm/src``
@c8c6df08 (same logic in triton-inference-server/tensorrtllm_backend r25.05); the executor files
are under NVIDIA/TensorRT-LLM ``cpp/tensorrt_llm``.

=== ============================================================ ==================================================
#   behaviour                                                    upstream source
=== ============================================================ ==================================================
1   streaming: each response has only the new tokens,            ``batch_manager/llmRequest.cpp`` ``createResult``
    output_ids [1,1,n], sequence_length [[n]]; the prompt is     (@89fd9b74: ``mMaxSentTokenLen`` starts at the
    never streamed, whatever exclude_input_in_output says        prompt length); backend ``fillTritonResponse``
2   the end token is never returned; a streamed request that     ``kernels/stopCriteriaKernels.cu`` (@9b931c0f) and
    ends on it gets a real FINAL response with output_ids        the sampling kernels do not advance the sequence
    [1,1,0] and sequence_length [[0]]                            length on EOS; ``createResult`` still emits when
                                                                 ``isFinished()``; backend ``WaitForResponse``
3   non-streaming: one FINAL response, output_ids = prompt +     ``llmRequest.cpp`` ``createResult``
    generated (generated only with exclude_input_in_output),
    sequence_length = that count
4   exclude_input_in_output: model parameter default false when  backend ``ModelInstanceState`` constructor;
    absent; the per-request input overrides it                   ``utils.cc`` ``createRequestsFromInputTensors``
5   requests beyond the active slots wait (FIFO); with           ``executor/executorImpl.cpp`` (@b35ac1b6)
    ``default_queue_policy.max_queue_size`` N > 0 one more       ``enqueueRequests`` / ``getLeaderNewReqWithIds``;
    waiting request gets "Maximum queue size of N has been       backend ``getExecutorConfigFromParams``
    reached, please try again later" (active ones don't count)
6   ``stop``: matched by Triton request id; known and unknown    backend ``handleStopRequest``,
    ids get one empty successful FINAL response; no id is an     ``sendEnqueueResponse``; ``executorImpl.cpp``
    error; the stopped request ends with a normal FINAL          ``terminateCancelledRequests``
    (streaming: remaining tokens; non-streaming: so far)
7   stop words match over prompt + output, ending at a new       ``kernels/stopCriteriaKernels.cu``
    token; a word wholly in the prompt never triggers; the       ``stopWordsCriterion`` (@9b931c0f)
    matched tokens stay in output_ids
8   validation: top_p <= 0 is unset; top_p > 1, repetition       ``executor/samplingConfig.cpp`` ``check*``
    penalty <= 0, temperature < 0, top_k < 0, min_tokens < 0,    (@da939094); backend ``utils.cc``
    request_output_len <= 0 are errors; temperature 0 is         ``getSamplingConfigFromTensors``;
    greedy; prompt > max_input_len is an error; prompt +         ``llmRequest.cpp`` ``LlmRequest::validate``
    output > max_seq_len is reduced, not an error; end_id        (@89fd9b74); ``requestImpl.h`` ``validate``
    outside [-1, vocab) is an error, -1 means no end token
8b  the maximum input length is the executor's: max_seq_len-1    ``batch_manager/trtGptModel.h`` ``TrtGptModel``
    with chunked context, else min(max_seq_len-1, max_num_tokens) constructor; plugin flags read by
    with context FMHA + packed input, else max_input_len          ``runtime/gptJsonConfig.cpp`` ``parsePluginConfig``
9a  no end_id means no end token                                 ``batch_manager/createNewDecoderRequests.cpp``
                                                                 (@b35ac1b6: ``mEndId.value_or(-1)``)
9b  neither top_k nor top_p (or top_p <= 0): greedy              ``layers/topKSamplingLayer.cpp`` ``setup``
                                                                 (@03961722), ``defaultDecodingParams.h``
                                                                 (@1020a8d7): k == 0 and p == 0.0 -> k = 1
9c  len_penalty < 0 is an error; beam_width > 1 is rejected      ``samplingConfig.cpp`` ``checkLengthPenalty``;
    (the reference has no beam search)                           (reference limitation)
9d  a client that lists outputs without output_ids gets "output  backend ``fillTritonResponse``
    _ids tensor must be present in list of output tensors"
10  guided decoding: guided_decoding_guide_type must be json,    backend ``utils.cc``
    json_schema, regex or ebnf_grammar exactly, any other value  ``getGuidedDecodingParamsFromTensors``;
    is ignored (unguided, no error); a guide type other than     ``executor/guidedDecodingParams.cpp``;
    json needs a guide; a guided request to a model whose        ``executorImpl.cpp`` ``fetchNewRequests``
    config does not turn guided decoding on fails ("... but      (@b35ac1b6); the guided path itself: see
    GuidedDecoder is not setup ...")                             tests/test_guided.py
11  guided decoding on: each guide type constrains the output    ``batch_manager/guidedDecoder.cpp`` (@000a01de);
                                                                 the LLM API's ``GuidedDecodingParams``
                                                                 (sampling_params.py @b35ac1b6)
12  a LoRA adapter gives transformers + peft's output: the C++   reference model's lora.py; the LLM API's
    tensors to the reference model, its folder (lora_path) to    ``LoRARequest`` (executor/request.py @4ce835a5)
    the PyTorch-backend model
13  Triton's request cancellation stops the generation           backend ``WaitForCancel``; the LLM API's
                                                                 ``RequestOutput.abort()`` (executor/result.py
                                                                 @a678b91a)
14  a sampling input takes effect (penalties, bad words,          ``_torch/pyexecutor/sampler.py`` @00026bd1
    min_tokens, seed) or is refused naming the input, the        (TorchSampler / TRTLLMSampler); _util.py
    sampler and the setting (PyTorch backend, TorchSampler)      ``instantiate_sampler``
15  log-probs are the generated tokens' or refused               sampler.py @00026bd1 (TorchSampler: the arg-max's)
16  a stopped request still waiting for a slot ends              ``executor_request_queue.py`` @007a7508
                                                                 ``update_waiting_queue``; ``executorImpl.cpp``
                                                                 ``terminateCancelledRequests``
17  a known LoRA task id with another adapter                     ``base_worker.py`` @7b437aaa
                                                                 ``_load_lora_adapter``; reference ``lora.py``
18  a bad adapter is that request's error; the next request is   ``base_worker.py`` @7b437aaa ``_enqueue_request``,
    served (the PyTorch-backend model checks every folder        ``worker.py`` @cc4777e9 ``worker_main``;
    first: 1.2.1 would stop its worker)                          reference ``lora.py``
=== ============================================================ ==================================================

What a client sees of a FINAL response through HTTP ``generate_stream`` (measured on Triton 2.51):
a flags-only final (``sender.send(flags=FINAL)``, no response object) produces **no event**; a
real response with output_ids [1,1,0] produces an event ``{"output_ids": [], "sequence_length":
0, ...}``; a real response without tensors (the stop reply) produces an event with only ``id``,
``model_name`` and ``model_version``. Non-streaming ``generate`` accepts exactly one response, so a
token response followed by an empty final is an error there ("generate expects model to produce
exactly 1 response"). Error responses give HTTP 400 whatever their Triton error code.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import string
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
from httpx_sse import connect_sse

from common.http import default_ssl_context
from tests.proc import stop_at_once

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / "triton_model_repo" / "tensorrt_llm_reference"
CHECKPOINT = ROOT / "build" / "default_model" / "checkpoint"
EOS = 2  # SmolLM2's <|im_end|>
VOCAB = 49152
MAX_ACTIVE = 2
MAX_QUEUE = 1
MAX_INPUT_LEN = 200
MAX_SEQ_LEN = 256
#: The queue test's model (reference server only): its running requests ask for QUEUE_ACTIVE_TOKENS tokens, so
#: that none can end while the test runs (minutes of CPU generation) and free a slot the test means to keep busy.
QUEUE_MODEL = "tensorrt_llm_queue"
QUEUE_MAX_SEQ_LEN = 4096
QUEUE_ACTIVE_TOKENS = 3800
#: A second model of the same server stands for an engine built with max_input_len 100 and max_num_tokens
#: 150 (context FMHA and packed input, chunked context off): the executor takes prompts up to 150 tokens.
NUM_TOKENS_MODEL = "tensorrt_llm_num_tokens"
NUM_TOKENS_ENGINE_MAX_INPUT_LEN = 100
MAX_NUM_TOKENS = 150
#: A third model of each server has guided decoding and LoRA on (the first one has both off).
FEATURES_MODEL = "tensorrt_llm_features"
#: A fourth, on the PyTorch-backend server only: the model whose LLM samples with TRTLLMSampler (sampler_type; the first
#: one has 1.2.1's default, TorchSampler). The C++ backend has one sampler, so the reference server has no such model.
SAMPLER_MODEL = "tensorrt_llm_trtllm_sampler"
LORA_MODULES = ["attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_4h_to_h"]
IMPLEMENTATIONS = ("reference", "pytorch")
PYTORCH_DIR = ROOT / "triton_model_repo" / "tensorrt_llm_pytorch"

pytestmark = pytest.mark.integration


# ------------------------------------------------------------------------------------------------
# server and helpers
# ------------------------------------------------------------------------------------------------


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def render_config(name: str = "tensorrt_llm", max_input_len: int = MAX_INPUT_LEN, values: dict | None = None,
                  **extra: object) -> str:
    """The reference template, filled; exclude_input_in_output left out (as the renderer drops an
    empty parameter), a queue limit added where the C++ backend reads it, ``values`` replacing placeholder
    values, and ``extra`` parameters."""
    text = (MODEL_DIR / "config.pbtxt").read_text()
    text = "\n".join(line for line in text.splitlines() if '"exclude_input_in_output" value' not in line)
    filled = dict(
        triton_max_batch_size=MAX_ACTIVE, decoupled_mode="true", max_queue_delay_microseconds=0,
        hf_model_dir=str(CHECKPOINT), max_input_len=max_input_len, max_seq_len=MAX_SEQ_LEN, torch_threads=0,
        guided_decoding_backend="", tokenizer_dir="",  # guided decoding off, as the C++ backend without its config
        lora_weights_datatype="TYPE_FP32", lora_plugin="", max_lora_rank="", lora_target_modules="",
        lora_model_shape="", lora_cache_host_memory_bytes="",  # LoRA off here; tests/test_lora_reference.py has it on
    )
    text = string.Template(text).substitute({**filled, **(values or {})})
    policy = f"  default_queue_policy {{ max_queue_size: {MAX_QUEUE} }}\n"
    text, count = re.subn(r"(dynamic_batching \{\n)", r"\1" + policy, text)
    assert count == 1
    text, count = re.subn(r'^name: "tensorrt_llm"$', f'name: "{name}"', text, flags=re.M)
    assert count == 1
    for key, value in extra.items():
        text += f'\nparameters: {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
    return text


def features_values() -> dict:
    """The reference model with guided decoding (xgrammar, as upstream's Python model is configured) and LoRA on
    (an engine built with max_lora_rank 8 on LORA_MODULES)."""
    from tensorrtllm_backend.engine import inspect_weights
    from tensorrtllm_backend.lora import spec_to_parameters

    info = inspect_weights(CHECKPOINT, reference_lora={"max_lora_rank": 8, "lora_target_modules": LORA_MODULES})
    lora = {key: value.replace("\\", "\\\\").replace('"', '\\"')  # inside pbtxt string literals
            for key, value in spec_to_parameters(info.lora).items()}
    return {"guided_decoding_backend": "xgrammar", "tokenizer_dir": str(CHECKPOINT), "lora_plugin": "float32",
            **lora, "lora_cache_host_memory_bytes": 50_000_000}


def render_pytorch_config(name: str, **values: object) -> str:
    """The PyTorch-backend template, filled as the renderer fills it (``values`` replacing its values),
    exclude_input_in_output left out."""
    text = (PYTORCH_DIR / "config.pbtxt").read_text()
    text = "\n".join(line for line in text.splitlines() if '"exclude_input_in_output" value' not in line)
    text = string.Template(text).substitute({
        **dict(triton_max_batch_size=MAX_ACTIVE, decoupled_mode="true", max_queue_delay_microseconds=0,
               lora_weights_datatype="TYPE_FP32", cancellation_check_period_ms="", guided_decoding_backend="",
               unanswered_stop_timeout_ms="", max_adapters_per_llm="", adapter_snapshot_dir="",
               images="false"),
        **values})
    text, count = re.subn(r'^name: "tensorrt_llm"$', f'name: "{name}"', text, flags=re.M)
    assert count == 1
    return text


def write_model(target: Path, source: Path, config: str, llm_args: dict | None = None) -> None:
    """A model folder: ``source``'s code as the renderer copies it (with the code it shares), the config, and
    llm_args.json for the PyTorch-backend model."""
    from tensorrtllm_backend.templates import copy_model_code

    (target / "1").mkdir(parents=True)
    copy_model_code(source.parent, source.name, target / "1")
    (target / "config.pbtxt").write_text(config)
    if llm_args is not None:
        (target / "1" / "llm_args.json").write_text(json.dumps(llm_args))


@pytest.fixture(scope="module", params=IMPLEMENTATIONS)
def server(request, tmp_path_factory):
    """One tritonserver per implementation (see the module docstring), serving it as ``tensorrt_llm`` (guided
    decoding and LoRA off), ``tensorrt_llm_num_tokens`` (the prompt-limit tests), ``tensorrt_llm_features`` (guided
    decoding and LoRA on), ``tensorrt_llm_queue`` (the waiting-queue tests: a longer max_seq_len) and, on the
    PyTorch-backend server, ``tensorrt_llm_trtllm_sampler`` (TRTLLMSampler)."""
    from tensorrtllm_backend.server import LaunchConfig, TritonServer, locate_tritonserver
    from tests.llmapi_overlay import overlay_venv, standin_installation

    impl = request.param
    tmp = tmp_path_factory.mktemp(f"conformance_{impl}")
    repo = tmp / "repo"
    installation = locate_tritonserver(work_dir=tmp / "work")
    if impl == "reference":
        write_model(repo / "tensorrt_llm", MODEL_DIR, render_config())
        write_model(repo / NUM_TOKENS_MODEL, MODEL_DIR, render_config(
            NUM_TOKENS_MODEL, NUM_TOKENS_ENGINE_MAX_INPUT_LEN, max_num_tokens=MAX_NUM_TOKENS))
        write_model(repo / FEATURES_MODEL, MODEL_DIR, render_config(FEATURES_MODEL, values=features_values()))
        write_model(repo / QUEUE_MODEL, MODEL_DIR, render_config(QUEUE_MODEL, values={"max_seq_len": QUEUE_MAX_SEQ_LEN}))
    else:
        base = {"model": str(CHECKPOINT), "max_batch_size": MAX_ACTIVE, "max_seq_len": MAX_SEQ_LEN}
        write_model(repo / "tensorrt_llm", PYTORCH_DIR, render_pytorch_config("tensorrt_llm"), base)
        write_model(repo / NUM_TOKENS_MODEL, PYTORCH_DIR, render_pytorch_config(NUM_TOKENS_MODEL),
                    {**base, "max_num_tokens": MAX_NUM_TOKENS})
        write_model(repo / FEATURES_MODEL, PYTORCH_DIR, render_pytorch_config(FEATURES_MODEL),
                    {**base, "guided_decoding_backend": "xgrammar", "lora_config": {"max_lora_rank": 8}})
        write_model(repo / QUEUE_MODEL, PYTORCH_DIR, render_pytorch_config(QUEUE_MODEL),
                    {**base, "max_seq_len": QUEUE_MAX_SEQ_LEN})
        write_model(repo / SAMPLER_MODEL, PYTORCH_DIR, render_pytorch_config(SAMPLER_MODEL),
                    {**base, "sampler_type": "TRTLLMSampler"})
        installation = standin_installation(installation, overlay_venv(tmp / "overlay"))
    http, grpc, metrics = _free_ports(3)
    triton = TritonServer(
        installation,
        LaunchConfig(model_repo=repo, http_port=http, grpc_port=grpc, metrics_port=metrics),
        log_file=tmp / "triton.log",
    )
    triton.start()
    try:
        triton.wait_ready(180)
        yield {"impl": impl, "url": triton.url, "grpc": f"127.0.0.1:{grpc}", "log": tmp / "triton.log"}
    finally:
        stop_at_once(triton)


@pytest.fixture(scope="module")
def url(server) -> str:
    return server["url"]


@pytest.fixture(scope="module")
def prompts(hf_tokenizer) -> dict[str, list[int]]:
    texts = {"haiku": "Write a haiku about the sea.", "one_word": "Answer with one word: is water wet?"}
    out = {}
    for key, text in texts.items():
        messages = [{"role": "user", "content": text}]
        enc = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        out[key] = list(enc["input_ids"] if not isinstance(enc, list) else enc)
    return out


@pytest.fixture(scope="module")
def greedy(hf_model, prompts):
    """``greedy(key, n)``: transformers' greedy continuation, ending before the first EOS."""
    cache: dict[str, list[int]] = {}

    def get(key: str, n: int) -> list[int]:
        if key not in cache or len(cache[key]) < n and EOS not in cache[key]:
            ids = torch.tensor([prompts[key]])
            with torch.inference_mode():
                out = hf_model.generate(ids, do_sample=False, max_new_tokens=max(n, 16), pad_token_id=0)
            cache[key] = out[0, ids.shape[1]:].tolist()
        tokens = cache[key]
        return tokens[: tokens.index(EOS)][:n] if EOS in tokens else tokens[:n]

    return get


def greedy_with_eos(greedy_fn, key: str) -> int:
    """Number of greedy tokens before the end token (the prompt must end quickly)."""
    n = len(greedy_fn(key, 16))
    assert n < 16, f"greedy decoding of {key!r} does not end within 16 tokens"
    return n


def _ids(value) -> list[int]:
    """generate_stream gives a one-element tensor as a bare number and an empty one as []."""
    return list(value) if isinstance(value, list) else [value]


def stream(url: str, payload: dict, timeout: float = 120.0, model: str = "tensorrt_llm") -> tuple[int, list[dict]]:
    """POST generate_stream; returns (HTTP status, events)."""
    events = []
    with httpx.Client(timeout=timeout, verify=default_ssl_context()) as client:
        with connect_sse(client, "POST", f"{url}/v2/models/{model}/generate_stream", json=payload) as source:
            status = source.response.status_code
            for sse in source.iter_sse():
                events.append(json.loads(sse.data))
    return status, events


def generate(url: str, payload: dict, timeout: float = 120.0, model: str = "tensorrt_llm") -> tuple[int, dict]:
    """POST generate (exactly one response expected); returns (HTTP status, body)."""
    answer = httpx.post(f"{url}/v2/models/{model}/generate", json=payload, timeout=timeout,
                        verify=default_ssl_context())
    return answer.status_code, answer.json()


def request(ids: list[int], n: int, **extra) -> dict:
    """A generate body: flat lists, shaped by Triton from the config dims. Greedy unless overridden."""
    body = {"input_ids": ids, "input_lengths": [len(ids)], "request_output_len": [n], "runtime_top_k": [1]}
    body.update(extra)
    return {k: v for k, v in body.items() if v is not None}


def stop_request(request_id: str | None) -> dict:
    """TensorRT-LLM's stop signal: only the two inputs Triton requires, plus stop."""
    body = {"input_lengths": [1], "request_output_len": [1], "stop": [True]}
    if request_id is not None:
        body["id"] = request_id
    return body


def error_of(status: int, events_or_body) -> str:
    events = events_or_body if isinstance(events_or_body, list) else [events_or_body]
    assert status == 400 and len(events) == 1 and "error" in events[0], (status, events)
    return events[0]["error"]


class Stream(threading.Thread):
    """A generate_stream request read in the background; ``events`` are (monotonic time, event)."""

    def __init__(self, url: str, payload: dict, model: str = "tensorrt_llm") -> None:
        super().__init__(daemon=True)
        self.url, self.payload, self.model = url, payload, model
        self.events: list[tuple[float, dict]] = []
        self.status: int | None = None
        self.first = threading.Event()
        self.failure: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            with httpx.Client(timeout=120, verify=default_ssl_context()) as client:
                with connect_sse(client, "POST", f"{self.url}/v2/models/{self.model}/generate_stream",
                                 json=self.payload) as source:
                    self.status = source.response.status_code
                    for sse in source.iter_sse():
                        self.events.append((time.monotonic(), json.loads(sse.data)))
                        self.first.set()
        except BaseException as exc:  # noqa: BLE001 - reported by finish()
            self.failure = exc
        finally:
            self.first.set()

    def finish(self, timeout: float = 120) -> list[dict]:
        self.join(timeout)
        assert not self.is_alive(), "the stream did not end"
        assert self.failure is None, self.failure
        return [event for _, event in self.events]

    def tokens(self) -> list[int]:
        return [t for _, e in self.events for t in _ids(e.get("output_ids", []))]


# ------------------------------------------------------------------------------------------------
# 1-4: response shapes
# ------------------------------------------------------------------------------------------------


def test_streaming_sends_only_new_tokens_never_the_prompt(url, prompts, greedy):
    """1. Each streamed response carries only the tokens new since the previous one (output_ids
    [1,1,n], sequence_length [[n]] with n = 1 here, not cumulative), and the prompt is never sent,
    even with exclude_input_in_output false (llmRequest.cpp ``createResult`` @89fd9b74;
    ``mMaxSentTokenLen`` starts at the prompt length)."""
    for exclude in (False, True):
        status, events = stream(url, request(prompts["haiku"], 6, streaming=[True], exclude_input_in_output=[exclude]))
        assert status == 200
        assert len(events) == 6
        assert all(e["sequence_length"] == 1 and len(_ids(e["output_ids"])) == 1 for e in events), events
        assert [t for e in events for t in _ids(e["output_ids"])] == greedy("haiku", 6)


def test_streamed_end_token_ends_with_an_empty_final_response(url, prompts, greedy):
    """2. The end token is never returned. A streamed request that ends on it gets a real FINAL
    response with output_ids [1,1,0] and sequence_length [[0]] (stopCriteriaKernels.cu @9b931c0f and
    the sampling kernels keep the sequence length; ``createResult`` still emits when finished). Through
    generate_stream that is one last event with empty output_ids, where a flags-only final would give
    no event."""
    n = greedy_with_eos(greedy, "one_word")
    status, events = stream(url, request(prompts["one_word"], 16, streaming=[True], end_id=[EOS]))
    assert status == 200 and "error" not in events[-1]
    assert len(events) == n + 1
    assert [_ids(e["output_ids"]) for e in events[:-1]] == [[t] for t in greedy("one_word", n)]
    assert events[-1]["output_ids"] == [] and events[-1]["sequence_length"] == 0


def test_non_streaming_returns_one_response_with_prompt_and_generated(url, prompts, greedy):
    """3. Without streaming, one FINAL response: output_ids = prompt + generated (without the end
    token) and sequence_length = that count (``createResult``: ``maxNbTokens`` minus the prompt only
    when excluded)."""
    prompt = prompts["one_word"]
    n = greedy_with_eos(greedy, "one_word")
    status, body = generate(url, request(prompt, 16, end_id=[EOS], exclude_input_in_output=[False]))
    assert status == 200, body
    assert _ids(body["output_ids"]) == prompt + greedy("one_word", n)
    assert body["sequence_length"] == len(prompt) + n
    status, body = generate(url, request(prompt, 3, exclude_input_in_output=[False]))  # ends by length
    assert status == 200 and _ids(body["output_ids"]) == prompt + greedy("one_word", 3)


def test_exclude_input_in_output_defaults_to_false_and_requests_override_it(server, url, prompts, greedy):
    """4. The model config has no exclude_input_in_output parameter, so the constructor default
    (false) applies; the per-request input overrides it (backend constructor and ``utils.cc``
    ``createRequestsFromInputTensors``: "If specified in request, set from request")."""
    prompt = prompts["haiku"]
    status, body = generate(url, request(prompt, 3))
    assert status == 200 and _ids(body["output_ids"]) == prompt + greedy("haiku", 3)
    assert body["sequence_length"] == len(prompt) + 3
    status, body = generate(url, request(prompt, 3, exclude_input_in_output=[True]))
    assert status == 200 and _ids(body["output_ids"]) == greedy("haiku", 3) and body["sequence_length"] == 3
    assert "exclude_input_in_output is not specified, will be set to false" in server["log"].read_text(errors="replace")


# ------------------------------------------------------------------------------------------------
# 5-6: queue and stop
# ------------------------------------------------------------------------------------------------

# 5 runs against the reference model only: the queue limit is the C++ executor's maxQueueSize
# (executorImpl.cpp enqueueRequests), read from default_queue_policy by the C++ backend; TensorRT-LLM's PyTorch
# backend has no queue limit to configure (TorchLlmArgs has no max_queue_size: llmapi/llm_args.py @7b437aaa),
# and the PyTorch-backend model cannot tell a request waiting inside the LLM from a running one.


def _handed_to_the_model(url: str, model: str) -> int:
    """How many requests Triton has handed to ``model``'s execute() (its statistics' inference_count: a decoupled
    Python model counts a request once execute() returned, i.e. once the reference model queued or ran it)."""
    stats = httpx.get(f"{url}/v2/models/{model}/stats", timeout=30).json()
    return int(stats["model_stats"][0]["inference_count"])


@pytest.mark.parametrize("server", ["reference"], indirect=True)  # the C++ executor's queue: see below
def test_requests_wait_for_a_slot_and_the_queue_limit_rejects_one_more(server, url, prompts, greedy):
    """5. With both active slots busy, a request waits (it is not rejected) and runs when a slot
    frees; with ``default_queue_policy { max_queue_size: 1 }`` a second waiting request gets
    "Maximum queue size of 1 has been reached, please try again later" (executorImpl.cpp @b35ac1b6
    ``enqueueRequests``; only not-yet-scheduled requests count).

    Deterministic: the two active requests ask for 3,800 tokens (a model of max_seq_len 4096), so neither can
    end during the test; the waiting request is sent first and known to be queued (Triton's statistics count it
    as handed to the model) before the second is sent. Whatever happens, every request it started is stopped
    before it returns, so a failure here cannot leave the slots busy for the tests after it."""
    long_ = {"streaming": [True], "end_id": [-1]}
    active: list[Stream] = []
    extra: list[Stream] = []
    try:
        for i in range(MAX_ACTIVE):
            s = Stream(url, {**request(prompts["haiku"], QUEUE_ACTIVE_TOKENS, **long_), "id": f"queue-active-{i}"},
                       QUEUE_MODEL)
            assert s.first.wait(60) and s.events, "an active request produced no token"
            active.append(s)
        handed = _handed_to_the_model(url, QUEUE_MODEL)
        waiting = Stream(url, {**request(prompts["haiku"], 3, **long_), "id": "queue-waiting"}, QUEUE_MODEL)
        extra.append(waiting)
        deadline = time.monotonic() + 60  # only "not hung"
        while _handed_to_the_model(url, QUEUE_MODEL) == handed and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _handed_to_the_model(url, QUEUE_MODEL) == handed + 1, "the waiting request never reached the model"
        rejected = Stream(url, {**request(prompts["haiku"], 3, **long_), "id": "queue-rejected"}, QUEUE_MODEL)
        extra.append(rejected)
        events = rejected.finish(60)
        assert all(s.is_alive() for s in active), "an active request ended: the test needs both slots busy"
        assert rejected.status == 400 and len(events) == 1, (rejected.status, events)
        assert "Maximum queue size of 1 has been reached, please try again later" in events[0]["error"]
        assert not waiting.events, "the waiting request ran while both slots were busy"
        status, _ = stream(url, stop_request("queue-active-0"), model=QUEUE_MODEL)
        assert status == 200
        first_done = active[0].finish()[-1]
        ended_at = active[0].events[-1][0]
        events = waiting.finish()
        assert waiting.status == 200 and "error" not in events[-1]
        assert waiting.tokens() == greedy("haiku", 3)
        assert waiting.events[0][0] > ended_at  # it started only after a slot freed
        assert "error" not in first_done
    finally:
        for s in [*active, *extra]:
            if s.is_alive():
                stream(url, stop_request(s.payload["id"]), model=QUEUE_MODEL)
        for s in [*active, *extra]:
            s.join(60)


def test_stop_by_request_id(url, prompts, greedy):
    """6. ``stop`` true is matched by the Triton request id (backend ``handleStopRequest``): known
    and unknown ids get one empty, successful FINAL response (``sendEnqueueResponse``: a response
    without tensors); no id is an error. The stopped request ends with a normal FINAL response
    (``terminateCancelledRequests``): streaming - the remaining new tokens (none here);
    non-streaming - the prompt and what was generated so far. The stop request itself needs only
    Triton's two required inputs (input_ids is optional upstream)."""
    prompt = prompts["haiku"]
    head = greedy("haiku", 8)
    running = Stream(url, {**request(prompt, 200, streaming=[True], end_id=[-1]), "id": "stop-streaming"})
    deadline = time.monotonic() + 60
    while len(running.events) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    status, events = stream(url, stop_request("stop-streaming"))
    assert status == 200 and events == [{"id": "stop-streaming", "model_name": "tensorrt_llm", "model_version": "1"}]
    events = running.finish()
    assert running.status == 200 and all("error" not in e for e in events)
    tokens = running.tokens()
    assert 2 <= len(tokens) < 200 and tokens[:8] == head[: len(tokens[:8])]
    assert all(e["sequence_length"] == len(_ids(e["output_ids"])) for e in events)
    assert events[-1]["sequence_length"] == 0  # the tokens before the stop were all sent already

    status, events = stream(url, stop_request("no-such-request"))
    assert status == 200 and events == [{"id": "no-such-request", "model_name": "tensorrt_llm", "model_version": "1"}]
    status, events = stream(url, stop_request(None))
    assert "Trying to stop a request but request ID is not provided" in error_of(status, events)

    result: dict = {}
    body = {**request(prompt, 200, end_id=[-1], exclude_input_in_output=[False]), "id": "stop-batch"}
    worker = threading.Thread(target=lambda: result.update(answer=generate(url, body)), daemon=True)
    worker.start()
    time.sleep(1.0)
    status, events = stream(url, stop_request("stop-batch"))
    assert status == 200 and len(events) == 1 and "error" not in events[0]
    worker.join(120)
    status, body = result["answer"]
    assert status == 200, body
    ids = _ids(body["output_ids"])
    generated = ids[len(prompt):]
    assert ids[: len(prompt)] == prompt and len(generated) < 200 and body["sequence_length"] == len(ids)
    assert generated[:8] == head[: len(generated[:8])]


# ------------------------------------------------------------------------------------------------
# 7: stop words
# ------------------------------------------------------------------------------------------------


def _word_list(words: list[list[int]]) -> list[int]:
    """Flat [2, S] TensorRT-LLM word list: token ids, then cumulative end offsets padded with -1."""
    flat = [t for w in words for t in w]
    offsets, total = [], 0
    for w in words:
        total += len(w)
        offsets.append(total)
    return flat + offsets + [-1] * (len(flat) - len(offsets))


def test_stop_words_match_over_prompt_and_output_and_stay_in_the_output(url, prompts, greedy):
    """7. A stop word is compared with prompt + output at each step ending at a new token, so it may
    begin in the prompt but a word wholly inside the prompt cannot trigger; the matched tokens stay
    in output_ids (stopCriteriaKernels.cu ``stopWordsCriterion`` @9b931c0f)."""
    prompt, g = prompts["haiku"], greedy("haiku", 8)
    straddling = [prompt[-1], g[0]]
    words = _word_list([straddling])
    status, body = generate(url, request(prompt, 8, exclude_input_in_output=[True], stop_words_list=words))
    assert status == 200 and _ids(body["output_ids"]) == g[:1]
    in_prompt, later = prompt[-3:-1], g[2:4]
    words = _word_list([in_prompt, later])
    status, body = generate(url, request(prompt, 8, exclude_input_in_output=[True], stop_words_list=words))
    assert status == 200 and _ids(body["output_ids"]) == g[:4] and body["sequence_length"] == 4


# ------------------------------------------------------------------------------------------------
# 8: validation
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, phrase",
    [
        ({"runtime_top_p": [1.5]}, "Assertion failed: topP.value() <= 1.f"),
        ({"repetition_penalty": [0.0]}, "Assertion failed: repetitionpenalty.value() > 0.f"),
        ({"temperature": [-0.5]}, "Assertion failed: temperature.value() >= 0.f"),
        ({"runtime_top_k": [-1]}, "Assertion failed: topK.value() >= 0"),
        ({"min_tokens": [-1]}, "Assertion failed: minTokens.value() >= 0"),
        ({"request_output_len": [0]}, "Assertion failed: mMaxNewTokens > 0"),
        ({"end_id": [VOCAB]}, f"EndId ({VOCAB}) is not within acceptable range [-1, {VOCAB})."),
        ({"end_id": [-2]}, f"EndId (-2) is not within acceptable range [-1, {VOCAB})."),
        ({"len_penalty": [-1.0]}, "Assertion failed: lengthPenalty.value() >= 0.f"),  # 9c
        ({"beam_width": [2]}, "beam_width must be 1"),  # 9c: the reference has no beam search
    ],
)
def test_invalid_values_are_errors_with_upstreams_text(url, prompts, extra, phrase):
    """8. Out-of-range sampling values are errors with the failed assertion of ``SamplingConfig::check*``
    (samplingConfig.cpp @da939094) or ``LlmRequest::validate`` (llmRequest.cpp @89fd9b74); errors are
    one FINAL error response (HTTP 400 through generate_stream)."""
    status, events = stream(url, request(prompts["haiku"], 2, streaming=[True], **extra))
    assert phrase in error_of(status, events)


def test_silently_adjusted_values(url, prompts, greedy):
    """8. What upstream adjusts instead of rejecting: runtime_top_p <= 0 is unset (``utils.cc``
    ``getSamplingConfigFromTensors``), and with top_k 0 that is greedy (9b); temperature 0 is greedy
    (runtime ``SamplingConfig::validate``); end_id -1 means no end token."""
    prompt = prompts["haiku"]
    for extra in ({"runtime_top_p": [0.0]}, {"runtime_top_p": [-1.0], "temperature": [1.3]},
                  {"temperature": [0.0], "runtime_top_k": [0], "runtime_top_p": [0.9], "seed": [5]}):
        body = request(prompt, 4, **{"runtime_top_k": None, "exclude_input_in_output": [True], **extra})
        status, body = generate(url, body)
        assert status == 200 and _ids(body["output_ids"]) == greedy("haiku", 4), extra

    n = greedy_with_eos(greedy, "one_word")
    status, body = generate(url, request(prompts["one_word"], n + 2, exclude_input_in_output=[True], end_id=[-1]))
    assert status == 200 and body["sequence_length"] == n + 2 and _ids(body["output_ids"])[n] == EOS


@pytest.mark.parametrize("server", ["reference"], indirect=True)  # the C++ executor's rule and texts
def test_prompt_and_sequence_limits_of_the_cpp_executor(server, url, hf_tokenizer):
    """8. prompt + request_output_len > max_seq_len reduces request_output_len to max_seq_len - prompt
    (``LlmRequest::validate``, a server warning only); a prompt longer than max_input_len is an error.
    (The PyTorch backend's rules and texts are the LLM API's: the next test.)"""
    long_prompt = (hf_tokenizer.encode("word " * 400) * 2)[:MAX_INPUT_LEN]
    status, body = generate(url, request(long_prompt, 100, exclude_input_in_output=[True], end_id=[-1]))
    assert status == 200 and body["sequence_length"] == MAX_SEQ_LEN - MAX_INPUT_LEN, body
    assert (
        f"exceeds maximum sequence length ({MAX_SEQ_LEN}). Number of requested output tokens is changed to "
        f"({MAX_SEQ_LEN - MAX_INPUT_LEN})." in server["log"].read_text(errors="replace")
    )
    status, body = generate(url, request(long_prompt + [1], 4))
    assert (
        f"Prompt length ({MAX_INPUT_LEN + 1}) exceeds maximum input length ({MAX_INPUT_LEN})" in error_of(status, body)
    )


@pytest.mark.parametrize("server", ["pytorch"], indirect=True)  # the LLM API's rules and texts
def test_prompt_and_sequence_limits_of_the_pytorch_backend(server, url, hf_tokenizer):
    """8 / 8b for the PyTorch backend, whose limits the LLM applies and words (the model passes them on): a
    request_output_len above max_seq_len - prompt is reduced to it with a server warning (executor/base_worker.py
    @7b437aaa ``_deduce_max_tokens``); without chunked prefill a prompt above max_num_tokens is refused
    (llmapi/llm.py @4c05a748 ``_check_arguments``, the prompt length printed as a float); one of max_seq_len tokens
    leaves no room and the C++ Request refuses 0 new tokens. No engine max_input_len exists here."""
    words = hf_tokenizer.encode("word " * 400) * 2
    long_prompt = words[:MAX_INPUT_LEN]
    status, body = generate(url, request(long_prompt, 100, exclude_input_in_output=[True], end_id=[-1]))
    assert status == 200 and body["sequence_length"] == MAX_SEQ_LEN - MAX_INPUT_LEN, body
    assert (f"User-specified `max_tokens` (100) is greater than deduced `default_max_tokens` "
            f"({MAX_SEQ_LEN - MAX_INPUT_LEN}), using default_max_tokens instead."
            in server["log"].read_text(errors="replace"))
    status, body = generate(url, request(words[:MAX_SEQ_LEN], 4))
    assert "Assertion failed: mMaxNewTokens > 0" in error_of(status, body)
    status, body = generate(url, request(words[: MAX_NUM_TOKENS + 1], 2), model=NUM_TOKENS_MODEL)
    assert (f"The sum of prompt length ({float(MAX_NUM_TOKENS + 1)}), query length (0) should not exceed "
            f"max_num_tokens ({MAX_NUM_TOKENS})" in error_of(status, body))
    status, body = generate(url, request(words[:MAX_NUM_TOKENS], 2, exclude_input_in_output=[True]),
                            model=NUM_TOKENS_MODEL)
    assert status == 200 and body["sequence_length"] == 2, body


@pytest.mark.parametrize("server", ["reference"], indirect=True)  # the C++ executor's TrtGptModel rule
def test_the_prompt_limit_is_min_of_max_seq_len_minus_1_and_max_num_tokens(server, url, hf_tokenizer):
    """8b. With chunked context off, for an engine with context FMHA and packed input, the executor's
    maximum input length is min(max_seq_len - 1, max_num_tokens), whatever the engine's max_input_len
    (``TrtGptModel`` constructor, batch_manager/trtGptModel.h): here min(255, 150) = 150 with an engine
    max_input_len of 100. A prompt above it fails ``LlmRequest::validate`` with both numbers; one above
    the engine's max_input_len but within it is served."""
    words = hf_tokenizer.encode("word " * 400) * 2
    status, body = generate(url, request(words[: MAX_NUM_TOKENS + 1], 2), model=NUM_TOKENS_MODEL)
    assert (
        f"Prompt length ({MAX_NUM_TOKENS + 1}) exceeds maximum input length ({MAX_NUM_TOKENS}). Set log level to "
        "info and check TRTGptModel logs for how maximum input length is set" in error_of(status, body)
    )
    for length in (NUM_TOKENS_ENGINE_MAX_INPUT_LEN + 1, MAX_NUM_TOKENS):
        status, body = generate(url, request(words[:length], 2, exclude_input_in_output=[True]), model=NUM_TOKENS_MODEL)
        assert status == 200 and body["sequence_length"] == 2, (length, body)


# ------------------------------------------------------------------------------------------------
# 9: other observable behaviour
# ------------------------------------------------------------------------------------------------


def test_defaults_no_end_token_and_greedy(url, prompts, greedy):
    """9a/9b. Without end_id the decoder runs with end id -1 (createNewDecoderRequests.cpp @b35ac1b6),
    so generation only ends by length; without top_k and top_p the sampling layer decodes greedily,
    whatever the temperature (topKSamplingLayer.cpp @03961722: k == 0 and p == 0.0 -> k = 1)."""
    n = greedy_with_eos(greedy, "one_word")
    status, body = generate(
        url, request(prompts["one_word"], n + 2, runtime_top_k=None, temperature=[1.5], exclude_input_in_output=[True])
    )
    assert status == 200, body
    tokens = _ids(body["output_ids"])
    assert len(tokens) == n + 2 and tokens[:n] == greedy("one_word", n) and tokens[n] == EOS


def test_requested_outputs_must_include_output_ids_and_sequence_length(server, prompts):
    """9d. A client that names its outputs must include output_ids and sequence_length (backend
    ``fillTritonResponse``: "output_ids tensor must be present in list of output tensors")."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    results: list = []
    done = threading.Event()

    def callback(result, error):
        results.append((result, error))
        done.set()

    client = grpcclient.InferenceServerClient(server["grpc"])
    try:
        ids = np.array([prompts["haiku"]], dtype=np.int32)
        inputs = []
        for name, value in (("input_ids", ids), ("input_lengths", np.array([[ids.shape[1]]], np.int32)),
                            ("request_output_len", np.array([[2]], np.int32))):
            tensor = grpcclient.InferInput(name, list(value.shape), "INT32")
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        client.start_stream(callback=callback)
        client.async_stream_infer("tensorrt_llm", inputs, outputs=[grpcclient.InferRequestedOutput("sequence_length")])
        assert done.wait(60)
    finally:
        client.stop_stream()
        client.close()
    (result, error) = results[0]
    assert error is not None and "output_ids tensor must be present in list of output tensors" in str(error)


# ------------------------------------------------------------------------------------------------
# 10: guided decoding tensors (this server's config leaves guided decoding off)
# ------------------------------------------------------------------------------------------------


def test_guide_tensors_with_guided_decoding_off(url, prompts, greedy):
    """10. Unknown guide types are ignored (``getGuidedDecodingParamsFromTensors`` maps four exact
    strings); a real guide fails in the executor when the config set up no guided decoder."""
    for ignored in ({"guided_decoding_guide_type": ["JSON"]}, {"guided_decoding_guide_type": ["structural_tag"], "guided_decoding_guide": ["{}"]},
                    {"guided_decoding_guide": ["[a-z]+"]}):  # fmt: skip
        status, events = stream(url, request(prompts["haiku"], 3, streaming=[True], **ignored))
        assert status == 200 and [t for e in events for t in _ids(e["output_ids"])] == greedy("haiku", 3), ignored
    status, events = stream(url, request(prompts["haiku"], 3, streaming=[True], guided_decoding_guide_type=["regex"]))
    assert "The guide string must be provided unless using GuideType::kJSON." in error_of(status, events)
    status, events = stream(url, request(prompts["haiku"], 3, streaming=[True], guided_decoding_guide_type=["json"]))
    assert (
        "Request is specified with GuidedDecodingParams, but GuidedDecoder is not setup. Please provide a valid "
        "GuidedDecodingConfig to setup GuidedDecoder." in error_of(status, events)
    )


# ------------------------------------------------------------------------------------------------
# 11-13: guided output, LoRA and cancellation (tensorrt_llm_features has guided decoding and LoRA on)
# ------------------------------------------------------------------------------------------------


def grpc_call(server: dict, model: str, tensors: dict, request_id: str = "", cancel_after_first: bool = False,
              timeout: float = 120.0) -> tuple[list[int], list[str]]:
    """One request over gRPC ModelStreamInfer (numpy tensors, each with its batch dimension); returns the ids of
    every response and the errors. ``cancel_after_first``: cancel the stream (Triton's request cancellation) once
    the first response arrived."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    types = {np.int32: "INT32", np.uint64: "UINT64", np.float32: "FP32", np.bool_: "BOOL", np.object_: "BYTES"}
    got: list = []
    first, done = threading.Event(), threading.Event()

    def callback(result, error):
        got.append((result, error))
        first.set()
        if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
            done.set()

    client = grpcclient.InferenceServerClient(server["grpc"])
    try:
        inputs = []
        for name, value in tensors.items():
            tensor = grpcclient.InferInput(name, list(value.shape), types[value.dtype.type])
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        client.start_stream(callback=callback)
        client.async_stream_infer(model, inputs, request_id=request_id, enable_empty_final_response=True)
        if cancel_after_first:
            assert first.wait(timeout), "no first response"
            client.stop_stream(cancel_requests=True)
        else:
            assert done.wait(timeout), "no final response"
    finally:
        client.stop_stream()
        client.close()
    tokens, errors = [], []
    for result, error in got:
        if error is not None:
            errors.append(str(error))
        elif result.as_numpy("output_ids") is not None:
            tokens += [int(t) for t in result.as_numpy("output_ids").reshape(-1)]
    return tokens, errors


def scalars(ids: list[int], n: int, **extra) -> dict:
    """A greedy, non-streaming request's tensors (generated tokens only), ``extra`` as numpy arrays."""
    import numpy as np

    tensors = {"input_ids": np.array([ids], np.int32), "input_lengths": np.array([[len(ids)]], np.int32),
               "request_output_len": np.array([[n]], np.int32), "runtime_top_k": np.array([[1]], np.int32),
               "end_id": np.array([[EOS]], np.int32), "exclude_input_in_output": np.array([[True]], np.bool_)}
    tensors.update(extra)
    return tensors


def test_guided_decoding_constrains_the_output(server, prompts, hf_tokenizer):
    """11. With guided decoding on (the C++ backend's guided_decoding_backend + tokenizer info; the PyTorch
    backend's LLM argument guided_decoding_backend='xgrammar'), each guide type constrains the greedy output:
    a regex's whole match, a JSON schema's valid document, any JSON object."""
    status, body = generate(server["url"], request(prompts["haiku"], 16, end_id=[EOS], exclude_input_in_output=[True],
                                                   guided_decoding_guide_type=["regex"],
                                                   guided_decoding_guide=["[0-9]{3}"]), model=FEATURES_MODEL)
    assert status == 200 and re.fullmatch("[0-9]{3}", hf_tokenizer.decode(_ids(body["output_ids"]))), body
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    status, body = generate(server["url"], request(prompts["haiku"], 40, end_id=[EOS], exclude_input_in_output=[True],
                                                   guided_decoding_guide_type=["json_schema"],
                                                   guided_decoding_guide=[json.dumps(schema)]), model=FEATURES_MODEL)
    document = json.loads(hf_tokenizer.decode(_ids(body["output_ids"])))
    assert status == 200 and set(document) == {"n"} and isinstance(document["n"], int), body
    status, body = generate(server["url"], request(prompts["haiku"], 40, end_id=[EOS], exclude_input_in_output=[True],
                                                   guided_decoding_guide_type=["json"]), model=FEATURES_MODEL)
    assert status == 200 and isinstance(json.loads(hf_tokenizer.decode(_ids(body["output_ids"]))), (dict, list))


def test_a_grammar_that_lets_a_thought_through_then_holds_the_answer_constrains_both(server, prompts, hf_tokenizer):
    """11b. The grammar the predictor sends for a model that thinks (cog_triton.streaming.guided: xgrammar's
    ``TagDispatch`` free text up to a closing string, a little whitespace, then the guide's grammar, as EBNF text) is an
    ``ebnf_grammar`` guide both take: the C++ backend maps the type to ``GuideType::kEBNF_GRAMMAR`` (utils.cc
    ``getGuidedDecodingParamsFromTensors``) and compiles it with ``Grammar::FromEBNF``; the PyTorch backend's
    ``GuidedDecodingParams(grammar=...)`` is compiled by ``compile_grammar`` (``_torch/pyexecutor/grammar_matcher.py``).
    The default model has no thinking markers, so "." closes the thought here: free text, then a valid document."""
    from cog_triton.ipc import Guide
    from cog_triton.reasoning import ThinkingFormat
    from cog_triton.streaming.guided import GuideChecker, thinking_head

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    period = ThinkingFormat("tags", open_id=0, close_id=0, open_text="<think>", close_text=".")
    sent = GuideChecker(hf_tokenizer).thinking_guide(Guide("json_schema", json.dumps(schema), "json_schema"),
                                                      thinking_head(period, "open"))
    status, body = generate(server["url"], request(prompts["haiku"], 60, end_id=[EOS], exclude_input_in_output=[True],
                                                   guided_decoding_guide_type=[sent.guide_type],
                                                   guided_decoding_guide=[sent.guide]), model=FEATURES_MODEL)
    assert status == 200, body
    thought, _, answer = hf_tokenizer.decode(_ids(body["output_ids"])).partition(".")
    document = json.loads(answer)
    assert thought.strip() and set(document) == {"n"} and isinstance(document["n"], int), (thought, answer)


@pytest.fixture(scope="module")
def adapter(tmp_path_factory, prompts):
    """A PEFT adapter of the default model (peft, random weights) and transformers + peft's greedy output with it."""
    from tests.lora_adapters import AdapterFactory

    factory = AdapterFactory(CHECKPOINT)
    folder = factory.make(tmp_path_factory.mktemp("conformance_lora") / "adapter", r=4, alpha=8,
                          targets=["q_proj", "v_proj"], seed=31)
    expected = factory.greedy(folder, prompts["haiku"], 8, EOS)
    assert expected != factory.greedy(None, prompts["haiku"], 8, EOS), "the adapter must change the output"
    return folder, expected


def test_a_lora_adapter_gives_peft_s_output(server, prompts, adapter):
    """12. A request with an adapter generates what transformers + peft generate with it. The reference model gets
    the C++ backend's lora_task_id, lora_weights and lora_config (converted by the predictor's converter); the
    PyTorch-backend model lora_task_id and the adapter's folder, lora_path (LoRARequest, executor/request.py
    @4ce835a5), as the predictor sends each."""
    import numpy as np

    folder, expected = adapter
    task = {"lora_task_id": np.array([[4242]], np.uint64)}
    if server["impl"] == "reference":
        from cog_triton.streaming.lora.convert import convert
        from tensorrtllm_backend.engine import inspect_weights
        from tests.lora_adapters import adapter_config

        spec = inspect_weights(CHECKPOINT, reference_lora={"max_lora_rank": 8, "lora_target_modules": LORA_MODULES}).lora
        tensors = convert(adapter_config(folder), folder / "adapter_model.safetensors", spec, "a").tensors
        task["lora_weights"] = np.frombuffer(tensors.weights, np.float32).reshape(1, tensors.rows, tensors.width)
        task["lora_config"] = np.frombuffer(tensors.config, np.int32).reshape(1, tensors.rows, 3)
    else:
        task["lora_path"] = np.array([[str(folder).encode()]], dtype=np.object_)
    tokens, errors = grpc_call(server, FEATURES_MODEL, scalars(prompts["haiku"], 8, **task))
    assert errors == [] and tokens == expected
    plain, errors = grpc_call(server, FEATURES_MODEL, scalars(prompts["haiku"], 8))
    assert errors == [] and plain != expected  # the next request without the adapter is the base model's


def test_a_cancelled_request_stops_generating(server, prompts):
    """13. Triton's request cancellation (the client cancels the stream) stops the generation: the model logs it
    with the request id, before the request's 400 tokens (the C++ backend's WaitForCancel thread checks every
    cancellation_check_period_ms; the reference's scheduler every step; the PyTorch-backend model calls
    RequestOutput.abort())."""
    import numpy as np

    before = server["log"].read_text(errors="replace").count("request 'cancel-me' cancelled by the client")
    tensors = scalars(prompts["haiku"], 400, streaming=np.array([[True]], np.bool_), end_id=np.array([[-1]], np.int32))
    grpc_call(server, "tensorrt_llm", tensors, request_id="cancel-me", cancel_after_first=True)
    deadline = time.monotonic() + 60  # only "not hung": the log line comes within a step or a check period
    pattern = re.compile(r"request 'cancel-me' cancelled by the client after (\d+) tokens")
    while time.monotonic() < deadline:
        found = pattern.findall(server["log"].read_text(errors="replace"))
        if len(found) > before:
            break
        time.sleep(0.1)
    assert len(found) > before and int(found[-1]) < 400, found


# ------------------------------------------------------------------------------------------------
# 14-17: TensorRT-LLM 1.2.1's PyTorch backend as it behaves (tensorrtllm_backend/samplers.py, the model's docstring)
# ------------------------------------------------------------------------------------------------

#: Per server, the models a sampling test runs on, and whether each applies every sampling input (else it refuses
#: the ones its sampler would ignore): the reference (the C++ backend's sampling); the PyTorch-backend model with
#: TorchSampler (1.2.1's default) and with TRTLLMSampler.
SAMPLING_MODELS = {"reference": (("tensorrt_llm", True),),
                   "pytorch": (("tensorrt_llm", False), (SAMPLER_MODEL, True))}
SAMPLED = {"runtime_top_k": [0], "runtime_top_p": [1.0], "temperature": [1.0]}


def _outcome(url: str, model: str, payload: dict) -> tuple[list[int], str]:
    """(tokens, error text or "") of one streamed request."""
    status, events = stream(url, payload, model=model)
    if status != 200:
        return [], error_of(status, events)
    return [t for e in events for t in _ids(e.get("output_ids", []))], ""


@pytest.mark.parametrize("case", ["repetition_penalty", "presence_penalty", "frequency_penalty", "bad_words",
                                  "min_tokens", "seed"])
def test_a_sampling_input_takes_effect_or_is_refused(server, url, prompts, greedy, case):
    """14. Every sampling input a client sends either takes effect (as on the C++ backend) or is refused: the error
    leads with what the caller can do (leave the input out), and the setting that would apply it is logged for the
    operator. TensorRT-LLM 1.2.1's TorchSampler (sampler_type auto)
    ignores the penalties, bad words and the request's seed and counts the prompt towards min_tokens
    (_torch/pyexecutor/sampler.py @00026bd1; the stand-in does the same): the PyTorch-backend model refuses those
    there; with TRTLLMSampler (the C++ decoder) they apply. "Effect": greedy output changed by a penalty, the banned
    first token avoided, the end token held back for min_tokens, the same seed reproducing and another changing a
    sample."""
    haiku = prompts["haiku"]
    remedies = server["log"].read_text(errors="replace").count("COG_TRITON_LLM_SAMPLER=TRTLLMSampler")
    for model, applies in SAMPLING_MODELS[server["impl"]]:
        if case in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
            tokens, error = _outcome(url, model, request(haiku, 8, streaming=[True], **{case: [2.0]}))
            effect = tokens != greedy("haiku", 8)
        elif case == "bad_words":
            first = greedy("haiku", 1)[0]
            tokens, error = _outcome(url, model, request(haiku, 4, streaming=[True], bad_words_list=[[first], [1]]))
            effect = bool(tokens) and tokens[0] != first
        elif case == "min_tokens":
            n = greedy_with_eos(greedy, "one_word")
            tokens, error = _outcome(url, model, request(prompts["one_word"], 16, streaming=[True], end_id=[EOS],
                                                         min_tokens=[n + 2]))
            effect = len(tokens) >= n + 2
        else:
            one, error = _outcome(url, model, request(haiku, 8, streaming=[True], seed=[7], **SAMPLED))
            again, _ = _outcome(url, model, request(haiku, 8, streaming=[True], seed=[7], **SAMPLED))
            other, _ = _outcome(url, model, request(haiku, 8, streaming=[True], seed=[8], **SAMPLED))
            effect = one == again and one != other
        if applies:
            assert not error and effect, (model, case, error)
        else:  # the caller's error leads with what the caller can do; the operator's remedy is in the server's log
            name = "bad_words_list" if case == "bad_words" else case
            assert error.startswith(name) and "cannot be applied here: leave" in error, (model, error)
            assert "TorchSampler" in error and "COG_TRITON_LLM_SAMPLER" not in error, (model, error)
            # the model logs through its stub to Triton's log apart from the error response: wait for the line
            deadline = time.monotonic() + 30
            while (server["log"].read_text(errors="replace").count("COG_TRITON_LLM_SAMPLER=TRTLLMSampler") <= remedies
                   and time.monotonic() < deadline):
                time.sleep(0.05)
            log = server["log"].read_text(errors="replace")
            assert log.count("COG_TRITON_LLM_SAMPLER=TRTLLMSampler") > remedies, "the remedy was logged"


def test_log_probs_are_the_generated_tokens_or_refused(server, url, prompts, hf_model):
    """15. return_log_probs gives each generated token's log-probability (log_softmax of the logits over the
    temperature, at that token: the C++ decoder's; TRTLLMSampler's), or is refused where the sampler would report
    another's: TorchSampler reports the arg-max token's raw log-probability, taken before sampling
    (sampler.py @00026bd1), so the PyTorch-backend model refuses log-probs with sampling under it."""
    haiku = prompts["haiku"]
    payload = request(haiku, 8, exclude_input_in_output=[True], return_log_probs=[True], seed=[3],
                      **{**SAMPLED, "temperature": [2.0]})
    for model, applies in SAMPLING_MODELS[server["impl"]]:
        if not applies:  # without a seed, which TorchSampler would refuse first
            status, body = generate(url, {k: v for k, v in payload.items() if k != "seed"}, model=model)
            error = error_of(status, body)
            assert "return_log_probs" in error and "TorchSampler" in error, error
            continue
        status, body = generate(url, payload, model=model)
        assert status == 200, body
        tokens = _ids(body["output_ids"])
        got = body["output_log_probs"]
        got = [float(v) for v in (got if isinstance(got, list) else [got])]
        with torch.inference_mode():
            logits = hf_model(torch.tensor([haiku + tokens])).logits[0].float()
        rows = [logits[len(haiku) - 1 + i] for i in range(len(tokens))]
        assert got == pytest.approx([float(torch.log_softmax(r / 2.0, -1)[t]) for r, t in zip(rows, tokens)],
                                    abs=5e-3), model
        assert any(int(torch.argmax(r)) != t for r, t in zip(rows, tokens)), "all arg-max: the test tells nothing"


def test_a_stopped_request_still_waiting_for_a_slot_ends(server, url, prompts):
    """16. A request stopped while it waits for a batch slot ends with a stopped request's final response (no tokens,
    no error). TensorRT-LLM 1.2.1's PyTorch backend drops such a request without any response
    (executor_request_queue.py @007a7508 update_waiting_queue; the stand-in does the same), so the PyTorch-backend
    model ends it itself one cancellation period after the stop, while the slots' holders run on. The C++ executor
    keeps a cancelled id until the request is scheduled and terminates it then (executorImpl.cpp
    terminateCancelledRequests: active requests only), so on the reference it ends once a slot frees, with no token
    generated. Sequenced as test 5: both slots held by requests that cannot end during the test, the waiting request
    known to be with the model (Triton's statistics) before it is stopped."""
    long_ = {"streaming": [True], "end_id": [-1]}
    active: list[Stream] = []
    waiting = None
    try:
        for i in range(MAX_ACTIVE):
            s = Stream(url, {**request(prompts["haiku"], QUEUE_ACTIVE_TOKENS, **long_), "id": f"abort-active-{i}"},
                       QUEUE_MODEL)
            assert s.first.wait(60) and s.events, "an active request produced no token"
            active.append(s)
        handed = _handed_to_the_model(url, QUEUE_MODEL)
        waiting = Stream(url, {**request(prompts["haiku"], 3, **long_), "id": "abort-waiting"}, QUEUE_MODEL)
        deadline = time.monotonic() + 60  # only "not hung"
        while _handed_to_the_model(url, QUEUE_MODEL) == handed and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _handed_to_the_model(url, QUEUE_MODEL) == handed + 1, "the waiting request never reached the model"
        status, _ = stream(url, stop_request("abort-waiting"), model=QUEUE_MODEL)
        assert status == 200
        if server["impl"] == "pytorch":
            events = waiting.finish()
            assert all(s.is_alive() for s in active), "it ended only when a slot freed"
        else:
            assert waiting.is_alive() and not waiting.events  # the C++ executor: still waiting for a slot
            stream(url, stop_request("abort-active-0"), model=QUEUE_MODEL)
            events = waiting.finish()
        assert waiting.status == 200 and events and all("error" not in e for e in events), events
        assert waiting.tokens() == [] and events[-1].get("sequence_length", 0) == 0
    finally:
        for s in [*active, *([waiting] if waiting else [])]:
            if s.is_alive():
                stream(url, stop_request(s.payload["id"]), model=QUEUE_MODEL)
        for s in [*active, *([waiting] if waiting else [])]:
            s.join(60)


def test_a_known_lora_task_id_with_another_adapter(server, prompts, adapter, tmp_path):
    """17. The adapter cache is keyed by the task id. The PyTorch backend's LLM API would serve the adapter cached
    under a known id whatever folder comes with it (base_worker.py @7b437aaa _load_lora_adapter; lora_manager.py
    @30e6fb55), so the PyTorch-backend model refuses a known id with another adapter's folder. The C++ backend keeps
    a cached task's weights when the id comes again with other weights (the reference model's lora.py, as
    PeftCacheManager); the predictor's ids are content hashes, so it never sends that."""
    import numpy as np

    from tests.lora_adapters import AdapterFactory

    folder, expected = adapter
    other = AdapterFactory(CHECKPOINT).make(tmp_path / "other", r=4, alpha=8, targets=["q_proj", "v_proj"], seed=32)
    task = {"lora_task_id": np.array([[5151]], np.uint64)}

    def tensors_of(path):
        if server["impl"] == "pytorch":
            return {"lora_path": np.array([[str(path).encode()]], dtype=np.object_)}
        from cog_triton.streaming.lora.convert import convert
        from tensorrtllm_backend.engine import inspect_weights
        from tests.lora_adapters import adapter_config

        spec = inspect_weights(CHECKPOINT, reference_lora={"max_lora_rank": 8, "lora_target_modules": LORA_MODULES}).lora
        converted = convert(adapter_config(path), path / "adapter_model.safetensors", spec, "a").tensors
        return {"lora_weights": np.frombuffer(converted.weights, np.float32).reshape(1, converted.rows, converted.width),
                "lora_config": np.frombuffer(converted.config, np.int32).reshape(1, converted.rows, 3)}

    tokens, errors = grpc_call(server, FEATURES_MODEL, scalars(prompts["haiku"], 8, **task, **tensors_of(folder)))
    assert errors == [] and tokens == expected
    tokens, errors = grpc_call(server, FEATURES_MODEL, scalars(prompts["haiku"], 8, **task, **tensors_of(other)))
    if server["impl"] == "pytorch":
        assert tokens == [] and len(errors) == 1 and "lora_task_id 5151 was first served with the adapter in" in errors[0]
    else:
        assert errors == [] and tokens == expected  # the cached task's weights: the first adapter's output


def test_a_bad_adapter_is_that_requests_error_and_the_next_request_is_served(server, prompts, adapter, tmp_path):
    """18. An adapter the backend cannot load fails only its request: the next one (with a good adapter) is served.
    The C++ backend checks a request's LoRA tensors and answers an error for that request (the reference model's
    lora.py, as the C++ LoraCache's validation). TensorRT-LLM 1.2.1's LLM API loads an adapter folder outside its
    RequestError path, and a folder it cannot read stops its executor worker, for every request (base_worker.py
    @7b437aaa _enqueue_request, worker.py @cc4777e9 worker_main; the stand-in does so): the PyTorch-backend model
    checks every lora_path first (complete, readable), so the request gets an error naming the folder."""
    import numpy as np

    folder, expected = adapter
    if server["impl"] == "pytorch":
        bad = shutil.copytree(folder, tmp_path / "truncated")
        weights = bad / "adapter_model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-100])
        task = {"lora_task_id": np.array([[6161]], np.uint64),
                "lora_path": np.array([[str(bad).encode()]], dtype=np.object_)}
        phrase = f"lora_path {bad}: adapter_model.safetensors is damaged or incomplete"
    else:
        task = {"lora_task_id": np.array([[6161]], np.uint64),
                "lora_weights": np.zeros((1, 2, 7), np.float32),  # rows of no module's width
                "lora_config": np.array([[[0, 0, 4], [1, 0, 4]]], np.int32)}
        phrase = ""
    tokens, errors = grpc_call(server, FEATURES_MODEL, scalars(prompts["haiku"], 8, **task))
    assert tokens == [] and len(errors) == 1 and phrase in errors[0], errors
    good = {"lora_task_id": np.array([[4242]], np.uint64)}
    if server["impl"] == "pytorch":
        good["lora_path"] = np.array([[str(folder).encode()]], dtype=np.object_)
    else:
        from cog_triton.streaming.lora.convert import convert
        from tensorrtllm_backend.engine import inspect_weights
        from tests.lora_adapters import adapter_config

        spec = inspect_weights(CHECKPOINT, reference_lora={"max_lora_rank": 8, "lora_target_modules": LORA_MODULES}).lora
        tensors = convert(adapter_config(folder), folder / "adapter_model.safetensors", spec, "a").tensors
        good["lora_weights"] = np.frombuffer(tensors.weights, np.float32).reshape(1, tensors.rows, tensors.width)
        good["lora_config"] = np.frombuffer(tensors.config, np.int32).reshape(1, tensors.rows, 3)
    tokens, errors = grpc_call(server, FEATURES_MODEL, scalars(prompts["haiku"], 8, **good))
    assert errors == [] and tokens == expected
