"""Engine build configs (YAML): every shipped example loads; bad configs fail naming key and allowed values."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.errors import BuildConfigError, ConfigError
from cog_triton.settings import REPO_ROOT
from tensorrtllm_backend.build_config import (
    Backend,
    DType,
    KVCacheQuantization,
    Quantization,
    load_build_config,
    parse_build_config,
)

EXAMPLES = sorted((REPO_ROOT / "configs" / "engines").glob("*.yaml"))
MINIMAL: dict[str, Any] = {"name": "m", "source": {"checkpoint": "org/model"}}


def problem(data: dict[str, Any]) -> str:
    with pytest.raises(BuildConfigError) as info:
        parse_build_config(data, where="test.yaml")
    message = str(info.value)
    assert message.startswith("[build_config_error] test.yaml: ")
    return message


def with_(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(MINIMAL)
    data.update(changes)
    return data


def test_the_examples_people_ask_for_are_shipped() -> None:
    names = {p.stem for p in EXAMPLES}
    assert {
        "llama-3-8b-instruct-bf16",
        "llama-2-7b-fp16-tp4",
        "gpt2-medium-fp16",
        "gemma-2b-it",
        "smollm2-135m-instruct-reference",
    } <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_loads(path: Path) -> None:
    config = load_build_config(path)
    assert config.name
    # The YAML holds only known keys, and re-validating the dump gives the same object.
    assert parse_build_config(config.to_manifest()) == config


def test_example_contents() -> None:
    by_stem = {p.stem: load_build_config(p) for p in EXAMPLES}
    llama3 = by_stem["llama-3-8b-instruct-bf16"]
    assert (llama3.dtype, llama3.parallelism.world_size, llama3.quantization) == (DType.BFLOAT16, 1, Quantization.NONE)
    assert llama3.source.checkpoint == "meta-llama/Meta-Llama-3-8B-Instruct" and not llama3.source.is_local
    llama2 = by_stem["llama-2-7b-fp16-tp4"]
    assert (llama2.dtype, llama2.parallelism.tp_size, llama2.parallelism.world_size) == (DType.FLOAT16, 4, 4)
    assert by_stem["gpt2-medium-fp16"].source.checkpoint == "openai-community/gpt2-medium"
    assert by_stem["gemma-2b-it"].quantization is Quantization.INT8_WO
    fp8 = by_stem["llama-3-8b-instruct-fp8"]
    assert fp8.needs_calibration and fp8.calibration is not None and fp8.min_compute_capability == (8, 9)
    assert fp8.kv_cache_quantization is KVCacheQuantization.FP8
    smol = by_stem["smollm2-135m-instruct-reference"]
    assert smol.backend is Backend.REFERENCE
    assert smol.checkpoint_path(REPO_ROOT / "configs" / "engines") == REPO_ROOT / "build" / "default_model" / "checkpoint"


def test_defaults() -> None:
    config = parse_build_config(MINIMAL)
    assert config.backend is Backend.TENSORRTLLM
    assert config.dtype is DType.FLOAT16
    assert config.features.paged_kv_cache and config.features.paged_context_fmha
    assert config.plugins == {"gemm_plugin": "auto", "gpt_attention_plugin": "auto"}
    assert config.calibration is None and not config.needs_calibration
    assert config.min_compute_capability is None


def test_calibrated_mode_gets_default_calibration() -> None:
    config = parse_build_config(with_(quantization="int4_awq", dtype="bfloat16"))
    assert config.calibration is not None and config.calibration.size == 512


def test_unknown_top_level_key_names_it_and_the_allowed_keys() -> None:
    message = problem(with_(max_batch_size=8))
    assert "max_batch_size: unknown key" in message
    assert "allowed: name, backend, source, dtype, quantization" in message
    assert "limits" in message


def test_unknown_nested_key_names_its_path_and_siblings() -> None:
    message = problem(with_(limits={"max_batch": 8}))
    assert "limits.max_batch: unknown key" in message
    assert "allowed: max_batch_size, max_input_len, max_seq_len, max_num_tokens, max_beam_width" in message


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"quantization": "int3"}, "quantization: Input should be 'none', 'int8_wo', 'int4_wo', 'int4_awq'"),
        ({"dtype": "fp16"}, "dtype: Input should be 'float16', 'bfloat16' or 'float32' (got 'fp16')"),
        ({"backend": "vllm"}, "backend: Input should be 'tensorrtllm', 'reference' or 'pytorch' (got 'vllm')"),
        ({"name": "Llama 3"}, "name: 'Llama 3' is not allowed: use 1-100 characters of a-z 0-9 . _ - (lowercase)"),
        ({"source": {"checkpoint": "not a hub id"}}, "neither a local folder"),
        ({"source": {"checkpoint": "./local", "revision": "main"}}, "revision applies to Hugging Face Hub ids only"),
        ({"limits": {"max_input_len": 4096, "max_seq_len": 4096}}, "max_input_len (4096) must be below max_seq_len (4096)"),
        ({"limits": {"max_batch_size": 0}}, "limits.max_batch_size: Input should be greater than or equal to 1 (got 0)"),
        ({"parallelism": {"tp_size": "four"}}, "parallelism.tp_size: Input should be a valid integer"),
        ({"plugins": {"gemm_plugin": "fast"}}, "gemm_plugin: 'fast' is not allowed; allowed: auto, float16"),
        ({"plugins": {"attention_plugin": "auto"}}, "unknown plugin 'attention_plugin'; known: fp8_rowwise_gemm_plugin"),
        ({"quantization": "int8_wo", "calibration": {"size": 64}}, "calibration is only used by quantization"),
        ({"quantization": "int4_wo", "kv_cache_quantization": "fp8"}, "kv_cache_quantization fp8 needs ModelOpt calibration"),
        ({"quantization": "int4_awq", "dtype": "float32"}, "quantization int4_awq needs dtype float16 or bfloat16"),
        ({"features": {"paged_kv_cache": False}}, "features.paged_context_fmha needs features.paged_kv_cache: true"),
        ({"plugins": {"gpt_attention_plugin": "disable"}}, "need gpt_attention_plugin enabled"),
        (
            {"features": {"paged_context_fmha": False}, "limits": {"max_input_len": 2048, "max_num_tokens": 1024}},
            "limits.max_num_tokens (1024) is below limits.max_input_len (2048)",
        ),
        ({"workers": 2}, "workers (2) must not exceed the world size (1)"),
        ({"backend": "reference", "parallelism": {"tp_size": 2}}, "tp_size*pp_size must be 1 (got 2)"),
        ({"backend": "reference", "quantization": "fp8"}, "quantization and kv_cache_quantization must be none"),
        ({"backend": "pytorch", "parallelism": {"tp_size": 2}, "limits": {"max_batch_size": 7}},
         "the pytorch backend builds nothing, so parallelism, limits cannot be set here"),
        ({"calibration": {"awq_block_size": 100}, "quantization": "int4_awq"}, "calibration.awq_block_size: Input should be 32, 64 or 128"),
    ],
)
def test_bad_values_are_named_with_what_is_allowed(changes: dict[str, Any], expected: str) -> None:
    assert expected in problem(with_(**changes))


def test_missing_required_keys() -> None:
    message = problem({"backend": "tensorrtllm"})
    assert "name: Field required" in message and "source: Field required" in message


def test_every_problem_is_reported_at_once() -> None:
    message = problem(with_(dtype="fp16", limits={"max_batch_size": -1}, colour="red"))
    assert "dtype:" in message and "limits.max_batch_size:" in message and "colour: unknown key" in message


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(BuildConfigError, match="cannot read build config .*missing.yaml"):
        load_build_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(BuildConfigError, match="bad.yaml is not valid YAML"):
        load_build_config(bad)
    listed = tmp_path / "list.yaml"
    listed.write_text("- name: x\n")
    with pytest.raises(BuildConfigError, match="must be a mapping of keys to values, got list"):
        load_build_config(listed)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(BuildConfigError, match="got NoneType"):
        load_build_config(empty)


def test_build_config_error_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(with_(dtype="int8")))
    with pytest.raises(ConfigError):
        load_build_config(path)


def test_local_checkpoint_paths(tmp_path: Path) -> None:
    config = parse_build_config(with_(source={"checkpoint": "../ckpt"}))
    assert config.source.is_local
    assert config.checkpoint_path(tmp_path / "configs") == (tmp_path / "ckpt").resolve()
    absolute = parse_build_config(with_(source={"checkpoint": str(tmp_path)}))
    assert absolute.checkpoint_path(Path("/elsewhere")) == tmp_path
    hub = parse_build_config(with_(source={"checkpoint": "org/name", "revision": "v1.0"}))
    assert hub.checkpoint_path(tmp_path) is None and hub.source.revision == "v1.0"


# --- LoRA ----------------------------------------------------------------------------------------


def test_a_lora_section_becomes_trtllm_builds_lora_flags_and_is_recorded() -> None:
    from tensorrtllm_backend.build import trtllm_build_argv

    config = parse_build_config(with_(lora={"max_lora_rank": 16, "lora_target_modules": ["attn_q", "attn_v"]}))
    argv = trtllm_build_argv(config, Path("/c"), Path("/e"))
    start = argv.index("--lora_plugin")
    assert argv[start:start + 7] == ("--lora_plugin", "auto", "--max_lora_rank", "16", "--lora_target_modules",
                                     "attn_q", "attn_v")
    assert config.to_manifest()["lora"] == {"lora_plugin": "auto", "max_lora_rank": 16,
                                            "lora_target_modules": ["attn_q", "attn_v"], "max_loras": 8}
    assert "--lora_plugin" not in trtllm_build_argv(parse_build_config(with_()), Path("/c"), Path("/e"))
    assert parse_build_config(with_(lora={})).lora.max_lora_rank == 64  # trtllm-build's default


@pytest.mark.parametrize("lora,expected", [
    ({"lora_plugin": "float16"}, "lora.lora_plugin float16 differs from the model dtype bfloat16"),
    ({"lora_plugin": "int8"}, "'int8' is not allowed; allowed: auto, float16, bfloat16, float32"),
    ({"max_lora_rank": 0}, "lora.max_lora_rank: Input should be greater than or equal to 1"),
    ({"lora_target_modules": ["attn_qkv"]}, "'attn_qkv' not supported; allowed: attn_q, attn_k"),
    ({"lora_target_modules": ["attn_q", "attn_q"]}, "a module is listed twice"),
    ({"lora_target_modules": []}, "lora.lora_target_modules"),
    ({"max_lora": 2},
     "lora.max_lora: unknown key; allowed: lora_plugin, max_lora_rank, lora_target_modules, max_loras"),
])
def test_bad_lora_sections_say_what_is_allowed(lora: dict[str, Any], expected: str) -> None:
    assert expected in problem(with_(dtype="bfloat16", lora=lora))


@pytest.mark.parametrize("modules,lone,partner", [
    (["attn_q", "mlp_h_to_4h", "mlp_4h_to_h"], "mlp_h_to_4h (gate_proj)", "mlp_gate (up_proj)"),
    (["mlp_gate"], "mlp_gate (up_proj)", "mlp_h_to_4h (gate_proj)"),
])
def test_one_of_the_fused_mlps_pair_is_refused_with_the_reason(modules: list[str], lone: str, partner: str) -> None:
    """trtllm-build fuses the gated MLP (features.use_fused_mlp, on by default), and the fused layer adds LoRA only
    when both mlp_h_to_4h and mlp_gate are LoRA modules (tensorrt_llm/layers/mlp.py fc_gate_lora @ 04a2cacb):
    the engine would take adapters' weights for the one listed and silently ignore them."""
    message = problem(with_(lora={"lora_target_modules": modules}))
    assert f"lora.lora_target_modules has {lone} without {partner}: the fused gated MLP applies LoRA" in message
    assert "together or not at all (tensorrt_llm/layers/mlp.py fc_gate_lora)" in message
    assert "list both mlp_h_to_4h and mlp_gate or neither, or set features.use_fused_mlp: false" in message


