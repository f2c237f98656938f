"""The LLM API stand-in (benchmarks/llmapi_standin) against the TensorRT-LLM 1.2.1 facts it claims (each module's
docstring cites the upstream file and commit), and its generation against transformers.

The stand-in is the one mock of these tests: TensorRT-LLM cannot run here. What is tested is that it refuses,
accepts and streams what the real LLM API does, so that tests of the PyTorch-backend model over it mean
something.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import re
from pathlib import Path

import pytest
import torch

from tests.llmapi_overlay import standin_imported

EOS = 2
PROMPT = "Write a haiku about the sea."


@pytest.fixture(scope="module")
def trtllm():
    with standin_imported() as module:
        yield module


@pytest.fixture(scope="module")
def prompt(hf_tokenizer) -> list[int]:
    enc = hf_tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                           tokenize=True)
    return list(enc["input_ids"] if not isinstance(enc, list) else enc)


@pytest.fixture(scope="module")
def hf_greedy(hf_model, prompt):
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = hf_model.generate(ids, do_sample=False, max_new_tokens=24, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module")
def llm(trtllm, checkpoint_dir):
    """sampler_type auto: TorchSampler, 1.2.1's default."""
    engine = trtllm.LLM(str(checkpoint_dir), max_batch_size=4, max_seq_len=256)
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def trt_llm(trtllm, checkpoint_dir):
    """sampler_type TRTLLMSampler: the C++ decoder's sampling."""
    engine = trtllm.LLM(str(checkpoint_dir), max_batch_size=4, max_seq_len=256, sampler_type="TRTLLMSampler")
    yield engine
    engine.shutdown()


def collect(llm, inputs, streaming=True, **params):
    """Run one request on a fresh event loop; return the (token_ids_diff, finished, finish_reason) of each step."""
    from tensorrt_llm import SamplingParams

    async def main():
        out = llm.generate_async(inputs, sampling_params=SamplingParams(**params), streaming=streaming)
        steps = []
        async for result in out:
            c = result.outputs[0]
            steps.append((list(c.token_ids_diff), result.finished, c.finish_reason))
        return steps

    return asyncio.run(main())


# ------------------------------------------------------------------------------------------------
# LLM(...) arguments
# ------------------------------------------------------------------------------------------------


def test_an_unknown_llm_argument_is_refused_before_pydantic(trtllm, checkpoint_dir):
    """llm.py @4c05a748 BaseLLM.__init__: keys outside TorchLlmArgs' fields, _mpi_session and backend."""
    with pytest.raises(ValueError, match=r"^LLM got invalid argument: max_queue_size$"):
        trtllm.LLM(str(checkpoint_dir), max_queue_size=4)


def test_nested_configs_forbid_extra_keys(trtllm, checkpoint_dir):
    """llm_args.py @7b437aaa: StrictBaseModel (extra forbid) at every level but lora_config."""
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="kv_cache_config.enable_reuse"):
        trtllm.LLM(str(checkpoint_dir), kv_cache_config={"enable_reuse": True})
    with pytest.raises(ValidationError, match="free_gpu_memory_fraction must be a float between 0 and 1"):
        trtllm.LLM(str(checkpoint_dir), kv_cache_config={"free_gpu_memory_fraction": 1.5})
    with pytest.raises(ValueError, match="stream_interval must be positive, got 0"):
        trtllm.LLM(str(checkpoint_dir), stream_interval=0)


def test_lora_config_is_a_pydantic_model_that_drops_unknown_keys(trtllm):
    """lora_helper.py @585c7565: a pydantic BaseModel (default extra "ignore"), with upstream's field names; an
    unknown key (a misspelt max_lora_rank) is dropped silently on both ways in, so the rank stays 64. That is why
    tensorrtllm_backend/llmapi_args.py checks lora_config's keys itself."""
    from pydantic import BaseModel, ValidationError
    from tensorrt_llm.llmapi import LoraConfig, TorchLlmArgs
    from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict

    assert issubclass(LoraConfig, BaseModel)
    assert set(LoraConfig.model_fields) == {
        "lora_dir", "lora_ckpt_source", "max_lora_rank", "lora_target_modules", "trtllm_modules_to_hf_modules",
        "max_loras", "max_cpu_loras", "swap_gate_up_proj_lora_b_weight"}
    args = update_llm_args_with_extra_dict({}, {"model": "m", "lora_config": {"max_rank": 8}})
    assert args["lora_config"].max_lora_rank == 64 and not hasattr(args["lora_config"], "max_rank")
    assert TorchLlmArgs(model="m", lora_config={"max_rank": 8}).lora_config.max_lora_rank == 64
    assert LoraConfig().swap_gate_up_proj_lora_b_weight is True
    with pytest.raises(ValidationError, match="lora_ckpt_source"):
        LoraConfig(lora_ckpt_source="peft")


