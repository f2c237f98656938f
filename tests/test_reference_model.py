"""Tests of the CPU reference ``tensorrt_llm`` model (triton_model_repo/tensorrt_llm_reference/1/model.py).

Unit level: the generation core runs with the real SmolLM2-135M checkpoint and is compared with
``transformers``' own ``generate``. Integration level: a real ``tritonserver`` (nvidia-pytriton
bundle) serves the model as ``tensorrt_llm``, and the tests talk to it over HTTP ``generate_stream``.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import socket
import string
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from httpx_sse import connect_sse

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIR = ROOT / "triton_model_repo" / "tensorrt_llm_reference"
CHECKPOINT = ROOT / "build" / "default_model" / "checkpoint"
EOS = 2  # SmolLM2's <|im_end|>

PROMPTS = {
    "haiku": "Write a haiku about the sea.",
    "photosynthesis": "Explain how photosynthesis works.",
    "dragon": "Tell me a short story about a dragon.",
    "one_word": "Answer with one word: is water wet?",
}


def _load_reference_module():
    spec = importlib.util.spec_from_file_location("reference_model", MODEL_DIR / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["reference_model"] = module
    spec.loader.exec_module(module)
    return module


ref = _load_reference_module()




# ------------------------------------------------------------------------------------------------
# fixtures and helpers
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    return ref.load_model(str(CHECKPOINT))


@pytest.fixture(scope="module")
def prompt_ids():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(CHECKPOINT))
    out = {}
    for key, text in PROMPTS.items():
        enc = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        out[key] = list(enc["input_ids"] if not isinstance(enc, list) else enc)
    return out


@pytest.fixture(scope="module")
def hf_greedy(model, prompt_ids):
    """``hf_greedy(key, n)``: transformers' greedy tokens for a prompt, without the trailing eos/padding."""
    cache: dict[str, list[int]] = {}

    def get(key: str, n: int) -> list[int]:
        if key not in cache or len(cache[key]) < n and EOS not in cache[key]:
            ids = torch.tensor([prompt_ids[key]])
            with torch.inference_mode():
                out = model.generate(ids, do_sample=False, max_new_tokens=max(n, 24))
            tokens = out[0, ids.shape[1]:].tolist()
            if EOS in tokens:
                tokens = tokens[: tokens.index(EOS) + 1]
            cache[key] = tokens
        tokens = cache[key]
        tokens = tokens[: tokens.index(EOS)] if EOS in tokens else tokens
        return tokens[:n]

    return get


def params(n: int, **kw):
    kw.setdefault("end_id", EOS)
    return ref.SamplingParams(max_new_tokens=n, **kw)


def run(model, ids, **kw):
    n = kw.pop("n", 16)
    gen = ref.Generation(model, ids, params(n, **kw))
    return gen.run(), gen


def word_list(words: list[list[int]]) -> np.ndarray:
    """Encode words as the TensorRT-LLM [2, L] int32 list (token ids, cumulative offsets padded with -1)."""
    flat = [t for w in words for t in w]
    offsets = list(np.cumsum([len(w) for w in words]))
    width = max(1, len(flat))
    return np.array([flat + [0] * (width - len(flat)), offsets + [-1] * (width - len(offsets))], dtype=np.int32)


LIMITS = ref.ModelLimits(max_input_len=512, max_seq_len=1024, vocab_size=49152, default_end_id=EOS)


def request_getter(**tensors):
    """Mimic what Triton delivers: every tensor with a leading batch dimension of 1."""
    arrays = {}
    for name, value in tensors.items():
        arr = np.asarray(value)
        if arr.dtype.kind == "f":
            arr = arr.astype(np.float32)
        elif arr.dtype.kind in "iu" and name != "seed":
            arr = arr.astype(np.int32)
        arrays[name] = arr[None, ...] if arr.ndim else arr.reshape(1)
    return lambda name: arrays.get(name)


# ------------------------------------------------------------------------------------------------
# unit level: generation core with the real model
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["haiku", "photosynthesis"])
def test_greedy_matches_hf_generate(model, prompt_ids, hf_greedy, key):
    tokens, gen = run(model, prompt_ids[key], n=16, temperature=0.0)
    assert tokens == hf_greedy(key, 16)
    assert gen.finish_reason == "length" and len(tokens) == 16


