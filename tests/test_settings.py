"""Tests of cog_triton.settings.Settings.from_env with a controlled environment."""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import get_args

import pytest
from pydantic import BaseModel, ValidationError

from common.errors import ConfigError
from cog_triton.settings import (
    ENV_PREFIX, REPO_ROOT, BatchingStrategy, LoraCacheSettings, SchedulerPolicy, Settings, WeightsSettings,
    variables,
)

GOOD_SHA = "0123456789abcdef" * 4


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No COG_TRITON_* or COG_WEIGHTS variables from the outer environment."""
    for key in list(os.environ):
        if key.startswith(ENV_PREFIX) or key == "COG_WEIGHTS":
            monkeypatch.delenv(key)
    return monkeypatch


def config_error(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> str:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        Settings.from_env()
    assert info.value.code == "config_error"
    return str(info.value)


def test_repo_root() -> None:
    assert (REPO_ROOT / "cog_triton" / "settings" / "__init__.py").is_file()
    assert (REPO_ROOT / "predict.py").is_file()


def test_defaults() -> None:
    s = Settings.from_env()
    assert s.weights.source is None
    assert s.weights.sha256 is None
    assert s.weights.dir == Path("triton_model_repo/tensorrt_llm/1")
    assert s.repository.template_dir == Path("triton_model_repo")
    assert s.repository.dir == Path("build/model_repository")
    assert s.tokenizer.dir is None
    assert s.repository.max_batch_size is None
    assert s.repository.batching_strategy is BatchingStrategy.INFLIGHT_FUSED
    assert s.repository.batch_scheduler_policy is SchedulerPolicy.GUARANTEED_NO_EVICT
    assert s.kv_cache.free_gpu_mem_fraction == 0.9
    assert s.kv_cache.enable_reuse is True  # the C++ backend's own default (getKvCacheConfigFromParams)
    assert s.tokenizer.special_tokens_in_user_text is False
    assert s.kv_cache.enable_chunked_context is False
    assert s.repository.tensorrt_llm_parameters == ""
    assert s.tokenizer.add_special_tokens is None
    assert (s.triton.http_port, s.triton.grpc_port, s.triton.metrics_port) == (8000, 8001, 8002)
    assert s.predictor.self_test is True
    assert s.predictor.max_concurrency == 64
    assert s.reference.max_batch_size == 8
    assert s.reference.max_seq_len is None
    assert s.download.retries == 3
    assert s.triton.mpirun == "mpirun"
    assert s.weights.default_source() is None


def test_env_overrides(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("COG_TRITON_HTTP_PORT", "9000")
    clean_env.setenv("COG_TRITON_GRPC_PORT", "9001")
    clean_env.setenv("COG_TRITON_TRITON_MAX_BATCH_SIZE", "16")
    clean_env.setenv("COG_TRITON_KV_CACHE_FREE_GPU_MEM_FRACTION", "0.5")
    clean_env.setenv("COG_TRITON_BATCHING_STRATEGY", "V1")
    clean_env.setenv("COG_TRITON_BATCH_SCHEDULER_POLICY", "max_utilization")
    clean_env.setenv("COG_TRITON_TENSORRT_LLM_PARAMETERS", "multi_block_mode:true")
    clean_env.setenv("COG_TRITON_WEIGHTS", "https://example.com/w.tar")
    clean_env.setenv("COG_TRITON_STARTUP_TIMEOUT_S", "12.5")
    s = Settings.from_env()
    assert s.triton.http_port == 9000
    assert s.triton.grpc_port == 9001
    assert s.triton.metrics_port == 8002
    assert s.repository.max_batch_size == 16
    assert s.kv_cache.free_gpu_mem_fraction == 0.5
    assert s.repository.batching_strategy is BatchingStrategy.V1
    assert s.repository.batch_scheduler_policy is SchedulerPolicy.MAX_UTILIZATION
    assert s.repository.tensorrt_llm_parameters == "multi_block_mode:true"
    assert s.weights.source == "https://example.com/w.tar"
    assert s.triton.startup_timeout_s == 12.5


def test_from_env_keyword_overrides(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("COG_TRITON_HTTP_PORT", "9000")
    assert Settings.from_env(http_port=9100).triton.http_port == 9100
    with pytest.raises(ConfigError, match="COG_TRITON_HTTP_PORT"):
        Settings.from_env(http_port=0)


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("true", True), ("false", False), ("1", True), ("0", False), ("yes", True), ("no", False),
        ("on", True), ("off", False), ("TRUE", True), ("Off", False),
    ],
)
def test_booleans(clean_env: pytest.MonkeyPatch, raw: str, expected: bool) -> None:
    clean_env.setenv("COG_TRITON_SELF_TEST", raw)
    clean_env.setenv("COG_TRITON_ENABLE_KV_CACHE_REUSE", raw)
    s = Settings.from_env()
    assert s.predictor.self_test is expected
    assert s.kv_cache.enable_reuse is expected


def test_empty_variable_means_unset(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("COG_TRITON_SELF_TEST", "")
    clean_env.setenv("COG_TRITON_TRITON_MAX_BATCH_SIZE", "")
    s = Settings.from_env()
    assert s.predictor.self_test is True
    assert s.repository.max_batch_size is None


@pytest.mark.parametrize("raw", ["maybe", "2", "ja"])
def test_bad_boolean(clean_env: pytest.MonkeyPatch, raw: str) -> None:
    message = config_error(clean_env, "COG_TRITON_SELF_TEST", raw)
    assert f"COG_TRITON_SELF_TEST={raw!r}" in message
    assert "boolean" in message


def test_optional_boolean(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("COG_TRITON_ADD_SPECIAL_TOKENS", "no")
    assert Settings.from_env().tokenizer.add_special_tokens is False
    message = config_error(clean_env, "COG_TRITON_ADD_SPECIAL_TOKENS", "perhaps")
    assert "COG_TRITON_ADD_SPECIAL_TOKENS='perhaps'" in message


@pytest.mark.parametrize("name", ["COG_TRITON_HTTP_PORT", "COG_TRITON_GRPC_PORT", "COG_TRITON_METRICS_PORT"])
@pytest.mark.parametrize("raw, bound", [("0", "greater than or equal to 1"), ("70000", "less than or equal to 65535")])
def test_bad_port(clean_env: pytest.MonkeyPatch, name: str, raw: str, bound: str) -> None:
    message = config_error(clean_env, name, raw)
    assert f"{name}={raw!r}" in message
    assert bound in message


def test_port_bounds_accepted(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("COG_TRITON_HTTP_PORT", "1")
    clean_env.setenv("COG_TRITON_GRPC_PORT", "65535")
    s = Settings.from_env()
    assert (s.triton.http_port, s.triton.grpc_port) == (1, 65535)


def test_not_a_number(clean_env: pytest.MonkeyPatch) -> None:
    message = config_error(clean_env, "COG_TRITON_HTTP_PORT", "eighty")
    assert "COG_TRITON_HTTP_PORT='eighty'" in message


@pytest.mark.parametrize(
    "name, raw",
    [
        ("COG_TRITON_KV_CACHE_FREE_GPU_MEM_FRACTION", "0"),
        ("COG_TRITON_KV_CACHE_FREE_GPU_MEM_FRACTION", "1.5"),
        ("COG_TRITON_DOWNLOAD_RETRIES", "-1"),
        ("COG_TRITON_MAX_CONCURRENCY", "0"),
        ("COG_TRITON_STARTUP_TIMEOUT_S", "0"),
        ("COG_TRITON_REFERENCE_MAX_SEQ_LEN", "1"),
        ("COG_TRITON_LOG_VERBOSE", "6"),
    ],
)
def test_range_checks(clean_env: pytest.MonkeyPatch, name: str, raw: str) -> None:
    assert f"{name}={raw!r}" in config_error(clean_env, name, raw)


def test_several_problems_reported_together(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("COG_TRITON_HTTP_PORT", "0")
    message = config_error(clean_env, "COG_TRITON_SELF_TEST", "maybe")
    assert "COG_TRITON_HTTP_PORT" in message
    assert "COG_TRITON_SELF_TEST" in message


def test_unknown_variable_lists_known_names(clean_env: pytest.MonkeyPatch) -> None:
    message = config_error(clean_env, "COG_TRITON_FOO", "1")
    assert "COG_TRITON_FOO" in message
    known = message.split("known:", 1)[1]
    assert "COG_TRITON_FOO" not in known
    for variable in variables():
        assert variable in known
    assert "COG_TRITON_HTTP_PORT" in known


def test_unknown_variable_typo(clean_env: pytest.MonkeyPatch) -> None:
    message = config_error(clean_env, "COG_TRITON_HTTP_PROT", "9000")
    assert "unknown setting(s) COG_TRITON_HTTP_PROT" in message


def test_unrelated_variables_ignored(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("COG_TRITONX", "1")
    clean_env.setenv("COG_MAX_CONCURRENCY", "8")
    assert Settings.from_env().triton.http_port == 8000


def test_weights_sha256(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("COG_TRITON_WEIGHTS_SHA256", GOOD_SHA.upper())
    assert Settings.from_env().weights.sha256 == GOOD_SHA
    clean_env.setenv("COG_TRITON_WEIGHTS_SHA256", f"  {GOOD_SHA}\n")
    assert Settings.from_env().weights.sha256 == GOOD_SHA
    clean_env.setenv("COG_TRITON_WEIGHTS_SHA256", "")
    assert Settings.from_env().weights.sha256 is None


@pytest.mark.parametrize("raw", ["xyz", GOOD_SHA[:-1], GOOD_SHA + "0", "g" * 64])
def test_bad_weights_sha256(clean_env: pytest.MonkeyPatch, raw: str) -> None:
    message = config_error(clean_env, "COG_TRITON_WEIGHTS_SHA256", raw)
    assert "COG_TRITON_WEIGHTS_SHA256" in message
    assert "64 hexadecimal characters" in message


def test_default_weights_falls_back_to_cog_weights(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("COG_WEIGHTS", "https://example.com/cog.tar")
    assert Settings.from_env().weights.default_source() == "https://example.com/cog.tar"
    clean_env.setenv("COG_TRITON_WEIGHTS", "")
    s = Settings.from_env()
    assert s.weights.source is None
    assert s.weights.default_source() == "https://example.com/cog.tar"
    clean_env.setenv("COG_TRITON_WEIGHTS", "/data/own.tar")
    assert Settings.from_env().weights.default_source() == "/data/own.tar"
    clean_env.delenv("COG_TRITON_WEIGHTS")
    clean_env.setenv("COG_WEIGHTS", "")
    assert Settings.from_env().weights.default_source() is None


def test_relative_paths_resolve_against_repo_root(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.chdir(tmp_path)  # the working directory must not matter
    clean_env.setenv("COG_TRITON_WEIGHTS_DIR", "some/weights")
    clean_env.setenv("COG_TRITON_MODEL_REPO_DIR", "out/repo")
    s = Settings.from_env()
    assert s.weights.path == REPO_ROOT / "some" / "weights"
    assert s.repository.path == REPO_ROOT / "out" / "repo"
    assert s.repository.template_path == REPO_ROOT / "triton_model_repo"
    assert s.weights.path.is_absolute()


def test_absolute_paths_kept(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    clean_env.setenv("COG_TRITON_WEIGHTS_DIR", str(tmp_path / "w"))
    clean_env.setenv("COG_TRITON_MODEL_REPO_DIR", str(tmp_path / "r"))
    clean_env.setenv("COG_TRITON_TEMPLATE_DIR", str(tmp_path / "t"))
    s = Settings.from_env()
    assert s.weights.path == tmp_path / "w"
    assert s.repository.path == tmp_path / "r"
    assert s.repository.template_path == tmp_path / "t"


def test_default_paths_resolve_into_repo() -> None:
    s = Settings.from_env()
    assert s.weights.path == REPO_ROOT / "triton_model_repo" / "tensorrt_llm" / "1"
    assert s.repository.path == REPO_ROOT / "build" / "model_repository"


@pytest.mark.parametrize(
    "name, raw, allowed",
    [
        ("COG_TRITON_BATCHING_STRATEGY", "fast", ("inflight_fused_batching", "V1")),
        ("COG_TRITON_BATCH_SCHEDULER_POLICY", "whatever", ("max_utilization", "guaranteed_no_evict")),
    ],
)
def test_bad_enum_lists_allowed(clean_env: pytest.MonkeyPatch, name: str, raw: str, allowed: tuple[str, ...]) -> None:
    message = config_error(clean_env, name, raw)
    assert f"{name}={raw!r}" in message
    for value in allowed:
        assert f"'{value}'" in message


def test_weights_hardening_defaults_match_fetch_weights() -> None:
    import inspect

    from cog_triton.settings import VerifyMode
    from cog_triton.weights import fetch_weights

    s = Settings.from_env()
    defaults = {k: p.default for k, p in inspect.signature(fetch_weights).parameters.items()}
    assert s.download.deadline_s == defaults["deadline_s"] == 21600
    assert s.download.min_rate_bytes_s == defaults["min_rate_bytes_s"] == 100_000
    assert s.download.rate_grace_s == defaults["rate_grace_s"] == 60
    assert s.weights.max_extracted_bytes is defaults["max_extracted_bytes"] is None
    assert s.weights.verify is VerifyMode.FAST


def test_the_prometheus_endpoints_bounds_default_to_its_modules(clean_env: pytest.MonkeyPatch) -> None:
    from cog_triton.worker import metrics_endpoint as endpoint

    m = Settings.from_env().metrics
    ours = (m.prometheus_max_connections, m.prometheus_backlog, m.prometheus_request_timeout_s, m.prometheus_reuse_s,
            m.prometheus_triton_timeout_s)
    assert ours == (endpoint.MAX_CONNECTIONS, endpoint.BACKLOG, endpoint.REQUEST_TIMEOUT_S, endpoint.REUSE_S,
                    endpoint.TRITON_SCRAPE_TIMEOUT_S) == (64, 1024, 10, 1, 2)
    clean_env.setenv("COG_TRITON_PROMETHEUS_MAX_CONNECTIONS", "7")
    clean_env.setenv("COG_TRITON_PROMETHEUS_REUSE_S", "0")
    m = Settings.from_env().metrics
    assert (m.prometheus_max_connections, m.prometheus_reuse_s) == (7, 0)


def test_weights_hardening_settings_from_env(clean_env: pytest.MonkeyPatch) -> None:
    from cog_triton.settings import VerifyMode

    clean_env.setenv("COG_TRITON_DOWNLOAD_DEADLINE_S", "0")
    clean_env.setenv("COG_TRITON_DOWNLOAD_MIN_RATE_BYTES_S", "1000000")
    clean_env.setenv("COG_TRITON_DOWNLOAD_RATE_GRACE_S", "30")
    clean_env.setenv("COG_TRITON_MAX_EXTRACTED_BYTES", "5000000000")
    clean_env.setenv("COG_TRITON_VERIFY_WEIGHTS", "full")
    s = Settings.from_env()
    assert (s.download.deadline_s, s.download.min_rate_bytes_s, s.download.rate_grace_s) == (0, 1_000_000, 30)
    assert s.weights.max_extracted_bytes == 5_000_000_000
    assert s.weights.verify is VerifyMode.FULL


@pytest.mark.parametrize(
    "name, raw, bound",
    [
        ("COG_TRITON_DOWNLOAD_DEADLINE_S", "-1", "greater than or equal to 0"),
        ("COG_TRITON_DOWNLOAD_MIN_RATE_BYTES_S", "-5", "greater than or equal to 0"),
        ("COG_TRITON_DOWNLOAD_MIN_RATE_BYTES_S", "1.5", "integer"),
        ("COG_TRITON_DOWNLOAD_RATE_GRACE_S", "0", "greater than 0"),
        ("COG_TRITON_MAX_EXTRACTED_BYTES", "0", "greater than or equal to 1"),
        ("COG_TRITON_VERIFY_WEIGHTS", "sometimes", "'fast' or 'full'"),
    ],
)
def test_weights_hardening_settings_are_validated(
    clean_env: pytest.MonkeyPatch, name: str, raw: str, bound: str
) -> None:
    message = config_error(clean_env, name, raw)
    assert f"{name}={raw!r}" in message and bound in message, message


def test_concurrency_follows_cogs_own_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """One source: coglet's COG_MAX_CONCURRENCY unless COG_TRITON_MAX_CONCURRENCY is set."""
    monkeypatch.setenv("COG_MAX_CONCURRENCY", "12")
    assert Settings.from_env().predictor.max_concurrency == 12
    monkeypatch.setenv("COG_TRITON_MAX_CONCURRENCY", "5")
    assert Settings.from_env().predictor.max_concurrency == 5


