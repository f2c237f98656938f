"""Tests of tensorrtllm_backend.engine: engine folders and Hugging Face checkpoints written in tmp_path."""

from __future__ import annotations

import copy
import json
import logging
import shutil
from pathlib import Path
from typing import Any, Optional

import pytest

from common.errors import ConfigError
from cog_triton.settings import REPO_ROOT
from tensorrtllm_backend.engine import (
    REFERENCE_DEFAULT_MAX_SEQ_LEN,
    TOKENIZER_FILES,
    ModelLimits,
    WeightsInfo,
    find_tokenizer_dir,
    inspect_weights,
)
from tensorrtllm_backend.pins import TENSORRT_LLM_VERSION, TRITON_IMAGE

CHECKPOINT = REPO_ROOT / "build" / "default_model" / "checkpoint"
TOKENIZER_SOURCE_FILES = ("tokenizer.json", "tokenizer_config.json")

ENGINE_CONFIG: dict[str, Any] = {
    "version": "1.2.1",
    "pretrained_config": {
        "architecture": "LlamaForCausalLM",
        "dtype": "float16",
        "vocab_size": 32000,
        "mapping": {"world_size": 2, "tp_size": 2, "pp_size": 1},
    },
    "build_config": {
        "max_batch_size": 64,
        "max_input_len": 2048,
        "max_seq_len": 4096,
        "max_num_tokens": 8192,
        "max_beam_width": 1,
    },
}


