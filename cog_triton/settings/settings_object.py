"""The settings object: the groups together (a field each), the checks across groups, the typed views other
modules take of the settings, and reading them from the environment."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from common.errors import ConfigError
from cog_triton.settings.base import ENV_PREFIX, resolve
from cog_triton.settings.flat import FlatSource, environment, flat_names, variable_at
from cog_triton.settings.inputs import FetchSettings, ImageSettings
from cog_triton.settings.llm import GuidedDecodingBackend, LlmSettings
from cog_triton.settings.lora import AdapterSettings, LoraCacheSettings
from cog_triton.settings.metrics import MetricsSettings
from cog_triton.settings.predictor import PredictorSettings
from cog_triton.settings.serving import KvCacheSettings, ReferenceSettings, RepositorySettings, TritonSettings
from cog_triton.settings.streaming import StreamSettings, TokenizerSettings
from cog_triton.settings.weights import DownloadSettings, WeightsSettings
from tensorrtllm_backend.llmapi_args import LlmApiOptions, parse_llm_args_text


class Settings(BaseSettings):
    """All knobs of the predictor, Triton process and model repository, one group per concern.

    Paths are resolved against the repository root when relative. Sizes are in tokens unless the
    name says otherwise; durations are in seconds (``_s``).
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", validate_default=True, env_ignore_empty=True
    )

    weights: WeightsSettings = Field(default_factory=WeightsSettings, title="Weights")
    download: DownloadSettings = Field(default_factory=DownloadSettings, title="Downloads")
    repository: RepositorySettings = Field(default_factory=RepositorySettings, title="Model repository")
    kv_cache: KvCacheSettings = Field(default_factory=KvCacheSettings, title="KV cache")
    tokenizer: TokenizerSettings = Field(default_factory=TokenizerSettings, title="Tokenizer")
    adapters: AdapterSettings = Field(default_factory=AdapterSettings, title="LoRA adapters")
    lora_cache: LoraCacheSettings = Field(default_factory=LoraCacheSettings, title="LoRA caches")
    llm: LlmSettings = Field(default_factory=LlmSettings, title="Hugging Face checkpoints and the PyTorch backend")
    reference: ReferenceSettings = Field(default_factory=ReferenceSettings, title="CPU reference backend")
    fetch: FetchSettings = Field(default_factory=FetchSettings, title="Fetch rules")
    images: ImageSettings = Field(default_factory=ImageSettings, title="Images")
    triton: TritonSettings = Field(default_factory=TritonSettings, title="Triton process")
    stream: StreamSettings = Field(default_factory=StreamSettings, title="Streaming")
    metrics: MetricsSettings = Field(default_factory=MetricsSettings, title="Metrics")
    predictor: PredictorSettings = Field(default_factory=PredictorSettings, title="Predictor")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The keywords over the environment, both by flat name (:mod:`cog_triton.settings.flat` says why); no .env
        file or secrets folder (none was configured)."""
        keywords = getattr(init_settings, "init_kwargs", {})
        return FlatSource(settings_cls, keywords), FlatSource(settings_cls, environment(settings_cls))

    @model_validator(mode="after")
    def _prometheus_port_is_not_tritons(self) -> "Settings":
        """The endpoint cannot share a port with Triton (both would need it; Triton would not start)."""
        triton, port = self.triton, self.metrics.prometheus_port
        taken = {"COG_TRITON_HTTP_PORT": triton.http_port, "COG_TRITON_GRPC_PORT": triton.grpc_port,
                 "COG_TRITON_METRICS_PORT": triton.metrics_port}
        for name, used in taken.items():
            if port and port == used:
                raise ValueError(
                    f"COG_TRITON_PROMETHEUS_PORT={used} is also {name}, Triton's; give the Prometheus endpoint "
                    "another port, or 0 to turn it off"
                )
        return self

    def llm_api_options(self) -> LlmApiOptions:
        """The typed options the PyTorch backend's ``LLM(...)`` arguments are built from
        (:func:`tensorrtllm_backend.llmapi_args.build_llm_args`), with the setting behind each argument.

        Raises:
            ConfigError: COG_TRITON_LLM_ARGS is not a JSON/YAML mapping.
        """
        e, llm, kv = ENV_PREFIX, self.llm, self.kv_cache
        sources = {
            "tensor_parallel_size": e + "LLM_TENSOR_PARALLEL_SIZE",
            "pipeline_parallel_size": e + "LLM_PIPELINE_PARALLEL_SIZE",
            "max_seq_len": e + "LLM_MAX_SEQ_LEN",
            "kv_cache_config.free_gpu_memory_fraction": e + "KV_CACHE_FREE_GPU_MEM_FRACTION",
            "kv_cache_config.enable_block_reuse": e + "ENABLE_KV_CACHE_REUSE",
            "enable_chunked_prefill": e + "ENABLE_CHUNKED_CONTEXT",
            "guided_decoding_backend": e + "LLM_GUIDED_DECODING_BACKEND",
            "sampler_type": e + "LLM_SAMPLER",
            "stream_interval": e + "LLM_STREAM_INTERVAL",
            "trust_remote_code": e + "LLM_TRUST_REMOTE_CODE",
        }
        optional = {
            "max_batch_size": (llm.max_batch_size, "LLM_MAX_BATCH_SIZE"),
            "max_num_tokens": (llm.max_num_tokens, "LLM_MAX_NUM_TOKENS"),
            "kv_cache_config.max_tokens": (kv.max_tokens, "MAX_TOKENS_IN_PAGED_KV_CACHE"),
        }
        sources.update({path: e + name for path, (value, name) in optional.items() if value is not None})
        if llm.enable_lora:
            sources.update({
                "lora_config.max_lora_rank": e + "LLM_MAX_LORA_RANK",
                "lora_config.max_loras": e + "LLM_MAX_LORAS",
                "lora_config.max_cpu_loras": e + "LLM_MAX_CPU_LORAS",
                "lora_config.lora_target_modules": e + "LLM_LORA_TARGET_MODULES",
            })
        guided = llm.guided_decoding_backend
        return LlmApiOptions(
            tensor_parallel_size=llm.tensor_parallel_size,
            pipeline_parallel_size=llm.pipeline_parallel_size,
            max_batch_size=llm.max_batch_size,
            max_num_tokens=llm.max_num_tokens,
            max_seq_len=llm.max_seq_len,
            free_gpu_memory_fraction=kv.free_gpu_mem_fraction,
            enable_block_reuse=kv.enable_reuse,
            kv_cache_max_tokens=kv.max_tokens,
            enable_chunked_prefill=kv.enable_chunked_context,
            guided_decoding_backend=None if guided is GuidedDecodingBackend.NONE else guided.value,
            sampler_type=llm.sampler.value,
            stream_interval=llm.stream_interval,
            enable_lora=llm.enable_lora,
            max_lora_rank=llm.max_lora_rank,
            max_loras=llm.max_loras,
            max_cpu_loras=llm.max_cpu_loras,
            lora_target_modules=tuple(m.strip() for m in llm.lora_target_modules.split(",") if m.strip()),
            trust_remote_code=llm.trust_remote_code,
            extra=parse_llm_args_text(llm.args),
            sources=sources,
        )

    def path(self, value: Path) -> Path:
        """Resolve ``value`` against the repository root when it is relative."""
        return resolve(value)

    @classmethod
    def from_env(cls, **overrides: object) -> "Settings":
        """Read settings from the environment (``COG_TRITON_*``), then apply ``overrides`` (flat names, as
        ``http_port=9000``, or whole groups).

        Raises:
            ConfigError: a value is invalid or a variable is unknown; the message names the
                environment variable, the value and the constraint.
        """
        known = flat_names(cls)
        unknown = sorted(k for k in os.environ if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX):].lower() not in known)
        if unknown:
            raise ConfigError(f"unknown setting(s) {', '.join(unknown)}; known: " + ", ".join(variables()))
        try:
            return cls(**overrides)  # type: ignore[arg-type]
        except ValidationError as exc:
            problems = []
            for err in exc.errors():
                loc = tuple(str(p) for p in err["loc"])
                if not loc:  # a check of several settings together: its message names them
                    problems.append(str(err["msg"]).removeprefix("Value error, "))
                    continue
                env = variable_at(cls, loc)
                problems.append(f"{env}={err.get('input')!r}: {str(err['msg']).removeprefix('Value error, ')}")
            raise ConfigError("invalid settings: " + "; ".join(problems)) from None


def variables() -> dict[str, tuple[str, str]]:
    """Each setting's environment variable -> its group and field, e.g. ``COG_TRITON_DOWNLOAD_TIMEOUT_S`` ->
    ``("download", "timeout_s")`` (``settings.download.timeout_s``), in the order of the groups and their fields."""
    return {ENV_PREFIX + flat.upper(): where for flat, where in flat_names(Settings).items()}