def test_the_lora_gpu_fraction_is_a_share_of_the_memory_free_before_the_kv_cache() -> None:
    """TrtGptModelInflightBatching's constructor makes the PeftCacheManager, which takes lora_cache_gpu_memory_fraction
    of the GPU memory free at that moment (peftCacheManager.cpp getMaxNumSlots @ 9df6d722), before it sizes the KV
    cache from the memory free after that (trtGptModelInflightBatching.cpp @ b35ac1b6, TensorRT-LLM 1.2.0rc2, and
    @ 00825c4e; kvCacheManager.cpp calculateFreeMemBytes @ b35ac1b6). Upstream's docs/lora.md, and our page until
    now, say "left after the KV cache"."""
    text = LoraCacheSettings.model_fields["gpu_memory_fraction"].description or ""
    assert "free when the engine's LoRA cache is made, before the KV cache is sized" in text
    assert "the KV cache's fraction applies to what is left after it" in text
    assert "left after the KV cache" not in text
    row = next(line for line in (REPO_ROOT / "docs" / "settings.md").read_text().splitlines()
               if line.startswith("| `COG_TRITON_LORA_CACHE_GPU_MEMORY_FRACTION`"))
    assert "before the KV cache is sized" in row


def test_the_prometheus_endpoint_settings(clean_env: pytest.MonkeyPatch) -> None:
    s = Settings.from_env()
    # on by default: docs/operations.md
    assert (s.metrics.prometheus_address, s.metrics.prometheus_port) == ("0.0.0.0", 9464)
    clean_env.setenv("COG_TRITON_PROMETHEUS_PORT", "0")
    clean_env.setenv("COG_TRITON_PROMETHEUS_ADDRESS", "127.0.0.1")
    s = Settings.from_env()
    assert (s.metrics.prometheus_address, s.metrics.prometheus_port) == ("127.0.0.1", 0)  # 0: off
    message = config_error(clean_env, "COG_TRITON_PROMETHEUS_PORT", "70000")
    assert "COG_TRITON_PROMETHEUS_PORT='70000'" in message and "65535" in message


