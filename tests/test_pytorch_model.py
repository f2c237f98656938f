"""Unit tests of the PyTorch-backend ``tensorrt_llm`` model (triton_model_repo/tensorrt_llm_pytorch/1/model.py).

Its behaviour towards clients is tested in a real Triton (tests/test_conformance.py, both implementations).
Here the model runs outside Triton, with a recording pb_utils (tests/fake_pb_utils.py) over the LLM API
stand-in, for what a test must observe inside it: which thread sends and asks ``is_cancelled()``, how
``generate_async`` is called (``streaming`` as a keyword, the ``SamplingParams`` and ``LoRARequest`` built from
the tensors), what each sampler is given or refused, the inherited MPI environment, an ``LLM(...)`` that fails,
and ``finalize``. The two mocks are said so: pb_utils (Triton cannot be driven thread by thread) and
TensorRT-LLM (not installable here).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests import fake_pb_utils
from tests.fake_pb_utils import FakeRequest, FakeSender
from tests.llmapi_overlay import standin_imported

EOS = 2


@pytest.fixture(scope="module")
def trtllm():
    with standin_imported() as module:
        yield module


@pytest.fixture(scope="module")
def model_module(pytorch_model_module, trtllm):
    """The model.py of a rendered repository (conftest's ``pytorch_model_module``), the stand-in importable."""
    return pytorch_model_module


@pytest.fixture(scope="module")
def prompt(hf_tokenizer) -> list[int]:
    enc = hf_tokenizer.apply_chat_template([{"role": "user", "content": "Write a haiku about the sea."}],
                                           add_generation_prompt=True, tokenize=True)
    return list(enc["input_ids"] if not isinstance(enc, list) else enc)


@pytest.fixture(scope="module")
def greedy(trtllm, checkpoint_dir, prompt):
    """The stand-in LLM's greedy tokens for the prompt (the stand-in itself is checked against transformers in
    tests/test_llmapi_standin.py)."""
    import asyncio

    llm = trtllm.LLM(str(checkpoint_dir))

    async def main():
        out = llm.generate_async(prompt, sampling_params=trtllm.SamplingParams(end_id=-1, max_tokens=24, top_k=1))
        return list((await out).outputs[0].token_ids)

    try:
        return asyncio.run(main())
    finally:
        llm.shutdown()


class Spy:
    """Records every generate_async call's arguments and every LLM(...) call's keywords."""

    def __init__(self, trtllm, monkeypatch, model=None) -> None:
        self.calls: list = []
        self.built: list = []
        spy = self
        if model is not None:  # a model built already: record its LLM's calls
            original = model.llm.generate_async

            def record(*args, **kwargs):
                spy.calls.append((args, kwargs))
                return original(*args, **kwargs)

            monkeypatch.setattr(model.llm, "generate_async", record)

        class SpyLLM(trtllm.LLM):
            def __init__(self, *args, **kwargs):
                spy.built.append(kwargs)
                super().__init__(*args, **kwargs)

            def generate_async(self, *args, **kwargs):
                spy.calls.append((args, kwargs))
                return super().generate_async(*args, **kwargs)

        monkeypatch.setattr(trtllm, "LLM", SpyLLM)


def make(model_module, llm_args=None, parameters=None):
    """An initialized model; ``llm_args`` replaces llm_args.json's (through the load_llm_args hook)."""
    instance = model_module.TritonPythonModel()
    if llm_args is not None:
        instance.load_llm_args = lambda params: dict(llm_args)
    params = {k: {"string_value": v} for k, v in (parameters or {"exclude_input_in_output": "false"}).items()}
    config = {"model_transaction_policy": {"decoupled": True}, "parameters": params}
    instance.initialize({"model_config": json.dumps(config)})
    return instance


@pytest.fixture()
def model(model_module):
    instance = make(model_module)
    yield instance
    instance.finalize()


def body(prompt, n, **extra):
    tensors = {"input_ids": prompt, "input_lengths": [len(prompt)], "request_output_len": [n], "runtime_top_k": [1]}
    tensors.update(extra)
    return tensors


def run(model, request, timeout=60):
    model.execute([request])
    assert request.sender.final.wait(timeout), "no final response"
    return request.sender


# ------------------------------------------------------------------------------------------------
# hosting: threads, the LLM call, streaming
# ------------------------------------------------------------------------------------------------


def test_streaming_sends_each_new_id_from_the_response_thread_with_streaming_as_a_keyword(
        model_module, trtllm, monkeypatch, prompt, greedy):
    spy = Spy(trtllm, monkeypatch)
    model = make(model_module)
    try:
        sender = run(model, FakeRequest("s1", **body(prompt, 5, streaming=[True], end_id=[-1])))
    finally:
        model.finalize()
    assert sender.tokens() == greedy[:5]
    flags = [flags for _, flags, _ in sender.sent]
    assert flags[-1] == 1 and set(flags[:-1]) <= {0}  # one response per step (or more steps' tokens in one)
    (thread,) = {thread for _, _, thread in sender.sent}  # one request's responses all come from one thread
    assert thread.startswith("trtllm-pytorch-responses-") and sender.cancel_threads <= {thread}
    (args, kwargs), = spy.calls
    assert args == (prompt,) and kwargs["streaming"] is True and kwargs["lora_request"] is None
    params = kwargs["sampling_params"]
    # no seed given: none passed (TorchSampler, the default, takes none; the C++ decoder's default is 0)
    assert (params.top_k, params.end_id, params.max_tokens, params.seed, params.detokenize) == (1, -1, 5, None, False)


def test_a_request_reads_its_inputs_once(model, prompt, greedy):
    """Every input the model asks for (some 30 names) comes from one read of the request's inputs: in Triton each
    ``get_input_tensor_by_name`` reads them all again (tests/fake_pb_utils.py does as upstream)."""
    request = FakeRequest(**body(prompt, 2, streaming=[True], end_id=[-1], temperature=[0.5], runtime_top_p=[0.9]))
    assert run(model, request).tokens() == greedy[:2]
    assert request.inputs_calls == 1


def test_the_llm_is_built_from_llm_args_json(model_module, trtllm, monkeypatch, checkpoint_dir):
    spy = Spy(trtllm, monkeypatch)
    model = make(model_module)
    model.finalize()
    assert spy.built == [{"model": str(checkpoint_dir), "max_batch_size": 4}]


@pytest.fixture()
def trtllm_sampler_model(model_module, checkpoint_dir):
    """A model whose LLM samples with TRTLLMSampler (sampler_type), which applies every sampling input."""
    instance = make(model_module, {"model": str(checkpoint_dir), "max_batch_size": 4, "sampler_type": "TRTLLMSampler"})
    yield instance
    instance.finalize()


def test_sampling_values_become_llm_api_sampling_params(trtllm_sampler_model, trtllm, monkeypatch, prompt):
    """translate.py: C++ greedy rules become top_k=1; otherwise the values pass (TRTLLMSampler takes them all); no
    end_id becomes -1."""
    model = trtllm_sampler_model
    assert model.sampler == "TRTLLMSampler"
    spy = Spy(trtllm, monkeypatch, model)
    cases = [
        ({"runtime_top_k": [0], "runtime_top_p": [0.0], "temperature": [1.3]}, {"top_k": 1}),  # top_p <= 0: unset
        ({"runtime_top_k": [0], "temperature": [0.0], "runtime_top_p": [0.9]}, {"top_k": 1}),
        ({"runtime_top_k": [40], "runtime_top_p": [0.9], "temperature": [0.7], "seed": [11],
          "repetition_penalty": [1.2], "presence_penalty": [0.5], "frequency_penalty": [0.25], "min_tokens": [2],
          "end_id": [EOS]},
         {"top_k": 40, "top_p": pytest.approx(0.9), "temperature": pytest.approx(0.7), "seed": 11,
          "repetition_penalty": pytest.approx(1.2), "presence_penalty": 0.5, "frequency_penalty": 0.25,
          "min_tokens": 2, "end_id": EOS}),
    ]
    for extra, expected in cases:
        run(model, FakeRequest(**{**body(prompt, 2, streaming=[True]), **extra}))
        params = spy.calls[-1][1]["sampling_params"]
        got = {key: getattr(params, key) for key in expected}
        assert got == expected, extra
    assert spy.calls[0][1]["sampling_params"].end_id == -1  # no end_id: no end token
    run(model, FakeRequest(**body(prompt, 2, streaming=[True], end_id=[EOS], pad_id=[7])))
    params = spy.calls[-1][1]["sampling_params"]
    assert (params.end_id, params.pad_id) == (EOS, 7)  # the request's pad_id (else the LLM API's: end_id)


def test_the_end_token_is_dropped_and_leaves_an_empty_final_response(model, prompt, hf_tokenizer):
    enc = hf_tokenizer.apply_chat_template([{"role": "user", "content": "Answer with one word: is water wet?"}],
                                           add_generation_prompt=True, tokenize=True)
    ids = list(enc["input_ids"] if not isinstance(enc, list) else enc)
    sender = run(model, FakeRequest(**body(ids, 16, streaming=[True], end_id=[EOS])))
    last = sender.sent[-1][0]
    assert last.tensor("output_ids").shape == (1, 1, 0) and last.tensor("sequence_length").tolist() == [[0]]
    assert EOS not in sender.tokens() and 0 < len(sender.tokens()) < 16


def test_non_streaming_returns_prompt_and_generated_unless_excluded(model, prompt, greedy):
    sender = run(model, FakeRequest(**body(prompt, 3, end_id=[-1])))
    assert sender.tokens() == prompt + greedy[:3] and len(sender.sent) == 1
    sender = run(model, FakeRequest(**body(prompt, 3, end_id=[-1], exclude_input_in_output=[True])))
    assert sender.tokens() == greedy[:3]


def test_stop_words_end_the_request_over_prompt_and_output(model, trtllm, monkeypatch, prompt, greedy):
    """stopWordsCriterion semantics, in the model: a word may start in the prompt; the matched tokens stay."""
    spy = Spy(trtllm, monkeypatch, model)
    words = [prompt[-1], greedy[0]]
    flat = words + [2, -1]
    sender = run(model, FakeRequest(**body(prompt, 8, end_id=[-1], exclude_input_in_output=[True],
                                           stop_words_list=[flat[:2], flat[2:]])))
    assert sender.tokens() == greedy[:1]
    assert spy.calls[-1][1]["streaming"] is True  # the model watches the tokens as they come
    in_prompt, later = prompt[-3:-1], greedy[2:4]
    sender = run(model, FakeRequest(**body(prompt, 8, streaming=[True], end_id=[-1], stop_words_list=[
        in_prompt + later, [2, 4, -1, -1]])))
    assert sender.tokens() == greedy[:4] and sender.sent[-1][1] == 1


# ------------------------------------------------------------------------------------------------
# stop, cancellation, errors
# ------------------------------------------------------------------------------------------------


def test_a_stop_request_aborts_the_latest_request_with_its_id(model, prompt, greedy):
    """The C++ backend's one entry per request id: a later request with the id replaces it; the stop reaches
    that one only, and after it ended, nothing (the earlier request runs to its end)."""
    earlier = FakeRequest("twice", **body(prompt, 24, streaming=[True], end_id=[-1]))
    later = FakeRequest("twice", **body(prompt, 400, streaming=[True], end_id=[-1]))
    model.execute([earlier, later])
    assert later.sender.first.wait(60)
    model.execute([FakeRequest("twice", input_lengths=[1], request_output_len=[1], stop=[True])])
    assert later.sender.final.wait(60) and earlier.sender.final.wait(60)
    assert len(later.sender.tokens()) < 400 and earlier.sender.tokens() == greedy[:24]


def test_a_stop_request_aborts_the_request_with_its_id(model, prompt):
    running = FakeRequest("stop-me", **body(prompt, 400, streaming=[True], end_id=[-1]))
    model.execute([running])
    assert running.sender.first.wait(60)
    stop = FakeRequest("stop-me", input_lengths=[1], request_output_len=[1], stop=[True])
    model.execute([stop])
    assert stop.sender.sent and stop.sender.sent[0][1] == 1 and stop.sender.sent[0][0].error is None
    assert stop.sender.sent[0][0].output_tensors == []
    assert running.sender.final.wait(60)
    assert len(running.sender.tokens()) < 400 and running.sender.errors() == []
    unknown = FakeRequest("nobody", input_lengths=[1], request_output_len=[1], stop=[True])
    model.execute([unknown])
    assert unknown.sender.errors() == [] and unknown.sender.sent[0][1] == 1
    anonymous = FakeRequest("", input_lengths=[1], request_output_len=[1], stop=[True])
    model.execute([anonymous])
    assert anonymous.sender.errors() == ["Trying to stop a request but request ID is not provided"]


def test_triton_cancellation_aborts_the_generation(model, prompt, model_module):
    fake_pb_utils.Logger.lines.clear()
    request = FakeRequest("gone", **body(prompt, 400, streaming=[True], end_id=[-1]))
    model.execute([request])
    assert request.sender.first.wait(60)
    request.sender.cancelled = True
    assert request.sender.final.wait(60)
    assert len(request.sender.tokens()) < 400
    assert any("request 'gone' cancelled by the client after" in line for _, line in fake_pb_utils.Logger.lines)
    assert request.sender.cancel_threads == {thread for _, _, thread in request.sender.sent}  # the same one thread


def test_stream_interval_joins_a_requests_tokens_the_first_at_once(model, prompt, greedy):
    """stream_interval_ms (this model's own optional input): the first token leaves at once, the rest are held
    until the interval passed or the request ends (here 10 s: every later token comes with the final response);
    without it, each step's tokens (the C++ backend's responses: tests/test_conformance.py)."""
    sender = run(model, FakeRequest(**body(prompt, 6, streaming=[True], end_id=[-1], stream_interval_ms=[10_000])))
    shapes = [(r.tensor("output_ids").reshape(-1).tolist(), flags) for r, flags, _ in sender.sent]
    assert shapes == [(greedy[:1], 0), (greedy[1:6], 1)]
    sender = run(model, FakeRequest(**body(prompt, 6, streaming=[True], end_id=[-1], stream_interval_ms=[0])))
    assert sender.tokens() == greedy[:6] and len(sender.sent) >= 2
    sender = run(model, FakeRequest(**body(prompt, 2, streaming=[True], stream_interval_ms=[-5])))
    assert sender.errors() == ["stream_interval_ms must be 0 (every step's tokens) to 10000 milliseconds, got -5"]


def test_a_requests_first_response_is_sent_before_the_others_waiting(model, model_module):
    """The response thread sends what waits for it one request after another; a request's first response (its time
    to first token) goes before other requests' later ones, each request's own responses in order."""
    order: list[str] = []

    class Recording(FakeSender):
        def __init__(self, name):
            super().__init__()
            self.name = name

        def send(self, response=None, flags=0):
            order.append(self.name)
            super().send(response, flags)

    running = model_module.InFlightRequest(1, "running", Recording("running"), object(), answered=True)
    new = model_module.InFlightRequest(2, "new", Recording("new"), object())
    queued = model_module.QueuedTokens
    model._send_merged([queued(running, [5], None, None, False), queued(new, [7], None, None, False),
                        queued(running, [6], None, None, False)])
    assert order == ["new", "running"] and running.sender.tokens() == [5, 6] and new.answered


def test_a_requests_waiting_responses_join_and_its_error_follows_its_tokens(model, model_module):
    """What waits for the response thread together becomes one response per request: the tokens and log-probs
    joined in order, the latest cumulative log-prob; a final response stays apart (its shape is the LLM's), and an
    error response goes after the tokens queued before it."""
    streamed = model_module.InFlightRequest(1, "streamed", FakeSender(), object(), answered=True)
    failed = model_module.InFlightRequest(2, "failed", FakeSender(), object(), answered=True)
    tokens, error = model_module.QueuedTokens, model_module.QueuedError
    model._send_merged([tokens(streamed, [5], [-0.5], -0.5, False), tokens(failed, [7], None, None, False),
                        tokens(streamed, [6], [-0.25], -0.75, False), error(failed, model_module.error_response("boom")),
                        tokens(streamed, [], [], -0.75, True)])
    (first, flags, _), (last, last_flags, _) = streamed.sender.sent
    assert first.tensor("output_ids").tolist() == [[[5, 6]]] and flags == 0
    assert first.tensor("output_log_probs").tolist() == [[[-0.5, -0.25]]]
    assert first.tensor("cum_log_probs").tolist() == [[-0.75]]
    assert last.tensor("output_ids").shape == (1, 1, 0) and last_flags == 1
    assert [(r.error is None, flags) for r, flags, _ in failed.sender.sent] == [(True, 0), (False, 1)]
    assert failed.sender.tokens() == [7] and failed.sender.errors() == ["boom"]


def _stop(instance, request, how):
    if how == "stop":
        instance.execute([FakeRequest(request.request_id(), input_lengths=[1], request_output_len=[1], stop=[True])])
    else:
        request.sender.cancelled = True


def _logged(phrase):
    return sum(phrase in line for _, line in fake_pb_utils.Logger.lines)


@pytest.mark.parametrize("how", ["stop", "cancel"])
def test_a_stopped_request_still_waiting_ends_after_the_unanswered_bound_and_leaves_no_worker_entry(
        model_module, checkpoint_dir, prompt, how):
    """TensorRT-LLM 1.2.1 drops an aborted request that waits for a batch slot without any response, and its entry in
    the worker's _results stays for the LLM's life (the stand-in does both: tests/test_llmapi_standin.py). The model
    does not abort a request the LLM has not answered: it ends it for the client (a stopped request's final response,
    no tokens) once unanswered_stop_timeout_ms passed, while the slot's holder runs on, and aborts it in the LLM when
    it gets a slot, so that the LLM answers it and the worker's entry goes."""
    fake_pb_utils.Logger.lines.clear()
    instance = make(model_module, {"model": str(checkpoint_dir), "max_batch_size": 1},
                    {"exclude_input_in_output": "false", "cancellation_check_period_ms": "50",
                     "unanswered_stop_timeout_ms": "200"})
    results = instance.llm._executor.results
    try:
        active = FakeRequest("active", **body(prompt, 400, streaming=[True], end_id=[-1]))
        waiting = FakeRequest("waiting", **body(prompt, 400, streaming=[True], end_id=[-1]))
        instance.execute([active])
        assert active.sender.first.wait(60)
        instance.execute([waiting])
        deadline = time.monotonic() + 30  # only "not hung": the model hands it to the LLM at once
        while len(results) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(results) == 2, "the waiting request never reached the LLM"
        _stop(instance, waiting, how)
        assert waiting.sender.final.wait(60), "the waiting request never ended"
        assert not active.sender.final.is_set()  # it ended while the slot's holder still generated
        assert waiting.sender.errors() == [] and waiting.sender.tokens() == []
        last = waiting.sender.sent[-1]
        assert last[1] == 1 and last[0].tensor("output_ids").shape == (1, 1, 0)  # a stopped request's final
        assert _logged("request 'waiting' was stopped while waiting for a batch slot") == 1
        assert len(results) == 2, "not aborted in the LLM while it waits (1.2.1 would drop it and keep its entry)"
        _stop(instance, active, how)
        assert active.sender.final.wait(60)
        # only "not hung": the waiting request gets the slot, answers, is aborted; the worker drops its entry as it
        # dispatches the final response, which the model's event loop then reads (and forgets the request)
        deadline = time.monotonic() + 60
        while (results or instance._submitted) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not results, f"worker entries left: {list(results)}"
        assert not instance._submitted
    finally:
        instance.finalize()


@pytest.mark.parametrize("how", ["stop", "cancel"])
def test_a_slow_abort_never_cuts_an_active_request_short(model_module, trtllm, checkpoint_dir, prompt, monkeypatch,
                                                         how):
    """An abort reaches 1.2.1's executor at its next iteration, through the proxy and the worker: under load that
    takes longer than a cancellation period (LLMAPI_STANDIN_ABORT_DELAY_MS: 700 ms here, against a 50 ms period and a
    100 ms unanswered bound). A request the LLM has answered is never ended by the model: its final response is
    the LLM's 'cancelled' one, and the client gets every token the LLM made, the ones after the stop included."""
    fake_pb_utils.Logger.lines.clear()
    monkeypatch.setenv("LLMAPI_STANDIN_ABORT_DELAY_MS", "700")
    outputs = []
    original = trtllm.LLM.generate_async

    def record(self, *args, **kwargs):
        outputs.append(original(self, *args, **kwargs))
        return outputs[-1]

    monkeypatch.setattr(trtllm.LLM, "generate_async", record)
    instance = make(model_module, {"model": str(checkpoint_dir), "max_batch_size": 2, "max_seq_len": 512},
                    {"exclude_input_in_output": "false", "cancellation_check_period_ms": "50",
                     "unanswered_stop_timeout_ms": "100"})
    try:
        active = FakeRequest("active", **body(prompt, 400, streaming=[True], end_id=[-1]))
        instance.execute([active])
        assert active.sender.first.wait(60)
        at_stop = len(active.sender.tokens())
        _stop(instance, active, how)
        assert active.sender.final.wait(60)
        (output,) = outputs
        assert output.finished and output.outputs[0].finish_reason == "cancelled"
        got = active.sender.tokens()
        assert got == list(output.outputs[0].token_ids) and at_stop < len(got) < 400, (at_stop, len(got))
        assert active.sender.errors() == []
        assert _logged("was stopped while waiting for a batch slot") == 0
        assert not instance.llm._executor.results
    finally:
        instance.finalize()


def test_a_known_lora_id_with_another_adapter_is_refused(model_module, trtllm, monkeypatch, checkpoint_dir, prompt,
                                                         tmp_path):
    """The LLM API caches an adapter under its id and would serve it for any later folder (base_worker.py
    _load_lora_adapter): another adapter under a known id is refused; the same adapter in another folder is not."""
    from tests.lora_adapters import make_adapter

    spy = Spy(trtllm, monkeypatch)
    first = make_adapter(checkpoint_dir, tmp_path / "first", r=4, alpha=8, targets=["q_proj"], seed=3)
    other = make_adapter(checkpoint_dir, tmp_path / "other", r=4, alpha=8, targets=["q_proj"], seed=4)
    same = shutil.copytree(first, tmp_path / "copy-of-first")
    lora = make(model_module, {"model": str(checkpoint_dir), "lora_config": {"max_lora_rank": 8}})
    try:
        for path in (first, same):
            sender = run(lora, FakeRequest(**body(prompt, 2, lora_task_id=[77], lora_path=[str(path)])))
            assert sender.errors() == [], path
        served = len(spy.calls)
        sender = run(lora, FakeRequest(**body(prompt, 2, lora_task_id=[77], lora_path=[str(other)])))
        (error,) = sender.errors()
        assert f"lora_task_id 77 was first served with the adapter in {first}, and {other} holds another" in error
        assert "give each adapter its own lora_task_id" in error and len(spy.calls) == served
        sender = run(lora, FakeRequest(**body(prompt, 2, lora_task_id=[78], lora_path=[str(other)])))
        assert sender.errors() == [] and spy.calls[-1][1]["lora_request"].lora_int_id == 78
    finally:
        lora.finalize()


def test_a_slow_sender_gets_several_steps_tokens_in_one_response(model, prompt, greedy):
    """Each send is a round trip to Triton's process; when sends take longer than the steps, what waits for one
    request goes in one response (the tokens in order, the final flag on the last), not one send per step."""
    import threading
    import time

    request = FakeRequest("slow", **body(prompt, 24, streaming=[True], end_id=[-1]))
    gate = threading.Event()
    request.sender = FakeSender(gate=gate)  # the first send returns only once the LLM made all 24 tokens
    model.execute([request])
    deadline = time.monotonic() + 60  # only "not hung"
    while time.monotonic() < deadline and not any(
            r.request_id == "slow" and len(r.tokens) == 24 for r in list(model._in_flight.values())):
        time.sleep(0.01)
    gate.set()
    assert request.sender.final.wait(60)
    assert request.sender.tokens() == greedy[:24]
    # the first step's response, then the 22 steps that waited as one, then the final response as made
    assert [(len(r.tensor("output_ids").reshape(-1)), flags) for r, flags, _ in request.sender.sent] == [
        (1, 0), (22, 0), (1, 1)]


@pytest.mark.parametrize("extra, text", [
    ({"runtime_top_p": [1.5]}, "Assertion failed: topP.value() <= 1.f"),
    ({"temperature": [-0.5]}, "Assertion failed: temperature.value() >= 0.f"),
    ({"repetition_penalty": [0.0]}, "Assertion failed: repetitionpenalty.value() > 0.f"),
    ({"request_output_len": [0]}, "Assertion failed: mMaxNewTokens > 0"),
    ({"end_id": [49152]}, "EndId (49152) is not within acceptable range [-1, 49152)."),
    ({"beam_width": [2]}, "beam_width must be 1"),
    ({"guided_decoding_guide_type": ["json"]}, "GuidedDecoder is not setup"),
    ({"lora_task_id": [3], "lora_path": ["/x"]}, "its LLM arguments have no lora_config"),
])
def test_invalid_requests_get_the_cpp_backends_text(model, prompt, extra, text):
    sender = run(model, FakeRequest(**{**body(prompt, 2, streaming=[True]), **extra}))
    (error,) = sender.errors()
    assert text in error and sender.sent[-1][1] == 1


def test_multi_token_bad_words_are_refused_single_ones_banned(trtllm_sampler_model, trtllm, monkeypatch, prompt):
    spy = Spy(trtllm, monkeypatch, trtllm_sampler_model)
    sender = run(trtllm_sampler_model, FakeRequest(**body(prompt, 2, streaming=[True], bad_words_list=[[5, 6], [2, -1]])))
    (error,) = sender.errors()
    assert "takes single-token bad words only" in error
    run(trtllm_sampler_model, FakeRequest(**body(prompt, 2, streaming=[True], bad_words_list=[[5, 6], [1, 2]])))
    assert spy.calls[-1][1]["sampling_params"].bad_token_ids == [5, 6]


# ------------------------------------------------------------------------------------------------
# the sampler: what TorchSampler (1.2.1's default) would ignore is refused
# ------------------------------------------------------------------------------------------------

SAMPLING = {"runtime_top_k": [0], "runtime_top_p": [0.9], "temperature": [0.8]}


@pytest.mark.parametrize("extra, phrase", [
    ({"repetition_penalty": [1.3]}, "repetition_penalty=1.3 cannot be applied here: leave repetition_penalty out"),
    ({"presence_penalty": [0.5]}, "presence_penalty=0.5 cannot be applied here: leave presence_penalty out"),
    ({"frequency_penalty": [-0.5]}, "frequency_penalty=-0.5 cannot be applied here: leave frequency_penalty out"),
    ({"min_tokens": [4], "end_id": [EOS]}, "min_tokens=4 cannot be applied here: leave min_tokens out"),
    ({"bad_words_list": [[5], [1]]}, "bad_words_list cannot be applied here: leave it out"),
    ({"seed": [11], **SAMPLING}, "seed=11 cannot be applied here: leave seed out, or set temperature to 0"),
    ({"return_log_probs": [True], **SAMPLING}, "return_log_probs with sampling cannot be applied here: set "
                                               "temperature to 0"),
])
def test_inputs_torch_sampler_would_ignore_are_refused_saying_what_the_caller_can_do(model, trtllm, monkeypatch,
                                                                                   prompt, extra, phrase):
    """TensorRT-LLM 1.2.1's TorchSampler (sampler_type auto) ignores them (tensorrtllm_backend/samplers.py has the
    sources): the request is refused before the LLM sees it. The error leads with what the caller can do (leave the
    input out; temperature 0 for a seed or log-probs), then why; the operator's remedy (the sampler setting) is in
    the model's log, not in the caller's error."""
    assert model.sampler == "TorchSampler"
    spy = Spy(trtllm, monkeypatch, model)
    fake_pb_utils.Logger.lines.clear()
    sender = run(model, FakeRequest("refused", **{**body(prompt, 2, streaming=[True]), **extra}))
    (error,) = sender.errors()
    assert error.startswith(phrase) and "TorchSampler" in error, error
    assert "COG_TRITON_LLM_SAMPLER" not in error and "PR #" not in error
    (line,) = [line for _, line in fake_pb_utils.Logger.lines if "request 'refused'" in line]
    assert "COG_TRITON_LLM_SAMPLER=TRTLLMSampler" in line and phrase.split("=")[0].split(" ")[0] in line, line
    assert spy.calls == []


def test_greedy_requests_keep_seed_and_log_probs_under_torch_sampler(model, trtllm, monkeypatch, prompt, greedy):
    """Greedy decoding: a seed changes nothing (accepted, not passed) and the arg-max TorchSampler reports is the
    generated token, so its log-probability is returned."""
    spy = Spy(trtllm, monkeypatch, model)
    sender = run(model, FakeRequest(**body(prompt, 4, streaming=[True], end_id=[-1], seed=[5],
                                           return_log_probs=[True])))
    assert sender.errors() == [] and sender.tokens() == greedy[:4]
    params = spy.calls[-1][1]["sampling_params"]
    assert params.seed is None and params.logprobs == 1
    log_probs = [float(v) for r, _, _ in sender.sent for v in r.tensor("output_log_probs").reshape(-1)]
    assert len(log_probs) == 4 and all(v <= 0 for v in log_probs)


def test_log_probs_are_the_sampled_tokens_under_trtllm_sampler(trtllm_sampler_model, prompt, hf_model):
    """TRTLLMSampler reports the sampled token's log-probability: each value is log_softmax of the logits (with the
    temperature, as the CPU reference model reports it) at the token that was generated."""
    import torch

    sender = run(trtllm_sampler_model, FakeRequest(**body(prompt, 8, streaming=[True], end_id=[-1], seed=[3],
                                                          return_log_probs=[True], runtime_top_k=[0],
                                                          runtime_top_p=[1.0], temperature=[2.0])))
    tokens = sender.tokens()
    got = [float(v) for r, _, _ in sender.sent for v in r.tensor("output_log_probs").reshape(-1)]
    with torch.inference_mode():
        logits = hf_model(torch.tensor([prompt + tokens])).logits[0].float()
    expected = [float(torch.log_softmax(logits[len(prompt) - 1 + i] / 2.0, dim=-1)[t]) for i, t in enumerate(tokens)]
    assert got == pytest.approx(expected, abs=2e-3)
    # the sampled tokens are not all the arg-max ones (else this test could not tell the two apart)
    assert any(int(torch.argmax(logits[len(prompt) - 1 + i])) != t for i, t in enumerate(tokens))


def test_requested_outputs_must_include_output_ids(model, prompt):
    sender = run(model, FakeRequest(requested=["sequence_length"], **body(prompt, 2)))
    assert sender.errors() == ["Error encountered while populating response: output_ids tensor must be present in "
                               "list of output tensors"]


def test_an_llm_error_of_the_request_is_its_error_response(model, prompt):
    """The LLM's own refusal (here the stand-in's _check_arguments) reaches the client as an error response."""
    instance = model
    long_prompt = (prompt * 400)[:9000]  # more than max_num_tokens (8192), chunked prefill off
    sender = run(instance, FakeRequest(**body(long_prompt, 2)))
    (error,) = sender.errors()
    assert "should not exceed max_num_tokens (8192)" in error


# ------------------------------------------------------------------------------------------------
# guided decoding and LoRA mapping
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("guide_type, guide, field, value", [
    ("json", None, "json_object", True),
    ("json_schema", '{"type": "object"}', "json", '{"type": "object"}'),
    ("regex", "[0-9]+", "regex", "[0-9]+"),
    ("ebnf_grammar", 'root ::= "a"', "grammar", 'root ::= "a"'),
])
def test_guides_become_guided_decoding_params(model_module, trtllm, monkeypatch, checkpoint_dir, prompt, guide_type,
                                              guide, field, value):
    spy = Spy(trtllm, monkeypatch)
    guided = make(model_module, {"model": str(checkpoint_dir), "guided_decoding_backend": "xgrammar"})
    try:
        extra = {"guided_decoding_guide_type": [guide_type]}
        if guide is not None:
            extra["guided_decoding_guide"] = [guide]
        run(guided, FakeRequest(**body(prompt, 3, streaming=[True], end_id=[EOS], **extra)))
    finally:
        guided.finalize()
    params = spy.calls[-1][1]["sampling_params"].guided_decoding
    assert getattr(params, field) == value


def test_lora_path_and_id_become_a_lora_request(model_module, trtllm, monkeypatch, checkpoint_dir, prompt, tmp_path):
    spy = Spy(trtllm, monkeypatch)
    from tests.lora_adapters import make_adapter

    adapter = make_adapter(checkpoint_dir, tmp_path / "adapter", r=4, alpha=8, targets=["q_proj"], seed=3)
    lora = make(model_module, {"model": str(checkpoint_dir), "lora_config": {"max_lora_rank": 8}},
                {"exclude_input_in_output": "false", "adapter_snapshot_dir": str(tmp_path / "snapshots")})
    try:
        run(lora, FakeRequest(**body(prompt, 2, lora_task_id=[77], lora_path=[str(adapter)])))
        request = spy.calls[-1][1]["lora_request"]
        assert (request.lora_int_id, request.lora_name) == (77, "lora_77")
        # the LLM reads the model's snapshot of the folder: the same files (hard links), in a folder nobody else removes
        snapshot = Path(request.lora_path)
        assert snapshot.parent.parent == tmp_path / "snapshots"
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            assert (snapshot / name).stat().st_ino == (adapter / name).stat().st_ino
        run(lora, FakeRequest(**body(prompt, 2, lora_task_id=[77])))  # the id alone: the folder it was sent with
        assert spy.calls[-1][1]["lora_request"].lora_path == str(snapshot)
        cases = [
            ({"lora_task_id": [78]}, "LoRA task 78 not found in cache. Please send lora_path with the request"),
            ({"lora_path": [str(adapter)]}, "lora_path was given without lora_task_id"),
            ({"lora_task_id": [77], "lora_weights": [[0.0, 0.0]], "lora_config": [[1, 0, 1]]},
             "lora_weights and lora_config are not supported by the PyTorch backend's tensorrt_llm model"),
            ({"lora_task_id": [79], "lora_path": [str(tmp_path / "missing")]},
             f"lora_path ({tmp_path / 'missing'}) does not exist."),
        ]
        for extra, text in cases:
            sender = run(lora, FakeRequest(**body(prompt, 2, **extra)))
            assert text in " ".join(sender.errors()), extra
    finally:
        lora.finalize()
    assert not snapshot.exists(), "unloading removes the snapshots"


@pytest.fixture(scope="module")
def two_adapters(checkpoint_dir, tmp_path_factory, prompt):
    """Three small adapters (a, b, c) and transformers + peft's greedy tokens with each."""
    from tests.lora_adapters import AdapterFactory

    tmp = tmp_path_factory.mktemp("model_lora")
    factory = AdapterFactory(checkpoint_dir)
    made = {name: factory.make(tmp / name, r=4, alpha=8, targets=["q_proj", "v_proj"], seed=seed)
            for name, seed in (("a", 41), ("b", 42), ("c", 43))}
    expected = {name: factory.greedy(path, prompt, 6, EOS) for name, path in made.items()}
    assert len({tuple(v) for v in expected.values()}) == 3
    return made, expected


def lbody(prompt, task, path=None, **extra):
    """A streamed greedy 6-token request with adapter ``task`` (and its folder ``path``, when given)."""
    if path is not None:
        extra["lora_path"] = [str(path)]
    return body(prompt, 6, end_id=[EOS], streaming=[True], lora_task_id=[task], **extra)


def _damaged(kind, good, tmp_path):
    """A copy of adapter folder ``good`` damaged as ``kind`` says; its path (as a string)."""
    folder = tmp_path / kind
    if kind == "missing":
        return str(folder)
    if kind == "a file":
        folder.write_text("not a folder")
        return str(folder)
    shutil.copytree(good, folder)
    config, weights = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    data = json.loads(config.read_text())
    if kind == "unreadable config":
        config.unlink()
        config.symlink_to(tmp_path / "nowhere")
    elif kind == "bad json":
        config.write_text("{not json")
    elif kind == "no rank":
        data.pop("r")
        config.write_text(json.dumps(data))
    elif kind == "no lora_alpha":
        data.pop("lora_alpha")
        config.write_text(json.dumps(data))
    elif kind == "rank above the limit":
        data["r"] = 16
        config.write_text(json.dumps(data))
    elif kind == "no weights":
        weights.unlink()
    elif kind == "truncated weights":
        weights.write_bytes(weights.read_bytes()[:-64])
    elif kind == "padded weights":
        weights.write_bytes(weights.read_bytes() + b"\0" * 64)
    elif kind == "bad header":
        raw = weights.read_bytes()
        weights.write_bytes((len(raw) * 2).to_bytes(8, "little") + raw[8:])  # a header length past the end
    return str(folder)


DAMAGE = {
    "missing": "does not exist.",
    "a file": "is not a folder",
    "unreadable config": "adapter_config.json cannot be read",
    "bad json": "adapter_config.json is not valid JSON",
    "no rank": "needs the adapter's rank r",
    "no lora_alpha": "needs lora_alpha",
    "rank above the limit": "has rank 16, above the LLM's max_lora_rank 8",
    "no weights": "holds neither adapter_model.safetensors nor adapter_model.bin",
    "truncated weights": "adapter_model.safetensors is damaged or incomplete",
    "padded weights": "adapter_model.safetensors is damaged or incomplete",
    "bad header": "adapter_model.safetensors is damaged or incomplete",
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_bad_adapter_folder_is_the_requests_error_and_the_next_request_is_served(
        model_module, trtllm, monkeypatch, checkpoint_dir, prompt, two_adapters, tmp_path, kind):
    """TensorRT-LLM 1.2.1 loads a new adapter's folder outside its RequestError path, so a folder it cannot read stops
    its worker, the LLM with it (base_worker.py @7b437aaa, worker.py @cc4777e9; the stand-in does the same). The model
    checks every folder first (it exists, is complete, is readable, its rank fits): the request gets an error naming
    the folder and what is wrong, the LLM never sees the folder, and the next request is served."""
    made, expected = two_adapters
    spy = Spy(trtllm, monkeypatch)
    lora = make(model_module, {"model": str(checkpoint_dir), "lora_config": {"max_lora_rank": 8}},
                {"exclude_input_in_output": "false", "adapter_snapshot_dir": str(tmp_path / "snapshots")})
    try:
        path = _damaged(kind, made["b"], tmp_path)
        sender = run(lora, FakeRequest(**lbody(prompt, 5, path)))
        (error,) = sender.errors()
        assert DAMAGE[kind] in error and path in error, error
        assert spy.calls == [], "the LLM never saw the folder"
        sender = run(lora, FakeRequest(**lbody(prompt, 6, made["a"])))
        assert sender.errors() == [] and sender.tokens() == expected["a"]
        assert lora.llm._executor.error is None
    finally:
        lora.finalize()


def test_an_adapter_folder_removed_while_its_id_is_live_is_still_what_the_llm_reads(
        model_module, trtllm, checkpoint_dir, prompt, two_adapters, tmp_path):
    """1.2.1 reads an id's folder again when its adapter cache evicted it (resource_manager.py @d2a5560a
    add_request_peft; the stand-in with max_cpu_loras 1 does so), and a failed read stops its worker. The adapter disk
    cache may evict the folder a request named (or a client remove it) while the id is live in the LLM: the LLM reads
    the model's snapshot, which stays until the LLM is recycled. Here the folder is removed after its first request,
    another adapter evicts it from the LLM's cache, and the id comes again with another copy of the same adapter (as
    the predictor sends a refetched folder), then alone."""
    made, expected = two_adapters
    first = shutil.copytree(made["a"], tmp_path / "fetched-once")
    again = shutil.copytree(made["a"], tmp_path / "fetched-again")
    lora = make(model_module, {"model": str(checkpoint_dir), "lora_config": {"max_lora_rank": 8, "max_cpu_loras": 1}},
                {"exclude_input_in_output": "false", "adapter_snapshot_dir": str(tmp_path / "snapshots")})
    try:
        for task, path in ((10, first), (11, made["b"])):
            sender = run(lora, FakeRequest(**lbody(prompt, task, str(path))))
            assert sender.errors() == []
        shutil.rmtree(first)  # evicted from the adapter disk cache
        for extra in ({"lora_path": [str(again)]}, {}):
            sender = run(lora, FakeRequest(**lbody(prompt, 10, **extra)))
            assert sender.errors() == [] and sender.tokens() == expected["a"], extra
        assert lora.llm._executor.error is None
    finally:
        lora.finalize()


def test_an_llm_whose_worker_stopped_anyway_stops_the_models_process(model_module, checkpoint_dir, prompt):
    """Should 1.2.1's executor worker stop all the same (a load failing after the checks, an OOM: the stand-in's
    worker stops here as 1.2.1's does), the next request gets its error and the one after "LLM is shutting down":
    nothing in the process can bring the LLM back, so the model stops its process (the predictor's supervisor then
    restarts Triton); the requests it was running would never end otherwise."""
    fake_pb_utils.Logger.lines.clear()
    instance = make(model_module, {"model": str(checkpoint_dir)})
    gave_up = []
    instance._give_up = lambda: gave_up.append(True)
    try:
        instance.llm._executor._die(OSError("adapter_model.safetensors: Input/output error"))
        first = run(instance, FakeRequest(**body(prompt, 2, streaming=[True])))
        assert "Input/output error" in " ".join(first.errors()) and gave_up == []
        second = run(instance, FakeRequest(**body(prompt, 2, streaming=[True])))
        assert "LLM is shutting down" in " ".join(second.errors()) and gave_up == [True]
        third = run(instance, FakeRequest(**body(prompt, 2, streaming=[True])))
        assert "the LLM's executor stopped" in " ".join(third.errors()) and gave_up == [True]
    finally:
        instance.finalize()


def _device_bytes(folder) -> int:
    """What the stand-in keeps on the device for an adapter of this checkpoint (float32: 4 bytes a value)."""
    from safetensors.torch import load_file

    return 4 * sum(t.numel() for n, t in load_file(str(folder / "adapter_model.safetensors")).items() if "lora_" in n)


def test_past_max_adapters_per_llm_the_llm_is_recycled_without_cutting_a_request(
        model_module, trtllm, monkeypatch, checkpoint_dir, prompt, two_adapters, tmp_path):
    """1.2.1 keeps every distinct adapter's device tensors for the LLM's life (lora_manager.py @30e6fb55; the stand-in
    with LLMAPI_STANDIN_LORA_DEVICE_BYTES = room for two adapters fails the third load as CUDA does, stopping the
    worker). With max_adapters_per_llm 2, the third distinct adapter recycles the LLM: it waits while the running
    request (adapter a, 60 tokens) runs to its end, then a new LLM serves it; the old LLM's snapshots go, the
    adapter count (a gauge) starts again and the recycles counter counts one."""
    made, expected = two_adapters
    monkeypatch.setenv("LLMAPI_STANDIN_LORA_DEVICE_BYTES", str(2 * _device_bytes(made["a"])))
    fake_pb_utils.MetricFamily.made.clear()
    lora = make(model_module, {"model": str(checkpoint_dir), "max_batch_size": 4, "lora_config": {"max_lora_rank": 8}},
                {"exclude_input_in_output": "false", "adapter_snapshot_dir": str(tmp_path / "snapshots"),
                 "max_adapters_per_llm": "2"})
    families = fake_pb_utils.MetricFamily.made
    gauge = families["cog_triton_llm_lora_adapters"].metrics[0]
    counter = families["cog_triton_llm_recycles"].metrics[0]
    first_llm = lora.llm
    try:
        long_a = FakeRequest("long", **body(prompt, 60, streaming=[True], end_id=[-1], lora_task_id=[1],
                                            lora_path=[str(made["a"])]))
        lora.execute([long_a])
        assert long_a.sender.first.wait(60)
        sender = run(lora, FakeRequest(**lbody(prompt, 2, made["b"])))
        assert sender.errors() == [] and sender.tokens() == expected["b"] and gauge.value() == 2
        old_life = Path(lora._lora_paths[1]).parent
        third = run(lora, FakeRequest(**lbody(prompt, 3, made["c"])))
        assert long_a.sender.final.is_set() and long_a.sender.errors() == [] and len(long_a.sender.tokens()) == 60
        assert third.errors() == [] and third.tokens() == expected["c"]
        assert lora.recycles == 1 and lora.llm is not first_llm and first_llm._executor is None
        assert gauge.value() == 1 and counter.value() == 1 and not old_life.exists()
        again = run(lora, FakeRequest(**lbody(prompt, 1, made["a"])))
        assert again.errors() == [] and again.tokens() == expected["a"] and gauge.value() == 2
    finally:
        lora.finalize()


# ------------------------------------------------------------------------------------------------
# loading, MPI, unloading
# ------------------------------------------------------------------------------------------------


def test_a_failing_llm_fails_initialize_with_its_text(model_module, checkpoint_dir):
    instance = model_module.TritonPythonModel()
    instance.load_llm_args = lambda params: {"model": str(checkpoint_dir), "max_queue_size": 8}
    config = {"model_transaction_policy": {"decoupled": True}, "parameters": {}}
    with pytest.raises(RuntimeError, match="LLM got invalid argument: max_queue_size"):
        instance.initialize({"model_config": json.dumps(config)})
    instance._loop_thread.join(10)
    assert not instance._loop_thread.is_alive()


def test_llm_args_json_must_exist_and_hold_the_model(model_module, tmp_path):
    instance = model_module.TritonPythonModel()
    folder = Path(model_module.__file__).parent
    args_file = folder / "llm_args.json"
    saved = args_file.read_text()
    try:
        args_file.write_text("[1, 2]")
        with pytest.raises(ValueError, match="must hold a JSON object with the LLM's arguments"):
            instance.load_llm_args({})
        args_file.unlink()
        with pytest.raises(ValueError, match="llm_args.json is missing"):
            instance.load_llm_args({})
    finally:
        args_file.write_text(saved)


def test_inherited_mpi_variables_are_removed_when_the_model_is_imported(model_module):
    """A tritonserver started under mpirun passes its rank's variables to the stub; the model removes them before
    tensorrt_llm starts MPI (upstream llmapi model.py @044a90d2), keeping MPI's configuration variables."""
    inherited = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                 "PMIX_RANK": "0", "PMIX_NAMESPACE": "ns", "PMI_SIZE": "2", "OMPI_MCA_orte_ess_num_procs": "2",
                 "ORTE_X": "1", "OMPI_MCA_btl": "tcp,self", "PMIX_MCA_gds": "hash"}
    code = ("import json, os; from tests.modules import load_file; "
            f"load_file('imported_model', {str(model_module.__file__)!r}); "
            "print(json.dumps(sorted(k for k in os.environ if k.startswith(('OMPI', 'PMI', 'ORTE')))))")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **inherited}, cwd=root,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["OMPI_MCA_btl", "PMIX_MCA_gds"]


