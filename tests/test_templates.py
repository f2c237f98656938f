"""Tests of tensorrtllm_backend.templates, scripts/fill_template.py and the real templates in triton_model_repo/."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
from enum import Enum
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2

from common.errors import ConfigError, TemplateError
from cog_triton.settings import REPO_ROOT, BatchingStrategy, SchedulerPolicy
from tensorrtllm_backend.engine import XGRAMMAR_TOKENIZER_INFO_NAME, ModelLimits, WeightsInfo
from tensorrtllm_backend.templates import (
    OPTIONAL_TENSORRT_LLM_PARAMETERS,
    REQUIRED_TENSORRT_LLM_PARAMETERS,
    RenderOptions,
    drop_empty_parameters,
    fill_template,
    format_value,
    guided_decoding_of,
    parse_key_values,
    parse_model_config,
    placeholders,
    render_model_repository,
    template_values,
)

TEMPLATE_DIR = REPO_ROOT / "triton_model_repo"
FILL_TEMPLATE = REPO_ROOT / "scripts" / "fill_template.py"
MODELS = ("ensemble", "ensemble_ids", "preprocessing", "tensorrt_llm")
PYTHON_LIVE_MODELS = ("ensemble", "preprocessing")
TEMPLATE_FOLDERS = (
    "ensemble",
    "ensemble_ids",
    "preprocessing",
    "tensorrt_llm",
    "tensorrt_llm_reference",
    "tensorrt_llm_pytorch",
)


# --- helpers ---------------------------------------------------------------------------------


def engine_info(tmp_path: Path, *, max_batch_size: int = 64) -> WeightsInfo:
    weights = tmp_path / "engine"
    return WeightsInfo(
        kind="engine",
        weights_dir=weights,
        tokenizer_dir=weights / "tokenizer",
        limits=ModelLimits(max_batch_size=max_batch_size, max_input_len=2048, max_seq_len=4096, max_num_tokens=8192),
        world_size=1,
        architecture="LlamaForCausalLM",
        dtype="float16",
        trtllm_version="1.2.1",
    )


def checkpoint_info(tmp_path: Path, *, max_batch_size: int = 8) -> WeightsInfo:
    weights = tmp_path / "checkpoint"
    return WeightsInfo(
        kind="hf_checkpoint",
        weights_dir=weights,
        tokenizer_dir=weights,
        limits=ModelLimits(max_batch_size=max_batch_size, max_input_len=1023, max_seq_len=1024),
        architecture="LlamaForCausalLM",
        dtype="float32",
    )


def options(tmp_path: Path, template_dir: Path = TEMPLATE_DIR, **kwargs) -> RenderOptions:
    return RenderOptions(template_dir=template_dir, model_repo_dir=tmp_path / "model_repository", **kwargs)


def params(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


def read_rendered(repo: Path) -> dict[str, model_config_pb2.ModelConfig]:
    """Parse every written config.pbtxt again, as Triton would read it."""
    return {
        name: parse_model_config((repo / name / "config.pbtxt").read_text(), source=str(repo / name))
        for name in MODELS
    }


def copy_templates(dest: Path) -> Path:
    """Copy the templates (config.pbtxt and 1/model.py only, not weights that may lie in tensorrt_llm/1)."""
    for folder in TEMPLATE_FOLDERS:
        src = TEMPLATE_DIR / folder
        (dest / folder / "1").mkdir(parents=True)
        shutil.copy2(src / "config.pbtxt", dest / folder / "config.pbtxt")
        if (src / "1" / "model.py").is_file():
            shutil.copy2(src / "1" / "model.py", dest / folder / "1" / "model.py")
    return dest


@pytest.fixture(params=["engine", "hf_checkpoint"])
def rendered(request, tmp_path: Path) -> tuple[WeightsInfo, dict[str, model_config_pb2.ModelConfig]]:
    info = engine_info(tmp_path) if request.param == "engine" else checkpoint_info(tmp_path)
    opts = options(tmp_path)
    render_model_repository(opts, info)
    return info, read_rendered(opts.model_repo_dir)


# --- placeholders / format_value / fill_template ----------------------------------------------


def test_placeholders_finds_braced_and_named_but_not_escaped() -> None:
    text = 'a: ${alpha} b: $beta c: $$gamma d: "${alpha}" e: $5'
    assert placeholders(text) == {"alpha", "beta"}
    assert placeholders("no placeholders here") == set()


def test_placeholders_of_real_template() -> None:
    names = placeholders((TEMPLATE_DIR / "preprocessing" / "config.pbtxt").read_text())
    assert names == {
        "triton_max_batch_size", "max_queue_delay_microseconds", "preprocessing_instance_count", "tokenizer_dir",
        "add_special_tokens",
    }


class Color(Enum):
    RED = "red"
    NUMBER = 7


def test_format_value() -> None:
    assert format_value(True) == "true"
    assert format_value(False) == "false"
    assert format_value(None) == ""
    assert format_value(Color.RED) == "red"
    assert format_value(Color.NUMBER) == "7"
    # str-mixin enums (as in settings) must render their value, not "BatchingStrategy.V1"
    assert format_value(BatchingStrategy.V1) == "V1"
    assert format_value(SchedulerPolicy.MAX_UTILIZATION) == "max_utilization"
    assert format_value(0) == "0"
    assert format_value(0.9) == "0.9"
    assert format_value("text") == "text"


def test_fill_template_success() -> None:
    text = 'max_batch_size: ${batch}\ndecoupled: ${flag}\nvalue: "${empty}"\ncost: $$5 $name'
    out = fill_template(text, {"batch": 8, "flag": True, "empty": None, "name": Color.RED}, source="x.pbtxt")
    assert out == 'max_batch_size: 8\ndecoupled: true\nvalue: ""\ncost: $5 red'


def test_fill_template_unfilled_placeholder_names_file_and_key() -> None:
    with pytest.raises(TemplateError) as info:
        fill_template("a: ${one}\nb: ${two}", {"one": 1}, source="models/foo/config.pbtxt")
    message = str(info.value)
    assert "models/foo/config.pbtxt" in message
    assert "${two}" in message
    assert "${one}" not in message
    assert info.value.code == "template_error"
    assert isinstance(info.value, ConfigError)


def test_fill_template_unknown_key_names_key() -> None:
    with pytest.raises(TemplateError) as info:
        fill_template("a: ${one}", {"one": 1, "bogus_key": 2}, source="cfg.pbtxt")
    message = str(info.value)
    assert "bogus_key" in message
    assert "cfg.pbtxt" in message
    assert "one" in message  # lists the placeholders that exist


def test_fill_template_allow_unfilled_keeps_placeholder() -> None:
    out = fill_template("a: ${one}\nb: ${two}", {"one": 1}, source="cfg", allow_unfilled=True)
    assert out == "a: 1\nb: ${two}"


def test_fill_template_allow_unknown_ignores_extra_values() -> None:
    out = fill_template("a: ${one}", {"one": 1, "extra": 2}, source="cfg", allow_unknown=True)
    assert out == "a: 1"
    # allow_unknown does not allow unfilled placeholders
    with pytest.raises(TemplateError, match=r"\$\{two\}"):
        fill_template("a: ${one} ${two}", {"one": 1, "extra": 2}, source="cfg", allow_unknown=True)


def test_fill_template_malformed_dollar_names_file() -> None:
    with pytest.raises(TemplateError) as info:
        fill_template("a: ${one}\nprice: $5", {"one": 1}, source="broken/config.pbtxt")
    message = str(info.value)
    assert "broken/config.pbtxt" in message
    assert "line 2" in message


# --- parse_model_config / drop_empty_parameters / parse_key_values ----------------------------


VALID_CONFIG = """
name: "m"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
parameters: { key: "a" value: { string_value: "1" } }
parameters: { key: "b" value: { string_value: "" } }
parameters: { key: "c" value: { string_value: "" } }
"""


def test_parse_model_config_valid() -> None:
    config = parse_model_config(VALID_CONFIG, source="m/config.pbtxt")
    assert isinstance(config, model_config_pb2.ModelConfig)
    assert config.name == "m"
    assert config.backend == "python"
    assert config.max_batch_size == 4
    assert [i.name for i in config.input] == ["X"]
    assert params(config) == {"a": "1", "b": "", "c": ""}


def test_parse_model_config_platform_suffices() -> None:
    config = parse_model_config('name: "ens" platform: "ensemble"', source="ens")
    assert config.platform == "ensemble"


def test_parse_model_config_leftover_placeholder_is_expected_integer() -> None:
    text = 'name: "m"\nbackend: "python"\nmax_batch_size: ${x}\n'
    with pytest.raises(TemplateError) as info:
        parse_model_config(text, source="live/m/config.pbtxt")
    message = str(info.value)
    assert "live/m/config.pbtxt" in message
    # the C++ parser says "Expected integer, got: $", Python protobuf "Couldn't parse integer: $"
    assert re.search(r"(Expected|parse) integer", message)
    assert "3:17" in message  # the protobuf error carries line:column  # the protobuf error carries line:column


def test_parse_model_config_unknown_field() -> None:
    with pytest.raises(TemplateError, match="no_such_field"):
        parse_model_config('name: "m" backend: "python" no_such_field: 1', source="m")


def test_parse_model_config_missing_name() -> None:
    with pytest.raises(TemplateError, match="has no name") as info:
        parse_model_config('backend: "python"', source="noname.pbtxt")
    assert "noname.pbtxt" in str(info.value)


def test_parse_model_config_missing_backend() -> None:
    with pytest.raises(TemplateError, match="neither backend nor platform") as info:
        parse_model_config('name: "m"', source="nobackend.pbtxt")
    assert "nobackend.pbtxt" in str(info.value)


def test_drop_empty_parameters() -> None:
    config = parse_model_config(VALID_CONFIG, source="m")
    assert drop_empty_parameters(config) == ["b", "c"]
    assert params(config) == {"a": "1"}
    assert drop_empty_parameters(config) == []


def test_parse_key_values() -> None:
    assert parse_key_values("a:1,b:two", what="subs") == {"a": "1", "b": "two"}
    assert parse_key_values(r"gpu_device_ids:0\,1,x:y", what="subs") == {"gpu_device_ids": "0,1", "x": "y"}
    assert parse_key_values("url:http://h:80/p", what="subs") == {"url": "http://h:80/p"}
    assert parse_key_values(" key :v,,", what="subs") == {"key": "v"}
    assert parse_key_values("empty:", what="subs") == {"empty": ""}


@pytest.mark.parametrize("spec", ["", "   "])
def test_parse_key_values_empty_spec(spec: str) -> None:
    assert parse_key_values(spec, what="subs") == {}


@pytest.mark.parametrize("spec, item", [("a:1,novalue", "novalue"), (":v", ":v")])
def test_parse_key_values_rejects_items_without_key(spec: str, item: str) -> None:
    with pytest.raises(TemplateError) as info:
        parse_key_values(spec, what="COG_TRITON_SOMETHING")
    message = str(info.value)
    assert "COG_TRITON_SOMETHING" in message
    assert repr(item) in message


# --- template_values / render_model_repository -------------------------------------------------


def test_template_values_cover_every_placeholder_exactly() -> None:
    opts = RenderOptions(template_dir=TEMPLATE_DIR, model_repo_dir=Path("/x"))
    values = template_values(opts, engine_info(Path("/weights")))
    for folder in TEMPLATE_FOLDERS:
        names = placeholders((TEMPLATE_DIR / folder / "config.pbtxt").read_text())
        assert set(values[folder]) == names, folder


def test_render_engine_repository(tmp_path: Path) -> None:
    info = engine_info(tmp_path)
    opts = options(tmp_path)
    returned = render_model_repository(opts, info)
    repo = opts.model_repo_dir
    assert sorted(p.name for p in repo.iterdir()) == sorted(MODELS)
    configs = read_rendered(repo)
    assert set(returned) == set(MODELS)
    for name in MODELS:
        assert configs[name] == returned[name], name
        assert configs[name].name == name
        assert (repo / name / "1").is_dir()
    trt = configs["tensorrt_llm"]
    assert trt.backend == "tensorrtllm"
    assert trt.max_batch_size == 64
    assert trt.model_transaction_policy.decoupled is True
    assert list(trt.dynamic_batching.preferred_batch_size) == [64]
    p = params(trt)
    assert p["gpt_model_path"] == str(info.weights_dir)
    assert p["tokenizer_dir"] == str(info.tokenizer_dir)
    assert p["max_beam_width"] == "1"
    assert p["gpt_model_type"] == "inflight_fused_batching"
    assert p["batch_scheduler_policy"] == "guaranteed_no_evict"
    assert p["kv_cache_free_gpu_mem_fraction"] == "0.9"
    assert p["exclude_input_in_output"] == "true"
    assert p["enable_kv_cache_reuse"] == "true"  # the backend's own default: a repeated system prompt is reused
    for key, value in p.items():
        if key not in REQUIRED_TENSORRT_LLM_PARAMETERS:
            assert value != "", key
        assert "${" not in value, key
    # unset optional parameters are dropped, not written empty
    for key in ("gpu_device_ids", "max_tokens_in_paged_kv_cache", "multi_block_mode", "encoder_model_path"):
        assert key not in p
    # no leftover placeholder anywhere in the written files
    for name in MODELS:
        assert "${" not in (repo / name / "config.pbtxt").read_text(), name
        assert "$" not in (repo / name / "config.pbtxt").read_text(), name
    # the engine's C++ model has no model.py
    assert not (repo / "tensorrt_llm" / "1" / "model.py").exists()
    for name in PYTHON_LIVE_MODELS:
        assert configs[name].backend == "python"
        assert (repo / name / "1" / "model.py").read_bytes() == (TEMPLATE_DIR / name / "1" / "model.py").read_bytes()
    for name in MODELS:
        assert configs[name].max_batch_size == 64, name
    assert configs["ensemble_ids"].platform == "ensemble"
    assert params(configs["preprocessing"])["tokenizer_dir"] == str(info.tokenizer_dir)
    # no staging or backup folders are left beside the repository
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_repository"]


def test_render_checkpoint_repository(tmp_path: Path) -> None:
    info = checkpoint_info(tmp_path)
    opts = options(tmp_path, reference_torch_threads=3)
    render_model_repository(opts, info)
    repo = opts.model_repo_dir
    configs = read_rendered(repo)
    assert sorted(p.name for p in repo.iterdir()) == sorted(MODELS)
    trt = configs["tensorrt_llm"]
    assert trt.name == "tensorrt_llm"
    assert trt.backend == "python"
    assert trt.max_batch_size == 8
    assert trt.model_transaction_policy.decoupled is True
    assert (repo / "tensorrt_llm" / "1" / "model.py").read_bytes() == (
        TEMPLATE_DIR / "tensorrt_llm_reference" / "1" / "model.py"
    ).read_bytes()
    p = params(trt)
    assert p["hf_model_dir"] == str(info.weights_dir)
    assert p["max_input_len"] == "1023"
    assert p["max_seq_len"] == "1024"
    assert p["max_active_requests"] == "8"
    assert p["torch_threads"] == "3"
    assert "gpt_model_path" not in p
    for name in PYTHON_LIVE_MODELS:
        assert (repo / name / "1" / "model.py").is_file()
    for name in MODELS:
        text = (repo / name / "config.pbtxt").read_text()
        assert "${" not in text, name
        for key, value in params(configs[name]).items():
            assert value != "", (name, key)


def test_triton_max_batch_size_override_wins(tmp_path: Path) -> None:
    info = engine_info(tmp_path, max_batch_size=64)
    opts = options(tmp_path, triton_max_batch_size=16)
    render_model_repository(opts, info)
    configs = read_rendered(opts.model_repo_dir)
    for name in MODELS:
        assert configs[name].max_batch_size == 16, name
    assert list(configs["tensorrt_llm"].dynamic_batching.preferred_batch_size) == [16]


def test_render_options_are_applied(tmp_path: Path) -> None:
    info = engine_info(tmp_path)
    opts = options(
        tmp_path,
        batching_strategy=BatchingStrategy.V1,
        batch_scheduler_policy=SchedulerPolicy.MAX_UTILIZATION,
        max_tokens_in_paged_kv_cache=10000,
        enable_kv_cache_reuse=True,
        max_queue_delay_microseconds=250,
        preprocessing_instance_count=3,
        add_special_tokens=False,
        gpu_device_ids="0,1",
    )
    render_model_repository(opts, info)
    configs = read_rendered(opts.model_repo_dir)
    p = params(configs["tensorrt_llm"])
    assert p["gpt_model_type"] == "V1"
    assert p["batch_scheduler_policy"] == "max_utilization"
    assert p["max_tokens_in_paged_kv_cache"] == "10000"
    assert p["enable_kv_cache_reuse"] == "true"
    assert p["gpu_device_ids"] == "0,1"
    assert configs["tensorrt_llm"].dynamic_batching.max_queue_delay_microseconds == 250
    assert configs["preprocessing"].dynamic_batching.max_queue_delay_microseconds == 250
    assert configs["preprocessing"].instance_group[0].count == 3
    assert params(configs["preprocessing"])["add_special_tokens"] == "false"


def test_tensorrt_llm_parameter_overrides(tmp_path: Path) -> None:
    info = engine_info(tmp_path)
    opts = options(tmp_path, tensorrt_llm_parameters="multi_block_mode:true,gpu_device_ids:0\\,1")
    rendered = render_model_repository(opts, info)
    p = params(read_rendered(opts.model_repo_dir)["tensorrt_llm"])
    assert p["multi_block_mode"] == "true"
    assert p["gpu_device_ids"] == "0,1"
    assert params(rendered["tensorrt_llm"]) == p


def test_tensorrt_llm_parameter_override_replaces_default(tmp_path: Path) -> None:
    opts = options(tmp_path, tensorrt_llm_parameters="kv_cache_free_gpu_mem_fraction:0.5")
    render_model_repository(opts, engine_info(tmp_path))
    assert params(read_rendered(opts.model_repo_dir)["tensorrt_llm"])["kv_cache_free_gpu_mem_fraction"] == "0.5"


@pytest.mark.parametrize("bad", ["no_such_parameter:1", "triton_max_batch_size:4", "decoupled_mode:false"])
def test_tensorrt_llm_parameter_unknown_key(tmp_path: Path, bad: str) -> None:
    key = bad.split(":")[0]
    opts = options(tmp_path, tensorrt_llm_parameters=f"multi_block_mode:true,{bad}")
    with pytest.raises(TemplateError) as info:
        render_model_repository(opts, engine_info(tmp_path))
    message = str(info.value)
    assert "COG_TRITON_TENSORRT_LLM_PARAMETERS" in message
    assert key in message
    allowed = message.split("allowed:", 1)[1]
    for name in ("multi_block_mode", "gpu_device_ids", "batch_scheduler_policy", *OPTIONAL_TENSORRT_LLM_PARAMETERS):
        assert name in allowed
    assert "triton_max_batch_size" not in allowed
    assert not opts.model_repo_dir.exists()


def test_tensorrt_llm_parameter_malformed(tmp_path: Path) -> None:
    opts = options(tmp_path, tensorrt_llm_parameters="multi_block_mode")
    with pytest.raises(TemplateError, match="COG_TRITON_TENSORRT_LLM_PARAMETERS"):
        render_model_repository(opts, engine_info(tmp_path))


def test_render_replaces_previous_repository(tmp_path: Path) -> None:
    opts = options(tmp_path)
    render_model_repository(opts, engine_info(tmp_path))
    stray = opts.model_repo_dir / "stray_model"
    stray.mkdir()
    render_model_repository(opts, checkpoint_info(tmp_path))
    assert not stray.exists()
    assert read_rendered(opts.model_repo_dir)["tensorrt_llm"].backend == "python"


@pytest.mark.parametrize(
    "folder, corrupt",
    [
        ("preprocessing", lambda t: t.replace('"${tokenizer_dir}"', '"${tokenizer_dir}" ${not_a_value}')),
        ("preprocessing", lambda t: t.replace("dynamic_batching {", "dynamic_batching { bogus_field: 1")),
        ("ensemble_ids", lambda t: t + "\nprice: $5\n"),
        ("tensorrt_llm", lambda t: t.replace('name: "tensorrt_llm"', 'name: "something_else"')),
    ],
)
def test_broken_template_leaves_previous_repository_intact(tmp_path: Path, folder: str, corrupt) -> None:
    templates = copy_templates(tmp_path / "templates")
    opts = options(tmp_path, template_dir=templates)
    info = engine_info(tmp_path)
    render_model_repository(opts, info)
    before = {p.relative_to(opts.model_repo_dir): p.read_bytes() for p in opts.model_repo_dir.rglob("*") if p.is_file()}
    assert len(before) == len(MODELS) + len(PYTHON_LIVE_MODELS)

    path = templates / folder / "config.pbtxt"
    path.write_text(corrupt(path.read_text()))
    with pytest.raises(TemplateError) as err:
        render_model_repository(opts, info)
    assert str(path) in str(err.value)

    after = {p.relative_to(opts.model_repo_dir): p.read_bytes() for p in opts.model_repo_dir.rglob("*") if p.is_file()}
    assert after == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_repository", "templates"]


def test_missing_model_py_is_an_error(tmp_path: Path) -> None:
    templates = copy_templates(tmp_path / "templates")
    (templates / "tensorrt_llm_reference" / "1" / "model.py").unlink()
    opts = options(tmp_path, template_dir=templates)
    with pytest.raises(TemplateError, match="model.py"):
        render_model_repository(opts, checkpoint_info(tmp_path))
    assert not opts.model_repo_dir.exists()
    # the engine variant does not need it
    render_model_repository(opts, engine_info(tmp_path))
    assert (opts.model_repo_dir / "tensorrt_llm" / "config.pbtxt").is_file()


def test_missing_template_is_an_error(tmp_path: Path) -> None:
    templates = copy_templates(tmp_path / "templates")
    (templates / "ensemble_ids" / "config.pbtxt").unlink()
    with pytest.raises(TemplateError, match="ensemble_ids"):
        render_model_repository(options(tmp_path, template_dir=templates), engine_info(tmp_path))


# --- ensemble wiring ----------------------------------------------------------------------------


def tensors(items) -> dict[str, model_config_pb2.ModelInput]:
    return {t.name: t for t in items}


def test_ensemble_steps_match_model_configs(rendered) -> None:
    _, configs = rendered
    ensemble = configs["ensemble_ids"]
    steps = ensemble.ensemble_scheduling.step
    assert [s.model_name for s in steps] == ["preprocessing", "tensorrt_llm"]
    available = {name: t.data_type for name, t in tensors(ensemble.input).items()}
    for step in steps:
        model = configs[step.model_name]
        inputs, outputs = tensors(model.input), tensors(model.output)
        for key, value in step.input_map.items():
            assert key in inputs, f"{step.model_name} has no input {key}"
            assert value in available, f"{step.model_name}.{key} reads {value}, which nothing produced before"
            assert inputs[key].data_type == available[value], f"{step.model_name}.{key} <- {value}: type mismatch"
        required = {name for name, t in inputs.items() if not t.optional}
        assert required <= set(step.input_map), f"{step.model_name} required inputs not mapped"
        for key, value in step.output_map.items():
            assert key in outputs, f"{step.model_name} has no output {key}"
            available[value] = outputs[key].data_type
    for name, out in tensors(ensemble.output).items():
        assert name in available, f"ensemble output {name} is produced by no step"
        assert available[name] == out.data_type, name


def test_every_ensemble_input_is_used(rendered) -> None:
    _, configs = rendered
    ensemble = configs["ensemble_ids"]
    used = {value for step in ensemble.ensemble_scheduling.step for value in step.input_map.values()}
    unused = {t.name for t in ensemble.input} - used
    assert not unused


def test_reference_declares_every_input_the_ensemble_maps() -> None:
    options_ = RenderOptions(template_dir=TEMPLATE_DIR, model_repo_dir=Path("/x"))
    values = template_values(options_, engine_info(Path("/weights")))
    ensemble = parse_model_config(
        fill_template((TEMPLATE_DIR / "ensemble_ids" / "config.pbtxt").read_text(), values["ensemble_ids"], source="e"),
        source="ensemble_ids",
    )
    (step,) = [s for s in ensemble.ensemble_scheduling.step if s.model_name == "tensorrt_llm"]
    for folder in ("tensorrt_llm", "tensorrt_llm_reference"):
        text = (TEMPLATE_DIR / folder / "config.pbtxt").read_text()
        config = parse_model_config(fill_template(text, values[folder], source=folder), source=folder)
        declared = {t.name for t in config.input}
        assert set(step.input_map) <= declared, (folder, set(step.input_map) - declared)
        produced = {t.name for t in config.output}
        assert set(step.output_map) <= produced, folder


# --- scripts/fill_template.py -------------------------------------------------------------------


FILL_VALUES = (
    "triton_max_batch_size:8,max_queue_delay_microseconds:0,preprocessing_instance_count:2,tokenizer_dir:/tok,"
    "add_special_tokens:true"
)


def run_fill(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(FILL_TEMPLATE), *args], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT
    )


@pytest.fixture
def template_copy(tmp_path: Path) -> Path:
    dest = tmp_path / "config.pbtxt"
    shutil.copy2(TEMPLATE_DIR / "preprocessing" / "config.pbtxt", dest)
    return dest


def test_script_writes_to_stdout(template_copy: Path) -> None:
    original = template_copy.read_text()
    result = run_fill(str(template_copy), FILL_VALUES)
    assert result.returncode == 0, result.stderr
    config = parse_model_config(result.stdout, source="stdout")
    assert config.max_batch_size == 8
    assert config.instance_group[0].count == 2
    assert params(config) == {"tokenizer_dir": "/tok", "add_special_tokens": "true"}
    assert template_copy.read_text() == original


def test_script_in_place(template_copy: Path) -> None:
    result = run_fill("-i", str(template_copy), FILL_VALUES)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    config = parse_model_config(template_copy.read_text(), source="file")
    assert config.max_batch_size == 8
    assert "${" not in template_copy.read_text()


def test_script_escaped_comma(template_copy: Path) -> None:
    result = run_fill(str(template_copy), FILL_VALUES.replace("/tok", "/a\\,b"))
    assert result.returncode == 0, result.stderr
    assert params(parse_model_config(result.stdout, source="stdout"))["tokenizer_dir"] == "/a,b"


def test_script_unfilled_fails(template_copy: Path) -> None:
    original = template_copy.read_text()
    values = "triton_max_batch_size:8,max_queue_delay_microseconds:0,preprocessing_instance_count:2,tokenizer_dir:/tok"
    result = run_fill("-i", str(template_copy), values)
    assert result.returncode == 2
    assert "${add_special_tokens}" in result.stderr
    assert str(template_copy) in result.stderr
    assert result.stdout == ""
    assert template_copy.read_text() == original


def test_script_unknown_key_fails_unless_allowed(template_copy: Path) -> None:
    result = run_fill(str(template_copy), FILL_VALUES + ",bogus:1")
    assert result.returncode == 2
    assert "bogus" in result.stderr
    result = run_fill("--allow-unknown", str(template_copy), FILL_VALUES + ",bogus:1")
    assert result.returncode == 0, result.stderr


def test_script_allow_unfilled(template_copy: Path) -> None:
    values = "triton_max_batch_size:8,max_queue_delay_microseconds:0,preprocessing_instance_count:2,tokenizer_dir:/tok"
    result = run_fill("--allow-unfilled", str(template_copy), values)
    assert result.returncode == 0, result.stderr
    assert '"${add_special_tokens}"' in result.stdout
    assert "max_batch_size: 8" in result.stdout


def test_script_allow_unfilled_numeric_needs_no_validate(template_copy: Path) -> None:
    values = "max_queue_delay_microseconds:0,preprocessing_instance_count:2,tokenizer_dir:/tok,add_special_tokens:true"
    result = run_fill("--allow-unfilled", str(template_copy), values)
    assert result.returncode == 2
    assert re.search(r"(Expected|parse) integer", result.stderr)
    assert str(template_copy) in result.stderr
    result = run_fill("--allow-unfilled", "--no-validate", str(template_copy), values)
    assert result.returncode == 0, result.stderr
    assert "max_batch_size: ${triton_max_batch_size}" in result.stdout


def test_script_invalid_result_fails(template_copy: Path) -> None:
    original = template_copy.read_text()
    values = FILL_VALUES.replace("triton_max_batch_size:8", "triton_max_batch_size:eight")
    result = run_fill("-i", str(template_copy), values)
    assert result.returncode == 2
    assert "invalid Triton model config" in result.stderr
    assert template_copy.read_text() == original


def test_script_missing_file(tmp_path: Path) -> None:
    result = run_fill(str(tmp_path / "nope.pbtxt"), "a:1")
    assert result.returncode == 2
    assert "nope.pbtxt" in result.stderr


def test_script_malformed_substitutions(template_copy: Path) -> None:
    result = run_fill(str(template_copy), "triton_max_batch_size")
    assert result.returncode == 2
    assert "triton_max_batch_size" in result.stderr


# --- what the TensorRT-LLM C++ backend (1.1, 1.2.1) reads without a default ------------------------


def test_parameters_the_backend_reads_unguarded_are_always_rendered(tmp_path: Path) -> None:
    """model_state.cc GetParameter throws "Cannot find parameter with name" for a missing key, and
    gpt_model_type, tokenizer_dir, guided_decoding_backend and xgrammar_tokenizer_info_path are read
    with no try/catch (model_instance_state.cc): an empty value must stay in the config (it means off)."""
    assert set(REQUIRED_TENSORRT_LLM_PARAMETERS) == {
        "gpt_model_type", "tokenizer_dir", "guided_decoding_backend", "xgrammar_tokenizer_info_path",
    }
    template = (TEMPLATE_DIR / "tensorrt_llm" / "config.pbtxt").read_text()
    for key in REQUIRED_TENSORRT_LLM_PARAMETERS:
        assert f'key: "{key}"' in template, key
    opts = options(tmp_path)
    render_model_repository(opts, engine_info(tmp_path))
    p = params(read_rendered(opts.model_repo_dir)["tensorrt_llm"])
    for key in REQUIRED_TENSORRT_LLM_PARAMETERS:
        assert key in p, f"{key} is missing: the C++ backend would not load"
    assert p["guided_decoding_backend"] == "" and p["xgrammar_tokenizer_info_path"] == ""  # off
    assert p["gpt_model_type"] == "inflight_fused_batching"


def test_drop_empty_parameters_keeps_what_it_is_told_to() -> None:
    config = model_config_pb2.ModelConfig(name="m", backend="x")
    for key, value in (("a", ""), ("tokenizer_dir", ""), ("b", "1")):
        config.parameters[key].string_value = value
    assert drop_empty_parameters(config, frozenset({"tokenizer_dir"})) == ["a"]
    assert set(config.parameters) == {"tokenizer_dir", "b"}


def test_guided_decoding_fully_configured_is_rendered(tmp_path: Path) -> None:
    info_file = tmp_path / "xgrammar_tokenizer_info.json"
    info_file.write_text('{"encoded_vocab": [], "tokenizer_str": "", "stop_token_ids": [2]}')
    spec = f"guided_decoding_backend:xgrammar,xgrammar_tokenizer_info_path:{info_file}"
    opts = options(tmp_path, tensorrt_llm_parameters=spec)
    render_model_repository(opts, engine_info(tmp_path))
    p = params(read_rendered(opts.model_repo_dir)["tensorrt_llm"])
    assert p["guided_decoding_backend"] == "xgrammar" and p["xgrammar_tokenizer_info_path"] == str(info_file)


def test_enable_trt_overlap_of_tensorrt_llm_1_2_is_left_to_the_backend_unless_set(tmp_path: Path) -> None:
    """TensorRT-LLM 1.2 reads enable_trt_overlap as a bool, default false, into
    ExecutorConfig::setEnableTrtOverlap (model_instance_state.cc @0c8de69a, 1.2.0rc8; 1.1 @c8c6df08 only
    warned that it is ignored). The rendered config leaves it out by default, so the backend's default
    applies; COG_TRITON_TENSORRT_LLM_PARAMETERS sets it."""
    assert 'key: "enable_trt_overlap"' in (TEMPLATE_DIR / "tensorrt_llm" / "config.pbtxt").read_text()
    default = options(tmp_path / "default")
    render_model_repository(default, engine_info(tmp_path))
    assert "enable_trt_overlap" not in params(read_rendered(default.model_repo_dir)["tensorrt_llm"])
    on = options(tmp_path / "on", tensorrt_llm_parameters="enable_trt_overlap:true")
    render_model_repository(on, engine_info(tmp_path))
    assert params(read_rendered(on.model_repo_dir)["tensorrt_llm"])["enable_trt_overlap"] == "true"


PERF_METRIC_OUTPUTS = {
    "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks", "arrival_time_ns",
    "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns", "acceptance_rate",
    "total_accepted_draft_tokens", "total_draft_tokens",
}


@pytest.mark.parametrize("folder", ["tensorrt_llm", "tensorrt_llm_reference"])
def test_no_request_input_without_the_outputs_it_makes_the_backend_write(folder: str) -> None:
    """With return_perf_metrics the C++ backend writes ten outputs whatever the request asked for
    (model_instance_state.cc fillTritonResponse); undeclared, each response fails ("unexpected
    inference output"). Either all are declared or the input is not."""
    opts = RenderOptions(template_dir=TEMPLATE_DIR, model_repo_dir=Path("/x"))
    values = template_values(opts, engine_info(Path("/w")))
    text = (TEMPLATE_DIR / folder / "config.pbtxt").read_text()
    config = parse_model_config(fill_template(text, values[folder], source=folder), source=folder)
    inputs = {t.name for t in config.input}
    outputs = {t.name for t in config.output}
    if "return_perf_metrics" in inputs:
        assert PERF_METRIC_OUTPUTS <= outputs
    else:
        assert not PERF_METRIC_OUTPUTS & outputs


def test_kv_cache_reuse_defaults_on_and_can_be_turned_off(tmp_path: Path) -> None:
    from cog_triton.settings import Settings

    assert Settings().kv_cache.enable_reuse is True and RenderOptions(Path("/t"), Path("/r")).enable_kv_cache_reuse
    opts = options(tmp_path, enable_kv_cache_reuse=False)
    render_model_repository(opts, engine_info(tmp_path))
    assert params(read_rendered(opts.model_repo_dir)["tensorrt_llm"])["enable_kv_cache_reuse"] == "false"


def test_the_decoupled_engine_is_the_ensembles_last_step(rendered) -> None:
    """Response order: Triton delivers an ensemble's responses in the order its last composing model
    completes them. With a per-token postprocessing step after the decoupled tensorrt_llm and more
    than one instance of it, tokens came back out of order (tensorrtllm_backend #614). The ensemble
    ends at tensorrt_llm, whose responses for one request are sent in order by one sender."""
    _, configs = rendered
    steps = configs["ensemble_ids"].ensemble_scheduling.step
    assert steps[-1].model_name == "tensorrt_llm"
    assert configs["tensorrt_llm"].model_transaction_policy.decoupled
    for step in steps[:-1]:
        assert not configs[step.model_name].model_transaction_policy.decoupled
    assert {t.name for t in configs["ensemble_ids"].output} == {"output_ids", "sequence_length"}


# --- LoRA ----------------------------------------------------------------------------------------


def lora_engine_info(tmp_path: Path, dtype: str = "bfloat16"):
    import dataclasses

    from tensorrtllm_backend.lora import LoraSpec, ModelShape

    shape = ModelShape(num_layers=32, hidden_size=4096, mlp_hidden_size=14336, num_heads=32, num_kv_heads=8,
                       head_size=128)
    lora = LoraSpec(True, dtype=dtype, max_rank=16, target_modules=("attn_q", "attn_v"), shape=shape, max_loras=4,
                    fused_mlp=True, paged_cache=True)
    return dataclasses.replace(engine_info(tmp_path), dtype=dtype, lora=lora)


def test_an_engine_with_lora_gets_its_lora_cache_sized_and_its_weights_dtype(tmp_path: Path) -> None:
    info = lora_engine_info(tmp_path)
    opts = options(tmp_path)
    render_model_repository(opts, info)
    configs = read_rendered(opts.model_repo_dir)
    p = params(configs["tensorrt_llm"])
    assert p["lora_cache_max_adapter_size"] == "16"  # the engine's max_lora_rank
    # peftCacheManager.cpp getPageManagerConfig: page width 5120 (attn_v's 4096 + 1024), 8 x (2 + 1) x 32 = 768
    # slots a page; a rank-16 adapter's rows take 26 (attn_q) and 16 (attn_v) slots a layer, 18 layers fill a page
    # (loraCache.cpp determineNumPages), so 2 pages; max_loras 4 -> 8 pages. Values alone (4 x 16 x 13312 x 32 x 2
    # bytes) would make 7 pages: 3 adapters.
    assert p["lora_cache_host_memory_bytes"] == str(4 * 2 * 768 * 5120 * 2)
    for key in ("lora_cache_optimal_adapter_size", "lora_cache_gpu_memory_fraction", "lora_prefetch_dir"):
        assert key not in p  # the backend's defaults
    for model in ("tensorrt_llm", "ensemble_ids"):
        weights = {t.name: t for t in configs[model].input}["lora_weights"]
        assert model_config_pb2.DataType.Name(weights.data_type) == "TYPE_BF16", model


def test_lora_cache_settings_win(tmp_path: Path) -> None:
    opts = options(tmp_path, lora_cache_optimal_adapter_size=4, lora_cache_max_adapter_size=32,
                   lora_cache_gpu_memory_fraction=0.1, lora_cache_host_memory_bytes=123456789)
    render_model_repository(opts, lora_engine_info(tmp_path, dtype="float16"))
    configs = read_rendered(opts.model_repo_dir)
    p = params(configs["tensorrt_llm"])
    assert (p["lora_cache_optimal_adapter_size"], p["lora_cache_max_adapter_size"], p["lora_cache_gpu_memory_fraction"],
            p["lora_cache_host_memory_bytes"]) == ("4", "32", "0.1", "123456789")
    weights = {t.name: t for t in configs["tensorrt_llm"].input}["lora_weights"]
    assert model_config_pb2.DataType.Name(weights.data_type) == "TYPE_FP16"


def test_the_host_cache_follows_the_optimal_adapter_size_setting(tmp_path: Path) -> None:
    """lora_cache_optimal_adapter_size sets the page size: 5 x 3 x 32 = 480 slots, 11 layers' rows a page, so a
    rank-16 adapter takes 3 pages and 4 take 12."""
    opts = options(tmp_path, lora_cache_optimal_adapter_size=5)
    render_model_repository(opts, lora_engine_info(tmp_path))
    p = params(read_rendered(opts.model_repo_dir)["tensorrt_llm"])
    assert p["lora_cache_optimal_adapter_size"] == "5"
    assert p["lora_cache_host_memory_bytes"] == str(4 * 3 * 480 * 5120 * 2)


def test_a_host_cache_too_small_for_one_adapter_is_refused_before_triton(tmp_path: Path) -> None:
    """The backend would stop at start-up ("Not enough space allocated to host LoRA cache to hold 1 max sized
    LoRA", peftCacheManager.cpp getPageManagerConfig) below ceil(16 x 13312 x 32 / 5120) = 1332 slots of 10240
    bytes: the setting is refused with the minimum."""
    minimum = 1332 * 5120 * 2
    render_model_repository(options(tmp_path, lora_cache_host_memory_bytes=minimum), lora_engine_info(tmp_path))
    with pytest.raises(TemplateError) as info:
        render_model_repository(options(tmp_path, lora_cache_host_memory_bytes=minimum - 1), lora_engine_info(tmp_path))
    assert f"COG_TRITON_LORA_CACHE_HOST_MEMORY_BYTES={minimum - 1} is below the {minimum} bytes" in info.value.message
    assert "Not enough space allocated to host LoRA cache" in info.value.message


def test_an_engine_without_lora_sets_no_lora_cache(tmp_path: Path) -> None:
    opts = options(tmp_path)
    render_model_repository(opts, engine_info(tmp_path))
    p = params(read_rendered(opts.model_repo_dir)["tensorrt_llm"])
    assert not [key for key in p if key.startswith("lora_")]


def test_the_reference_model_gets_the_lora_build_as_parameters(tmp_path: Path) -> None:
    import dataclasses
    import json

    from tensorrtllm_backend.lora import checkpoint_lora_spec

    hf = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 8, "intermediate_size": 16,
          "num_attention_heads": 2, "num_key_value_heads": 1}
    lora = checkpoint_lora_spec(hf, {"max_lora_rank": 4, "lora_target_modules": ["attn_q"], "max_loras": 3}, True)
    info = dataclasses.replace(checkpoint_info(tmp_path), lora=lora)
    opts = options(tmp_path)
    render_model_repository(opts, info)
    config = read_rendered(opts.model_repo_dir)["tensorrt_llm"]
    p = params(config)
    assert p["lora_plugin"] == "float32" and p["max_lora_rank"] == "4"
    assert json.loads(p["lora_target_modules"]) == ["attn_q"]
    assert json.loads(p["lora_model_shape"])["hidden_size"] == 8
    assert p["lora_cache_host_memory_bytes"] == str(3 * 4 * (8 + 8) * 2 * 4)
    weights = {t.name: t for t in config.input}["lora_weights"]
    assert model_config_pb2.DataType.Name(weights.data_type) == "TYPE_FP32"
    off = dataclasses.replace(info, lora=checkpoint_lora_spec(hf, None, False))
    render_model_repository(opts, off)
    assert "lora_plugin" not in params(read_rendered(opts.model_repo_dir)["tensorrt_llm"])