def test_greedy_stops_at_end_id_without_returning_it(model, prompt_ids, hf_greedy):
    tokens, gen = run(model, prompt_ids["one_word"], n=16, temperature=0.0)
    assert tokens == hf_greedy("one_word", 16)
    assert len(tokens) < 16 and EOS not in tokens and gen.finish_reason == "end_id"


def test_top_k_1_equals_greedy_at_temperature_1(model, prompt_ids, hf_greedy):
    tokens, _ = run(model, prompt_ids["haiku"], n=12, temperature=1.0, top_k=1, seed=123)
    assert tokens == hf_greedy("haiku", 12)


def test_seeded_sampling_is_reproducible(model, prompt_ids):
    ids = prompt_ids["dragon"]
    a, _ = run(model, ids, n=8, temperature=1.2, top_p=0.98, top_k=50, seed=7)
    b, _ = run(model, ids, n=8, temperature=1.2, top_p=0.98, top_k=50, seed=7)
    others = [run(model, ids, n=8, temperature=1.2, top_p=0.98, top_k=50, seed=s)[0] for s in (8, 9)]
    assert a == b
    assert any(o != a for o in others), "different seeds gave identical samples"


def test_min_tokens_suppresses_end_id(model, prompt_ids, hf_greedy):
    assert len(hf_greedy("one_word", 16)) < 10  # greedy ends early on this prompt
    tokens, gen = run(model, prompt_ids["one_word"], n=16, temperature=0.0, min_tokens=10)
    assert len(tokens) >= 10 and EOS not in tokens[:10]


def test_stop_word_ends_generation_and_is_included(model, prompt_ids, hf_greedy):
    greedy = hf_greedy("haiku", 20)
    stop = greedy[3:5]
    words = ref.parse_word_list(word_list([[99, 98, 97], stop]), "stop_words_list")
    tokens, gen = run(model, prompt_ids["haiku"], n=20, temperature=0.0, stop_words=words)
    assert tokens == greedy[:5]
    assert gen.finish_reason == "stop_words"


def test_bad_words_are_never_generated(model, prompt_ids, hf_greedy):
    greedy = hf_greedy("haiku", 16)
    first = greedy[0]
    tokens, _ = run(model, prompt_ids["haiku"], n=16, temperature=0.0, bad_words=[[first]])
    assert first not in tokens and tokens[0] != first
    # A two-token bad word bans only its last token, and only right after its first one.
    tokens, _ = run(model, prompt_ids["haiku"], n=4, temperature=0.0, bad_words=[[greedy[0], greedy[1]]])
    assert tokens[0] == greedy[0] and tokens[1] != greedy[1]


@pytest.mark.parametrize(
    "penalty",
    [{"repetition_penalty": 1.5}, {"presence_penalty": 1.0}, {"frequency_penalty": 1.0}],
    ids=lambda p: next(iter(p)),
)
def test_penalties_change_the_output(model, prompt_ids, hf_greedy, penalty):
    neutral = hf_greedy("haiku", 16)  # "The waves of the sea, a ..., A ... of the" repeats tokens
    tokens, _ = run(model, prompt_ids["haiku"], n=16, temperature=0.0, **penalty)
    assert tokens != neutral


def test_log_probs(model, prompt_ids):
    tokens, gen = run(model, prompt_ids["haiku"], n=6, temperature=0.0, return_log_probs=True)
    assert len(gen.log_probs) == len(tokens) == 6
    assert all(lp <= 0.0 for lp in gen.log_probs)
    assert gen.cum_log_prob == pytest.approx(sum(gen.log_probs))


def test_parse_word_list_valid():
    assert ref.parse_word_list(np.array([[5, 6, 7], [2, 3, -1]], dtype=np.int32)) == [[5, 6], [7]]
    assert ref.parse_word_list(np.array([[[5, 6, 7], [2, 3, -1]]], dtype=np.int32)) == [[5, 6], [7]]
    assert ref.parse_word_list(np.array([[9], [1]], dtype=np.int32)) == [[9]]
    assert ref.parse_word_list(np.zeros((1, 2, 0), dtype=np.int32)) == []
    assert ref.parse_word_list(np.array([[0, 0], [-1, -1]], dtype=np.int32)) == []
    assert ref.parse_word_list(None) == []