def test_known_arguments_are_accepted_and_converted(trtllm):
    from tensorrt_llm.llmapi import LoraConfig, TorchLlmArgs
    from tensorrt_llm.llmapi.llm_utils import update_llm_args_with_extra_dict

    args = update_llm_args_with_extra_dict({}, {"model": "m", "lora_config": {"max_lora_rank": 8},
                                                "kv_cache_config": {"free_gpu_memory_fraction": 0.5},
                                                "max_num_tokens": 4096, "enable_chunked_prefill": True})
    assert isinstance(args["lora_config"], LoraConfig) and args["lora_config"].max_lora_rank == 8
    parsed = TorchLlmArgs.from_kwargs(**args)
    assert parsed.kv_cache_config.free_gpu_memory_fraction == 0.5 and parsed.backend == "pytorch"


def test_a_multi_gpu_world_needs_the_gpus(trtllm, checkpoint_dir):
    """llm.py @4c05a748: "Only N GPUs are available, but M are required." (none here)."""
    with pytest.raises(RuntimeError, match=r"Only 0 GPUs are available, but 2 are required\."):
        trtllm.LLM(str(checkpoint_dir), tensor_parallel_size=2)


# ------------------------------------------------------------------------------------------------
# SamplingParams, LoRARequest, the generate_async signature
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, text", [
    ({"top_p": 1.5}, "require 0 <= top_p <= 1, got top_p=1.5"),
    ({"top_k": -1}, "require top_k >= 0, got top_k=-1"),
    ({"temperature": -0.5}, "require temperature >= 0, got temperature=-0.5"),
    ({"n": 2, "best_of": 1}, "best_of (1) cannot be less than n (2)"),
    ({"best_of": 2, "top_k": 1}, "Greedy decoding in the LLM API does not allow multiple returns"),
])
def test_sampling_params_validate_as_upstream(trtllm, kwargs, text):
    """sampling_params.py @b35ac1b6 _validate."""
    with pytest.raises(ValueError) as info:
        trtllm.SamplingParams(**kwargs)
    assert text in str(info.value)


def test_sampling_params_are_keyword_only_with_upstreams_defaults(trtllm):
    from tensorrt_llm import GuidedDecodingParams, SamplingParams

    with pytest.raises(TypeError):
        SamplingParams(2)  # kw_only
    with pytest.raises(TypeError):
        SamplingParams(stream=True)
    p = SamplingParams(end_id=7)
    assert (p.pad_id, p.max_tokens, p.best_of, p.detokenize, p.exclude_input_from_output) == (7, 32, 1, True, True)
    with pytest.raises(ValueError, match="Only one guide can be used for a request, but got 2."):
        SamplingParams(guided_decoding=GuidedDecodingParams(regex="a+", json_object=True))
    greedy = SamplingParams.params_imply_greedy_decoding
    assert greedy(temperature=None, top_p=None, top_k=None) and greedy(temperature=0.7, top_p=None, top_k=1)
    assert greedy(temperature=0, top_p=0.9, top_k=0) and greedy(temperature=1.0, top_p=0.0, top_k=0)
    assert not greedy(temperature=1.0, top_p=None, top_k=0) and not greedy(temperature=None, top_p=1.0, top_k=None)


def test_lora_request_needs_an_existing_folder(trtllm, tmp_path):
    """executor/request.py @4ce835a5."""
    from tensorrt_llm.executor.request import LoRARequest

    with pytest.raises(ValueError, match=re.escape(f"lora_path ({tmp_path / 'gone'}) does not exist.")):
        LoRARequest("a", 3, str(tmp_path / "gone"))
    with pytest.raises(ValueError, match="lora_ckpt_source must be 'hf' or 'nemo'"):
        LoRARequest("a", 3, str(tmp_path), "peft")
    request = LoRARequest("a", 3, str(tmp_path))
    assert (request.adapter_id, request.path, request.name) == (3, str(tmp_path), "a")