def test_the_reference_model_py_and_its_modules_are_copied(tmp_path: Path) -> None:
    opts = options(tmp_path)
    render_model_repository(opts, checkpoint_info(tmp_path))
    live = opts.model_repo_dir / "tensorrt_llm" / "1"
    source = sorted(p.name for p in (TEMPLATE_DIR / "tensorrt_llm_reference" / "1").glob("*.py"))
    assert {"model.py", "lora.py", "parsing.py", "generation.py", "scheduler.py"} <= set(source)
    assert sorted(p.name for p in live.glob("*.py")) == source


# --- messages, escaping, leftovers of an interrupted render, guided decoding, log lines ------------


def test_template_errors_list_every_name_comma_separated() -> None:
    with pytest.raises(TemplateError) as info:
        fill_template("a: ${one} ${two}", {"one": 1, "two": 2, "x": 3, "y": 4}, source="s.pbtxt")
    assert info.value.message == "s.pbtxt: no placeholder named x, y (placeholders: one, two)"
    with pytest.raises(TemplateError) as info:
        fill_template("a: ${one} ${two} ${three}", {"one": 1}, source="s.pbtxt")
    assert info.value.message == "s.pbtxt: placeholder(s) left unfilled: ${three}, ${two}"


def test_a_backslash_or_quote_in_a_value_survives_into_the_parsed_config() -> None:
    """A Windows-style path or a quote in a value would end or change the pbtxt string literal unescaped."""
    value = 'C:\\models\\tok "v2"'
    text = 'name: "m"\nbackend: "python"\nparameters: { key: "p" value: { string_value: "${p}" } }\n'
    filled = fill_template(text, {"p": value}, source="m")
    assert 'string_value: "C:\\\\models\\\\tok \\"v2\\""' in filled
    assert params(parse_model_config(filled, source="m")) == {"p": value}