@pytest.mark.parametrize("triton", ["COG_TRITON_HTTP_PORT", "COG_TRITON_GRPC_PORT", "COG_TRITON_METRICS_PORT"])
def test_the_prometheus_port_cannot_be_one_of_tritons(clean_env: pytest.MonkeyPatch, triton: str) -> None:
    clean_env.setenv(triton, "9100")
    message = config_error(clean_env, "COG_TRITON_PROMETHEUS_PORT", "9100")
    assert f"COG_TRITON_PROMETHEUS_PORT=9100 is also {triton}" in message and "or 0 to turn it off" in message
    assert "COG_TRITON_=" not in message  # a check of two settings names them, not an empty field
    clean_env.setenv("COG_TRITON_PROMETHEUS_PORT", "0")
    assert Settings.from_env().metrics.prometheus_port == 0  # off: no conflict


def test_stream_processes_zero_is_refused_with_what_to_set_instead(clean_env: pytest.MonkeyPatch) -> None:
    """COG_TRITON_STREAM_PROCESSES=0 once ran the per-token work in the Cog worker; that second pipeline is gone,
    so 0 fails setup with a message naming the value, the range and the default, not silently a process."""
    message = config_error(clean_env, "COG_TRITON_STREAM_PROCESSES", "0")
    assert "COG_TRITON_STREAM_PROCESSES='0'" in message
    assert "no longer offered" in message and "set 1 to 64, or leave it unset for one per 5 CPUs" in message
    assert "Value error" not in message  # pydantic's prefix is dropped
    assert "greater than or equal to 1" in config_error(clean_env, "COG_TRITON_STREAM_PROCESSES", "-1")
    clean_env.setenv("COG_TRITON_STREAM_PROCESSES", "1")
    assert Settings.from_env().stream.process_count() == 1
    clean_env.delenv("COG_TRITON_STREAM_PROCESSES")
    assert Settings.from_env().stream.process_count() >= 1