def test_tensor_parallelism_is_the_llms_to_spawn(model_module, trtllm, monkeypatch, checkpoint_dir):
    """One model process builds one LLM with tensor_parallel_size as given (the LLM spawns its ranks, llm.py
    @4c05a748 MpiPoolSession); no MPI session is made here. The stand-in, like the LLM, needs the GPUs."""
    spy = Spy(trtllm, monkeypatch)
    instance = model_module.TritonPythonModel()
    instance.load_llm_args = lambda params: {"model": str(checkpoint_dir), "tensor_parallel_size": 2}
    config = {"model_transaction_policy": {"decoupled": True}, "parameters": {}}
    before = sys.getswitchinterval()
    with pytest.raises(RuntimeError, match="but 2 are required"):
        instance.initialize({"model_config": json.dumps(config)})
    assert sys.getswitchinterval() == before  # the failed load put the switch interval back
    (kwargs,) = spy.built
    assert kwargs["tensor_parallel_size"] == 2 and "_mpi_session" not in kwargs


def test_finalize_aborts_running_requests_and_shuts_the_llm_down(model_module, prompt):
    model = make(model_module)
    request = FakeRequest("long", **body(prompt, 400, streaming=[True], end_id=[-1]))
    model.execute([request])
    assert request.sender.first.wait(60)
    model.finalize()
    assert request.sender.final.is_set() and len(request.sender.tokens()) < 400
    assert model.llm._executor is None and not model._loop_thread.is_alive()
    late = FakeRequest(**body(prompt, 2))
    model.execute([late])
    assert late.sender.errors() and "not serving" in late.sender.errors()[0]


