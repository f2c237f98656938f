"""Tests of the CPU reference ``tensorrt_llm`` model (triton_model_repo/tensorrt_llm_reference/1/model.py).

Unit level: the generation core runs with the real SmolLM2-135M checkpoint and is compared with
``transformers``' own ``generate``. Integration level: a real ``tritonserver`` (nvidia-pytriton
bundle) serves the model as ``tensorrt_llm``, and the tests talk to it over HTTP ``generate_stream``.
"""

from __future__ import annotations

import json
import shutil
import socket
import string
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from httpx_sse import connect_sse

from common.http import default_ssl_context
from tests.modules import load_file
from tests.proc import stop_at_once

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


ref = load_file("reference_model", MODEL_DIR / "1" / "model.py")




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


LIMITS = ref.ModelLimits(max_input_len=512, max_seq_len=1024, vocab_size=49152)


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


def upstream_scores(model, prompt: list[int], tokens: list[int], *, temperature: float = 1.0,
                    repetition_penalty: float = 1.0, presence_penalty: float = 0.0, frequency_penalty: float = 0.0,
                    top_k: int = 0, top_p: float = 1.0) -> tuple[torch.Tensor, ...]:
    """The processed scores of each generated position, computed apart from the reference model: one
    transformers forward pass over prompt + tokens, then, in TensorRT-LLM's order (penaltyKernels.cu
    batchApplyPenalty: temperature, then repetition/presence/frequency over the prompt and the tokens so
    far), transformers' TemperatureLogitsWarper and RepetitionPenaltyLogitsProcessor, presence/frequency
    written from the kernel, then transformers' TopKLogitsWarper/TopPLogitsWarper for sampling."""
    from transformers import (
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    ids = torch.tensor([prompt + tokens])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0].float()
    scores = []
    for i in range(len(tokens)):
        seen = ids[:, : len(prompt) + i]
        row = logits[len(prompt) + i - 1].unsqueeze(0)
        if temperature != 1.0:
            row = TemperatureLogitsWarper(temperature)(seen, row)
        if repetition_penalty != 1.0:
            row = RepetitionPenaltyLogitsProcessor(repetition_penalty)(seen, row)
        counts = torch.bincount(seen[0], minlength=row.shape[-1]).float().unsqueeze(0)
        row = row - torch.where(counts > 0, presence_penalty + frequency_penalty * counts, 0.0)
        if top_k > 0:
            row = TopKLogitsWarper(top_k)(seen, row)
        if top_p < 1.0:
            row = TopPLogitsWarper(top_p)(seen, row)
        scores.append(row)
    return tuple(scores)


PENALTY_CASES = {
    "repetition": {"repetition_penalty": 1.5},
    "repetition_below_1": {"repetition_penalty": 0.7},
    "presence": {"presence_penalty": 1.0},
    "presence_negative": {"presence_penalty": -1.0},
    "frequency": {"frequency_penalty": 0.75},
    "all_and_temperature": {"temperature": 0.6, "repetition_penalty": 1.2, "presence_penalty": 0.5,
                            "frequency_penalty": -0.3},
}


@pytest.mark.parametrize("case", PENALTY_CASES.values(), ids=PENALTY_CASES)
def test_greedy_penalties_and_log_probs_match_transformers_on_the_same_ids(model, prompt_ids, hf_greedy, case):
    """Greedy (top_k 1): every token is the argmax of the independently processed scores, and every
    log-probability is transformers' compute_transition_scores of them: a wrong sign, a penalty that skips
    the prompt, a swapped presence/frequency or temperature after the penalties all change both."""
    prompt = prompt_ids["haiku"]
    tokens, gen = run(model, prompt, n=12, top_k=1, return_log_probs=True, **case)
    assert len(tokens) == 12 and tokens != hf_greedy("haiku", 12)  # the penalties changed the answer
    scores = upstream_scores(model, prompt, tokens, **case)
    assert [int(row.argmax()) for row in scores] == tokens
    expected = model.compute_transition_scores(torch.tensor([prompt + tokens]), scores, normalize_logits=True)[0]
    assert gen.log_probs == pytest.approx(expected.tolist(), abs=2e-3)
    assert gen.cum_log_prob == pytest.approx(float(expected.sum()), abs=1e-2)