# --- the groups (issue 33): each flat variable reaches its one nested field ----------------------------------------

def _groups() -> dict[str, type[BaseModel]]:
    return {group: field.annotation for group, field in Settings.model_fields.items()}  # type: ignore[misc]


def _sample(group: type[BaseModel], name: str) -> str:
    """A text of ``name``'s variable that validates and differs from its default."""
    kinds = get_args(group.model_fields[name].annotation) or (group.model_fields[name].annotation,)
    members = [member.value for kind in kinds if isinstance(kind, type) and issubclass(kind, Enum) for member in kind]
    candidates = ["true", "false", "2", "3", "0.5", "/elsewhere", "example.com", "10.1.2.0/24", '{"a": 1}', GOOD_SHA]
    for raw in candidates + members:
        try:
            value = getattr(group.model_validate({name: raw}), name)
        except ValidationError:
            continue
        if value != getattr(group(), name):
            return raw
    raise AssertionError(f"no sample for {group.__name__}.{name}")


def test_every_field_has_its_own_variable() -> None:
    assert len(variables()) == sum(len(group.model_fields) for group in _groups().values()) == 95
    assert all(variable.startswith(ENV_PREFIX) and variable.isupper() for variable in variables())


@pytest.mark.parametrize("variable", list(variables()))
def test_each_variable_reaches_its_field_and_no_other(clean_env: pytest.MonkeyPatch, variable: str) -> None:
    """By the environment and by its flat keyword alike; the field counts as set explicitly, no other does."""
    group, name = variables()[variable]
    raw = _sample(_groups()[group], name)
    default = Settings.from_env().model_dump()
    clean_env.setenv(variable, raw)
    from_env = Settings.from_env()
    clean_env.delenv(variable)
    from_keyword = Settings(**{variable[len(ENV_PREFIX):].lower(): raw})
    for s in (from_env, from_keyword):
        changed = {(g, n) for g, fields in s.model_dump().items() for n, v in fields.items() if v != default[g][n]}
        assert changed == {(group, name)}
        assert {g: getattr(s, g).model_fields_set for g in _groups() if getattr(s, g).model_fields_set} == {
            group: {name}}
    assert from_env == from_keyword