@pytest.mark.parametrize(
    ("spec", "parsed"),
    [
        ("a:1,,b:2", {"a": "1", "b": "2"}),  # an empty item is skipped, not the end
        (",a:1", {"a": "1"}),  # a leading comma separates (nothing before it is escaped)
        ("\\,a:1", {",a": "1"}),  # an escaped comma is part of the key
        ("a:x\\\\y", {"a": "x\\y"}),  # an escaped backslash is one backslash
    ],
)
def test_parse_key_values_separators_and_escapes(spec: str, parsed: dict) -> None:
    assert parse_key_values(spec, what="subs") == parsed


def test_a_malformed_override_names_the_setting_and_the_item(tmp_path: Path) -> None:
    opts = options(tmp_path, tensorrt_llm_parameters="multi_block_mode")
    with pytest.raises(TemplateError) as info:
        render_model_repository(opts, engine_info(tmp_path))
    assert info.value.message == "COG_TRITON_TENSORRT_LLM_PARAMETERS: 'multi_block_mode' is not key:value"


@pytest.mark.parametrize(
    "key", ["max_queue_delay_microseconds", "logits_datatype", "lora_weights_datatype", "triton_max_batch_size"]
)
def test_structural_parameters_cannot_be_overridden(tmp_path: Path, key: str) -> None:
    """These are set from other settings or the weights (and shared with the ensemble): an override would make
    the models disagree, so it is refused like an unknown name."""
    opts = options(tmp_path, tensorrt_llm_parameters=f"{key}:1,zzz:2")
    with pytest.raises(TemplateError) as info:
        render_model_repository(opts, engine_info(tmp_path))
    message = info.value.message
    assert message.startswith(f"COG_TRITON_TENSORRT_LLM_PARAMETERS: unknown parameter(s) {key}, zzz; allowed: ")
    allowed = message.split("; allowed: ", 1)[1].split(", ")
    assert allowed == sorted(allowed) and "batch_scheduler_policy" in allowed and "multi_block_mode" in allowed
    assert key not in allowed