def test_sampled_tokens_and_log_probs_match_transformers_warpers_on_the_same_ids(model, prompt_ids):
    """Sampling (temperature, top_k, top_p, penalties): each token lies inside transformers' top-k/top-p
    set and its log-probability is compute_transition_scores' over the renormalized set."""
    prompt = prompt_ids["dragon"]
    case = {"temperature": 0.8, "top_k": 20, "top_p": 0.9, "presence_penalty": 0.4, "frequency_penalty": 0.2}
    tokens, gen = run(model, prompt, n=12, seed=5, return_log_probs=True, **case)
    scores = upstream_scores(model, prompt, tokens, **case)
    expected = model.compute_transition_scores(torch.tensor([prompt + tokens]), scores, normalize_logits=True)[0]
    assert torch.isfinite(expected).all()  # every token was inside the kept set
    assert gen.log_probs == pytest.approx(expected.tolist(), abs=2e-3)
    assert any(lp < -0.01 for lp in gen.log_probs)  # sampled, not all near-certain


def test_temperature_zero_is_greedy_and_outweighs_additive_penalties(model, prompt_ids, hf_greedy):
    """Upstream multiplies the logits by 1 / (0 + 1e-6) before subtracting presence/frequency penalties,
    so at temperature 0 they no longer change the argmax; the repetition penalty (a factor) still does."""
    neutral = hf_greedy("haiku", 12)
    assert run(model, prompt_ids["haiku"], n=12, temperature=0.0, presence_penalty=1.0)[0] == neutral
    assert run(model, prompt_ids["haiku"], n=12, temperature=0.0, repetition_penalty=1.5)[0] != neutral


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
    # exclude_input_in_output defaults to the model parameter, whose own default is false (upstream)
    assert parsed.prompt_ids == [1, 2, 3] and parsed.streaming and not parsed.exclude_input_in_output
    assert parsed.warnings == []
    p = parsed.params
    assert (p.max_new_tokens, p.end_id, p.temperature, p.top_k, p.seed) == (8, None, 0.5, 40, 2**63 + 5)
    assert p.top_p == pytest.approx(0.9) and not p.greedy
    assert p.stop_words == [[4, 5]] and p.bad_words == [] and p.min_tokens == 0 and p.repetition_penalty == 1.0
    minimal = ref.parse_request(request_getter(input_ids=[7], input_lengths=1, request_output_len=1), LIMITS)
    # absent end_id: no end token; absent top_k and top_p: TensorRT-LLM decodes greedily
    assert minimal.params.temperature == 1.0 and minimal.params.top_k == 0 and minimal.params.top_p is None
    assert minimal.params.end_id is None and minimal.params.greedy
    assert not minimal.streaming and minimal.params.seed == 0
    excluded = ref.parse_request(
        request_getter(input_ids=[7], input_lengths=1, request_output_len=1, end_id=EOS, exclude_input_in_output=True),
        LIMITS,
    )
    assert excluded.exclude_input_in_output and excluded.params.end_id == EOS
    by_default = ref.ModelLimits(max_input_len=512, max_seq_len=1024, vocab_size=49152, exclude_input_in_output=True)
    minimal_getter = request_getter(input_ids=[7], input_lengths=1, request_output_len=1)
    assert ref.parse_request(minimal_getter, by_default).exclude_input_in_output


