"""setup()'s plan (cog_triton.worker.planning.plan_serving), made without starting anything: which backend serves the
weights, the limits, the model repository's values, how Triton is launched, the stream processes and their interval,
and the one log line that says all of it. The weights are the default model's real checkpoint (inspected as setup
inspects it) and engine descriptions as the template tests use them; the GPUs are values (nothing here probes one).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from common.errors import ConfigError
from cog_triton.settings import REPO_ROOT, Settings
from cog_triton.worker.facts import Facts
from cog_triton.worker.planning import ServingPlan, plan_serving
from tensorrtllm_backend.engine import inspect_weights
from tensorrtllm_backend.gpus import GPU
from tests.test_templates import engine_info

CHECKPOINT = REPO_ROOT / "build" / "default_model" / "checkpoint"
H100 = GPU(0, "GPU-0", "NVIDIA H100 80GB HBM3", "9.0")


def facts(info, gpus, cpus: int = 16, xgrammar: bool = True) -> Facts:
    """What gather_facts would find: ``info``'s weights without a manifest, ``gpus``, ``cpus``, xgrammar or not."""
    return Facts(info, None, tuple(gpus), cpus, xgrammar)


@pytest.fixture(scope="module")
def checkpoint():
    return inspect_weights(CHECKPOINT)


def test_a_checkpoint_without_a_gpu_is_served_by_the_reference_model(checkpoint) -> None:
    plan = plan_serving(facts(checkpoint, []), Settings(stream_processes=2))
    assert (plan.backend, plan.pytorch, plan.sampler, plan.render.llm_args) == ("reference", None, None, None)
    assert (plan.launch.world_size, plan.launch.single_rank_mpirun, plan.stream_processes) == (1, False, 2)
    line = plan.describe()
    assert line.startswith("plan: Hugging Face checkpoint on the CPU reference model LlamaForCausalLM") and "\n" not in line
    assert "one Triton;" in line and "2 stream process(es), stream interval 50 ms (up to 200 ms beyond 64" in line


def test_the_plan_reads_no_checkpoint_file_and_raises_what_the_facts_found(checkpoint, monkeypatch) -> None:
    """A checkpoint's files were checked when the facts were gathered: the plan for the PyTorch backend raises the
    refusal recorded there and reads nothing itself; the reference backend (no GPU) does not need those files."""
    import dataclasses

    from common.errors import IncompatibleWeightsError
    from tensorrtllm_backend import checkpoint as checkpoint_module

    def read(*args, **kwargs):
        raise AssertionError("the plan read the checkpoint's files")

    monkeypatch.setattr(checkpoint_module, "check_checkpoint_files", read)
    assert plan_serving(facts(checkpoint, [H100]), Settings()).backend == "pytorch"
    refusal = IncompatibleWeightsError("the checkpoint lacks preprocessor_config.json")
    refused = dataclasses.replace(facts(checkpoint, [H100]), checkpoint_files_refusal=refusal)
    with pytest.raises(IncompatibleWeightsError) as raised:
        plan_serving(refused, Settings())
    assert raised.value is refusal
    assert plan_serving(dataclasses.replace(refused, gpus=()), Settings()).backend == "reference"


def test_the_plan_decides_from_the_facts_gathered_not_from_the_machine(checkpoint) -> None:
    """The CPUs, the GPUs and whether xgrammar is installed come from the facts: the stream processes (one per 5 CPUs,
    1 to 8, unless set), guided decoding in the model repository, and the stream processes' generator config."""
    few, many = plan_serving(facts(checkpoint, [], cpus=4), Settings()), plan_serving(facts(checkpoint, [], cpus=64),
                                                                                      Settings())
    assert (few.stream_processes, many.stream_processes) == (1, 8)
    assert plan_serving(facts(checkpoint, [], cpus=64), Settings(stream_processes=3)).stream_processes == 3
    assert few.render.guided_decoding and not plan_serving(facts(checkpoint, [], xgrammar=False),
                                                           Settings()).render.guided_decoding
    pytorch = plan_serving(facts(checkpoint, [H100]), Settings(request_timeout_s=7))
    generator = pytorch.generator
    assert (generator.backend, generator.sampler, generator.limits, generator.tokenizer_dir) == \
        ("pytorch", pytorch.sampler, pytorch.limits, pytorch.info.tokenizer_dir)
    assert generator.token_timeout_s == 7 and generator.images_off == pytorch.images_off
    assert (few.generator.backend, few.generator.sampler) == ("engine", None)


def test_a_checkpoint_with_a_gpu_goes_to_the_pytorch_backend_with_its_llm_arguments(checkpoint) -> None:
    plan = plan_serving(facts(checkpoint, [H100]), Settings(llm_max_seq_len=512, llm_max_num_tokens=384))
    assert plan.backend == "pytorch" and plan.sampler == "TorchSampler"
    assert plan.render.llm_args == plan.pytorch.args and plan.render.llm_args["max_seq_len"] == 512
    assert plan.limits.executor_max_input_len() == 384 and plan.info.limits == plan.limits
    assert "on the PyTorch backend (LLM API) with tp 1 x pp 1: max_seq_len 512, longest prompt 384" in plan.describe()


def test_tensor_parallelism_of_a_checkpoint_is_one_triton_under_mpirun(checkpoint) -> None:
    plan = plan_serving(facts(checkpoint, [H100, H100]), Settings(llm_tensor_parallel_size=2))
    assert (plan.launch.world_size, plan.launch.single_rank_mpirun, plan.info.world_size) == (1, True, 2)
    assert "one Triton under mpirun -n 1" in plan.describe()