GUIDED = "COG_TRITON_TENSORRT_LLM_PARAMETERS"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("guided_decoding_backend:xgrammar",
         f"{GUIDED}: guided_decoding_backend=xgrammar needs xgrammar_tokenizer_info_path too (the tokenizer info "
         "JSON made by TensorRT-LLM's examples/generate_xgrammar_tokenizer_info.py); without it the backend leaves "
         "guided decoding off and ignores every request's guide"),
        ("guided_decoding_backend:outlines",
         f"{GUIDED}: guided_decoding_backend='outlines'; TensorRT-LLM 1.2.1's C++ backend only accepts xgrammar and "
         "would fail to load"),
        ("xgrammar_tokenizer_info_path:/tmp/x.json",
         f"{GUIDED}: xgrammar_tokenizer_info_path is set but guided_decoding_backend is not; set "
         "guided_decoding_backend:xgrammar, or the backend leaves guided decoding off"),
        ("guided_decoding_backend:xgrammar,xgrammar_tokenizer_info_path:/no/such.json",
         f"{GUIDED}: xgrammar_tokenizer_info_path=/no/such.json does not exist"),
    ],
    ids=["backend-only", "other-backend", "info-only", "missing-file"],
)
def test_guided_decoding_refusals_say_what_to_set(tmp_path: Path, spec: str, message: str) -> None:
    """The backend silently leaves guided decoding off when only one of the two is set
    (getGuidedDecodingConfigFromParams): a user who sets only one gets an error saying what to set instead."""
    with pytest.raises(TemplateError) as info:
        render_model_repository(options(tmp_path, tensorrt_llm_parameters=spec), engine_info(tmp_path))
    assert info.value.message == message