def test_generate_async_signature_puts_lora_request_third(trtllm):
    """llm.py @4c05a748: streaming comes fifth, so a positional third argument is the LoRA request (the defect
    of upstream's llmapi Triton model, which passed streaming there)."""
    names = list(inspect.signature(trtllm.LLM.generate_async).parameters)
    assert names == ["self", "inputs", "sampling_params", "lora_request", "prompt_adapter_request", "streaming",
                     "kv_cache_retention_config", "disaggregated_params", "_postproc_params", "scheduling_params",
                     "cache_salt"]


def test_streaming_passed_positionally_does_not_stream(llm, prompt):
    from tensorrt_llm import SamplingParams

    async def main():
        out = llm.generate_async(prompt, SamplingParams(end_id=-1, max_tokens=4, top_k=1), True)
        return [list(r.outputs[0].token_ids_diff) async for r in out]

    steps = asyncio.run(main())
    assert len(steps) == 1 and len(steps[0]) == 4  # one response with every token: not streamed


# ------------------------------------------------------------------------------------------------
# generation and streaming results
# ------------------------------------------------------------------------------------------------


def test_streaming_gives_the_new_ids_per_step_and_greedy_matches_transformers(llm, prompt, hf_greedy):
    """result.py @a678b91a: token_ids_diff is the step's new ids; finished and finish_reason on the last."""
    steps = collect(llm, prompt, end_id=-1, max_tokens=6, top_k=1)
    assert [s[0] for s in steps] == [[t] for t in hf_greedy[:6]]
    assert [s[1] for s in steps] == [False] * 5 + [True]
    assert steps[-1][2] == "length" and all(s[2] is None for s in steps[:-1])


def test_the_end_token_is_in_token_ids_and_ends_with_stop(llm, trtllm, hf_tokenizer, hf_model):
    """sampler.py @28edbcdb TorchSampler: add_token, then the end check (finish reason END_ID -> 'stop')."""
    enc = hf_tokenizer.apply_chat_template([{"role": "user", "content": "Answer with one word: is water wet?"}],
                                           add_generation_prompt=True, tokenize=True)
    ids = list(enc["input_ids"] if not isinstance(enc, list) else enc)
    with torch.inference_mode():
        expected = hf_model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=16, pad_token_id=0)
    expected = expected[0, len(ids):].tolist()
    n = expected.index(EOS)
    steps = collect(llm, ids, end_id=EOS, max_tokens=16, top_k=1)
    tokens = [t for s in steps for t in s[0]]
    assert tokens == expected[: n + 1] and steps[-1] == ([EOS], True, "stop")


def test_non_streaming_is_one_response_with_every_token(llm, prompt, hf_greedy):
    steps = collect(llm, prompt, streaming=False, end_id=-1, max_tokens=5, top_k=1)
    assert steps == [(hf_greedy[:5], True, "length")]


def _tokens(llm, prompt, **params) -> list[int]:
    return [t for s in collect(llm, prompt, end_id=-1, max_tokens=8, **params) for t in s[0]]


def test_the_sampler_is_chosen_per_llm_as_1_2_1_chooses_it(trtllm, checkpoint_dir, llm, trt_llm):
    """_util.py instantiate_sampler: auto is TorchSampler unless beam search (max_beam_width > 1); any other string
    falls through to TorchSampler (sampler_type is Union[str, SamplerType])."""
    assert (llm.sampler, trt_llm.sampler) == ("TorchSampler", "TRTLLMSampler")
    from tensorrt_llm._standin.engine import instantiate_sampler

    assert instantiate_sampler("auto", 4) == "TRTLLMSampler" and instantiate_sampler("Torch", None) == "TorchSampler"


def test_trtllm_sampler_seeds_each_request(trt_llm, prompt):
    """TRTLLMSampler: the C++ decoder seeds each request with its seed."""
    one = _tokens(trt_llm, prompt, temperature=1.0, top_k=0, seed=3)
    assert one == _tokens(trt_llm, prompt, temperature=1.0, top_k=0, seed=3)
    assert one != _tokens(trt_llm, prompt, temperature=1.0, top_k=0, seed=4)


def test_torch_sampler_ignores_the_seed(trtllm, checkpoint_dir, prompt):
    """sampler.py @00026bd1: one generator seeded once with 42 for every request: the same seed twice gives other
    tokens, and two fresh LLMs give the same tokens whatever the seed."""
    fresh = []
    for seed in (3, 4):
        llm = trtllm.LLM(str(checkpoint_dir), max_batch_size=4, max_seq_len=256)
        try:
            fresh.append(_tokens(llm, prompt, temperature=1.0, top_k=0, seed=seed))
            if seed == 3:
                again = _tokens(llm, prompt, temperature=1.0, top_k=0, seed=3)
        finally:
            llm.shutdown()
    assert fresh[0] == fresh[1] and again != fresh[0]


