"""One typed settings object for cog-triton, read from ``COG_TRITON_*`` environment variables.

Parsing and validation are pydantic-settings': booleans accept only true/false/1/0/yes/no/on/off
(never ``bool(os.getenv(...))``), numbers are range-checked, and a bad value raises
:class:`common.errors.ConfigError` naming the variable, the value and what is allowed.

The settings are grouped by concern, one pydantic model per group (``settings.download.timeout_s``,
``settings.llm.sampler``, ``settings.triton.http_port``), while each keeps its flat variable,
``COG_TRITON_<NAME>``: NAME is the field's ``validation_alias`` where it has one (``download_timeout_s``), else
its name (``http_port``). :func:`variables` lists them; docs/settings.md is generated from them, a section per
group.

How a flat variable reaches its nested field: pydantic-settings reads the environment only into top-level fields,
so :meth:`Settings.settings_customise_sources` gives it two :class:`FlatSource` instances instead, one over the
keywords (``Settings(http_port=...)``, flat names as before) and one over the environment, each sorting the flat
names into their groups (``{"triton": {"http_port": ...}}``); pydantic-settings then merges them group by group
(a keyword over a variable, field by field) and pydantic validates the groups. Keyed by field names, a group's
``model_fields_set`` still means "set explicitly" (by a variable or a keyword). The other ways were worse:
``env_nested_delimiter`` renames every variable (``COG_TRITON_DOWNLOAD__TIMEOUT_S``); groups that are
``BaseSettings`` themselves read the environment in their default factories, where a bad value fails alone and
without its group (several groups' errors are no longer reported together); regrouping in a
``model_validator(mode="before")`` comes after the merge, where ``weights``, both a group and COG_TRITON_WEIGHTS,
is one key: the weights from one source would replace the other source's whole group, or the other way round.

Why one module: one concern, the operator's settings: the fields (each with the description
docs/settings.md is generated from, in groups), the source that fills the groups from the
flat variables, their validation, and the typed views other modules take of them (``llm_api_options``, paths, the
stream process count).
"""

from __future__ import annotations

import functools
import os
from enum import Enum
from pathlib import Path
from typing import Any, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from common.errors import ConfigError
from tensorrtllm_backend.llmapi_args import LlmApiOptions, parse_llm_args_text

REPO_ROOT = Path(__file__).resolve().parents[2]
ENV_PREFIX = "COG_TRITON_"
#: predict.py's ``@cog.concurrent(max=...)`` and the Dockerfile's COG_MAX_CONCURRENCY (tests keep them equal).
DEFAULT_CONCURRENCY = 64
#: The stream interval's default, ms (README "Performance" has the GPU-host figures behind it).
DEFAULT_STREAM_INTERVAL_MS = 50.0
DEFAULT_STREAM_INTERVAL_MS = 50.0


class BatchingStrategy(str, Enum):
    """``gpt_model_type`` of the TensorRT-LLM backend."""

    INFLIGHT_FUSED = "inflight_fused_batching"
    V1 = "V1"


class SchedulerPolicy(str, Enum):
    """``batch_scheduler_policy`` of the TensorRT-LLM backend."""

    MAX_UTILIZATION = "max_utilization"
    GUARANTEED_NO_EVICT = "guaranteed_no_evict"


class CheckpointBackend(str, Enum):
    """Which backend serves a Hugging Face checkpoint (tensorrtllm_backend.llmapi_args.choose_checkpoint_backend)."""

    AUTO = "auto"  # the PyTorch backend when a GPU is visible, else the CPU reference model
    PYTORCH = "pytorch"  # TensorRT-LLM's PyTorch backend through the LLM API (GPU)
    REFERENCE = "reference"  # the CPU reference model


class GuidedDecodingBackend(str, Enum):
    """``guided_decoding_backend`` of the LLM API (TorchLlmArgs: xgrammar, llguidance or none)."""

    XGRAMMAR = "xgrammar"
    LLGUIDANCE = "llguidance"
    NONE = "none"


class LlmSampler(str, Enum):
    """``sampler_type`` of the LLM API (TorchLlmArgs; tensorrtllm_backend.samplers has what each applies)."""

    AUTO = "auto"  # TorchSampler (1.2.1's choice without beam search)
    TORCH_SAMPLER = "TorchSampler"
    TRTLLM_SAMPLER = "TRTLLMSampler"


class VerifyMode(str, Enum):
    """How setup checks weights it reuses against their manifest.json (weights it just fetched are
    always hashed in full)."""

    FAST = "fast"  # hash only files whose size or mtime changed since the last successful full hash
    FULL = "full"  # hash every file on every setup



def resolve(path: Path) -> Path:
    """``path`` resolved against the repository root when it is relative."""
    return path if path.is_absolute() else (REPO_ROOT / path)


class Group(BaseModel):
    """A group of settings: each field is read from ``COG_TRITON_<its validation_alias, else its name>``."""

    model_config = ConfigDict(extra="forbid", validate_default=True, validate_by_name=True, validate_by_alias=True)