@pytest.mark.parametrize(
    "arr, fragment",
    [
        (np.array([[1, 2, 3]], dtype=np.int32), "shape [2, L]"),
        (np.zeros((2, 2, 2), dtype=np.int32), "shape [2, L]"),
        (np.array([[5.0, 6.0], [1.0, 2.0]]), "int32"),
        (np.array([[5, 6], [2, 1]], dtype=np.int32), "strictly increasing"),
        (np.array([[5, 6], [0, 2]], dtype=np.int32), "strictly increasing"),
        (np.array([[5, 6], [3, -1]], dtype=np.int32), "strictly increasing"),
        (np.array([[5, 6, 7], [1, -1, 3]], dtype=np.int32), "after the first -1"),
        (np.array([[5, -6], [2, -1]], dtype=np.int32), ">= 0"),
    ],
)
def test_parse_word_list_invalid(arr, fragment):
    with pytest.raises(ref.RequestError, match="bad_words_list") as info:
        ref.parse_word_list(arr, "bad_words_list")
    assert fragment in str(info.value)


def test_parse_request_defaults_and_values():
    get = request_getter(
        input_ids=[1, 2, 3], input_lengths=3, request_output_len=8, temperature=0.5, runtime_top_k=40,
        runtime_top_p=0.9, seed=np.uint64(2**63 + 5), streaming=True, stop_words_list=word_list([[4, 5]]),
    )
    parsed = ref.parse_request(get, LIMITS)
    assert parsed.prompt_ids == [1, 2, 3] and parsed.streaming and parsed.exclude_input_in_output
    p = parsed.params
    assert (p.max_new_tokens, p.end_id, p.temperature, p.top_k, p.seed) == (8, EOS, 0.5, 40, 2**63 + 5)
    assert p.top_p == pytest.approx(0.9)
    assert p.stop_words == [[4, 5]] and p.bad_words == [] and p.min_tokens == 0 and p.repetition_penalty == 1.0
    minimal = ref.parse_request(request_getter(input_ids=[7], input_lengths=1, request_output_len=1), LIMITS)
    assert minimal.params.temperature == 1.0 and minimal.params.top_k == 0 and minimal.params.top_p == 1.0
    assert not minimal.streaming and minimal.params.seed == 0


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        ({"input_lengths": 4}, ["input_lengths is 4", "3 tokens"]),
        ({"input_ids": np.zeros((0,), np.int32), "input_lengths": 0}, ["input_ids is empty"]),
        ({"input_ids": np.ones(600, np.int32), "input_lengths": 600}, ["prompt has 600 tokens, max_input_len is 512"]),
        ({"input_ids": [1, 2, 60000]}, ["input_ids", "49152"]),
        ({"request_output_len": 0}, ["request_output_len must be >= 1, got 0"]),
        ({"input_ids": np.ones(500, np.int32), "input_lengths": 500, "request_output_len": 600},
         ["input_lengths (500)", "request_output_len (600)", "max_seq_len 1024"]),
        ({"temperature": -0.5}, ["temperature", "-0.5", ">= 0"]),
        ({"runtime_top_p": 1.5}, ["runtime_top_p", "1.5", "[0, 1]"]),
        ({"runtime_top_k": -1}, ["runtime_top_k", "-1", ">= 0"]),
        ({"beam_width": 2}, ["beam_width must be 1", "got 2"]),
        ({"repetition_penalty": 0.0}, ["repetition_penalty", "> 0"]),
        ({"min_tokens": -1}, ["min_tokens", ">= 0"]),
        ({"stop_words_list": np.array([[5, 6], [3, -1]], np.int32)}, ["stop_words_list", "strictly increasing"]),
        ({"bad_words_list": np.array([1, 2, 3], np.int32)}, ["bad_words_list", "shape"]),
    ],
)
def test_parse_request_rejects(overrides, fragments):
    tensors = {"input_ids": [1, 2, 3], "input_lengths": 3, "request_output_len": 4, **overrides}
    with pytest.raises(ref.RequestError) as info:
        ref.parse_request(request_getter(**tensors), LIMITS)
    for fragment in fragments:
        assert fragment in str(info.value)


# ------------------------------------------------------------------------------------------------
# unit level: the scheduler with fake response senders
# ------------------------------------------------------------------------------------------------