TOKENIZER_INFO = {"encoded_vocab": ["a"], "tokenizer_str": "{}", "stop_token_ids": [0]}


def write_tokenizer_info(info: WeightsInfo, content: object) -> Path:
    path = info.tokenizer_dir / XGRAMMAR_TOKENIZER_INFO_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    return path


def test_the_engines_tokenizer_info_turns_guided_decoding_on(tmp_path: Path) -> None:
    """With the tokenizer info file (TensorRT-LLM's _xgrammar_tokenizer_info) beside the engine's tokenizer, the
    C++ backend gets both parameters it needs (getGuidedDecodingConfigFromParams); without it, or with guided
    decoding turned off (no xgrammar to check guides), both stay empty: off."""
    info = engine_info(tmp_path)
    off = render_model_repository(options(tmp_path), info)["tensorrt_llm"]
    assert not guided_decoding_of(off)
    path = write_tokenizer_info(info, {**TOKENIZER_INFO, "tokenizer_str": "é"})  # not ASCII: read as UTF-8
    on = render_model_repository(options(tmp_path), info)["tensorrt_llm"]
    assert params(on)["guided_decoding_backend"] == "xgrammar"
    assert params(on)["xgrammar_tokenizer_info_path"] == str(path)
    assert guided_decoding_of(on)
    disabled = render_model_repository(options(tmp_path, guided_decoding=False), info)["tensorrt_llm"]
    assert (params(disabled)["guided_decoding_backend"], params(disabled)["xgrammar_tokenizer_info_path"]) == ("", "")
    assert not guided_decoding_of(disabled)