class WeightsSettings(Group):
    """The weights: which, where they are unpacked, and how they are checked."""

    source: Optional[str] = Field(
        default=None,
        validation_alias="weights",
        description="Default weights when setup() gets none: http(s)/file URL or local path to a "
        ".tar/.tar.gz archive or a directory, or hf://owner/repo[@revision] (a Hugging Face checkpoint fetched "
        "from the Hub with HF_TOKEN). Cog's COG_WEIGHTS is used when this is unset.",
    )
    sha256: Optional[str] = Field(
        default=None, validation_alias="weights_sha256",
        description="Expected sha256 (hex) of the weights archive; checked when set."
    )
    dir: Path = Field(
        default=Path("triton_model_repo/tensorrt_llm/1"),
        validation_alias="weights_dir",
        description="Where weights are unpacked: engine files (rank*.engine + config.json) or a "
        "Hugging Face checkpoint, plus tokenizer files.",
    )
    require_manifest: bool = Field(
        default=False,
        description="Refuse weights without manifest.json (archives from scripts/build_engine always have one; "
        "with it, files, TensorRT-LLM version, world size and GPU compute capability are verified).",
    )
    max_extracted_bytes: Optional[int] = Field(
        default=None,
        ge=1,
        description="Most bytes an archive may unpack to; default: its manifest.json's file sizes plus 1 MiB, "
        "without one 20 times the archive's size, at least 1 GiB.",
    )
    verify: VerifyMode = Field(
        default=VerifyMode.FAST,
        validation_alias="verify_weights",
        description="Reused weights: 'fast' hashes only files whose size or mtime changed since the last full "
        "check; 'full' hashes every file on every setup. Freshly fetched weights are always hashed in full.",
    )

    @field_validator("source", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("sha256")
    @classmethod
    def _check_sha256(cls, value: Optional[str]) -> Optional[str]:
        if value is None or value == "":
            return None
        value = value.strip().lower()
        if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
            raise ValueError("must be 64 hexadecimal characters")
        return value

    @property
    def path(self) -> Path:
        """Absolute ``dir``."""
        return resolve(self.dir)

    def default_source(self) -> Optional[str]:
        """The weights to use when setup() is given none: ``source``, else Cog's ``COG_WEIGHTS`` (read now)."""
        return self.source or os.environ.get("COG_WEIGHTS") or None


class DownloadSettings(Group):
    """Network fetches of the weights (all of these) and of LoRA adapters (all but the deadline)."""

    timeout_s: float = Field(default=60.0, gt=0, validation_alias="download_timeout_s",
                             description="Connect/read timeout per network operation.")
    retries: int = Field(default=3, ge=0, le=20, validation_alias="download_retries",
                         description="Retries on connection errors and 5xx.")
    # the defaults equal cog_triton.weights.DEFAULT_DOWNLOAD_* (tests/test_settings.py checks)
    deadline_s: float = Field(default=21600.0, ge=0, validation_alias="download_deadline_s",
        description="Deadline of the weights' whole fetch, "
        "enforced from outside the reads: connections, TLS, headers, body, redirects, retries, hf:// too; 0: none.")
    min_rate_bytes_s: int = Field(
        default=100_000, ge=0, validation_alias="download_min_rate_bytes_s",
        description="An attempt slower than this (bytes/s) over the grace window fails; 0: off."
    )
    rate_grace_s: float = Field(
        default=60.0, gt=0, le=86400, validation_alias="download_rate_grace_s",
        description="Window (seconds) over which the download rate is measured."
    )


class RepositorySettings(Group):
    """The model repository Triton loads, and the parameters of its models that are not the KV cache's."""

    template_dir: Path = Field(default=Path("triton_model_repo"), description="Model-repository templates.")
    dir: Path = Field(
        default=Path("build/model_repository"), validation_alias="model_repo_dir",
        description="Live model repository that Triton loads (rewritten by setup)."
    )
    max_batch_size: Optional[int] = Field(
        default=None, ge=1, validation_alias="triton_max_batch_size",
        description="Triton max_batch_size; default: the engine's max_batch_size."
    )
    max_queue_delay_microseconds: int = Field(
        default=0, ge=0, description="Triton's dynamic batching queue delay (max_queue_delay_microseconds)."
    )
    batching_strategy: BatchingStrategy = Field(
        default=BatchingStrategy.INFLIGHT_FUSED,
        description="gpt_model_type of the TensorRT-LLM backend: inflight_fused_batching or V1.",
    )
    batch_scheduler_policy: SchedulerPolicy = Field(
        default=SchedulerPolicy.GUARANTEED_NO_EVICT,
        description="batch_scheduler_policy of the TensorRT-LLM backend: max_utilization or guaranteed_no_evict.",
    )
    tensorrt_llm_parameters: str = Field(
        default="",
        description="Extra parameters of the C++ tensorrt_llm model as key:value,key:value "
        "(e.g. multi_block_mode:true); only TensorRT-LLM 1.2.1 parameter keys are accepted.",
    )
    preprocessing_instance_count: int = Field(
        default=1, ge=1, le=64, description="Instances of the ensemble's preprocessing model."
    )
    gpu_device_ids: Optional[str] = Field(default=None, description="Comma-separated GPU ids for the backend.")
    text_ensemble: bool = Field(
        default=True,
        description="Serve the `ensemble` model (text in, text out: TensorRT-LLM's ensemble contract, for upstream's "
        "clients and debugging; docs/operations.md). false leaves it out, saving its Python stub (measured on a "
        "2-core host: 2.6 CPU-s at start, 119 MB resident); the predictor never uses it.",
    )

    @property
    def path(self) -> Path:
        """Absolute ``dir``."""
        return resolve(self.dir)

    @property
    def template_path(self) -> Path:
        """Absolute ``template_dir``."""
        return resolve(self.template_dir)


class KvCacheSettings(Group):
    """The paged KV cache and chunked context, of the C++ backend and of the PyTorch backend."""

    free_gpu_mem_fraction: float = Field(
        default=0.9, gt=0, le=1, validation_alias="kv_cache_free_gpu_mem_fraction",
        description="Share of the free GPU memory the paged KV cache takes, (0, 1] "
        "(also the PyTorch backend's kv_cache_config.free_gpu_memory_fraction)."
    )
    max_tokens: Optional[int] = Field(
        default=None, ge=1, validation_alias="max_tokens_in_paged_kv_cache",
        description="Cap on the paged KV cache, tokens; default: none (the memory fraction decides) "
        "(also the PyTorch backend's kv_cache_config.max_tokens)."
    )
    enable_reuse: bool = Field(
        default=True,
        validation_alias="enable_kv_cache_reuse",
        description="Reuse paged KV-cache blocks of a common prompt prefix (a repeated system prompt) across "
        "requests; the C++ backend's own default is true (getKvCacheConfigFromParams). Also the PyTorch backend's "
        "kv_cache_config.enable_block_reuse.",
    )
    enable_chunked_context: bool = Field(
        default=False,
        description="Chunked context (prefill) in the C++ backend; the longest prompt is then max_seq_len - 1 "
        "(README: Inputs). Needs an engine built with paged context FMHA. Also the PyTorch backend's "
        "enable_chunked_prefill (without it a prompt may not exceed max_num_tokens).",
    )


class TokenizerSettings(Group):
    """The tokenizer, and how prompts are tokenized."""

    dir: Optional[Path] = Field(
        default=None, validation_alias="tokenizer_dir",
        description="Tokenizer folder; default: weights_dir/tokenizer if present, else weights_dir."
    )
    add_special_tokens: Optional[bool] = Field(
        default=None,
        description="Add the tokenizer's special tokens (BOS) to every prompt (true) or to none (false); "
        "default: decided per request (cog_triton.streaming.prompt): not with the chat template, which writes its own, "
        "and with a prompt_template or plain prompt unless it already starts with the BOS token.",
    )
    special_tokens_in_user_text: bool = Field(
        default=False,
        description="Tokenize special-token strings in the prompt and system prompt as the control tokens they "
        "name; by default they stay text, so a user cannot open a system turn.",
    )


class AdapterSettings(Group):
    """LoRA adapters (the lora_weights input): whether they are accepted, their download and disk cache."""

    enabled: bool = Field(
        default=True, validation_alias="lora_adapters",
        description="Accept the lora_weights input; false refuses every prediction that gives one "
        "(with a message saying so), and nothing is fetched."
    )
    cache_dir: Path = Field(
        default=Path("build/adapters"),
        validation_alias="adapter_cache_dir",
        description="Local disk cache of LoRA adapters, shared by the stream processes (one folder per source).",
    )
    cache_bytes: int = Field(
        default=20 << 30, ge=1, validation_alias="adapter_cache_bytes",
        description="Most bytes the cached adapters take together; least recently used "
        "ones are removed above it."
    )
    max_bytes: int = Field(
        default=4 << 30, ge=1, validation_alias="adapter_max_bytes",
        description="Most bytes one adapter may download and unpack to. The limit applied is the smaller of this and "
        "the largest adapter the model serves (rank max_lora_rank on its LoRA modules at its sizes, as a float32 "
        "adapter_model.safetensors) plus COG_TRITON_ADAPTER_EXTRA_BYTES; a larger adapter is refused before it is "
        "read."
    )
    extra_bytes: int = Field(
        default=16 << 20, ge=0, validation_alias="adapter_extra_bytes",
        description="Bytes an adapter's files may take beyond the largest adapter_model.safetensors the model serves "
        "(adapter_config.json, a README.md, tokenizer files of the archive)."
    )
    max_members: int = Field(
        default=1000, ge=2, validation_alias="adapter_max_members",
        description="Most members (files, folders, links) an adapter archive may have; counted before anything is "
        "unpacked."
    )
    download_deadline_s: float = Field(default=600.0, gt=0, validation_alias="adapter_download_deadline_s",
        description="Deadline of one adapter's whole "
        "fetch from its request, waits for other fetches of it and unpacking its archive included; enforced from "
        "outside the reads (seconds).")


class LoraCacheSettings(Group):
    """The engine's LoRA caches in GPU and host memory (the C++ backend; the host one is also the CPU reference
    model's)."""

    optimal_adapter_size: Optional[int] = Field(
        default=None, ge=1, validation_alias="lora_cache_optimal_adapter_size",
        description="The C++ backend's lora_cache_optimal_adapter_size (rank an adapter page "
        "is sized for); default: the backend's, 8."
    )
    max_adapter_size: Optional[int] = Field(
        default=None, ge=1, validation_alias="lora_cache_max_adapter_size",
        description="The C++ backend's lora_cache_max_adapter_size; default: the engine's "
        "max_lora_rank."
    )
    # The backend's PeftCacheManager takes this share of (free GPU memory + the memory pool's free bytes) when it is
    # made (peftCacheManager.cpp getMaxNumSlots @ 9df6d722), which TrtGptModelInflightBatching's constructor does
    # before it sizes the KV cache (trtGptModelInflightBatching.cpp @ b35ac1b6, 1.2.0rc2, and @ 00825c4e), and the
    # KV cache takes kv_cache_free_gpu_mem_fraction of the memory free then (kvCacheManager.cpp
    # calculateFreeMemBytes @ b35ac1b6): not "of the memory left after the KV cache" (upstream's docs/lora.md).
    gpu_memory_fraction: Optional[float] = Field(
        default=None, gt=0, le=1, validation_alias="lora_cache_gpu_memory_fraction",
        description="Share of the GPU memory free when the engine's LoRA cache is made, "
        "before the KV cache is sized, that the LoRA cache takes (so the KV cache's fraction applies to what is left "
        "after it); default: the backend's, 0.05."
    )
    host_memory_bytes: Optional[int] = Field(
        default=None, ge=1, validation_alias="lora_cache_host_memory_bytes",
        description="Host LoRA cache, bytes (the CPU reference model's whole LoRA cache); "
        "default: room for the engine's lora.max_loras adapters of its max_lora_rank, in whole pages of the "
        "backend's cache; a value below one such adapter is refused at setup."
    )


class LlmSettings(Group):
    """Hugging Face checkpoints: which backend serves them, and the LLM API arguments of TensorRT-LLM's PyTorch
    backend."""

    checkpoint_backend: CheckpointBackend = Field(
        default=CheckpointBackend.AUTO,
        description="What serves a Hugging Face checkpoint: auto (the PyTorch backend when a GPU is visible, else "
        "the CPU reference model), pytorch (TensorRT-LLM's LLM API; needs a GPU) or reference (CPU).",
    )
    tensor_parallel_size: int = Field(
        default=1, ge=1, le=64, validation_alias="llm_tensor_parallel_size",
        description="PyTorch backend: tensor parallel size (GPUs per pipeline stage)."
    )
    pipeline_parallel_size: int = Field(default=1, ge=1, le=64, validation_alias="llm_pipeline_parallel_size",
                                        description="PyTorch backend: pipeline stages.")
    max_batch_size: Optional[int] = Field(
        default=None, ge=1, validation_alias="llm_max_batch_size",
        description="PyTorch backend: most requests batched together; default: the LLM API's, 2048."
    )
    max_num_tokens: Optional[int] = Field(
        default=None, ge=1, validation_alias="llm_max_num_tokens",
        description="PyTorch backend: most tokens in one batch; default: the LLM API's, 8192. "
        "Without chunked prefill it also caps the prompt (README: Inputs)."
    )
    max_seq_len: Optional[int] = Field(
        default=None, ge=2, validation_alias="llm_max_seq_len",
        description="PyTorch backend: prompt + output tokens; default and maximum: the "
        "checkpoint's max_position_embeddings (times its rope scaling factor), as the backend infers it."
    )
    guided_decoding_backend: GuidedDecodingBackend = Field(
        default=GuidedDecodingBackend.XGRAMMAR,
        validation_alias="llm_guided_decoding_backend",
        description="PyTorch backend: guided decoding (structured output) backend: xgrammar, llguidance or none.",
    )
    stream_interval: int = Field(
        default=1,
        ge=1,
        le=1000,
        validation_alias="llm_stream_interval",
        description="PyTorch backend: the LLM API's stream_interval: a streaming request gets a response on its first "
        "step, then every this many steps, and on its last (1: every step, as the C++ backend). Each response is work "
        "for the one Python process that hosts the LLM (about 20,000 a second on a 16-core host): raise it (e.g. 4) "
        "when streams x steps per second exceed that (docs/performance.md).",
    )
    sampler: LlmSampler = Field(
        default=LlmSampler.AUTO,
        validation_alias="llm_sampler",
        description="PyTorch backend: the sampler (the LLM API's sampler_type): auto and TorchSampler (1.2.1's "
        "default) apply temperature, top_k and top_p, and predictions that set repetition/presence/frequency "
        "penalties, min_tokens or a seed are refused (TorchSampler would ignore them); TRTLLMSampler (the C++ "
        "decoder, deprecated after 1.2) applies every input as the C++ backend does (docs/deploy.md: Samplers).",
    )
    enable_lora: bool = Field(
        default=False, validation_alias="llm_enable_lora",
        description="PyTorch backend: serve per-request LoRA adapters (the LLM API's lora_config)."
    )
    max_lora_rank: int = Field(
        default=64, ge=1, le=1024, validation_alias="llm_max_lora_rank",
        description="PyTorch backend: largest adapter rank (r) served; a larger adapter "
        "is refused per request naming its rank and this limit."
    )
    max_loras: int = Field(default=8, ge=1, validation_alias="llm_max_loras",
                           description="PyTorch backend: adapters held on the GPU at once.")
    max_cpu_loras: int = Field(default=16, ge=1, validation_alias="llm_max_cpu_loras",
                               description="PyTorch backend: adapters held in host memory.")
    lora_target_modules: str = Field(
        default="attn_q,attn_k,attn_v,attn_dense,mlp_h_to_4h,mlp_4h_to_h,mlp_gate",
        validation_alias="llm_lora_target_modules",
        description="PyTorch backend: comma-separated TensorRT-LLM modules adapters may adapt.",
    )
    max_adapters_per_llm: int = Field(
        default=8, ge=0, validation_alias="llm_max_adapters_per_llm",
        description="PyTorch backend: distinct LoRA adapters one LLM is given over its life; the next new one first "
        "recycles the LLM (running requests finish, new ones wait, a new LLM is built). TensorRT-LLM 1.2.1 keeps every "
        "distinct adapter's GPU tensors until then; 8 adapters of rank 64 on all seven modules of an 8B model are "
        "2.7 GB, what an 80 GB GPU has left after the KV cache and the runtime (docs/deploy.md: LoRA adapters on the "
        "PyTorch backend). 0: no bound.",
    )
    trust_remote_code: bool = Field(
        default=False,
        validation_alias="llm_trust_remote_code",
        description="PyTorch backend: run code a checkpoint brings (the configuration, model or processor classes "
        "its auto_map names, in *.py files beside it). Off: such a checkpoint is refused at setup, naming the file. "
        "On: LLM(trust_remote_code=True), and an hf:// source also fetches the repository's top-level *.py files. "
        "That code runs inside the server with its rights and environment (tokens included): only for a "
        "repository you trust, pinned to a commit.",
    )
    args: str = Field(
        default="",
        validation_alias="llm_args",
        description="PyTorch backend: further LLM API arguments as a JSON or YAML mapping (e.g. "
        "{\"kv_cache_config\": {\"dtype\": \"fp8\"}}), merged over the ones these settings make and checked "
        "against TensorRT-LLM 1.2.1's TorchLlmArgs fields before Triton starts; a key a setting covers is refused.",
    )

    @field_validator("args")
    @classmethod
    def _check_args(cls, value: str) -> str:
        try:
            parse_llm_args_text(value)
        except ConfigError as exc:
            raise ValueError(exc.message) from None
        return value


class ReferenceSettings(Group):
    """The CPU reference backend (Hugging Face checkpoints without a GPU)."""

    max_batch_size: int = Field(default=8, ge=1, le=256, validation_alias="reference_max_batch_size",
                                description="Concurrent requests it interleaves.")
    max_seq_len: Optional[int] = Field(
        default=None, ge=2, validation_alias="reference_max_seq_len",
        description="Prompt + output tokens; default min(max_position_embeddings, 4096)."
    )
    max_input_len: Optional[int] = Field(
        default=None, ge=1, validation_alias="reference_max_input_len",
        description="Prompt tokens; default reference_max_seq_len - 1."
    )
    torch_threads: int = Field(default=0, ge=0, validation_alias="reference_torch_threads",
                               description="torch threads; 0 = torch default.")


class FetchSettings(Group):
    """Where inputs (lora_weights, cog train's checkpoint) may make the server fetch from
    (cog_triton/fetch/rules.py)."""

    allow_http: bool = Field(
        default=False, validation_alias="fetch_allow_http",
        description="Let inputs fetch over plain http://; by default only https:// (each redirect "
        "included)."
    )
    allow_private: bool = Field(
        default=False, validation_alias="fetch_allow_private",
        description="Let inputs fetch from every address: loopback, private networks, link-local "
        "(the cloud instance metadata service 169.254.169.254 included) and other non-public ones; by default only "
        "public addresses, checked on the address connected to. For tests; prefer COG_TRITON_FETCH_ALLOW_NETWORKS."
    )
    allow_networks: str = Field(
        default="", validation_alias="fetch_allow_networks",
        description="Comma-separated networks (CIDR, e.g. 10.1.2.0/24,fd00:1::/64) inputs may fetch "
        "from although they are not public (a private mirror)."
    )
    allow_hosts: str = Field(
        default="", validation_alias="fetch_allow_hosts",
        description="Comma-separated hosts URLs in inputs may fetch from, each redirect included: "
        "names or IP addresses, *.example.com for its subdomains; empty: any host."
    )
    allow_hf_owners: str = Field(
        default="", validation_alias="fetch_allow_hf_owners",
        description="Comma-separated Hugging Face Hub users or organizations whose repositories hf:// "
        "references (and cog train's Hub ids) may name; empty: any."
    )

    @field_validator("allow_networks", "allow_hosts", "allow_hf_owners")
    @classmethod
    def _check_lists(cls, value: str, info: ValidationInfo) -> str:
        from cog_triton.fetch.rules import parse_hosts, parse_networks, parse_owners  # noqa: PLC0415

        parse = {"allow_networks": parse_networks, "allow_hosts": parse_hosts,
                 "allow_hf_owners": parse_owners}[info.field_name]
        return ",".join(str(item) for item in parse(value))


class ImageSettings(Group):
    """Images in predictions (image_input, image parts of messages) on the PyTorch backend: how many, how large, and
    how long an image URL may take (cog_triton/streaming/images.py)."""

    enabled: bool = Field(
        default=True, validation_alias="images",
        description="Accept images (image_input, image parts of messages) on a checkpoint whose architecture "
        "TensorRT-LLM 1.2.1 serves with images; false refuses every prediction that gives one, saying so."
    )
    max_count: int = Field(
        default=8, ge=1, le=64, validation_alias="image_max_count",
        description="Most images one prediction may carry (image_input and image parts together)."
    )
    max_pixels: int = Field(
        default=4096 * 4096, ge=1, le=1 << 30, validation_alias="image_max_pixels",
        description="Most pixels (width x height) an image may have, checked from its header before it is "
        "decoded (a decompression bomb is refused unread)."
    )
    max_bytes: int = Field(
        default=20 << 20, ge=1, le=1 << 30, validation_alias="image_max_bytes",
        description="Most bytes one image file may have (a data URI's decoded bytes; an image URL's download)."
    )
    fetch_deadline_s: float = Field(
        default=30.0, gt=0, le=3600, validation_alias="image_fetch_deadline_s",
        description="Deadline of fetching a prediction's image URLs (image parts of messages), all of them "
        "together, enforced from outside the reads (seconds)."
    )


class TritonSettings(Group):
    """The Triton process: its binary, ports, deadlines and log."""

    tritonserver: Optional[Path] = Field(default=None, description="tritonserver binary; default: auto-detect.")
    backend_dir: Optional[Path] = Field(default=None, description="--backend-directory; default: auto-detect.")
    http_port: int = Field(default=8000, ge=1, le=65535, description="Triton's HTTP port (bound to 127.0.0.1).")
    grpc_port: int = Field(default=8001, ge=1, le=65535, description="Triton's gRPC port (bound to 127.0.0.1).")
    metrics_port: int = Field(default=8002, ge=1, le=65535, description="Triton's metrics port (127.0.0.1).")
    startup_timeout_s: float = Field(default=600.0, gt=0, description="Deadline for /v2/health/ready.")
    stop_timeout_s: float = Field(default=15.0, gt=0, description="Grace period after SIGINT before SIGKILL.")
    log_file: Path = Field(default=Path("build/triton.log"), validation_alias="triton_log_file",
                           description="Where Triton's output is written.")
    log_verbose: int = Field(default=0, ge=0, le=5, description="tritonserver --log-verbose.")
    mpirun: str = Field(default="mpirun", description="mpirun binary for world_size > 1.")


class StreamSettings(Group):
    """Streaming: the stream processes that do the per-token work, and the stream interval."""

    processes: Optional[int] = Field(
        default=None,
        ge=1,
        le=64,
        validation_alias="stream_processes",
        description="Processes that do the per-token work (gRPC receive, detokenizing, stop sequences) beside the "
        "Cog worker, 1 to 64; default: one per 5 CPUs of this container, 1 to 8.",
    )
    interval_ms: float = Field(
        default=DEFAULT_STREAM_INTERVAL_MS,
        ge=0,
        le=1000,
        validation_alias="stream_interval_ms",
        description="Stream interval: a prediction's text leaves at most every this many milliseconds (the first "
        "text at once); 0 = every token's text as it comes.",
    )
    interval_streams: int = Field(
        default=64,
        ge=0,
        le=100000,
        validation_alias="stream_interval_streams",
        description="Running predictions the stream interval serves; beyond, the interval grows in proportion to them "
        "(up to COG_TRITON_STREAM_INTERVAL_MAX_MS), so that the Cog worker relays about as many chunks per second "
        "and new predictions' first text is not held up behind them; 0 = never grows.",
    )
    interval_max_ms: float = Field(
        default=200.0,
        ge=0,
        le=1000,
        validation_alias="stream_interval_max_ms",
        description="The longest stream interval under load, milliseconds (at or below COG_TRITON_STREAM_INTERVAL_MS: "
        "it never grows).",
    )
    request_timeout_s: float = Field(
        default=120.0, gt=0, description="Longest wait for the next streamed token before failing."
    )

    @field_validator("processes", mode="before")
    @classmethod
    def _no_in_process_mode(cls, value: object) -> object:
        """0 once ran the per-token work in the Cog worker itself; that second pipeline was removed (one GIL, and
        on 2 cores it cost as much CPU per token as one stream process: docs/architecture.md)."""
        if isinstance(value, (int, str)) and not isinstance(value, bool) and str(value).strip() in ("0", "-0", "+0"):
            raise ValueError(
                "0 (the per-token work in the Cog worker) is no longer offered: every prediction is streamed by a "
                "stream process; set 1 to 64, or leave it unset for one per 5 CPUs"
            )
        return value

    def process_count(self) -> int:
        """``processes``, or by default one per 5 CPUs this process may run on, 1 to 8.

        Fewer, busier processes cost less CPU per token than many idle ones: each gRPC response wakes a
        process's poller thread and event loop, and a busy process handles several per wake-up (16-core
        GPU host, 128 streams: 2 processes 176 µs of CPU per token, 4 processes 226; README, Performance).
        """
        if self.processes is not None:
            return self.processes
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cpus = os.cpu_count() or 1
        return max(1, min(8, cpus // 5))


class MetricsSettings(Group):
    """The predictor's metrics: the Prometheus endpoint (cog_triton/worker/metrics_endpoint.py; docs/operations.md,
    Metrics) and the timing metric."""

    prometheus_port: int = Field(
        default=9464,
        ge=0,
        le=65535,
        description="Port of the Prometheus endpoint: GET /metrics answers the predictor's metrics (cog_triton_*) "
        "followed by Triton's own (nv_*); 0 = off. Only port 5000 is published on Replicate; elsewhere publish "
        "this port to scrape it.",
    )
    prometheus_address: str = Field(
        default="0.0.0.0",  # noqa: S104 - scraped from outside the container
        min_length=1,
        description="Address the Prometheus endpoint listens on; 127.0.0.1 keeps it inside the container.",
    )
    # the defaults equal cog_triton.worker.metrics_endpoint's constants (tests/test_settings.py checks)
    prometheus_max_connections: int = Field(
        default=64, ge=1, le=10000,
        description="Most connections the Prometheus endpoint holds at once. A new one beyond it closes the oldest "
        "idle one (no whole request after 0.25 s); while all are being answered, new ones wait in the accept "
        "queue, in the order they came.",
    )
    prometheus_backlog: int = Field(
        default=1024, ge=1, le=65535,
        description="Connections the kernel queues for the Prometheus endpoint to accept (listen backlog, capped by "
        "net.core.somaxconn); one beyond it is answered only when the client retries its handshake.",
    )
    prometheus_request_timeout_s: float = Field(
        default=10.0, gt=0, le=3600,
        description="Seconds a connection to the Prometheus endpoint has for its whole request, and again to take "
        "the answer; then it is closed.",
    )
    prometheus_reuse_s: float = Field(
        default=1.0, ge=0, le=60,
        description="Seconds a rendering of the metrics (and Triton's, fetched once for it) answers the scrapes "
        "that arrive after it started: a scrape may show the metrics as they were up to this long before; 0: each "
        "scrape waits for a rendering that starts after it arrives (still one at a time, shared).",
    )
    prometheus_triton_timeout_s: float = Field(
        default=2.0, gt=0, le=60,
        description="Seconds a rendering waits for Triton's own /metrics; past it the scrape answers without them "
        "(cog_triton_triton_metrics_up 0).",
    )
    timing: bool = Field(
        default=False,
        validation_alias="timing_metrics",
        description="Record one `timing` metric per prediction: when its start passed each step (inputs checked and the "
        "Start sent, its stream process reached, its prompt tokenized and sent, its first text sent, relayed and "
        "yielded to coglet), in seconds since predict() began; for scripts/benchmark's time-to-first-token steps.",
    )


class PredictorSettings(Group):
    """The predictor itself: its concurrency and its self-test."""

    self_test: bool = Field(default=True, description="Generate a few tokens at the end of setup().")
    max_concurrency: int = Field(
        default=DEFAULT_CONCURRENCY,
        ge=1,
        le=1024,
        description="Predictions served at once; default: Cog's COG_MAX_CONCURRENCY (predict.py's @cog.concurrent).",
    )


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
        """The keywords over the environment, both by flat name (the module docstring says why); no .env file or
        secrets folder (none was configured)."""
        keywords = getattr(init_settings, "init_kwargs", {})
        return FlatSource(settings_cls, keywords), FlatSource(settings_cls, _environment(settings_cls))

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
        known = _flat_names()
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
                env = _variable_at(loc)
                problems.append(f"{env}={err.get('input')!r}: {str(err['msg']).removeprefix('Value error, ')}")
            raise ConfigError("invalid settings: " + "; ".join(problems)) from None


def _flat_name(name: str, field: Any) -> str:
    """A group's field's flat name: its validation alias, else its name (``COG_TRITON_`` + it upper-cased)."""
    return field.validation_alias if isinstance(field.validation_alias, str) else name


@functools.cache
def _flat_names() -> dict[str, tuple[str, str]]:
    """Flat name -> (group, field), in the order of the groups and their fields."""
    return {_flat_name(name, field): (group, name)
            for group, group_field in Settings.model_fields.items()
            for name, field in group_field.annotation.model_fields.items()}


def variables() -> dict[str, tuple[str, str]]:
    """Each setting's environment variable -> its group and field, e.g. ``COG_TRITON_DOWNLOAD_TIMEOUT_S`` ->
    ``("download", "timeout_s")`` (``settings.download.timeout_s``), in the order of the groups and their fields."""
    return {ENV_PREFIX + flat.upper(): where for flat, where in _flat_names().items()}


def _variable_at(loc: tuple[str, ...]) -> str:
    """The environment variable of a validation error's location: (group, field name or alias), else the location
    itself (an unknown keyword)."""
    for flat, where in _flat_names().items():
        if loc in (where, (where[0], flat)):
            return ENV_PREFIX + flat.upper()
    return ENV_PREFIX + ".".join(loc).upper()


def _environment(settings_cls: type[BaseSettings]) -> dict[str, str]:
    """The settings' variables that are set, by flat name: as pydantic-settings' own source reads them (the prefix
    of ``env_prefix``, any case unless ``case_sensitive``, an empty one unset under ``env_ignore_empty``), plus
    Cog's COG_MAX_CONCURRENCY as ``max_concurrency`` unless ours is set (one source for the concurrency)."""
    config = settings_cls.model_config
    sensitive = config.get("case_sensitive", False)
    environ = dict(os.environ) if sensitive else {key.lower(): value for key, value in os.environ.items()}
    found = {}
    for flat in _flat_names():
        name = config.get("env_prefix", "") + flat.upper()
        value = environ.get(name if sensitive else name.lower())
        if value is not None and not (value == "" and config.get("env_ignore_empty", False)):
            found[flat] = value
    if "max_concurrency" not in found and os.environ.get("COG_MAX_CONCURRENCY"):
        found["max_concurrency"] = os.environ["COG_MAX_CONCURRENCY"]
    return found


class FlatSource(PydanticBaseSettingsSource):
    """Settings by flat name (``http_port``, as COG_TRITON_HTTP_PORT), sorted into their groups
    (``{"triton": {"http_port": ...}}``) for pydantic-settings to merge group by group.

    A key that is no flat name passes as it is: a whole group (a dict or a model) or an unknown keyword, which
    validation refuses. ``weights`` is both a group and COG_TRITON_WEIGHTS: a dict or a model given for it is the
    group, anything else the variable. Flat names are matched in any case, as pydantic-settings matches keywords.
    """

    def __init__(self, settings_cls: type[BaseSettings], flat: Mapping[str, Any]) -> None:
        super().__init__(settings_cls)
        self.flat = dict(flat)

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        """Unused: :meth:`__call__` gives all the values at once."""
        return None, field_name, False

    def _is_flat(self, key: str, value: object) -> bool:
        if key in self.settings_cls.model_fields and isinstance(value, (dict, BaseModel)):
            return False
        return key.lower() in _flat_names()

    def __call__(self) -> dict[str, Any]:
        grouped = {key: value for key, value in self.flat.items() if not self._is_flat(key, value)}
        for key, value in self.flat.items():
            if self._is_flat(key, value):
                group, name = _flat_names()[key.lower()]
                given = grouped.get(group)
                given = given.model_dump(exclude_unset=True) if isinstance(given, BaseModel) else given or {}
                grouped[group] = {**given, name: value}
        return grouped


def _shown_default(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, Enum):
        return f"`{value.value}`"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Path):
        return f"`{value}`"
    if isinstance(value, str):
        return f"`{value}`" if value else "`\"\"`"
    if isinstance(value, float) and value.is_integer():
        return f"{int(value)}"
    return f"{value}"


def settings_markdown() -> str:
    """The settings as Markdown, a section per group with a table (variable, default, meaning), from this module's
    :class:`Settings`: docs/settings.md is this text (tests/test_docs.py checks it), so the docs cannot drift from
    the code. Regenerate with ``python -m cog_triton.settings > docs/settings.md``."""
    lines = [
        "# Settings",
        "",
        "<!-- generated by `python -m cog_triton.settings > docs/settings.md` from cog_triton/settings.py; "
        "do not edit -->",
        "",
        "Environment variables, read into one typed object (`cog_triton/settings.py`, pydantic-settings).",
        "Booleans accept true/false/1/0/yes/no/on/off; an empty variable means \"unset\"; an unknown",
        "`COG_TRITON_*` variable or a bad value fails setup naming the variable and what is allowed.",
        "Relative paths are relative to the repository root. Cog's own variables: `COG_WEIGHTS` (the weights",
        "when `COG_TRITON_WEIGHTS` is unset), `COG_MAX_CONCURRENCY` (prediction slots; the Dockerfile sets it",
        "to predict.py's `@cog.concurrent` maximum), `PORT` (5000).",
        "",
        "The settings are grouped by concern; in the code each group is an attribute of the settings object.",
    ]
    for group, group_field in Settings.model_fields.items():
        model = group_field.annotation
        about = " ".join((model.__doc__ or "").split())
        lines += ["", f"## {group_field.title}", "", f"{about} In the code: `settings.{group}`.", "",
                  "| variable | default | meaning |", "|---|---|---|"]
        for name, field in model.model_fields.items():
            meaning = " ".join((field.description or "").split()).replace("|", "\\|")
            variable = ENV_PREFIX + _flat_name(name, field).upper()
            lines.append(f"| `{variable}` | {_shown_default(field.default)} | {meaning} |")
    return "\n".join(lines) + "\n"