def _one_word_prompt(hf_tokenizer) -> list[int]:
    enc = hf_tokenizer.apply_chat_template([{"role": "user", "content": "Answer with one word: is water wet?"}],
                                           add_generation_prompt=True, tokenize=True)
    return list(enc["input_ids"] if not isinstance(enc, list) else enc)


def test_trtllm_sampler_applies_penalties_bad_words_and_min_tokens(trt_llm, hf_tokenizer, prompt, hf_greedy):
    assert _tokens(trt_llm, prompt, top_k=1, repetition_penalty=5.0) != hf_greedy[:8]
    assert _tokens(trt_llm, prompt, top_k=1, presence_penalty=2.0) != hf_greedy[:8]
    banned = _tokens(trt_llm, prompt, top_k=1, bad_token_ids=[hf_greedy[0]])
    assert banned[0] != hf_greedy[0]
    ids = _one_word_prompt(hf_tokenizer)
    free = [t for s in collect(trt_llm, ids, end_id=EOS, max_tokens=16, top_k=1) for t in s[0]]
    held = [t for s in collect(trt_llm, ids, end_id=EOS, max_tokens=16, top_k=1, min_tokens=len(free) + 2)
            for t in s[0]]
    assert len(held) > len(free) and EOS not in held[: len(free) + 1]


def test_torch_sampler_ignores_penalties_and_bad_words_and_counts_the_prompt_for_min_tokens(
        llm, hf_tokenizer, prompt, hf_greedy):
    """sampler.py @00026bd1 TorchSampler: no penalty and no bad-words code (PRs #16485, #16052 came later);
    _apply_min_length_penalty counts the prompt's tokens (PR #12166 came later)."""
    for params in ({"repetition_penalty": 5.0}, {"presence_penalty": 2.0}, {"frequency_penalty": 2.0},
                   {"bad_token_ids": [hf_greedy[0]]}):
        assert _tokens(llm, prompt, top_k=1, **params) == hf_greedy[:8], params
    ids = _one_word_prompt(hf_tokenizer)
    free = [t for s in collect(llm, ids, end_id=EOS, max_tokens=16, top_k=1) for t in s[0]]
    assert len(ids) > len(free) + 2
    held = [t for s in collect(llm, ids, end_id=EOS, max_tokens=16, top_k=1, min_tokens=len(free) + 2)
            for t in s[0]]
    assert held == free  # the prompt alone is longer than min_tokens: nothing held back
    longer = [t for s in collect(llm, ids, end_id=EOS, max_tokens=16, top_k=1, min_tokens=len(ids) + len(free) + 2)
              for t in s[0]]
    assert len(longer) > len(free)  # counting the prompt, it holds the end token back only past the prompt


def _logprob_steps(llm, prompt, **params):
    from tensorrt_llm import SamplingParams

    async def main():
        out = llm.generate_async(prompt, sampling_params=SamplingParams(end_id=-1, max_tokens=10, logprobs=1, **params),
                                 streaming=False)
        result = await out
        return list(result.outputs[0].token_ids), list(result.outputs[0].logprobs)

    return asyncio.run(main())


def test_log_probs_per_sampler(llm, trt_llm, prompt, hf_model):
    """TorchSampler (sampler.py @00026bd1): top-1 of log_softmax over the raw logits before sampling, keyed by the
    arg-max token; TRTLLMSampler: the sampled token's, keyed by it."""
    sampling = {"temperature": 2.0, "top_k": 0, "top_p": 1.0, "seed": 3}
    for engine, keyed_by_sampled in ((llm, False), (trt_llm, True)):
        tokens, entries = _logprob_steps(engine, prompt, **sampling)
        with torch.inference_mode():
            logits = hf_model(torch.tensor([prompt + tokens])).logits[0].float()
        rows = [logits[len(prompt) - 1 + i] for i in range(len(tokens))]
        keys = [next(iter(entry)) for entry in entries]
        if keyed_by_sampled:
            assert keys == tokens
        else:
            assert keys == [int(torch.argmax(row)) for row in rows] and keys != tokens
            values = [entry[key].logprob for entry, key in zip(entries, keys)]
            assert values == pytest.approx([float(torch.log_softmax(row, -1).max()) for row in rows], abs=2e-3)