def copy_tokenizer(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_SOURCE_FILES:
        shutil.copy2(CHECKPOINT / name, dest / name)


def write_engine(
    folder: Path,
    config: Optional[dict[str, Any]] = None,
    *,
    ranks: int = 2,
    tokenizer: Optional[str] = ".",
) -> Path:
    """An engine folder: config.json, rank<K>.engine for K < ranks, tokenizer at ``tokenizer`` (None: none)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(ENGINE_CONFIG if config is None else config))
    for rank in range(ranks):
        (folder / f"rank{rank}.engine").write_bytes(b"\x00engine" * 16)
    if tokenizer is not None:
        copy_tokenizer(folder / tokenizer)
    return folder


def engine_config(**build_changes: Any) -> dict[str, Any]:
    """ENGINE_CONFIG with build_config keys changed (value None removes the key)."""
    config = copy.deepcopy(ENGINE_CONFIG)
    for key, value in build_changes.items():
        if value is None:
            config["build_config"].pop(key, None)
        else:
            config["build_config"][key] = value
    return config


def write_checkpoint(folder: Path, config: dict[str, Any], *, weights: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if weights:
        (folder / "model.safetensors").write_bytes(b"")
    copy_tokenizer(folder)
    return folder


HF_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "max_position_embeddings": 2048,
             "torch_dtype": "bfloat16"}


# --- engines -----------------------------------------------------------------------------------


def test_engine_limits_and_world_size(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    folder = write_engine(tmp_path / "engine")
    with caplog.at_level(logging.WARNING, logger="tensorrtllm_backend.engine"):
        info = inspect_weights(folder)
    assert isinstance(info, WeightsInfo)
    assert info.kind == "engine"
    assert info.weights_dir == folder
    assert info.tokenizer_dir == folder
    assert info.limits == ModelLimits(
        max_batch_size=64, max_input_len=2048, max_seq_len=4096, max_beam_width=1, max_num_tokens=8192
    )
    assert info.limits.max_output_len == 4095
    assert (info.world_size, info.tp_size, info.pp_size) == (2, 2, 1)
    assert info.architecture == "LlamaForCausalLM"
    assert info.dtype == "float16"
    assert info.trtllm_version == "1.2.1"
    assert TENSORRT_LLM_VERSION == "1.2.1"
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_engine_pipeline_parallel(tmp_path: Path) -> None:
    config = copy.deepcopy(ENGINE_CONFIG)
    config["pretrained_config"]["mapping"] = {"world_size": 4, "tp_size": 2, "pp_size": 2}
    info = inspect_weights(write_engine(tmp_path / "engine", config, ranks=4))
    assert (info.world_size, info.tp_size, info.pp_size) == (4, 2, 2)


def test_engine_without_mapping_is_single_rank(tmp_path: Path) -> None:
    config = copy.deepcopy(ENGINE_CONFIG)
    del config["pretrained_config"]["mapping"]
    info = inspect_weights(write_engine(tmp_path / "engine", config, ranks=1))
    assert (info.world_size, info.tp_size, info.pp_size) == (1, 1, 1)


def test_engine_legacy_max_output_len(tmp_path: Path) -> None:
    config = engine_config(max_seq_len=None, max_output_len=512)
    info = inspect_weights(write_engine(tmp_path / "engine", config))
    assert info.limits.max_input_len == 2048
    assert info.limits.max_seq_len == 2048 + 512


def test_engine_max_seq_len_wins_over_max_output_len(tmp_path: Path) -> None:
    config = engine_config(max_output_len=512)
    info = inspect_weights(write_engine(tmp_path / "engine", config))
    assert info.limits.max_seq_len == 4096


def test_engine_missing_rank_file(tmp_path: Path) -> None:
    folder = write_engine(tmp_path / "engine", ranks=1)
    with pytest.raises(ConfigError) as info:
        inspect_weights(folder)
    message = str(info.value)
    assert "rank1.engine" in message
    assert "rank0.engine" not in message
    assert "world_size 2" in message


def test_engine_pre_08_layout_names_pinned_version(tmp_path: Path) -> None:
    legacy = {
        "builder_config": {"name": "llama", "precision": "float16", "tensor_parallel": 1, "max_batch_size": 8},
        "plugin_config": {"gpt_attention_plugin": "float16"},
    }
    folder = write_engine(tmp_path / "engine", legacy, ranks=0)
    (folder / "llama_float16_tp1_rank0.engine").write_bytes(b"old")
    with pytest.raises(ConfigError) as info:
        inspect_weights(folder)
    message = str(info.value)
    assert "pre-0.8" in message
    assert TENSORRT_LLM_VERSION in message
    assert TRITON_IMAGE in message
    assert str(folder / "config.json") in message


def test_engine_world_size_mismatch(tmp_path: Path) -> None:
    config = copy.deepcopy(ENGINE_CONFIG)
    config["pretrained_config"]["mapping"] = {"world_size": 2, "tp_size": 1, "pp_size": 1}
    with pytest.raises(ConfigError) as info:
        inspect_weights(write_engine(tmp_path / "engine", config))
    message = str(info.value)
    assert "world_size=2" in message
    assert "tp_size*pp_size=1" in message


@pytest.mark.parametrize("mapping", [{"world_size": 2, "tp_size": "two", "pp_size": 1}, ["not", "a", "dict"]])
def test_engine_malformed_mapping(tmp_path: Path, mapping: Any) -> None:
    config = copy.deepcopy(ENGINE_CONFIG)
    config["pretrained_config"]["mapping"] = mapping
    with pytest.raises(ConfigError) as info:
        inspect_weights(write_engine(tmp_path / "engine", config))
    assert "pretrained_config.mapping" in str(info.value)
    assert "config.json" in str(info.value)


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"max_batch_size": None}, "max_batch_size"),
        ({"max_batch_size": "64"}, "max_batch_size"),
        ({"max_input_len": -1}, "max_input_len"),
        ({"max_input_len": None}, "max_input_len"),
        ({"max_input_len": True}, "max_input_len"),
        ({"max_seq_len": 0}, "max_seq_len"),
        ({"max_seq_len": 4096.0}, "max_seq_len"),
        ({"max_seq_len": None, "max_output_len": 0}, "max_output_len"),
    ],
)
def test_engine_bad_build_values(tmp_path: Path, changes: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        inspect_weights(write_engine(tmp_path / "engine", engine_config(**changes)))
    message = str(info.value)
    assert f"{key} must be a positive integer" in message
    assert "config.json" in message


def test_engine_without_any_sequence_limit(tmp_path: Path) -> None:
    # Neither max_seq_len nor the legacy max_output_len.
    with pytest.raises(ConfigError, match="build_config needs max_seq_len"):
        inspect_weights(write_engine(tmp_path / "engine", engine_config(max_seq_len=None)))


def test_engine_input_longer_than_sequence(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="max_input_len 5000 exceeds max_seq_len 4096"):
        inspect_weights(write_engine(tmp_path / "engine", engine_config(max_input_len=5000)))


def test_engine_without_pretrained_config(tmp_path: Path) -> None:
    config = copy.deepcopy(ENGINE_CONFIG)
    del config["pretrained_config"]
    with pytest.raises(ConfigError, match="pretrained_config/build_config"):
        inspect_weights(write_engine(tmp_path / "engine", config))


def test_invalid_json(tmp_path: Path) -> None:
    folder = write_engine(tmp_path / "engine")
    (folder / "config.json").write_text('{"version": "1.2.1", "build_config": ')
    with pytest.raises(ConfigError) as info:
        inspect_weights(folder)
    assert "not valid JSON" in str(info.value)
    assert str(folder / "config.json") in str(info.value)


def test_json_not_an_object(tmp_path: Path) -> None:
    folder = write_engine(tmp_path / "engine")
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must hold a JSON object"):
        inspect_weights(folder)


def test_no_config_json(tmp_path: Path) -> None:
    folder = write_engine(tmp_path / "engine")
    (folder / "config.json").unlink()
    with pytest.raises(ConfigError) as info:
        inspect_weights(folder)
    message = str(info.value)
    assert f"{folder / 'config.json'} not found" in message
    assert "rank*.engine" in message


def test_no_tokenizer_lists_expected_files(tmp_path: Path) -> None:
    folder = write_engine(tmp_path / "engine", tokenizer=None)
    with pytest.raises(ConfigError) as info:
        inspect_weights(folder)
    message = str(info.value)
    for name in ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json"):
        assert name in message
    assert set(TOKENIZER_FILES) == {"tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json"}
    assert str(folder) in message


def test_tokenizer_subfolder_preferred(tmp_path: Path) -> None:
    folder = write_engine(tmp_path / "engine", tokenizer=".")
    copy_tokenizer(folder / "tokenizer")
    assert inspect_weights(folder).tokenizer_dir == folder / "tokenizer"


def test_tokenizer_only_in_subfolder(tmp_path: Path) -> None:
    folder = write_engine(tmp_path / "engine", tokenizer="tokenizer")
    assert not (folder / "tokenizer.json").exists()
    assert inspect_weights(folder).tokenizer_dir == folder / "tokenizer"


def test_empty_tokenizer_subfolder_falls_back_to_top_level(tmp_path: Path) -> None:
    folder = write_engine(tmp_path / "engine", tokenizer=".")
    (folder / "tokenizer").mkdir()
    assert inspect_weights(folder).tokenizer_dir == folder


def test_tokenizer_override(tmp_path: Path) -> None:
    folder = write_engine(tmp_path / "engine", tokenizer=".")
    elsewhere = tmp_path / "tok"
    copy_tokenizer(elsewhere)
    assert inspect_weights(folder, tokenizer_dir=elsewhere).tokenizer_dir == elsewhere
    with pytest.raises(ConfigError) as info:
        find_tokenizer_dir(folder, tmp_path / "missing")
    assert str(tmp_path / "missing") in str(info.value)


def test_engine_version_is_reported_not_judged(tmp_path: Path) -> None:
    # Whether this image can serve it is tensorrtllm_backend.manifest's decision (tests/test_manifest.py).
    config = copy.deepcopy(ENGINE_CONFIG)
    config["version"] = "0.12.0"
    assert inspect_weights(write_engine(tmp_path / "engine", config)).trtllm_version == "0.12.0"


# --- Hugging Face checkpoints ------------------------------------------------------------------


def test_real_checkpoint_default_limits() -> None:
    positions = json.loads((CHECKPOINT / "config.json").read_text())["max_position_embeddings"]
    info = inspect_weights(CHECKPOINT)
    assert info.kind == "hf_checkpoint"
    assert info.weights_dir == CHECKPOINT
    assert info.tokenizer_dir == CHECKPOINT
    assert info.limits.max_seq_len == min(positions, REFERENCE_DEFAULT_MAX_SEQ_LEN) == 4096
    assert info.limits.max_input_len == info.limits.max_seq_len - 1
    assert info.limits.max_batch_size == 8
    assert info.limits.max_beam_width == 1
    assert (info.world_size, info.tp_size, info.pp_size) == (1, 1, 1)
    assert info.architecture == "LlamaForCausalLM"
    assert info.trtllm_version is None


def test_checkpoint_small_position_embeddings(tmp_path: Path) -> None:
    info = inspect_weights(write_checkpoint(tmp_path / "ckpt", HF_CONFIG))
    assert info.kind == "hf_checkpoint"
    assert info.limits.max_seq_len == 2048
    assert info.limits.max_input_len == 2047
    assert info.dtype == "bfloat16"
    assert info.architecture == "LlamaForCausalLM"


def test_checkpoint_without_position_embeddings(tmp_path: Path) -> None:
    config = {"model_type": "gpt2"}
    info = inspect_weights(write_checkpoint(tmp_path / "ckpt", config))
    assert info.limits.max_seq_len == REFERENCE_DEFAULT_MAX_SEQ_LEN
    assert info.architecture == "gpt2"
    assert info.dtype == "float32"


def test_checkpoint_pytorch_bin_weights(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ckpt", HF_CONFIG, weights=False)
    (folder / "pytorch_model-00001-of-00002.bin").write_bytes(b"")
    assert inspect_weights(folder).kind == "hf_checkpoint"


def test_checkpoint_reference_overrides(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ckpt", HF_CONFIG)
    info = inspect_weights(folder, reference_max_batch_size=3, reference_max_seq_len=1024, reference_max_input_len=1000)
    assert info.limits == ModelLimits(max_batch_size=3, max_input_len=1000, max_seq_len=1024)
    only_seq = inspect_weights(folder, reference_max_seq_len=512)
    assert (only_seq.limits.max_seq_len, only_seq.limits.max_input_len) == (512, 511)
    only_input = inspect_weights(folder, reference_max_input_len=100)
    assert (only_input.limits.max_seq_len, only_input.limits.max_input_len) == (2048, 100)
    at_limit = inspect_weights(folder, reference_max_seq_len=2048)
    assert at_limit.limits.max_seq_len == 2048


def test_checkpoint_seq_len_above_position_embeddings(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ckpt", HF_CONFIG)
    with pytest.raises(ConfigError) as info:
        inspect_weights(folder, reference_max_seq_len=4096)
    message = str(info.value)
    assert "COG_TRITON_REFERENCE_MAX_SEQ_LEN=4096" in message
    assert "2048" in message


@pytest.mark.parametrize("seq, inp", [(1024, 1024), (1024, 2000), (None, 2048)])
def test_checkpoint_input_not_below_seq_len(tmp_path: Path, seq: Optional[int], inp: int) -> None:
    folder = write_checkpoint(tmp_path / "ckpt", HF_CONFIG)
    with pytest.raises(ConfigError) as info:
        inspect_weights(folder, reference_max_seq_len=seq, reference_max_input_len=inp)
    assert f"COG_TRITON_REFERENCE_MAX_INPUT_LEN={inp}" in str(info.value)


def test_checkpoint_without_weights(tmp_path: Path) -> None:
    folder = write_checkpoint(tmp_path / "ckpt", HF_CONFIG, weights=False)
    with pytest.raises(ConfigError) as info:
        inspect_weights(folder)
    message = str(info.value)
    assert "no weights" in message
    assert "*.safetensors" in message
    assert str(folder) in message


def test_checkpoint_without_tokenizer(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(HF_CONFIG))
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match="no tokenizer found"):
        inspect_weights(folder)


def test_engine_detected_by_rank_files_even_without_build_config(tmp_path: Path) -> None:
    """A folder with rank*.engine is never mistaken for a checkpoint."""
    folder = write_engine(tmp_path / "engine", HF_CONFIG, ranks=1)
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match="not a trtllm-build engine config"):
        inspect_weights(folder)


def test_model_in_a_single_top_level_folder_is_found(tmp_path: Path, checkpoint_dir: Path) -> None:
    import shutil

    nested = tmp_path / "weights" / "smollm2"
    nested.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(checkpoint_dir / name, nested / name)
    (nested / "model.safetensors").write_bytes(b"")
    (tmp_path / "weights" / ".cog-triton-weights.json").write_text("{}")  # hidden files are ignored
    info = inspect_weights(tmp_path / "weights")
    assert info.weights_dir == nested
    assert info.tokenizer_dir == nested
    # Two visible entries: ambiguous, so the top level is used and the error names it.
    (tmp_path / "weights" / "other").mkdir()
    with pytest.raises(ConfigError, match="config.json not found"):
        inspect_weights(tmp_path / "weights")


# --- the longest prompt the executor takes -----------------------------------------------------


def test_engine_config_records_packed_context_fmha(tmp_path: Path) -> None:
    """build_config.plugin_config.context_fmha and remove_input_padding (gptJsonConfig.cpp
    parsePluginConfig) decide which limit the executor applies (trtGptModel.h)."""
    both = engine_config(plugin_config={"context_fmha": True, "remove_input_padding": True})
    assert inspect_weights(write_engine(tmp_path / "both", both)).limits.packed_context_fmha is True
    padded = engine_config(plugin_config={"context_fmha": True, "remove_input_padding": False})
    assert inspect_weights(write_engine(tmp_path / "padded", padded)).limits.packed_context_fmha is False
    none = inspect_weights(write_engine(tmp_path / "none", engine_config(plugin_config=None)))
    assert none.limits.packed_context_fmha is False


@pytest.mark.parametrize(
    ("limits", "expected", "reason"),
    [
        # chunked context off, context FMHA + packed input: min(max_seq_len - 1, max_num_tokens), not max_input_len
        (ModelLimits(64, 16384, 16384, max_num_tokens=8192, packed_context_fmha=True), 8192, "min(16383, 8192)"),
        (ModelLimits(64, 1024, 4096, max_num_tokens=8192, packed_context_fmha=True), 4095, "min(4095, 8192)"),
        # chunked context: max_seq_len - 1
        (ModelLimits(64, 16384, 16384, max_num_tokens=8192, packed_context_fmha=True, enable_chunked_context=True),
         16383, "chunked context on"),
        # neither: the engine's max_input_len
        (ModelLimits(64, 16384, 16384, max_num_tokens=8192), 16384, ""),
        (ModelLimits(64, 2047, 2048), 2047, ""),
    ],
)
def test_executor_max_input_len_follows_trtgptmodel(limits: ModelLimits, expected: int, reason: str) -> None:
    assert limits.executor_max_input_len() == expected
    assert reason in limits.input_limit_reason() and (reason != "" or limits.input_limit_reason() == "")


def test_the_reference_model_applies_the_same_input_limit() -> None:
    """The reference tensorrt_llm model (and the benchmark stand-in, which reuses its initialize) computes
    the limit with its own function: it must agree with ModelLimits on every branch (the reference stands
    for an engine with context FMHA and packed input when it is given max_num_tokens)."""
    from tests.modules import load_file

    ref = load_file("reference_model", REPO_ROOT / "triton_model_repo" / "tensorrt_llm_reference" / "1" / "model.py")
    for max_input_len, max_seq_len in ((100, 256), (300, 256), (16384, 16384)):
        for max_num_tokens in (None, 1, 50, 150, 255, 8192):
            for chunked in (False, True):
                ours = ModelLimits(8, max_input_len, max_seq_len, max_num_tokens=max_num_tokens,
                                   packed_context_fmha=max_num_tokens is not None, enable_chunked_context=chunked)
                theirs = ref.executor_max_input_len(max_input_len, max_seq_len, max_num_tokens, chunked)
                assert theirs == ours.executor_max_input_len(), (max_input_len, max_seq_len, max_num_tokens, chunked)
# --- LoRA support ------------------------------------------------------------------------------

LLAMA_SIZES = {"num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
               "num_key_value_heads": 8, "head_size": 128}


def lora_engine_config(plugin: Any = "bfloat16", **lora: Any) -> dict[str, Any]:
    """An engine config.json as trtllm-build 1.1 and 1.2 write its LoRA facts (gptJsonConfig.cpp parseLora reads them)."""
    config = copy.deepcopy(ENGINE_CONFIG)
    config["pretrained_config"].update(LLAMA_SIZES, dtype="bfloat16")
    config["build_config"]["plugin_config"] = {"lora_plugin": plugin}
    config["build_config"]["lora_config"] = {"max_lora_rank": 16, "lora_target_modules": ["attn_q", "attn_v"], **lora}
    return config


def test_an_engine_with_the_lora_plugin_serves_its_modules_up_to_its_rank(tmp_path: Path) -> None:
    info = inspect_weights(write_engine(tmp_path / "e", lora_engine_config()))
    lora = info.lora
    assert lora.enabled and lora.dtype == "bfloat16" and lora.max_rank == 16
    assert lora.target_modules == ("attn_q", "attn_v")
    assert lora.shape.module_dims("attn_q") == (4096, 4096) and lora.shape.module_dims("attn_v") == (4096, 1024)
    assert lora.triton_datatype == "TYPE_BF16"
    # peftCacheManager.cpp getPageManagerConfig: max adapter = rank x sum(in + out) x layers values
    assert lora.adapter_values() == 16 * ((4096 + 4096) + (4096 + 1024)) * 32
    # the C++ backend's paged cache, per rank of the engine's tensor parallelism (tests/test_lora.py: the sizes)
    assert lora.paged_cache and (lora.tp_size, lora.pp_size) == (2, 1)
    assert lora.fused_mlp and lora.applied_modules == ("attn_q", "attn_v")


@pytest.mark.parametrize("config,reason", [
    (lora_engine_config(plugin=None), "built without the LoRA plugin"),
    (lora_engine_config(lora_target_modules=[]), "no LoRA module or max_lora_rank 0"),
    (lora_engine_config(max_lora_rank=0), "no LoRA module or max_lora_rank 0"),
    (lora_engine_config(lora_target_modules=["attn_qkv"]), "include attn_qkv, which this image cannot convert"),
    (ENGINE_CONFIG, "built without the LoRA plugin"),
])
def test_an_engine_without_usable_lora_says_why(tmp_path: Path, config: dict[str, Any], reason: str) -> None:
    lora = inspect_weights(write_engine(tmp_path / "e", config)).lora
    assert not lora.enabled and reason in lora.off_reason


def test_a_checkpoint_takes_its_lora_limits_from_the_build_config(tmp_path: Path) -> None:
    import importlib.util

    sizes = {**LLAMA_SIZES, "head_dim": 128}
    sizes.pop("head_size")
    folder = write_checkpoint(tmp_path / "c", {**HF_CONFIG, **sizes})
    default = inspect_weights(folder).lora
    limited = inspect_weights(folder, reference_lora={"max_lora_rank": 4, "lora_target_modules": ["attn_k"],
                                                      "max_loras": 2}, base_model="org/model").lora
    if importlib.util.find_spec("peft") is None:
        assert not default.enabled and "peft" in default.off_reason
        return
    assert default.enabled and default.dtype == "float32" and default.max_rank == 64
    assert len(default.target_modules) == 7
    assert (limited.max_rank, limited.target_modules, limited.max_loras, limited.base_model) == (4, ("attn_k",), 2,
                                                                                               "org/model")