class FakeSink:
    def __init__(self, name, order, cancel_after=None, on_tokens=None):
        self.name, self.order, self.cancel_after, self.on_tokens = name, order, cancel_after, on_tokens
        self.tokens, self.final, self.error, self.cancelled = [], False, None, False
        self.done = threading.Event()

    def send_tokens(self, tokens, log_probs, cum_log_prob, final):
        self.order.append(self.name)
        self.tokens += tokens
        if self.on_tokens:
            self.on_tokens(self)
        if final:
            self.final = True
            self.done.set()

    def send_final(self):
        self.final = True
        self.done.set()

    def send_error(self, message, cancelled=False):
        self.error, self.cancelled = message, cancelled
        self.done.set()

    def is_cancelled(self):
        return self.cancel_after is not None and len(self.tokens) >= self.cancel_after


def test_scheduler_round_robin_fifo(model, prompt_ids, hf_greedy):
    order: list[str] = []
    sched = ref.Scheduler(max_active=2)
    sinks = {}
    for name in ("A", "B", "C"):
        sinks[name] = FakeSink(name, order)
        gen = ref.Generation(model, prompt_ids["haiku"], params(4, temperature=0.0))
        sched.submit(ref.Job(generation=gen, sink=sinks[name], streaming=True, request_id=name))
    sched.start()
    try:
        assert all(s.done.wait(60) for s in sinks.values())
    finally:
        sched.shutdown()
    assert order[:8] == ["A", "B"] * 4  # A and B share the two slots, one token each per turn
    assert order[8:] == ["C"] * 4  # C waited (FIFO) for a free slot
    for sink in sinks.values():
        assert sink.tokens == hf_greedy("haiku", 4) and sink.final and sink.error is None


def test_scheduler_isolates_errors_and_handles_cancel_and_stop(model, prompt_ids, hf_greedy):
    order: list[str] = []
    sched = ref.Scheduler(max_active=4)
    ok = FakeSink("ok", order)
    broken = FakeSink("broken", order)
    cancelled = FakeSink("cancelled", order, cancel_after=2)
    stopped = FakeSink("stopped", order, on_tokens=lambda s: len(s.tokens) == 2 and sched.request_stop("stop-me"))
    batch = FakeSink("batch", order)
    jobs = {}
    cases = [(ok, True, "ok"), (broken, True, "b"), (cancelled, True, "c"), (stopped, True, "stop-me"),
             (batch, False, "x")]
    for sink, streaming, rid in cases:
        gen = ref.Generation(model, prompt_ids["haiku"], params(6, temperature=0.0))
        jobs[sink.name] = ref.Job(generation=gen, sink=sink, streaming=streaming, request_id=rid,
                                  prefix_ids=[11, 12] if not streaming else [])

    def boom():
        raise RuntimeError("boom")

    jobs["broken"].generation.step = boom
    for job in jobs.values():
        sched.submit(job)
    sched.start()
    try:
        assert all(s.done.wait(60) for s in (ok, broken, cancelled, stopped, batch))
    finally:
        sched.shutdown()
    greedy = hf_greedy("haiku", 6)
    assert ok.tokens == greedy and ok.final
    assert "generation failed: RuntimeError: boom" in broken.error
    assert cancelled.cancelled and cancelled.tokens == greedy[:2]
    assert stopped.final and stopped.error is None and stopped.tokens == greedy[:2]
    assert jobs["stopped"].generation.finish_reason == "stopped"
    assert batch.tokens == [11, 12] + greedy and order.count("batch") == 1  # one response, prompt prefix
    assert sched.counts() == (0, 0)


# ------------------------------------------------------------------------------------------------
# integration level: a real tritonserver serving the model as `tensorrt_llm`
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


@pytest.fixture(scope="module")
def triton_url(tmp_path_factory):
    from tensorrtllm_backend.server import LaunchConfig, TritonServer, locate_tritonserver

    tmp = tmp_path_factory.mktemp("reference_triton")
    target = tmp / "repo" / "tensorrt_llm"
    (target / "1").mkdir(parents=True)
    shutil.copy2(MODEL_DIR / "1" / "model.py", target / "1" / "model.py")
    template = string.Template((MODEL_DIR / "config.pbtxt").read_text())
    (target / "config.pbtxt").write_text(
        template.substitute(
            triton_max_batch_size=4, decoupled_mode="true", max_queue_delay_microseconds=0,
            hf_model_dir=str(CHECKPOINT), max_input_len=512, max_seq_len=1024,
            exclude_input_in_output="true", torch_threads=0,
        )
    )
    installation = locate_tritonserver(work_dir=tmp / "work")
    http, grpc, metrics = _free_ports(3)
    server = TritonServer(
        installation,
        LaunchConfig(model_repo=tmp / "repo", http_port=http, grpc_port=grpc, metrics_port=metrics),
        log_file=tmp / "triton.log",
    )
    server.start()
    try:
        server.wait_ready(120)
        yield server.url
    finally:
        server.stop()