@pytest.mark.parametrize(
    "tensors, expected",
    [
        ({"runtime_top_p": 0.0}, {"top_p": None, "greedy": True}),  # <= 0 is unset; with top_k 0: greedy
        ({"runtime_top_p": -3.0, "runtime_top_k": 5}, {"top_p": None, "top_k": 5, "greedy": False}),
        ({"runtime_top_p": 1.0}, {"top_p": 1.0, "greedy": False}),
        ({"temperature": 0.0, "runtime_top_p": 0.5}, {"greedy": True}),
        ({"end_id": -1}, {"end_id": None}),  # -1: no end token
        ({"end_id": 0}, {"end_id": 0}),
    ],
)
def test_parse_request_silent_adjustments(tensors, expected):
    get = request_getter(input_ids=[1, 2, 3], input_lengths=3, request_output_len=4, **tensors)
    parsed = ref.parse_request(get, LIMITS)
    for name, value in expected.items():
        assert getattr(parsed.params, name) == value, name


def test_parse_request_reduces_output_len_to_max_seq_len():
    parsed = ref.parse_request(
        request_getter(input_ids=np.ones(500, np.int32), input_lengths=500, request_output_len=600), LIMITS
    )
    assert parsed.params.max_new_tokens == 1024 - 500
    assert parsed.warnings == [
        "Prompt length + number of requested output tokens + draft tokens per step (500 + 600 + 0) exceeds maximum "
        "sequence length (1024). Number of requested output tokens is changed to (524)."
    ]


def test_stop_word_end_matches_over_prompt_and_output():
    assert ref.stop_word_end([1, 2, 3, 4], 1, [[3, 4]]) == 4  # starts in the prompt, ends at the new token
    assert ref.stop_word_end([1, 2, 3, 4], 1, [[2, 3]]) is None  # wholly before the new token
    assert ref.stop_word_end([1, 2, 3, 4, 5], 2, [[3, 4], [9]]) == 4  # the first completed word wins
    assert ref.stop_word_end([1, 2], 1, []) is None


@pytest.mark.parametrize(
    "overrides, fragments",
    [
        ({"input_lengths": 4}, ["input_lengths is 4", "3 tokens"]),
        ({"input_ids": np.zeros((0,), np.int32), "input_lengths": 0}, ["input_ids is empty"]),
        ({"input_ids": np.ones(600, np.int32), "input_lengths": 600},
         ["Executor failed process requestId 0 due to the following error: Encountered an error when fetching new "
          "request: Prompt length (600) exceeds maximum input length (512)."]),
        ({"input_ids": [1, 2, 60000]}, ["input_ids", "49152"]),
        ({"request_output_len": 0}, ["Assertion failed: mMaxNewTokens > 0", "request_output_len is 0"]),
        ({"temperature": -0.5}, ["Assertion failed: temperature.value() >= 0.f", "temperature is -0.5"]),
        ({"runtime_top_p": 1.5}, ["Assertion failed: topP.value() <= 1.f", "runtime_top_p is 1.5"]),
        ({"runtime_top_k": -1}, ["Assertion failed: topK.value() >= 0", "runtime_top_k is -1"]),
        ({"len_penalty": -1.0}, ["Assertion failed: lengthPenalty.value() >= 0.f", "len_penalty is -1.0"]),
        ({"beam_width": 2}, ["beam_width must be 1", "got 2"]),
        ({"repetition_penalty": 0.0},
         ["Assertion failed: repetitionpenalty.value() > 0.f", "repetition_penalty is 0.0"]),
        ({"min_tokens": -1}, ["Assertion failed: minTokens.value() >= 0", "min_tokens is -1"]),
        ({"end_id": 49152}, ["EndId (49152) is not within acceptable range [-1, 49152)."]),
        ({"end_id": -2}, ["EndId (-2) is not within acceptable range [-1, 49152)."]),
        ({"input_ids": None}, ["input_ids is not present in the request."]),
        ({"request_output_len": None}, ["request_output_len is not present in the request"]),
        ({"stop_words_list": np.array([[5, 6], [3, -1]], np.int32)}, ["stop_words_list", "strictly increasing"]),
        ({"bad_words_list": np.array([1, 2, 3], np.int32)}, ["bad_words_list", "shape"]),
    ],
)
def test_parse_request_rejects(overrides, fragments):
    tensors = {"input_ids": [1, 2, 3], "input_lengths": 3, "request_output_len": 4, **overrides}
    tensors = {name: value for name, value in tensors.items() if value is not None}  # None: absent
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
        self.tokens, self.final, self.error = [], False, None
        self.responses: list[list[int]] = []  # tokens of each response, in order
        self.done = threading.Event()

    def send_tokens(self, tokens, log_probs, cum_log_prob, final):
        assert not self.final, "a response after the FINAL one"
        self.order.append(self.name)
        self.responses.append(list(tokens))
        self.tokens += tokens
        if self.on_tokens:
            self.on_tokens(self)
        if final:
            self.final = True
            self.done.set()

    def send_error(self, message):
        self.error = message
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
        assert sink.responses == [[t] for t in hf_greedy("haiku", 4)]  # the last token went with FINAL


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
    # a client cancel ends like a stop (terminateCancelledRequests): a normal FINAL, here with 0 tokens
    assert cancelled.final and cancelled.error is None and cancelled.tokens == greedy[:2]
    assert cancelled.responses[-1] == [] and jobs["cancelled"].generation.finish_reason == "cancelled"
    assert stopped.final and stopped.error is None and stopped.tokens == greedy[:2]
    assert stopped.responses == [[greedy[0]], [greedy[1]], []]  # the remaining new tokens: none
    assert jobs["stopped"].generation.finish_reason == "stopped"
    assert batch.tokens == [11, 12] + greedy and order.count("batch") == 1  # one response, prompt prefix
    assert sched.counts() == (0, 0)