def test_unset_settings_are_not_explicit_and_a_default_value_set_is(clean_env: pytest.MonkeyPatch) -> None:
    """worker.facts.reference_limits lets a variable set, even to the default, win over the archive's limits."""
    assert all(not getattr(Settings.from_env(), group).model_fields_set for group in _groups())
    clean_env.setenv("COG_TRITON_REFERENCE_MAX_BATCH_SIZE", "8")
    assert Settings.from_env().reference.model_fields_set == {"max_batch_size"}


def test_keywords_win_over_the_environment_field_by_field(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("COG_TRITON_HTTP_PORT", "9000")
    clean_env.setenv("COG_TRITON_GRPC_PORT", "9001")
    triton = Settings.from_env(grpc_port=9101, metrics_port=9102).triton
    assert (triton.http_port, triton.grpc_port, triton.metrics_port) == (9000, 9101, 9102)
    assert Settings(triton={"grpc_port": 9201}).triton.http_port == 9000  # a group given as a dict, too
    assert Settings(triton={"http_port": 9200}, http_port=9300).triton.http_port == 9300  # the flat name last


def test_weights_is_a_group_and_a_variable(clean_env: pytest.MonkeyPatch) -> None:
    """``weights`` names the group and COG_TRITON_WEIGHTS: a dict or a model is the group, a text the variable."""
    clean_env.setenv("COG_TRITON_WEIGHTS_SHA256", GOOD_SHA)
    s = Settings(weights="/data/w.tar")
    assert (s.weights.source, s.weights.sha256) == ("/data/w.tar", GOOD_SHA)
    assert Settings(weights={"dir": "/w"}).weights.path == Path("/w")
    assert Settings(weights=WeightsSettings(source="x")).weights.source == "x"


def test_a_grouped_field_error_names_the_flat_variable(clean_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env(download={"timeout_s": 0}, fetch_allow_networks="nonsense")
    assert "COG_TRITON_DOWNLOAD_TIMEOUT_S=0: Input should be greater than 0" in str(info.value)
    assert "COG_TRITON_FETCH_ALLOW_NETWORKS='nonsense'" in str(info.value)


def test_variable_names_match_in_any_case(clean_env: pytest.MonkeyPatch) -> None:
    """As pydantic-settings' own environment source (case_sensitive off) matched them."""
    clean_env.setenv("cog_triton_http_port", "9000")
    assert Settings.from_env().triton.http_port == 9000


#: Fields whose name is not the end of their variable's name (the rest are: COG_TRITON_DOWNLOAD_TIMEOUT_S is
#: settings.download.timeout_s), so that a reader finds a variable's field, and two fields' variables cannot swap.
RENAMED = {"COG_TRITON_WEIGHTS": "weights.source", "COG_TRITON_VERIFY_WEIGHTS": "weights.verify",
           "COG_TRITON_MAX_TOKENS_IN_PAGED_KV_CACHE": "kv_cache.max_tokens",
           "COG_TRITON_ENABLE_KV_CACHE_REUSE": "kv_cache.enable_reuse", "COG_TRITON_LORA_ADAPTERS": "adapters.enabled",
           "COG_TRITON_TIMING_METRICS": "metrics.timing",
           "COG_TRITON_IMAGES": "images.enabled"}


def test_a_fields_name_ends_its_variables_name_unless_renamed() -> None:
    renamed = {variable: f"{group}.{name}" for variable, (group, name) in variables().items()
               if not variable.lower().endswith(name)}
    assert renamed == RENAMED