def test_an_engine_keeps_its_world_size_and_chunked_context_holds_its_prompts(tmp_path: Path) -> None:
    info = engine_info(tmp_path, max_batch_size=64)
    info = info.__class__(**{**info.__dict__, "world_size": 2})
    plan = plan_serving(facts(info, [H100, H100]), Settings(enable_chunked_context=False))
    assert (plan.backend, plan.launch.world_size, plan.launch.single_rank_mpirun) == ("engine", 2, False)
    assert not plan.limits.enable_chunked_context and "2 Triton ranks under mpirun" in plan.describe()
    chunked = plan_serving(facts(info, [H100, H100]), Settings(enable_chunked_context=True))
    assert chunked.limits.enable_chunked_context and chunked.render.enable_chunked_context


def test_more_concurrency_than_the_engine_batches_is_a_warning_and_adapters_follow_their_setting(tmp_path: Path) -> None:
    info = engine_info(tmp_path, max_batch_size=4)
    plan = plan_serving(facts(info, [H100]), Settings(max_concurrency=16))
    (warning,) = plan.warnings
    assert "Cog serves up to 16 predictions at once" in warning and "batches at most 4 requests" in warning
    assert plan.adapter_limits is not None and plan.adapter_limits.fetches == 16
    off = plan_serving(facts(info, [H100]), Settings(lora_adapters=False, max_concurrency=4))
    assert off.adapter_limits is None and off.warnings == () and "LoRA adapters off" in off.describe()


def test_the_pytorch_backend_without_a_gpu_is_refused_before_anything_starts(checkpoint) -> None:
    with pytest.raises(ConfigError, match="COG_TRITON_CHECKPOINT_BACKEND=pytorch needs an NVIDIA GPU"):
        plan_serving(facts(checkpoint, []), Settings(checkpoint_backend="pytorch"))


def test_the_plan_is_plain_data() -> None:
    import dataclasses

    assert dataclasses.is_dataclass(ServingPlan) and ServingPlan.__dataclass_params__.frozen


def test_lora_on_the_pytorch_backend_bounds_the_adapters_per_llm_and_snapshots_beside_the_adapter_cache(
        checkpoint, tmp_path: Path) -> None:
    """COG_TRITON_LLM_MAX_ADAPTERS_PER_LLM reaches the PyTorch-backend model, with its snapshot folder beside the
    adapter disk cache's own folder (same file system: hard links); the plan's line says what the bound keeps on the
    GPU at most: bound x (rank x the sum of each module's in + out sizes x layers) x the dtype's bytes."""
    import json

    plan = plan_serving(facts(checkpoint, [H100]), Settings(llm_enable_lora=True, adapter_cache_dir=tmp_path / "cache"))
    assert plan.render.max_adapters_per_llm == 8
    assert plan.render.adapter_snapshot_dir == str(tmp_path / "cache" / "llm-snapshots")
    c = json.loads((CHECKPOINT / "config.json").read_text())
    h, m = c["hidden_size"], c["intermediate_size"]
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]  # the k and v projections' width
    per_layer = (h + h) + 2 * (h + kv) + (h + h) + 3 * (h + m)  # q, k and v, dense, and the three MLP modules
    kept = 8 * 64 * per_layer * c["num_hidden_layers"] * 4  # float32
    assert "recycled after 8 distinct LoRA adapters" in plan.describe()
    assert f"at most {kept / 1e9:.2f} GB at rank 64 on every module" in plan.describe()
    never = plan_serving(facts(checkpoint, [H100]), Settings(llm_enable_lora=True, llm_max_adapters_per_llm=0))
    assert never.render.max_adapters_per_llm == 0 and "never recycled for LoRA adapters" in never.describe()
    assert "recycled" not in plan_serving(facts(checkpoint, [H100]), Settings()).describe()  # LoRA off


@pytest.fixture(scope="module")
def vlm_checkpoint(tmp_path_factory):
    from tests.vlm_checkpoint import build_vlm_checkpoint

    return inspect_weights(build_vlm_checkpoint(tmp_path_factory.mktemp("vlm") / "gemma3-tiny", CHECKPOINT))


def test_images_are_served_for_an_image_architecture_on_the_pytorch_backend(vlm_checkpoint, checkpoint,
                                                                             tmp_path: Path) -> None:
    """Only a checkpoint of IMAGE_ARCHITECTURES on the PyTorch backend, with COG_TRITON_IMAGES on: the plan says so,
    renders the model's images parameter, and gives every other case its reason."""
    plan = plan_serving(facts(vlm_checkpoint, [H100]), Settings())
    assert (plan.backend, plan.images_off, plan.render.images) == ("pytorch", None, True)
    assert plan.describe().endswith("; images on")
    off = plan_serving(facts(vlm_checkpoint, [H100]), Settings(images=False))
    assert off.images_off == "images are switched off on this server (COG_TRITON_IMAGES=false)"
    assert not off.render.images and off.describe().endswith("; images off")
    text_only = plan_serving(facts(checkpoint, [H100]), Settings())
    assert text_only.images_off.startswith("architecture LlamaForCausalLM is served text only") and \
        "Gemma3ForConditionalGeneration" in text_only.images_off and not text_only.render.images
    cpu = plan_serving(facts(vlm_checkpoint, []), Settings())
    assert cpu.backend == "reference" and cpu.images_off.startswith("this checkpoint is served by the CPU reference")
    engine = plan_serving(facts(engine_info(tmp_path), [H100]), Settings())
    assert engine.images_off.startswith("this model is a prebuilt engine on TensorRT-LLM's C++ backend")