def test_abort_ends_the_request_as_cancelled(llm, prompt, trtllm):
    """result.py @a678b91a: abort() asks the executor; aborted() is a method; the last response says 'cancelled'."""
    from tensorrt_llm import SamplingParams

    async def main():
        out = llm.generate_async(prompt, sampling_params=SamplingParams(end_id=-1, max_tokens=200, top_k=1),
                                 streaming=True)
        assert out.aborted() is False
        steps = []
        async for result in out:
            steps.append((len(result.outputs[0].token_ids), result.finished, result.outputs[0].finish_reason))
            if len(steps) == 2:
                out.abort()
        return out, steps

    out, steps = asyncio.run(main())
    assert out.aborted() is True and steps[-1][1:] == (True, "cancelled") and steps[-1][0] < 200


def test_an_aborted_request_still_waiting_is_dropped_without_a_response(trtllm, checkpoint_dir, prompt):
    """executor_request_queue.py @007a7508 update_waiting_queue, py_executor.py _handle_canceled_requests: waiting
    requests fill free slots first, then aborted ones still waiting leave the queue and nothing answers them;
    an aborted active request ends 'cancelled'."""
    from tensorrt_llm import SamplingParams

    llm = trtllm.LLM(str(checkpoint_dir), max_batch_size=1, max_seq_len=256)

    async def main():
        params = SamplingParams(end_id=-1, max_tokens=12, top_k=1)
        active = llm.generate_async(prompt, sampling_params=params, streaming=True)
        waiting = llm.generate_async(prompt, sampling_params=params, streaming=True)
        steps = 0
        async for _ in active:
            steps += 1
            if steps == 2:
                waiting.abort()
        return active, waiting

    try:
        active, waiting = asyncio.run(main())
        assert active.finished and active.outputs[0].finish_reason == "length"
        assert not waiting.finished and waiting._aqueue.empty()
        assert not llm._executor._waiting and not llm._executor._active
    finally:
        llm.shutdown()


def test_a_sampling_config_error_is_a_request_error_of_the_iteration(llm, prompt):
    """base_worker.py @7b437aaa: the C++ SamplingConfig's failure, wrapped in RequestError."""
    from tensorrt_llm.executor.utils import RequestError

    with pytest.raises(RequestError, match=re.escape("Assertion failed: repetitionpenalty.value() > 0.f")):
        collect(llm, prompt, end_id=-1, max_tokens=2, repetition_penalty=0.0)


def test_prompt_limits_of_the_pytorch_backend(trtllm, checkpoint_dir, prompt, caplog):
    """llm.py @4c05a748 _check_arguments (prompt > max_num_tokens without chunked prefill) and base_worker.py
    @7b437aaa _deduce_max_tokens (max_tokens reduced to max_seq_len - prompt, with a warning)."""
    small = trtllm.LLM(str(checkpoint_dir), max_num_tokens=len(prompt) - 1, max_seq_len=len(prompt) + 3)
    try:
        with pytest.raises(ValueError, match=re.escape(
                f"The sum of prompt length ({float(len(prompt))}), query length (0) should not exceed max_num_tokens "
                f"({len(prompt) - 1})")):
            collect(small, prompt, end_id=-1, max_tokens=2)
    finally:
        small.shutdown()
    chunked = trtllm.LLM(str(checkpoint_dir), max_num_tokens=len(prompt) - 1, enable_chunked_prefill=True,
                         max_seq_len=len(prompt) + 3)
    try:
        with caplog.at_level(logging.WARNING, logger="tensorrt_llm"):
            steps = collect(chunked, prompt, end_id=-1, max_tokens=10, top_k=1)
        assert sum(len(s[0]) for s in steps) == 3
        assert "User-specified `max_tokens` (10) is greater than deduced `default_max_tokens` (3)" in caplog.text
    finally:
        chunked.shutdown()


def test_a_shut_down_llm_refuses_requests(trtllm, checkpoint_dir, prompt):
    engine = trtllm.LLM(str(checkpoint_dir))
    engine.shutdown()
    with pytest.raises(RuntimeError, match="LLM is shutting down"):
        collect(engine, prompt, end_id=-1, max_tokens=2)


# ------------------------------------------------------------------------------------------------
# guided decoding and LoRA
# ------------------------------------------------------------------------------------------------