def test_the_reference_model_has_guided_decoding_unless_it_is_off(tmp_path: Path) -> None:
    """The CPU reference model, like upstream's Python model, needs only guided_decoding_backend (it builds
    xgrammar from tokenizer_dir); turned off, the parameter is not rendered at all (the reference model keeps no
    empty parameters: only the C++ backend needs its required keys present)."""
    on = render_model_repository(options(tmp_path), checkpoint_info(tmp_path))["tensorrt_llm"]
    assert params(on)["guided_decoding_backend"] == "xgrammar" and guided_decoding_of(on)
    off = render_model_repository(options(tmp_path, guided_decoding=False), checkpoint_info(tmp_path))["tensorrt_llm"]
    assert "guided_decoding_backend" not in params(off) and not guided_decoding_of(off)
    assert params(off)["exclude_input_in_output"] == "true"  # only generated tokens come back, as from the engine


def config_with(backend: str, **parameters: str) -> model_config_pb2.ModelConfig:
    config = model_config_pb2.ModelConfig(name="tensorrt_llm", backend=backend)
    for key, value in parameters.items():
        config.parameters[key].string_value = value
    return config


@pytest.mark.parametrize(
    ("config", "on"),
    [
        (config_with("tensorrtllm"), False),
        (config_with("tensorrtllm", guided_decoding_backend="xgrammar"), False),
        (config_with("tensorrtllm", guided_decoding_backend="xgrammar", xgrammar_tokenizer_info_path=""), False),
        (config_with("tensorrtllm", guided_decoding_backend="xgrammar", xgrammar_tokenizer_info_path="/i.json"), True),
        (config_with("tensorrtllm", guided_decoding_backend="outlines", xgrammar_tokenizer_info_path="/i.json"), False),
        (config_with("tensorrtllm", xgrammar_tokenizer_info_path="/i.json"), False),
        (config_with("python", guided_decoding_backend="xgrammar"), True),
        (config_with("python", guided_decoding_backend=""), False),
        (config_with("python"), False),
    ],
    ids=["cpp-none", "cpp-backend-only", "cpp-empty-path", "cpp-both", "cpp-other-backend", "cpp-path-only",
         "python-xgrammar", "python-empty", "python-none"],
)
def test_guided_decoding_of_a_rendered_config(config: model_config_pb2.ModelConfig, on: bool) -> None:
    before = model_config_pb2.ModelConfig()
    before.CopyFrom(config)
    assert guided_decoding_of(config) is on
    # looking does not write: reading a missing key of a protobuf map would add it, empty, to the config
    assert config == before


