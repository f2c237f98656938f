"""A Hugging Face checkpoint on TensorRT-LLM 1.2.1's PyTorch backend, without a GPU: which checkpoints it serves
(tensorrtllm_backend.checkpoint), the ``LLM(...)`` arguments built from the settings and checked against
TorchLlmArgs' fields before Triton starts (tensorrtllm_backend.llmapi_args), the longest prompt they allow as the
predictor enforces it, and the LoRA rank limit per request. TensorRT-LLM cannot run here: these tests check the
recorded upstream facts (cited in the modules) on real checkpoint folders and the real settings object."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save

from common.errors import ConfigError, IncompatibleWeightsError, InputError, LoraAdapterError
from cog_triton.ipc import PredictInputs
from cog_triton.worker.inputs import validate_inputs
from cog_triton.streaming.lora.convert import convert
from cog_triton.streaming.token_budget import token_budget
from cog_triton.settings import REPO_ROOT, Settings
from tensorrtllm_backend.checkpoint import (
    MODELOPT_QUANT_ALGOS,
    PROCESSOR_ARCHITECTURES,
    PYTORCH_ARCHITECTURES,
    REMOTE_CODE_ARCHITECTURES,
    architecture_support,
    check_pytorch_checkpoint,
)
from tensorrtllm_backend.engine import inspect_weights
from tensorrtllm_backend.gpus import GPU
from tensorrtllm_backend.llmapi_args import (
    TORCH_LLM_ARGS_FIELDS,
    LlmApiOptions,
    build_llm_args,
    choose_checkpoint_backend,
    inferred_max_seq_len,
    plan_pytorch_serving,
    pytorch_limits,
    pytorch_lora_spec,
    validate_llm_args,
)
from tests.hub_server import tiny_checkpoint

DEFAULT_CHECKPOINT = REPO_ROOT / "build" / "default_model" / "checkpoint"
H100 = GPU(0, "GPU-0", "NVIDIA H100 80GB HBM3", "9.0")
B200 = GPU(0, "GPU-0", "NVIDIA B200", "10.0")
A100 = GPU(0, "GPU-0", "NVIDIA A100-SXM4-80GB", "8.0")


def checkpoint(tmp_path: Path, architecture: str = "LlamaForCausalLM", extra: dict | None = None, **config) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir(exist_ok=True)
    for name, data in tiny_checkpoint(architecture, **config).items():
        (folder / name).write_bytes(data)
    for name, data in (extra or {}).items():
        (folder / name).write_text(json.dumps(data))
    return folder


@pytest.fixture(scope="module")
def smollm2():
    return inspect_weights(DEFAULT_CHECKPOINT)


def env_settings(monkeypatch, **env) -> Settings:
    for key, value in env.items():
        monkeypatch.setenv(f"COG_TRITON_{key}", value)
    return Settings.from_env()


# --- which checkpoints -------------------------------------------------------------------------------


def test_the_default_checkpoint_is_served(smollm2):
    check_pytorch_checkpoint(smollm2, [H100])
    assert architecture_support("LlamaForCausalLM")[0]


@pytest.mark.parametrize("architecture,fragment", [
    ("GPT2LMHeadModel", "architecture GPT2LMHeadModel is not in TensorRT-LLM 1.2.1's PyTorch backend model registry"),
    ("LlamaForCausalLm", "(close: LlamaForCausalLM"),
    ("Qwen2ForRewardModel", "does not generate text"),
    ("Gemma4ForConditionalGeneration", "is not in TensorRT-LLM 1.2.1"),  # registered after 1.2
])
def test_unsupported_architectures_are_refused_naming_them(tmp_path, architecture, fragment):
    info = inspect_weights(checkpoint(tmp_path, architecture))
    with pytest.raises(IncompatibleWeightsError) as refused:
        check_pytorch_checkpoint(info)
    assert fragment in refused.value.message
    if "registry" in fragment:
        assert "supported: " in refused.value.message and "Qwen3ForCausalLM" in refused.value.message


def test_an_engine_is_not_a_checkpoint(tmp_path):
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "config.json").write_text(json.dumps({
        "version": "1.1.0", "pretrained_config": {"architecture": "LlamaForCausalLM", "dtype": "float16"},
        "build_config": {"max_batch_size": 8, "max_input_len": 16, "max_seq_len": 32}}))
    (engine / "rank0.engine").write_bytes(b"x")
    (engine / "tokenizer.json").write_text("{}")
    info = inspect_weights(engine)
    with pytest.raises(IncompatibleWeightsError, match="holds a TensorRT-LLM engine"):
        check_pytorch_checkpoint(info)
    with pytest.raises(ConfigError, match="holds a TensorRT-LLM engine"):
        build_llm_args(LlmApiOptions(), info)


MODELOPT = {"producer": {"name": "modelopt", "version": "0.37.0"}}


@pytest.mark.parametrize("files,config,expected", [
    ({"hf_quant_config.json": {**MODELOPT, "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}},
     {}, ("FP8", "FP8", "hf_quant_config.json", True)),
    ({"hf_quant_config.json": {"quantization": {"quant_algo": "NVFP4", "group_size": 16}}},
     {}, ("NVFP4", "", "hf_quant_config.json", True)),
    ({"hf_quant_config.json": {"quantization": {"quant_algo": "fp8_pb_wo"}}},
     {}, ("FP8_BLOCK_SCALES", "", "hf_quant_config.json", True)),
    ({}, {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}},
     ("FP8_BLOCK_SCALES", "", "config.json quantization_config", True)),
    ({}, {"quantization_config": {"quant_method": "mxfp4"}}, ("MXFP4", "", "config.json quantization_config", True)),
])
def test_supported_quantization_is_detected_and_reported(tmp_path, files, config, expected):
    info = inspect_weights(checkpoint(tmp_path, extra=files, **config))
    q = info.quantization
    assert (q.algo, q.kv_cache_algo, q.source, q.supported) == expected
    check_pytorch_checkpoint(info, [B200])


@pytest.mark.parametrize("files,config,fragment", [
    ({"hf_quant_config.json": {"quantization": {"quant_algo": "W8A8_SQ_PER_CHANNEL"}}}, {},
     "quant_algo W8A8_SQ_PER_CHANNEL is not one the PyTorch backend of TensorRT-LLM 1.2.1 runs"),
    ({"hf_quant_config.json": {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "INT8"}}}, {},
     "kv_cache_quant_algo INT8 is not one the PyTorch backend's KV cache takes"),
    ({}, {"quantization_config": {"quant_method": "gptq", "bits": 4}},
     "quant_method 'gptq' is not read by TensorRT-LLM 1.2.1's PyTorch backend"),
    ({}, {"quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"}},
     "reads ModelOpt's settings from hf_quant_config.json"),
    ({"hf_quant_config.json": {"quant_algo": "FP8"}}, {}, "has no \"quantization\" object"),
])
def test_unsupported_quantization_is_refused_naming_it(tmp_path, files, config, fragment):
    info = inspect_weights(checkpoint(tmp_path, extra=files, **config))
    assert info.quantization is not None and not info.quantization.supported
    with pytest.raises(IncompatibleWeightsError) as refused:
        check_pytorch_checkpoint(info)
    assert fragment in refused.value.message


@pytest.mark.parametrize("algo,gpu,needed", [("NVFP4", H100, "10.0"), ("FP8", A100, "8.9")])
def test_a_quantization_the_gpu_cannot_run_is_refused_naming_both(tmp_path, algo, gpu, needed):
    info = inspect_weights(checkpoint(tmp_path, extra={"hf_quant_config.json": {"quantization": {"quant_algo": algo}}}))
    with pytest.raises(IncompatibleWeightsError) as refused:
        check_pytorch_checkpoint(info, [gpu])
    assert f"quant_algo {algo} needs a GPU of compute capability {needed} or newer" in refused.value.message
    assert gpu.compute_capability in refused.value.message
    check_pytorch_checkpoint(info, [B200])


def test_the_recorded_lists_are_consistent():
    assert "LlamaForCausalLM" in PYTORCH_ARCHITECTURES and "NemotronNASForCausalLM" not in PYTORCH_ARCHITECTURES
    assert set(MODELOPT_QUANT_ALGOS) >= {"FP8", "NVFP4", "FP8_BLOCK_SCALES", "W4A16_AWQ"}
    assert {"model", "max_num_tokens", "kv_cache_config", "lora_config", "enable_chunked_prefill",
            "guided_decoding_backend", "stream_interval", "cuda_graph_config"} <= TORCH_LLM_ARGS_FIELDS


# --- the LLM(...) arguments ------------------------------------------------------------------------


def test_default_settings_build_the_arguments_of_the_default_checkpoint(monkeypatch, smollm2):
    args = build_llm_args(env_settings(monkeypatch).llm_api_options(), smollm2)
    assert args == {
        "model": str(smollm2.weights_dir), "tokenizer": str(smollm2.tokenizer_dir),
        "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "max_seq_len": 8192,  # max_position_embeddings
        "kv_cache_config": {"free_gpu_memory_fraction": 0.9, "enable_block_reuse": True},
        "enable_chunked_prefill": False, "trust_remote_code": False, "guided_decoding_backend": "xgrammar",
    }
    json.dumps(args)  # what the Triton model receives must serialise


def test_settings_map_to_their_llm_api_fields(monkeypatch, smollm2):
    settings = env_settings(
        monkeypatch, LLM_TENSOR_PARALLEL_SIZE="2", LLM_MAX_BATCH_SIZE="64", LLM_MAX_NUM_TOKENS="4096",
        LLM_MAX_SEQ_LEN="4096", KV_CACHE_FREE_GPU_MEM_FRACTION="0.8", ENABLE_KV_CACHE_REUSE="false",
        MAX_TOKENS_IN_PAGED_KV_CACHE="100000", ENABLE_CHUNKED_CONTEXT="true", LLM_GUIDED_DECODING_BACKEND="none",
        LLM_ENABLE_LORA="true", LLM_MAX_LORA_RANK="16", LLM_LORA_TARGET_MODULES="attn_q, attn_v",
        LLM_ARGS="kv_cache_config:\n  dtype: fp8\ncuda_graph_config:\n  enable_padding: true\n",
    )
    args = build_llm_args(settings.llm_api_options(), smollm2)
    assert args["tensor_parallel_size"] == 2 and args["max_batch_size"] == 64 and args["max_num_tokens"] == 4096
    assert args["max_seq_len"] == 4096 and args["enable_chunked_prefill"] is True
    assert args["kv_cache_config"] == {"free_gpu_memory_fraction": 0.8, "enable_block_reuse": False,
                                       "max_tokens": 100000, "dtype": "fp8"}
    assert "guided_decoding_backend" not in args and args["cuda_graph_config"] == {"enable_padding": True}
    assert args["lora_config"] == {"max_lora_rank": 16, "max_loras": 8, "max_cpu_loras": 16,
                                   "lora_target_modules": ["attn_q", "attn_v"]}
    assert args["trust_remote_code"] is False
    assert build_llm_args(env_settings(monkeypatch, LLM_TRUST_REMOTE_CODE="true").llm_api_options(),
                          smollm2)["trust_remote_code"] is True


@pytest.mark.parametrize("extra,fragment", [
    ({"max_num_token": 4096}, "'max_num_token' is not a field of TensorRT-LLM 1.2.1's TorchLlmArgs, which forbids "
                              "unknown fields; did you mean max_num_tokens"),
    ({"kv_cache_config": {"free_gpu_mem_fraction": 0.5}},
     "kv_cache_config.free_gpu_mem_fraction is not a field of kv_cache_config in TensorRT-LLM 1.2.1; did you mean "
     "free_gpu_memory_fraction"),
    ({"lora_config": {"max_lora_ranks": 8}}, "lora_config.max_lora_ranks is not a field"),
    ({"kv_cache_config": {"free_gpu_memory_fraction": 0.5}},
     "set 'kv_cache_config.free_gpu_memory_fraction', which the setting COG_TRITON_KV_CACHE_FREE_GPU_MEM_FRACTION "
     "already sets"),
    ({"max_seq_len": 100}, "which the setting COG_TRITON_LLM_MAX_SEQ_LEN already sets"),
    ({"model": "/elsewhere"}, "set 'model', which this image sets from the weights"),
    ({"max_batch_size": 0}, "max_batch_size must be a positive integer, got 0"),
    ({"trust_remote_code": True}, "set 'trust_remote_code', which this image sets from "
                                  "COG_TRITON_LLM_TRUST_REMOTE_CODE, checked against the checkpoint's files at setup"),
    ({"cuda_graph_config": 4}, "cuda_graph_config must be a mapping of its fields, got int"),
])
def test_extra_arguments_are_checked_before_triton_starts(monkeypatch, smollm2, extra, fragment):
    settings = env_settings(monkeypatch, LLM_ARGS=json.dumps(extra))
    with pytest.raises(ConfigError) as refused:
        build_llm_args(settings.llm_api_options(), smollm2)
    assert fragment in refused.value.message, refused.value.message


def test_the_field_list_source_is_named_and_values_are_checked():
    with pytest.raises(ConfigError, match=r"field names from tensorrt_llm/llmapi/llm_args.py @7b437aaa"):
        validate_llm_args({"model": "m", "enable_sleep_mode": True})
    with pytest.raises(ConfigError, match="guided_decoding_backend 'outlines' is not one of xgrammar, llguidance"):
        validate_llm_args({"model": "m", "guided_decoding_backend": "outlines"})
    with pytest.raises(ConfigError, match="free_gpu_memory_fraction must be between 0 and 1, got 1.5"):
        validate_llm_args({"model": "m", "kv_cache_config": {"free_gpu_memory_fraction": 1.5}})
    with pytest.raises(ConfigError, match="model must be the checkpoint folder"):
        validate_llm_args({"max_seq_len": 5})


def test_a_bad_llm_args_document_fails_the_settings(monkeypatch):
    monkeypatch.setenv("COG_TRITON_LLM_ARGS", "{not json: [")
    with pytest.raises(ConfigError, match="COG_TRITON_LLM_ARGS.*neither JSON nor YAML"):
        Settings.from_env()
    monkeypatch.setenv("COG_TRITON_LLM_ARGS", "[1, 2]")
    with pytest.raises(ConfigError, match="must be a JSON or YAML mapping of LLM API arguments"):
        Settings.from_env()


def test_max_seq_len_above_the_checkpoints_is_refused(monkeypatch, smollm2):
    settings = env_settings(monkeypatch, LLM_MAX_SEQ_LEN="9000")
    with pytest.raises(ConfigError) as refused:
        build_llm_args(settings.llm_api_options(), smollm2)
    assert "max_seq_len (COG_TRITON_LLM_MAX_SEQ_LEN) 9000 exceeds what the checkpoint supports, 8192 tokens" in \
        refused.value.message


@pytest.mark.parametrize("config,expected", [
    ({"max_position_embeddings": 4096}, 4096),
    ({}, 2048),
    ({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}}, 16384),
    ({"max_position_embeddings": 8192, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 8192),
    ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, 4096),
    ({"max_position_embeddings": 1000, "rope_scaling": {"type": "dynamic", "factor": 1.5}}, 1500),
    ({"text_config": {"max_position_embeddings": 131072}}, 131072),
])
def test_max_seq_len_is_inferred_as_the_pytorch_backend_does(config, expected):
    assert inferred_max_seq_len(config) == expected


# --- the longest prompt ----------------------------------------------------------------------------


def test_the_prompt_limit_follows_max_num_tokens_without_chunked_prefill(monkeypatch, smollm2):
    args = build_llm_args(env_settings(monkeypatch, LLM_MAX_NUM_TOKENS="100").llm_api_options(), smollm2)
    limits = pytorch_limits(args)
    assert (limits.executor_max_input_len(), limits.max_seq_len, limits.max_batch_size) == (100, 8192, 2048)
    inputs = validate_inputs(prompt="hi", max_tokens=10)
    assert token_budget(inputs, 100, limits.executor_max_input_len(), limits.max_seq_len,
                               limits.input_limit_reason()) == 10
    with pytest.raises(InputError) as refused:
        token_budget(inputs, 101, limits.executor_max_input_len(), limits.max_seq_len, limits.input_limit_reason())
    assert ("it has 101 tokens (after formatting), and the model's maximum input length is 100 tokens (the PyTorch "
            "backend's limit with chunked prefill off: min(max_seq_len - 1, max_num_tokens) = min(8191, 100))"
            ) in refused.value.message


def test_chunked_prefill_lifts_the_max_num_tokens_limit(monkeypatch, smollm2):
    env = env_settings(monkeypatch, LLM_MAX_NUM_TOKENS="100", ENABLE_CHUNKED_CONTEXT="true")
    limits = pytorch_limits(build_llm_args(env.llm_api_options(), smollm2))
    assert limits.executor_max_input_len() == 8191
    assert "with chunked prefill on (PyTorch backend)" in limits.input_limit_reason()
    short = pytorch_limits({"max_seq_len": 50, "max_num_tokens": 100})  # the sequence limit is the smaller one
    assert short.executor_max_input_len() == 49 and short.max_num_tokens == 100


def test_defaults_fill_the_limits():
    limits = pytorch_limits({"max_seq_len": 100000})
    assert (limits.max_batch_size, limits.max_num_tokens, limits.executor_max_input_len()) == (2048, 8192, 8192)


# --- backend choice and LoRA ---------------------------------------------------------------------


def test_the_checkpoint_backend_follows_the_gpus():
    assert choose_checkpoint_backend("auto", [H100]) == "pytorch"
    assert choose_checkpoint_backend("auto", []) == "reference"
    assert choose_checkpoint_backend("reference", [H100]) == "reference"
    with pytest.raises(ConfigError, match="pytorch needs an NVIDIA GPU, and none is visible"):
        choose_checkpoint_backend("pytorch", [])
    with pytest.raises(ConfigError, match="'trt' is not one of auto, pytorch, reference"):
        choose_checkpoint_backend("trt", [H100])


def _adapter(r: int, shape, folder: Path) -> Path:
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    out = shape.num_heads * shape.head_size
    path = folder / f"r{r}.safetensors"
    path.write_bytes(save({f"{prefix}.lora_A.weight": torch.ones(r, shape.hidden_size),
                           f"{prefix}.lora_B.weight": torch.ones(out, r)}))
    return path


def test_an_adapter_above_the_max_lora_rank_is_refused_per_request(monkeypatch, smollm2, tmp_path):
    off = pytorch_lora_spec(smollm2, build_llm_args(env_settings(monkeypatch).llm_api_options(), smollm2))
    assert not off.enabled and "COG_TRITON_LLM_ENABLE_LORA=true" in off.off_reason
    args = build_llm_args(env_settings(monkeypatch, LLM_ENABLE_LORA="true", LLM_MAX_LORA_RANK="8").llm_api_options(),
                          smollm2)
    spec = pytorch_lora_spec(smollm2, args)
    assert (spec.enabled, spec.max_rank, spec.dtype, spec.shape.num_layers) == (True, 8, "float32", 30)
    config = {"peft_type": "LORA", "lora_alpha": 8}
    convert(config, _adapter(8, spec.shape, tmp_path), spec, "hf://me/r8")
    with pytest.raises(LoraAdapterError) as refused:
        convert(config, _adapter(16, spec.shape, tmp_path), spec, "hf://me/r16")
    assert ("its rank r=16 (layer 0 q_proj) is above the max_lora_rank (COG_TRITON_LLM_MAX_LORA_RANK) of 8; use an "
            "adapter of rank <= 8, or raise COG_TRITON_LLM_MAX_LORA_RANK") in refused.value.message


def test_lora_modules_outside_the_checked_ones_are_refused(monkeypatch, smollm2):
    settings = env_settings(monkeypatch, LLM_ENABLE_LORA="true", LLM_LORA_TARGET_MODULES="attn_qkv,attn_q")
    with pytest.raises(ConfigError, match=r"lora_config.lora_target_modules \(COG_TRITON_LLM_LORA_TARGET_MODULES\) "
                                          r"attn_qkv: give TensorRT-LLM module names"):
        build_llm_args(settings.llm_api_options(), smollm2)


@pytest.mark.parametrize("architecture", ["Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration"])
def test_lora_is_refused_where_the_model_would_ignore_every_adapter(monkeypatch, smollm2, architecture):
    """TensorRT-LLM 1.2.1's Qwen2-VL models call their language model without lora_params
    (LORA_IGNORED_ARCHITECTURES cites the source): turning LoRA on for one fails setup, naming the setting."""
    import dataclasses

    settings = env_settings(monkeypatch, LLM_ENABLE_LORA="true")
    build_llm_args(settings.llm_api_options(), smollm2)  # a Llama checkpoint: LoRA applies
    with pytest.raises(ConfigError, match=rf"COG_TRITON_LLM_ENABLE_LORA is on, and TensorRT-LLM 1.2.1 would "
                                          rf"ignore every adapter on {architecture} \(modeling_qwen2vl.py"):
        build_llm_args(settings.llm_api_options(), dataclasses.replace(smollm2, architecture=architecture))


def test_a_checkpoint_copy_keeps_its_facts(tmp_path, smollm2):
    """inspect_weights reads the config it reports (the limits and arguments are built from it)."""
    copy = tmp_path / "copy"
    shutil.copytree(DEFAULT_CHECKPOINT, copy, ignore=shutil.ignore_patterns("model.safetensors"))
    (copy / "model.safetensors").write_bytes((DEFAULT_CHECKPOINT / "model.safetensors").read_bytes()[:64])
    info = inspect_weights(copy)
    assert info.config == smollm2.config and info.config["max_position_embeddings"] == 8192


def test_setup_plan_checks_the_machine_and_reports_the_quantization(tmp_path, monkeypatch):
    info = inspect_weights(checkpoint(tmp_path, extra={
        "hf_quant_config.json": {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}}}))
    options = env_settings(monkeypatch, LLM_TENSOR_PARALLEL_SIZE="2").llm_api_options()
    with pytest.raises(IncompatibleWeightsError) as refused:
        plan_pytorch_serving(info, options, [H100])
    assert ("tensor_parallel_size (COG_TRITON_LLM_TENSOR_PARALLEL_SIZE) 2 x pipeline_parallel_size "
            "(COG_TRITON_LLM_PIPELINE_PARALLEL_SIZE) 1 = 2 ranks need 2 GPUs, but 1 is visible") in refused.value.message
    with pytest.raises(IncompatibleWeightsError, match="compute capability 8.9 or newer"):
        plan_pytorch_serving(info, options, [A100, A100])
    serving = plan_pytorch_serving(info, options, [H100, H100])
    assert serving.world_size == 2 and serving.args["tensor_parallel_size"] == 2
    line = serving.describe(info)
    assert "LlamaForCausalLM (bfloat16), quantization FP8 (modelopt, hf_quant_config.json, KV cache FP8)" in line
    assert "max_seq_len 2048, longest prompt 2047" in line and "LoRA off" in line


# --- files beyond the weights, and remote code (checkpoint.check_checkpoint_files) --------------------------


PREPROCESSOR = {"image_processor_type": "LlavaNextImageProcessor", "image_grid_pinpoints": [[336, 672]],
                "crop_size": {"height": 336, "width": 336}, "size": {"shortest_edge": 336}}


@pytest.mark.parametrize("architecture", sorted(PROCESSOR_ARCHITECTURES))
def test_a_multimodal_checkpoint_needs_its_processor_config(tmp_path, architecture):
    """Each architecture whose PyTorch-backend model registers an input processor (AutoProcessor at LLM load) is
    refused without preprocessor_config.json, naming the file and the upstream source, and served with it."""
    trust = architecture in REMOTE_CODE_ARCHITECTURES  # Phi4MM is refused for its code first
    info = inspect_weights(checkpoint(tmp_path, architecture))
    with pytest.raises(IncompatibleWeightsError) as refused:
        check_pytorch_checkpoint(info, [H100], trust_remote_code=trust)
    message = refused.value.message
    assert f"architecture {architecture} is multimodal" in message and "preprocessor_config.json" in message
    assert PROCESSOR_ARCHITECTURES[architecture] in message and "an hf:// source fetches them" in message
    (info.weights_dir / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    check_pytorch_checkpoint(info, [H100], trust_remote_code=trust)


def test_text_architectures_and_mllama_need_no_processor(tmp_path, smollm2):
    """MllamaForConditionalGeneration registers no input processor (the default one: the tokenizer only)."""
    check_pytorch_checkpoint(smollm2, [H100])
    check_pytorch_checkpoint(inspect_weights(checkpoint(tmp_path, "MllamaForConditionalGeneration")), [H100])


def test_the_processor_check_is_what_transformers_needs(tmp_path):
    """The real transformers (the venv's): AutoProcessor.from_pretrained of a LLaVA-NeXT checkpoint folder fails
    without preprocessor_config.json (OSError: can't load image processor) exactly where the check refuses it, and
    loads the processor once the file is there."""
    from transformers import AutoProcessor

    folder = checkpoint(tmp_path, "LlavaNextForConditionalGeneration", model_type="llava_next")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEFAULT_CHECKPOINT / name, folder / name)
    info = inspect_weights(folder)
    with pytest.raises(OSError, match="image processor"):
        AutoProcessor.from_pretrained(str(folder))
    with pytest.raises(IncompatibleWeightsError, match="preprocessor_config.json"):
        check_pytorch_checkpoint(info)
    (folder / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    assert type(AutoProcessor.from_pretrained(str(folder))).__name__ == "LlavaNextProcessor"
    check_pytorch_checkpoint(info)


@pytest.mark.parametrize("file,auto_map,module", [
    ("config.json", {"AutoConfig": "configuration_x.XConfig", "AutoModelForCausalLM": "modeling_x.XForCausalLM"},
     "configuration_x.py"),
    ("tokenizer_config.json", {"AutoTokenizer": ["tokenization_x.XTokenizer", None]}, "tokenization_x.py"),
    ("preprocessor_config.json", {"AutoProcessor": "processing_x.XProcessor"}, "processing_x.py"),
])
def test_code_a_checkpoint_names_is_refused_unless_allowed(tmp_path, file, auto_map, module):
    """By default: refused naming the entry and the setting. Allowed: the named module must be in the folder."""
    folder = checkpoint(tmp_path)
    data = json.loads((folder / file).read_text()) if (folder / file).is_file() else {}
    (folder / file).write_text(json.dumps({**data, "auto_map": auto_map}))
    info = inspect_weights(folder)
    first = next(iter(auto_map.items()))
    reference = first[1][0] if isinstance(first[1], list) else first[1]
    with pytest.raises(IncompatibleWeightsError) as refused:
        check_pytorch_checkpoint(info, [H100])
    message = refused.value.message
    assert f"the checkpoint names code of its repository ({file} auto_map {first[0]}: {reference}" in message
    assert "This image runs no code of a checkpoint unless COG_TRITON_LLM_TRUST_REMOTE_CODE=true" in message
    with pytest.raises(IncompatibleWeightsError, match=f"needs {module} beside it, and the checkpoint lacks it"):
        check_pytorch_checkpoint(info, [H100], trust_remote_code=True)
    for value in auto_map.values():
        for ref in value if isinstance(value, list) else [value]:
            if ref:
                (folder / (ref.rsplit(".", 1)[0] + ".py")).write_text("# the repository's code\n")
    check_pytorch_checkpoint(info, [H100], trust_remote_code=True)


def test_code_of_another_repository_and_phi4mm_without_trust_are_refused(tmp_path):
    folder = checkpoint(tmp_path, auto_map={"AutoConfig": "someone/else--configuration_x.XConfig"})
    with pytest.raises(IncompatibleWeightsError, match="is code of another repository, which this image does not "
                                                       "fetch"):
        check_pytorch_checkpoint(inspect_weights(folder), trust_remote_code=True)
    (tmp_path / "phi").mkdir()
    phi = inspect_weights(checkpoint(tmp_path / "phi", "Phi4MMForCausalLM",
                                     extra={"preprocessor_config.json": PREPROCESSOR}))
    with pytest.raises(IncompatibleWeightsError) as refused:
        check_pytorch_checkpoint(phi)
    assert "architecture Phi4MMForCausalLM needs its repository's code (Phi4MMInputProcessor raises unless " \
           "trust_remote_code" in refused.value.message
    check_pytorch_checkpoint(phi, trust_remote_code=True)


def test_vila_needs_the_folders_its_config_names(tmp_path):
    parts = {key: {"_name_or_path": f"./{name}"} for key, name in
             (("llm_cfg", "llm"), ("vision_tower_cfg", "vision_tower"), ("mm_projector_cfg", "mm_projector"))}
    folder = checkpoint(tmp_path, "LlavaLlamaModel", **parts)
    info = inspect_weights(folder)
    for name in ("llm", "vision_tower"):
        (folder / name).mkdir()
    with pytest.raises(IncompatibleWeightsError) as refused:
        check_pytorch_checkpoint(info)
    assert f"mm_projector_cfg names {folder / 'mm_projector'}, which does not exist" in refused.value.message
    (folder / "mm_projector").mkdir()
    check_pytorch_checkpoint(info)


def test_setup_plan_holds_the_checkpoint_to_the_trust_setting(tmp_path, monkeypatch):
    folder = checkpoint(tmp_path, auto_map={"AutoConfig": "configuration_x.XConfig"})
    (folder / "configuration_x.py").write_text("# the repository's code\n")
    info = inspect_weights(folder)
    with pytest.raises(IncompatibleWeightsError, match="COG_TRITON_LLM_TRUST_REMOTE_CODE=true"):
        plan_pytorch_serving(info, env_settings(monkeypatch).llm_api_options(), [H100])
    options = env_settings(monkeypatch, LLM_TRUST_REMOTE_CODE="true").llm_api_options()
    assert plan_pytorch_serving(info, options, [H100]).args["trust_remote_code"] is True


def test_the_pytorch_backend_facts_are_those_of_the_pinned_tensorrt_llm() -> None:
    """The architecture list, field tables and quantization rules were recorded for one release: moving the pin
    (tensorrtllm_backend/pins.py) without reading them again at the new release fails here."""
    from tensorrtllm_backend.checkpoint import FACTS_VERSION
    from tensorrtllm_backend.pins import TENSORRT_LLM_VERSION

    assert FACTS_VERSION == TENSORRT_LLM_VERSION


# --- the sampler (tensorrtllm_backend.samplers) -------------------------------------------------------


def test_the_sampler_setting_becomes_sampler_type_and_is_the_served_sampler(monkeypatch, smollm2):
    """COG_TRITON_LLM_SAMPLER: auto sends nothing (1.2.1's default, TorchSampler without beam search); a sampler
    named is sent; the serving plan knows which sampler runs (the predictor refuses by it)."""
    auto = plan_pytorch_serving(smollm2, env_settings(monkeypatch).llm_api_options(), [H100])
    assert "sampler_type" not in auto.args and auto.sampler == "TorchSampler"
    assert "sampler TorchSampler" in auto.describe(smollm2)
    trt = plan_pytorch_serving(smollm2, env_settings(monkeypatch, LLM_SAMPLER="TRTLLMSampler").llm_api_options(),
                               [H100])
    assert trt.args["sampler_type"] == "TRTLLMSampler" and trt.sampler == "TRTLLMSampler"
    with pytest.raises(ConfigError, match="LLM_SAMPLER"):
        env_settings(monkeypatch, LLM_SAMPLER="Torch")
    with pytest.raises(ConfigError, match="COG_TRITON_LLM_SAMPLER already sets"):
        build_llm_args(env_settings(monkeypatch, LLM_SAMPLER="auto", LLM_ARGS='{"sampler_type": "TorchSampler"}')
                       .llm_api_options(), smollm2)


def test_an_unknown_sampler_type_is_refused_where_1_2_1_would_take_torch_sampler():
    """sampler_type is Union[str, SamplerType]: 1.2.1 validates any string and samples with TorchSampler for one it
    does not know (_util.py instantiate_sampler); a typo of TRTLLMSampler is refused here instead."""
    with pytest.raises(ConfigError, match="sampler_type 'TRTLLM' is not one of auto, TorchSampler, TRTLLMSampler"):
        validate_llm_args({"model": "/m", "sampler_type": "TRTLLM"})


def test_beam_search_or_a_speculative_decoder_decide_the_sampler_as_1_2_1_does():
    from tensorrtllm_backend.samplers import effective_sampler

    assert effective_sampler({}) == "TorchSampler"
    assert effective_sampler({"max_beam_width": 2}) == "TRTLLMSampler"
    assert effective_sampler({"sampler_type": "TorchSampler", "max_beam_width": 2}) == "TorchSampler"
    assert effective_sampler({"sampler_type": "TRTLLMSampler", "speculative_config": {"decoding_type": "MTP"}}) == (
        "TorchSampler")  # the speculative decoder's sampler replaces the choice; nothing more assumed of it


def test_the_worker_refuses_what_the_sampler_would_ignore(tmp_path, caplog):
    """LLMService.validate: under TorchSampler a prediction with a penalty, min_tokens or a seed (when sampling) is
    refused before it leaves the Cog worker, its error leading with what the caller can do (the operator's remedy,
    the sampler setting, logged); a drawn seed is not a refusal (it is not sent); the C++ backend and TRTLLMSampler
    take everything."""
    from cog_triton.stream_config import GeneratorConfig
    from cog_triton.worker.service import LLMService
    from tensorrtllm_backend.engine import ModelLimits

    service = LLMService(Settings())
    limits = ModelLimits(max_batch_size=8, max_input_len=100, max_seq_len=200)
    for sampler in ("TorchSampler", "TRTLLMSampler", None):
        service.generator_config = GeneratorConfig(tokenizer_dir=tmp_path, limits=limits, grpc_address="x:1",
                                                   backend="engine" if sampler is None else "pytorch", sampler=sampler)
        refused = sampler == "TorchSampler"
        for inputs, phrase in (({"repetition_penalty": 1.3}, "repetition_penalty=1.3 cannot be applied here: leave "
                                                             "repetition_penalty out"),
                               ({"presence_penalty": 0.5}, "presence_penalty=0.5 cannot be applied here"),
                               ({"frequency_penalty": 0.5}, "frequency_penalty=0.5 cannot be applied here"),
                               ({"min_tokens": 3}, "min_tokens=3 cannot be applied here: leave min_tokens out"),
                               ({"seed": 5}, "seed=5 cannot be applied here: leave seed out, or set temperature to 0")):
            if refused:
                with caplog.at_level(logging.WARNING, logger="cog_triton.worker.service"):
                    caplog.clear()
                    with pytest.raises(InputError) as info:
                        service.validate(prompt="hi", **inputs)
                message = info.value.message
                assert message.startswith(phrase) and "TorchSampler" in message, message
                assert "COG_TRITON_LLM_SAMPLER" not in message and "PR #" not in message
                assert "COG_TRITON_LLM_SAMPLER=TRTLLMSampler" in caplog.text  # the operator's remedy, logged
            else:
                service.validate(prompt="hi", **inputs)
        drawn = service.validate(prompt="hi")
        assert not drawn.seed_given
        service.validate(prompt="hi", seed=5, temperature=0)  # greedy: the seed changes nothing anywhere
        note = service.seed_note(drawn)
        assert note.startswith("no seed sent") if refused else note == f"seed {drawn.seed}"
    # each refusal counted as a failed prediction with an input error code (5 under TorchSampler)
    assert service.metrics.errors.labels(InputError.code)._value.get() == 5


def test_a_tensor_parallel_checkpoint_runs_one_triton_under_mpirun_whose_llm_spawns_the_ranks(tmp_path, monkeypatch):
    """The llmapi model's documented launch (tensorrtllm_backend docs/llmapi.md @08ed112e: launch_triton_server.py
    with world size 1, i.e. mpirun -n 1 tritonserver): one server, the LLM given tensor_parallel_size spawns its
    ranks; not one server per rank as for an engine. mpirun here is a stand-in that records its argv and exits."""
    from common.errors import TritonStartupError
    from cog_triton.dev.local import free_port
    from cog_triton.worker.service import LLMService
    from tests.gpu_fakes import fake_nvidia_smi, gpus, path_with

    monkeypatch.setenv("PATH", path_with(fake_nvidia_smi(tmp_path / "smi", gpus(2))))
    record = tmp_path / "mpirun.argv"
    mpirun = tmp_path / "mpirun"
    mpirun.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {record}\necho 'mpirun stand-in: no GPUs here' >&2\nexit 3\n")
    mpirun.chmod(0o755)
    settings = Settings(weights_dir=tmp_path / "weights", model_repo_dir=tmp_path / "repo", http_port=free_port(),
                        grpc_port=free_port(), metrics_port=free_port(), prometheus_port=free_port(),
                        prometheus_address="127.0.0.1", triton_log_file=tmp_path / "triton.log", stop_timeout_s=5,
                        startup_timeout_s=30, mpirun=str(mpirun), llm_tensor_parallel_size=2, stream_processes=1)
    service = LLMService(settings)
    try:
        with pytest.raises(TritonStartupError, match="mpirun stand-in: no GPUs here"):
            service.setup(str(DEFAULT_CHECKPOINT))
    finally:
        service.shutdown()
    argv = record.read_text().splitlines()
    assert argv[:3] == ["--allow-run-as-root", "-n", "1"] and ":" not in argv
    assert len([a for a in argv if a.endswith("/tritonserver")]) == 1
    args = json.loads((tmp_path / "repo" / "tensorrt_llm" / "1" / "llm_args.json").read_text())
    assert args["tensor_parallel_size"] == 2 and "_mpi_session" not in args


def test_the_llm_stream_interval_setting_becomes_stream_interval(monkeypatch, smollm2):
    """COG_TRITON_LLM_STREAM_INTERVAL: TorchLlmArgs.stream_interval, sent unless 1 (its default); the extra arguments
    may not set it again."""
    assert "stream_interval" not in build_llm_args(env_settings(monkeypatch).llm_api_options(), smollm2)
    args = build_llm_args(env_settings(monkeypatch, LLM_STREAM_INTERVAL="4").llm_api_options(), smollm2)
    assert args["stream_interval"] == 4
    with pytest.raises(ConfigError, match="COG_TRITON_LLM_STREAM_INTERVAL already sets"):
        build_llm_args(env_settings(monkeypatch, LLM_ARGS='{"stream_interval": 2}').llm_api_options(), smollm2)