def test_guided_decoding_with_xgrammar(trtllm, checkpoint_dir, prompt, hf_tokenizer):
    from tensorrt_llm import GuidedDecodingParams

    guided = trtllm.LLM(str(checkpoint_dir), guided_decoding_backend="xgrammar")
    try:
        steps = collect(guided, prompt, end_id=EOS, max_tokens=12, top_k=1,
                        guided_decoding=GuidedDecodingParams(regex="[0-9]{3}"))
        tokens = [t for s in steps for t in s[0]]
        assert re.fullmatch("[0-9]{3}", hf_tokenizer.decode([t for t in tokens if t != EOS])), tokens
        steps = collect(guided, prompt, end_id=EOS, max_tokens=40, top_k=1,
                        guided_decoding=GuidedDecodingParams(json={"type": "object", "properties": {
                            "a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}))
        text = hf_tokenizer.decode([t for s in steps for t in s[0] if t != EOS])
        assert isinstance(json.loads(text)["a"], int), text
    finally:
        guided.shutdown()


@pytest.fixture(scope="module")
def adapters(checkpoint_dir, tmp_path_factory, prompt):
    from tests.lora_adapters import AdapterFactory

    tmp = tmp_path_factory.mktemp("standin_lora")
    factory = AdapterFactory(checkpoint_dir)
    a = factory.make(tmp / "a", r=4, alpha=8, targets=["q_proj", "v_proj"], seed=11)
    b = factory.make(tmp / "b", r=8, alpha=32, targets=["k_proj", "o_proj", "down_proj"], seed=12)
    expected = {name: factory.greedy(path, prompt, 6, EOS) for name, path in (("a", a), ("b", b), ("base", None))}
    assert len({tuple(v) for v in expected.values()}) == 3
    return {"a": a, "b": b, "expected": expected}


def _lora_tokens(llm, prompt, lora):
    from tensorrt_llm import SamplingParams

    async def main():
        out = llm.generate_async(prompt, sampling_params=SamplingParams(end_id=-1, max_tokens=6, top_k=1),
                                 lora_request=lora, streaming=True)
        return [t async for r in out for t in r.outputs[0].token_ids_diff]

    return asyncio.run(main())


def test_lora_adapters_from_folders_cached_by_id(trtllm, checkpoint_dir, prompt, adapters):
    """A PEFT folder per LoRARequest; the id is the cache key (base_worker.py @7b437aaa): another path under a
    cached id gets the cached weights."""
    from tensorrt_llm.executor.request import LoRARequest

    llm = trtllm.LLM(str(checkpoint_dir), lora_config={"max_lora_rank": 8})
    try:
        assert _lora_tokens(llm, prompt, LoRARequest("a", 1, str(adapters["a"]))) == adapters["expected"]["a"]
        assert _lora_tokens(llm, prompt, None) == adapters["expected"]["base"]
        assert _lora_tokens(llm, prompt, LoRARequest("b", 2, str(adapters["b"]))) == adapters["expected"]["b"]
        assert _lora_tokens(llm, prompt, LoRARequest("b", 1, str(adapters["b"]))) == adapters["expected"]["a"]
    finally:
        llm.shutdown()


def test_lora_requests_are_ignored_without_lora_config(trtllm, llm, prompt, adapters):
    """base_worker.py @7b437aaa: no LoRA manager without lora_config, and the request's adapter is not used."""
    from tensorrt_llm.executor.request import LoRARequest

    assert _lora_tokens(llm, prompt, LoRARequest("a", 1, str(adapters["a"]))) == adapters["expected"]["base"]


def _lora_values(folder) -> int:
    from safetensors.torch import load_file

    return sum(t.numel() for name, t in load_file(str(folder / "adapter_model.safetensors")).items() if "lora_" in name)


def test_every_distinct_adapter_stays_on_the_device_for_the_llms_life(trtllm, checkpoint_dir, prompt, adapters):
    """lora_manager.py @30e6fb55 and @007e181b load_from_hf: each new uid's device tensors are appended to
    _lora_weights, which never shrinks, whatever the C++ cache evicts (max_cpu_loras 1 here); a uid loaded before is
    skipped (PR #12815's _retain_device_tensors came after 1.2.1). The tensors take the model's dtype (this
    checkpoint's config.json: float32, 4 bytes a value)."""
    from tensorrt_llm.executor.request import LoRARequest

    config = json.loads((checkpoint_dir / "config.json").read_text())
    assert (config.get("dtype") or config.get("torch_dtype")) == "float32"
    llm = trtllm.LLM(str(checkpoint_dir), lora_config={"max_lora_rank": 8, "max_cpu_loras": 1})
    worker = llm._executor.lora_worker
    a, b = 4 * _lora_values(adapters["a"]), 4 * _lora_values(adapters["b"])
    try:
        seen = []
        for name, uid in (("a", 1), ("b", 2), ("a", 1), ("b", 3), ("a", 1)):
            assert _lora_tokens(llm, prompt, LoRARequest(name, uid, str(adapters[name]))) == adapters["expected"][name]
            seen.append(worker.retained_device_bytes)
        assert seen == [a, a + b, a + b, a + 2 * b, a + 2 * b]
        assert sorted(worker.loaded) == [1, 2, 3] and len(llm._executor.lora._names) == 1
    finally:
        llm.shutdown()


def _start(llm, prompt, n, lora=None):
    from tensorrt_llm import SamplingParams

    return llm.generate_async(prompt, sampling_params=SamplingParams(end_id=-1, max_tokens=n, top_k=1),
                              lora_request=lora, streaming=True)


@pytest.mark.parametrize("failure", ["truncated", "no_config", "out_of_memory"])
def test_a_lora_load_failure_stops_the_worker(trtllm, checkpoint_dir, prompt, adapters, tmp_path, monkeypatch,
                                              failure):
    """base_worker.py @7b437aaa _enqueue_request loads the adapter before its try (RequestError), and worker_main
    (worker.py @cc4777e9) treats anything else as critical: the proxy's dispatch thread quits, so a request in flight
    gets no further response; the next generate_async raises the failure and shuts the executor down
    (executor.py _handle_background_error), and the one after that "LLM is shutting down". Damaged folders, and a
    load beyond the device memory left (LLMAPI_STANDIN_LORA_DEVICE_BYTES: room for adapter "a" only)."""
    import shutil

    from tensorrt_llm.executor.request import LoRARequest

    bad = tmp_path / "bad"
    shutil.copytree(adapters["b"], bad)
    if failure == "truncated":
        weights = bad / "adapter_model.safetensors"
        weights.write_bytes(weights.read_bytes()[:-100])
    elif failure == "no_config":
        (bad / "adapter_config.json").unlink()
        bad.joinpath("adapter_config.json").mkdir()  # exists (LoRARequest takes it) but cannot be read as a file
    else:
        monkeypatch.setenv("LLMAPI_STANDIN_LORA_DEVICE_BYTES", str(4 * _lora_values(adapters["a"])))
    llm = trtllm.LLM(str(checkpoint_dir), max_batch_size=2, lora_config={"max_lora_rank": 8})

    async def main():
        good = _start(llm, prompt, 200, LoRARequest("a", 1, str(adapters["a"])))
        steps = 0
        async for _ in good:
            steps += 1
            if steps == 2:
                _start(llm, prompt, 4, LoRARequest("bad", 2, str(bad)))
                break
        deadline = asyncio.get_running_loop().time() + 30  # only "not hung": the worker stops at its next loop
        while llm._executor.error is None and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        at_death = (llm._executor.steps, good._aqueue.qsize())
        await asyncio.sleep(0.5)  # a step takes about 0.1 s here: several would have run
        return good, at_death

    try:
        good, at_death = asyncio.run(main())
        assert llm._executor.error is not None
        assert (llm._executor.steps, good._aqueue.qsize()) == at_death, "nothing ran or answered after the stop"
        assert not good.finished
        expected = {"truncated": Exception, "no_config": OSError, "out_of_memory": RuntimeError}[failure]
        with pytest.raises(expected) as raised:
            collect(llm, prompt, end_id=-1, max_tokens=2)
        assert not isinstance(raised.value, trtllm.executor.utils.RequestError)
        if failure == "out_of_memory":
            assert "CUDA out of memory" in str(raised.value)
        with pytest.raises(RuntimeError, match="LLM is shutting down"):
            collect(llm, prompt, end_id=-1, max_tokens=2)
    finally:
        llm.shutdown()


def test_a_slow_abort_lets_an_active_request_run_until_the_executor_sees_it(trtllm, checkpoint_dir, prompt,
                                                                            monkeypatch):
    """An abort travels from RequestOutput.abort() through the proxy's request queue to the worker and the executor
    loop's next iteration (LLMAPI_STANDIN_ABORT_DELAY_MS stands for that under load): the request keeps generating
    until then and ends 'cancelled' with every token it made."""
    from tensorrt_llm import SamplingParams

    monkeypatch.setenv("LLMAPI_STANDIN_ABORT_DELAY_MS", "400")
    llm = trtllm.LLM(str(checkpoint_dir), max_batch_size=2, max_seq_len=512)

    async def main():
        out = llm.generate_async(prompt, sampling_params=SamplingParams(end_id=-1, max_tokens=400, top_k=1),
                                 streaming=True)
        steps, after = [], 0
        async for result in out:
            steps.append(list(result.outputs[0].token_ids_diff))
            if len(steps) == 2:
                out.abort()
            elif len(steps) > 2:
                after += 1
        return out, steps, after

    try:
        out, steps, after = asyncio.run(main())
        assert out.outputs[0].finish_reason == "cancelled" and after >= 2, (after, len(steps))
        assert sum(len(s) for s in steps) == len(out.outputs[0].token_ids) < 400
    finally:
        llm.shutdown()


def test_the_workers_results_entry_of_a_dropped_waiting_request_stays(trtllm, checkpoint_dir, prompt):
    """base_worker.py @7b437aaa: _results[client_id] is removed when the request's final response or error is
    handled (handle_for_worker); an aborted request dropped while waiting gets neither, so its entry stays."""
    llm = trtllm.LLM(str(checkpoint_dir), max_batch_size=1, max_seq_len=256)

    async def main():
        active = _start(llm, prompt, 6)
        waiting = _start(llm, prompt, 6)
        steps = 0
        async for _ in active:
            steps += 1
            if steps == 2:
                waiting.abort()
        return active, waiting

    try:
        active, waiting = asyncio.run(main())
        assert active.finished and list(llm._executor.results) == [waiting.request_id]
    finally:
        llm.shutdown()


# ------------------------------------------------------------------------------------------------
# paced mode (the benchmark's)
# ------------------------------------------------------------------------------------------------


def test_paced_mode_cycles_the_text_in_batched_steps(trtllm, checkpoint_dir, hf_tokenizer, monkeypatch):
    """Paced mode emits token (seed + k) mod n of the text, as benchmarks/standin does, one token per active
    request per step: two requests of 6 tokens together take 6 steps, not 12."""
    from benchmarks.paths import STANDIN_TEXT
    from tensorrt_llm import SamplingParams
    from tests.modules import load_file

    standin = load_file("benchmark_standin_model", Path(STANDIN_TEXT).parent / "1" / "model.py")
    cycle = standin.text_token_ids(hf_tokenizer, STANDIN_TEXT.read_text(encoding="utf-8"))
    monkeypatch.setenv("LLMAPI_STANDIN_STEP_MS", "2")
    monkeypatch.setenv("LLMAPI_STANDIN_TEXT", str(STANDIN_TEXT))
    paced = trtllm.LLM(str(checkpoint_dir), max_batch_size=4)
    try:
        assert paced._executor.model is None  # no network loaded

        async def main():
            outs = [paced.generate_async([1, 2, 3], sampling_params=SamplingParams(end_id=EOS, max_tokens=6, seed=s),
                                         streaming=True) for s in (5, 9)]

            async def tokens(out):
                return [t async for r in out for t in r.outputs[0].token_ids_diff]

            return await asyncio.gather(*(tokens(o) for o in outs))

        before = paced._executor.steps
        got = asyncio.run(main())
        assert got == [standin.expected_tokens(cycle, 5, 6), standin.expected_tokens(cycle, 9, 6)]
        assert paced._executor.steps - before <= 7
    finally:
        paced.shutdown()


def test_stream_interval_sends_the_first_step_then_every_nth_and_the_last(trtllm, checkpoint_dir, prompt, hf_greedy):
    """py_executor.py _handle_responses (1.2-era): a response on decoding iteration 1, on every multiple of
    TorchLlmArgs.stream_interval, and when finished; every token is delivered."""
    llm = trtllm.LLM(str(checkpoint_dir), max_batch_size=4, max_seq_len=256, stream_interval=4)
    try:
        steps = collect(llm, prompt, end_id=-1, max_tokens=10, top_k=1)
    finally:
        llm.shutdown()
    assert [len(s[0]) for s in steps] == [1, 3, 4, 2]  # tokens 1, 2-4, 5-8, 9-10 (the last)
    assert [t for s in steps for t in s[0]] == hf_greedy[:10] and [s[1] for s in steps] == [False] * 3 + [True]