@pytest.mark.parametrize(
    ("content", "warning"),
    [
        ({"encoded_vocab": [], "stop_token_ids": [0]}, "lacks tokenizer_str, which TensorRT-LLM's C++ backend reads "
         "unconditionally: guided decoding stays off"),
        ({}, "lacks encoded_vocab, tokenizer_str, stop_token_ids, which TensorRT-LLM's C++ backend reads "
         "unconditionally: guided decoding stays off"),
        ([], "lacks encoded_vocab, tokenizer_str, stop_token_ids, which"),  # JSON, but not an object
        ("{not json", "is unreadable (Expecting property name enclosed in double quotes: line 1 column 2 (char 1)): "
         "guided decoding stays off"),
    ],
    ids=["one-key-missing", "all-keys-missing", "not-an-object", "not-json"],
)
def test_a_tokenizer_info_the_backend_cannot_load_leaves_guided_decoding_off_with_a_warning(
    tmp_path: Path, caplog, content: object, warning: str
) -> None:
    info = engine_info(tmp_path)
    path = write_tokenizer_info(info, content)
    with caplog.at_level(logging.WARNING, logger="tensorrtllm_backend.templates"):
        config = render_model_repository(options(tmp_path), info)["tensorrt_llm"]
    assert not guided_decoding_of(config)
    warnings = [r.getMessage() for r in caplog.records if r.name == "tensorrtllm_backend.templates"]
    assert len(warnings) == 1 and warnings[0].startswith(f"{path} {warning}"), warnings


