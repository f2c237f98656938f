"""Generator.prepare (cog_triton.streaming.generation): what a request carries to Triton, checked in-process in seconds
where before only the end-to-end tests (same seed, same text; an adapter's output) noticed a mistake:

* the ``seed`` input reaches the request and its gRPC ``seed`` tensor (UINT64 [1, 1]), for every seed the
  schema allows and for the one drawn when none is given;
* the C++ backend's LoRA task ids (the CPU reference model takes the same tensors): two different adapters get
  two ``lora_task_id`` s, one adapter the same id whatever URL it came from, and that id is its content hash
  (:func:`cog_triton.streaming.lora.tasks.task_id_of`), so every stream process and every restart agree.

The generator's tokenizer and adapter fetching are real (adapters made with peft, served over HTTP on
127.0.0.1); nothing is sent: the gRPC address is never connected by ``prepare``.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Iterator

import pytest

from cog_triton.fetch.rules import FetchRules
from cog_triton.streaming.generation import build_generator
from cog_triton.stream_config import GeneratorConfig
from cog_triton.ipc import PredictInputs
from cog_triton.worker.inputs import validate_inputs
from cog_triton.dev.local import WeightsHTTPServer
from cog_triton.stream_config import StoreLimits
from cog_triton.streaming.lora.tasks import task_id_of
from tensorrtllm_backend.engine import ModelLimits, inspect_weights
from tests.lora_adapters import AdapterFactory, pack

LIMITS = ModelLimits(max_batch_size=8, max_input_len=2048, max_seq_len=4096)


def _tensor(request: Any, name: str) -> tuple[Any, bytes]:
    """The gRPC ModelInferRequest's input ``name`` and its raw bytes."""
    index = [t.name for t in request.inputs].index(name)
    return request.inputs[index], request.raw_input_contents[index]


def _uint64(request: Any, name: str) -> int:
    tensor, raw = _tensor(request, name)
    assert tensor.datatype == "UINT64" and list(tensor.shape) == [1, 1], tensor
    return struct.unpack("<Q", raw)[0]


@pytest.fixture(scope="module")
def generator(checkpoint_dir: Path, hf_tokenizer):
    return build_generator(GeneratorConfig(tokenizer_dir=checkpoint_dir, limits=LIMITS, grpc_address="127.0.0.1:9"),
                           tokenizer=hf_tokenizer)


@pytest.mark.parametrize("seed", [0, 1, 1234, 2**31 - 1, 2**32 + 7, 2**53 - 1])
def test_the_seed_input_goes_into_the_request_and_its_tensor(generator, seed: int) -> None:
    prepared = generator.prepare(validate_inputs(prompt="Hi", seed=seed, temperature=0.7), "seeded")
    assert prepared.request.seed == seed
    assert _uint64(prepared.request.to_grpc("ensemble_ids"), "seed") == seed


def test_a_drawn_seed_is_the_one_the_request_carries(generator) -> None:
    """No seed given: PredictInputs draws one (logged by predict.py); the request carries that one, and two
    predictions draw two (a constant would make every "random" prediction the same)."""
    drawn = [validate_inputs(prompt="Hi") for _ in range(2)]
    sent = [generator.prepare(inputs, f"drawn-{i}").request for i, inputs in enumerate(drawn)]
    assert [r.seed for r in sent] == [i.seed for i in drawn]
    assert [_uint64(r.to_grpc("ensemble_ids"), "seed") for r in sent] == [i.seed for i in drawn]
    assert drawn[0].seed != drawn[1].seed  # 2**31 values: equal once in two billion runs


def test_no_seed_is_sent_to_a_sampler_that_takes_none(checkpoint_dir: Path, hf_tokenizer) -> None:
    """The PyTorch backend's TorchSampler (1.2.1's default) ignores a request's seed: the drawn one is not sent, so
    the model does not refuse it (tensorrtllm_backend.samplers); the C++ backend and TRTLLMSampler get it."""
    for sampler, sends in (("TorchSampler", False), ("TRTLLMSampler", True), (None, True)):
        config = GeneratorConfig(tokenizer_dir=checkpoint_dir, limits=LIMITS, grpc_address="127.0.0.1:9",
                                 backend="engine" if sampler is None else "pytorch", sampler=sampler)
        request = build_generator(config, tokenizer=hf_tokenizer).prepare(validate_inputs(prompt="Hi"), "s").request
        names = [t.name for t in request.to_grpc("ensemble_ids").inputs]
        assert ("seed" in names) is sends and (request.seed is not None) is sends, sampler