def test_the_stub_process_switches_threads_every_half_millisecond_while_the_model_is_loaded(model_module):
    """The model's process (Triton's stub) runs its threads with a 0.5 ms switch interval (GIL_SWITCH_INTERVAL_S:
    CPython's 5 ms kept a thread back from a send waiting for the GIL, measured on the device), set before the LLM
    starts and put back by finalize()."""
    original = sys.getswitchinterval()  # another test's model, left loaded, may have set it in this process
    sys.setswitchinterval(0.005)
    try:
        model = make(model_module)
        try:
            assert sys.getswitchinterval() == pytest.approx(0.0005)
        finally:
            model.finalize()
        assert sys.getswitchinterval() == pytest.approx(0.005)
    finally:
        sys.setswitchinterval(original)


def test_requests_are_sent_from_several_threads_each_request_from_one(model, prompt, greedy):
    """Sends are round trips to Triton's process, so several threads send; a request's sends and is_cancelled()
    calls stay on one thread (one sender used from two threads crashed Triton 2.51)."""
    requests = [FakeRequest(f"many-{i}", **body(prompt, 6, streaming=[True], end_id=[-1])) for i in range(8)]
    model.execute(requests)
    threads = set()
    for request in requests:
        assert request.sender.final.wait(60)
        assert request.sender.tokens() == greedy[:6]
        (thread,) = {thread for _, _, thread in request.sender.sent}
        assert request.sender.cancel_threads <= {thread}
        threads.add(thread)
    assert len(threads) == 4, threads