@pytest.mark.parametrize("changes", [
    dict(lora={"lora_target_modules": ["attn_q", "mlp_h_to_4h", "mlp_gate"]}),  # both
    dict(lora={"lora_target_modules": ["attn_q", "attn_v", "mlp_4h_to_h"]}),  # neither
    dict(lora={}),  # every module
    dict(lora={"lora_target_modules": ["mlp_h_to_4h"]}, features={"use_fused_mlp": False}),  # GatedMLP: fc, gate apart
    dict(lora={"lora_target_modules": ["mlp_h_to_4h"]}, backend="reference"),  # transformers' MLP: not fused
])
def test_the_fused_mlps_pair_together_neither_or_unfused_is_accepted(changes: dict[str, Any]) -> None:
    parse_build_config(with_(**changes))


def test_lora_on_the_fused_mlps_pair_with_the_gemm_swiglu_plugin_is_refused() -> None:
    """FusedGatedMLP.fc_gate_plugin (tensorrt_llm/layers/mlp.py @ 04a2cacb) raises NotImplementedError at build
    time for LoRA on mlp_h_to_4h or mlp_gate with gemm_swiglu_plugin."""
    message = problem(with_(quantization="fp8", plugins={"gemm_swiglu_plugin": "fp8"}, lora={}))
    assert "plugins.gemm_swiglu_plugin fp8 cannot apply LoRA to mlp_h_to_4h and mlp_gate" in message
    parse_build_config(with_(quantization="fp8", plugins={"gemm_swiglu_plugin": "fp8"},
                             lora={"lora_target_modules": ["attn_q", "mlp_4h_to_h"]}))


def test_the_lora_plugin_lives_in_the_lora_section() -> None:
    assert "set the LoRA plugin in the lora section" in problem(with_(plugins={"lora_plugin": "auto"}))