def test_leftovers_of_an_interrupted_render_are_cleared(tmp_path: Path) -> None:
    """A render killed half-way leaves <repo>.staging (being written) or <repo>.old (the one replaced): the next
    render removes both and succeeds; a model repository in a folder that does not exist yet is created."""
    opts = RenderOptions(template_dir=TEMPLATE_DIR, model_repo_dir=tmp_path / "live" / "model_repository")
    render_model_repository(opts, engine_info(tmp_path))
    for leftover in ("model_repository.staging", "model_repository.old"):
        (tmp_path / "live" / leftover / "stray_model").mkdir(parents=True)
    render_model_repository(opts, checkpoint_info(tmp_path))
    assert sorted(p.name for p in (tmp_path / "live").iterdir()) == ["model_repository"]
    assert read_rendered(opts.model_repo_dir)["tensorrt_llm"].backend == "python"
    render_model_repository(opts, engine_info(tmp_path))  # replacing it leaves no backup behind either
    assert sorted(p.name for p in (tmp_path / "live").iterdir()) == ["model_repository"]


@pytest.mark.parametrize(("kind", "backend"), [("engine", "TensorRT-LLM"), ("hf_checkpoint", "CPU reference")])
def test_a_render_is_logged_with_its_folder_and_backend(tmp_path: Path, caplog, kind: str, backend: str) -> None:
    info = engine_info(tmp_path) if kind == "engine" else checkpoint_info(tmp_path)
    opts = options(tmp_path)
    with caplog.at_level(logging.INFO, logger="tensorrtllm_backend.templates"):
        render_model_repository(opts, info)
    lines = [r.getMessage() for r in caplog.records if r.name == "tensorrtllm_backend.templates"]
    assert lines == [f"rendered model repository {opts.model_repo_dir} ({backend} backend)"]


@pytest.mark.parametrize(
    ("dtype", "datatype"), [("bfloat16", "TYPE_BF16"), ("float32", "TYPE_FP32"), ("", "TYPE_FP16")]
)
def test_an_engine_without_lora_declares_lora_weights_in_the_engines_dtype(
    tmp_path: Path, dtype: str, datatype: str
) -> None:
    """An engine config without a dtype is float16, TensorRT-LLM's default."""
    import dataclasses

    info = dataclasses.replace(engine_info(tmp_path), dtype=dtype)
    configs = render_model_repository(options(tmp_path), info)
    for model in ("tensorrt_llm", "ensemble_ids"):
        weights = {t.name: t for t in configs[model].input}["lora_weights"]
        assert model_config_pb2.DataType.Name(weights.data_type) == datatype, model


def test_the_reference_model_without_lora_ignores_the_lora_cache_setting(tmp_path: Path) -> None:
    opts = options(tmp_path, lora_cache_host_memory_bytes=123456789)
    p = params(render_model_repository(opts, checkpoint_info(tmp_path))["tensorrt_llm"])
    assert not [key for key in p if key.startswith("lora_")]