def test_the_model_interval_goes_only_to_a_model_that_takes_it(checkpoint_dir: Path, hf_tokenizer) -> None:
    """The PyTorch-backend model's stream_interval_ms (INT32 [1, 1]) is sent when setup found the model takes it: the
    value given with the request (the interval due when it starts), none for a model that does not take it."""
    for sends in (True, False):
        config = GeneratorConfig(tokenizer_dir=checkpoint_dir, limits=LIMITS, grpc_address="127.0.0.1:9",
                                 sends_stream_interval=sends)
        grpc = build_generator(config, tokenizer=hf_tokenizer).prepare(validate_inputs(prompt="Hi"), "i",
                                                                       stream_interval_ms=50)\
            .request.to_grpc("ensemble_ids")
        if not sends:
            assert "stream_interval_ms" not in [t.name for t in grpc.inputs]
        else:
            tensor, raw = _tensor(grpc, "stream_interval_ms")
            assert tensor.datatype == "INT32" and list(tensor.shape) == [1, 1] and struct.unpack("<i", raw)[0] == 50


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, checkpoint_dir: Path) -> Iterator[tuple[dict[str, str], dict[str, str]]]:
    """Adapter A under two URLs (a .tar.gz, and a .zip with a folder inside), a different adapter C under a third."""
    work = tmp_path_factory.mktemp("prepare_lora")
    factory = AdapterFactory(checkpoint_dir)
    a = factory.make(work / "a", r=4, alpha=8, targets=["q_proj", "v_proj"], seed=31)
    c = factory.make(work / "c", r=4, alpha=8, targets=["q_proj", "v_proj"], seed=32)
    pack(a, work / "served" / "a.tar.gz")
    pack(a, work / "served" / "a-again.zip", folder="inside")
    pack(c, work / "served" / "c.tar.gz")
    with WeightsHTTPServer(work / "served") as server:
        yield {"a": f"{server.url}/a.tar.gz", "a-again": f"{server.url}/a-again.zip", "c": f"{server.url}/c.tar.gz"}


def _lora_generator(checkpoint_dir: Path, tokenizer: Any, cache: Path):
    """A generator of the C++ backend's requests (the reference model's LoRA spec), its adapter cache in ``cache``
    (loopback addresses allowed: the adapters are served on 127.0.0.1)."""
    lora = inspect_weights(checkpoint_dir, reference_lora={"max_lora_rank": 8}).lora
    limits = StoreLimits(root=cache, retries=0, rules=FetchRules.open())
    return build_generator(GeneratorConfig(tokenizer_dir=checkpoint_dir, limits=LIMITS, grpc_address="127.0.0.1:9",
                                           lora=lora, adapter_limits=limits), tokenizer=tokenizer)


@pytest.fixture(scope="module")
def lora_generator(checkpoint_dir: Path, hf_tokenizer, tmp_path_factory):
    return _lora_generator(checkpoint_dir, hf_tokenizer, tmp_path_factory.mktemp("prepare_adapter_cache"))


def test_two_adapters_get_two_task_ids_and_one_adapter_one_id_from_two_urls(lora_generator, adapters) -> None:
    urls = adapters
    sent = {name: lora_generator.prepare(validate_inputs(prompt="Hi", seed=1, lora_weights=url), name).request
            for name, url in urls.items()}
    ids = {name: _uint64(request.to_grpc("ensemble_ids"), "lora_task_id") for name, request in sent.items()}
    assert ids["a"] == ids["a-again"] != ids["c"], ids
    assert {name: request.lora_task_id for name, request in sent.items()} == ids
    assert sent["a"].lora is not None and sent["c"].lora is not None  # nothing was served yet: weights go along
    base = lora_generator.prepare(validate_inputs(prompt="Hi", seed=1), "base").request
    assert base.lora_task_id is None and "lora_task_id" not in [t.name for t in base.to_grpc("ensemble_ids").inputs]


def test_another_process_gives_each_adapter_the_same_task_id(lora_generator, adapters, checkpoint_dir: Path,
                                                             hf_tokenizer, tmp_path: Path) -> None:
    """The id comes from the adapter's content (:func:`task_id_of` of its sha256), not from a counter or the URL:
    a second generator with its own disk cache (another stream process, or the same after a restart), asked in
    another order, gives every adapter the id the first one gave."""
    urls = adapters
    first = {name: lora_generator.resolve_adapter(validate_inputs(prompt="Hi", lora_weights=url).lora)
             for name, url in urls.items()}
    other = _lora_generator(checkpoint_dir, hf_tokenizer, tmp_path / "cache")
    second = {name: other.resolve_adapter(validate_inputs(prompt="Hi", lora_weights=urls[name]).lora)
              for name in reversed(list(urls))}
    assert {name: a.task_id for name, a in second.items()} == {name: a.task_id for name, a in first.items()}
    for adapter in first.values():
        assert adapter.task_id == task_id_of(adapter.sha256) > 0
    assert first["a"].sha256 == first["a-again"].sha256 != first["c"].sha256