def _stream(url: str, payload: dict, timeout: float = 120.0):
    """POST generate_stream; returns (HTTP status, [(monotonic time, event dict)])."""
    events = []
    with httpx.Client(timeout=timeout) as client:
        with connect_sse(client, "POST", f"{url}/v2/models/tensorrt_llm/generate_stream", json=payload) as source:
            status = source.response.status_code
            for sse in source.iter_sse():
                events.append((time.monotonic(), json.loads(sse.data)))
    return status, events


def _payload(ids: list[int], n: int, **extra) -> dict:
    # generate_stream takes flat JSON arrays (or bare scalars) and shapes them by the config dims,
    # adding the batch dimension; nested arrays are rejected.
    return {"input_ids": ids, "input_lengths": [len(ids)], "request_output_len": [n], "streaming": [True],
            "runtime_top_k": [1], **extra}


def _tokens(events) -> list[int]:
    out = []
    for _, event in events:
        ids = event["output_ids"]
        out += ids if isinstance(ids, list) else [ids]
    return out


@pytest.mark.integration
def test_triton_streaming_matches_greedy(triton_url, prompt_ids, hf_greedy):
    status, events = _stream(triton_url, _payload(prompt_ids["haiku"], 16))
    assert status == 200
    assert len(events) == 16  # one event per token
    assert all(event["sequence_length"] == 1 and "error" not in event for _, event in events)
    assert _tokens(events) == hf_greedy("haiku", 16)


@pytest.mark.integration
def test_triton_non_streaming_with_prompt_and_log_probs(triton_url, prompt_ids, hf_greedy):
    ids = prompt_ids["one_word"]
    payload = _payload(ids, 16, streaming=[False], exclude_input_in_output=[False], return_log_probs=[True])
    with httpx.Client(timeout=120) as client:
        answer = client.post(f"{triton_url}/v2/models/tensorrt_llm/generate", json=payload)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    greedy = hf_greedy("one_word", 16)
    assert body["output_ids"] == ids + greedy and body["sequence_length"] == len(ids) + len(greedy)
    assert len(body["output_log_probs"]) == len(greedy)


@pytest.mark.integration
def test_triton_invalid_requests_then_keeps_serving(triton_url, prompt_ids, hf_greedy):
    status, events = _stream(triton_url, _payload([1] * 600, 4))
    assert status == 400 and len(events) == 1
    assert "prompt has 600 tokens, max_input_len is 512" in events[0][1]["error"]
    bad = _payload(prompt_ids["haiku"], 4)
    bad["request_output_len"] = 0  # a bare scalar works as well
    status, events = _stream(triton_url, bad)
    assert status == 400 and "request_output_len must be >= 1, got 0" in events[0][1]["error"]
    status, events = _stream(triton_url, _payload(prompt_ids["haiku"], 4, stop_words_list=[5, 6, 3, -1]))
    assert status == 400 and "stop_words_list" in events[0][1]["error"]
    status, events = _stream(triton_url, _payload(prompt_ids["haiku"], 4, beam_width=[2]))
    assert status == 400 and "beam_width must be 1" in events[0][1]["error"]
    status, events = _stream(triton_url, _payload(prompt_ids["haiku"], 4))
    assert status == 200 and _tokens(events) == hf_greedy("haiku", 4)


@pytest.mark.integration
def test_triton_concurrent_streams_are_interleaved(triton_url, prompt_ids, hf_greedy):
    keys = ["haiku", "photosynthesis", "dragon"]
    results: dict[str, tuple] = {}
    barrier = threading.Barrier(len(keys))

    def worker(key):
        barrier.wait()
        try:
            results[key] = _stream(triton_url, _payload(prompt_ids[key], 24))
        except Exception as exc:  # noqa: BLE001
            results[key] = exc

    threads = [threading.Thread(target=worker, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    for key in keys:
        assert not isinstance(results[key], Exception), results[key]
        status, events = results[key]
        assert status == 200 and len(events) == 24
        assert _tokens(events) == hf_greedy(key, 24), key
    first_token = max(results[k][1][0][0] for k in keys)
    first_finish = min(results[k][1][-1][0] for k in keys)
    assert first_token < first_finish, "a request got its first token only after another one finished"