def test_scheduler_streamed_end_token_final_is_an_empty_response(model, prompt_ids, hf_greedy):
    greedy = hf_greedy("one_word", 16)
    assert len(greedy) < 16  # greedy decoding ends on the end token
    sched = ref.Scheduler(max_active=1)
    sink = FakeSink("s", [])
    gen = ref.Generation(model, prompt_ids["one_word"], params(16, temperature=0.0))
    sched.submit(ref.Job(generation=gen, sink=sink, streaming=True, request_id="s"))
    sched.start()
    try:
        assert sink.done.wait(60)
    finally:
        sched.shutdown()
    assert sink.responses == [[t] for t in greedy] + [[]] and sink.final and EOS not in sink.tokens


class ScriptedGeneration:
    """A TokenGenerator that emits the given tokens, one per step, and ends ("length") after them."""

    def __init__(self, tokens=(7,) * 100_000):
        self.prompt_ids, self.params = [1], ref.SamplingParams(max_new_tokens=len(tokens))
        self.tokens, self.log_probs, self.finished, self.finish_reason = [], [], False, None
        self._script = list(tokens)
        self.stepped = threading.Event()

    def step(self):
        self.stepped.set()
        time.sleep(0.002)
        self.tokens.append(self._script[len(self.tokens)])
        if len(self.tokens) == len(self._script):
            self.finish("length")
        return self.tokens[-1:]

    def finish(self, reason):
        if not self.finished:
            self.finished, self.finish_reason = True, reason


def test_scheduler_queue_limit_counts_only_waiting_jobs():
    sched = ref.Scheduler(max_active=1, max_queue_size=1)
    sinks = [FakeSink(str(i), []) for i in range(3)]
    jobs = [
        ref.Job(generation=ScriptedGeneration(), sink=sink, streaming=True, request_id=f"q{i}")
        for i, sink in enumerate(sinks)
    ]
    sched.submit(jobs[0])  # active at once: does not count against the queue
    sched.submit(jobs[1])  # waits
    with pytest.raises(ref.QueueFullError, match=r"^Maximum queue size of 1 has been reached, please try again later$"):
        sched.submit(jobs[2])
    assert sched.counts() == (1, 1)
    assert not sched.request_stop("q2")  # the rejected job was never registered
    sched.start()
    try:
        assert sched.request_stop("q0") and sinks[0].done.wait(10)
        assert jobs[1].generation.stepped.wait(10)  # q1 moved up into the freed slot
        assert sched.request_stop("q1") and sinks[1].done.wait(10)
    finally:
        sched.shutdown()
    assert sinks[0].final and sinks[1].final and sinks[0].error is None and sinks[1].error is None
    assert not sched.request_stop("q0")  # ended jobs are forgotten


def test_scheduler_stop_finds_the_latest_job_with_an_id_even_while_queued():
    sched = ref.Scheduler(max_active=1)
    first, second, other = FakeSink("first", []), FakeSink("second", []), FakeSink("other", [])
    running = ref.Job(generation=ScriptedGeneration(), sink=other, streaming=True, request_id="other")
    older = ref.Job(
        generation=ScriptedGeneration([5] * 30), sink=first, streaming=False, request_id="dup", prefix_ids=[1]
    )
    newer = ref.Job(generation=ScriptedGeneration(), sink=second, streaming=True, request_id="dup")
    for job in (running, older, newer):
        sched.submit(job)
    assert sched.request_stop("dup")  # a later request with the same id replaced the older one's entry
    assert newer.stop_requested and not older.stop_requested
    assert not sched.request_stop("") and not sched.request_stop("unknown")
    sched.start()
    try:
        assert sched.request_stop("other") and other.done.wait(10)
        assert first.done.wait(10) and second.done.wait(10)
    finally:
        sched.shutdown()
    assert first.responses == [[1] + [5] * 30] and first.error is None  # ran to its end, prompt prefix
    assert second.responses == [[]] and second.final  # stopped while queued: a FINAL with 0 tokens
    assert not sched.request_stop("dup")


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
    for module in (MODEL_DIR / "1").glob("*.py"):
        shutil.copy2(module, target / "1" / module.name)
    template = string.Template((MODEL_DIR / "config.pbtxt").read_text())
    (target / "config.pbtxt").write_text(
        template.substitute(
            triton_max_batch_size=4, decoupled_mode="true", max_queue_delay_microseconds=0,
            hf_model_dir=str(CHECKPOINT), max_input_len=512, max_seq_len=1024,
            exclude_input_in_output="true", torch_threads=0,
            guided_decoding_backend="xgrammar", tokenizer_dir=str(CHECKPOINT),
            lora_weights_datatype="TYPE_FP32", lora_plugin="", max_lora_rank="", lora_target_modules="",
            lora_model_shape="", lora_cache_host_memory_bytes="",  # LoRA off (tests/test_lora_reference.py has it on)
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
        stop_at_once(server)


def _stream(url: str, payload: dict, timeout: float = 120.0):
    """POST generate_stream; returns (HTTP status, [(monotonic time, event dict)])."""
    events = []
    with httpx.Client(timeout=timeout, verify=default_ssl_context()) as client:
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
    payload = _payload(
        ids, 16, streaming=[False], exclude_input_in_output=[False], return_log_probs=[True], end_id=[EOS]
    )
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
    assert "Prompt length (600) exceeds maximum input length (512)" in events[0][1]["error"]
    bad = _payload(prompt_ids["haiku"], 4)
    bad["request_output_len"] = 0  # a bare scalar works as well
    status, events = _stream(triton_url, bad)
    assert status == 400 and "Assertion failed: mMaxNewTokens > 0" in events[0][1]["error"]
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


def test_parse_request_clamps_top_k_to_the_sampling_layers_maximum():
    """topKSamplingLayer.cpp ``setup``: a top_k above TOP_K_MAX (1024, samplingTopKKernels.h) is clamped to
    it with a log warning; the request runs (the predictor's schema refuses such values before)."""
    parsed = ref.parse_request(request_getter(input_ids=[7, 8], input_lengths=2, request_output_len=2,
                                              runtime_top_k=5000), LIMITS)
    assert parsed.params.top_k == ref.TOP_K_MAX == 1024
    assert parsed.warnings == [
        "TopK (5000) is larger than max supported number (1024). Clip to max supported number."
    ]
    at_max = ref.parse_request(request_getter(input_ids=[7], input_lengths=1, request_output_len=1,
                                              runtime_top_k=1024), LIMITS)
    assert at_max.params.top_k == 1024 and at_max.warnings == []
