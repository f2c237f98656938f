"""One typed settings object for cog-triton, read from ``COG_TRITON_*`` environment variables.

Parsing and validation are pydantic-settings': booleans accept only true/false/1/0/yes/no/on/off
(never ``bool(os.getenv(...))``), numbers are range-checked, and a bad value raises
:class:`common.errors.ConfigError` naming the variable, the value and what is allowed.

Every field is documented in README.md ("Settings"); the env name is ``COG_TRITON_<FIELD>``.

Why one module (about 620 lines): one concern, the operator's settings: the fields (most of the module, each
with its description, which docs/settings.md is generated from), their validation, and the typed views other
modules take of them (``llm_api_options``, paths, the stream process count).
"""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import Optional

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from common.errors import ConfigError
from tensorrtllm_backend.llmapi_args import LlmApiOptions, parse_llm_args_text

REPO_ROOT = Path(__file__).resolve().parents[1]
ENV_PREFIX = "COG_TRITON_"
#: cog.yaml ``concurrency.max`` and the Dockerfile's COG_MAX_CONCURRENCY (tests keep them equal).
DEFAULT_CONCURRENCY = 64
#: The stream interval's default, ms (README "Performance" has the GPU-host figures behind it).
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



class Settings(BaseSettings):
    """All knobs of the predictor, Triton process and model repository.

    Paths are resolved against the repository root when relative. Sizes are in tokens unless the
    name says otherwise; durations are in seconds (``_s``).
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="forbid", validate_default=True, env_ignore_empty=True
    )

    # --- weights -------------------------------------------------------------------------
    weights: Optional[str] = Field(
        default=None,
        description="Default weights when setup() gets none: http(s)/file URL or local path to a "
        ".tar/.tar.gz archive or a directory, or hf://owner/repo[@revision] (a Hugging Face checkpoint fetched "
        "from the Hub with HF_TOKEN). Cog's COG_WEIGHTS is used when this is unset.",
    )
    weights_sha256: Optional[str] = Field(
        default=None, description="Expected sha256 (hex) of the weights archive; checked when set."
    )
    weights_dir: Path = Field(
        default=Path("triton_model_repo/tensorrt_llm/1"),
        description="Where weights are unpacked: engine files (rank*.engine + config.json) or a "
        "Hugging Face checkpoint, plus tokenizer files.",
    )
    require_manifest: bool = Field(
        default=False,
        description="Refuse weights without manifest.json (archives from scripts/build_engine always have one; "
        "with it, files, TensorRT-LLM version, world size and GPU compute capability are verified).",
    )
    download_timeout_s: float = Field(default=60.0, gt=0, description="Connect/read timeout per network operation.")
    download_retries: int = Field(default=3, ge=0, le=20, description="Retries on connection errors and 5xx.")
    # the defaults equal cog_triton.weights.DEFAULT_DOWNLOAD_* (tests/test_settings.py checks)
    download_deadline_s: float = Field(default=21600.0, ge=0, description="Deadline of the weights' whole fetch, "
        "enforced from outside the reads: connections, TLS, headers, body, redirects, retries, hf:// too; 0: none.")
    download_min_rate_bytes_s: int = Field(
        default=100_000, ge=0, description="An attempt slower than this (bytes/s) over the grace window fails; 0: off."
    )
    download_rate_grace_s: float = Field(
        default=60.0, gt=0, le=86400, description="Window (seconds) over which the download rate is measured."
    )
    max_extracted_bytes: Optional[int] = Field(
        default=None,
        ge=1,
        description="Most bytes an archive may unpack to; default: its manifest.json's file sizes plus 1 MiB, "
        "without one 20 times the archive's size, at least 1 GiB.",
    )
    verify_weights: VerifyMode = Field(
        default=VerifyMode.FAST,
        description="Reused weights: 'fast' hashes only files whose size or mtime changed since the last full "
        "check; 'full' hashes every file on every setup. Freshly fetched weights are always hashed in full.",
    )

    # --- model repository ----------------------------------------------------------------
    template_dir: Path = Field(default=Path("triton_model_repo"), description="Model-repository templates.")
    model_repo_dir: Path = Field(
        default=Path("build/model_repository"), description="Live model repository that Triton loads (rewritten by setup)."
    )
    tokenizer_dir: Optional[Path] = Field(
        default=None, description="Tokenizer folder; default: weights_dir/tokenizer if present, else weights_dir."
    )
    triton_max_batch_size: Optional[int] = Field(
        default=None, ge=1, description="Triton max_batch_size; default: the engine's max_batch_size."
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
    kv_cache_free_gpu_mem_fraction: float = Field(
        default=0.9, gt=0, le=1, description="Share of the free GPU memory the paged KV cache takes, (0, 1] "
        "(also the PyTorch backend's kv_cache_config.free_gpu_memory_fraction)."
    )
    max_tokens_in_paged_kv_cache: Optional[int] = Field(
        default=None, ge=1, description="Cap on the paged KV cache, tokens; default: none (the memory fraction decides) "
        "(also the PyTorch backend's kv_cache_config.max_tokens)."
    )
    enable_kv_cache_reuse: bool = Field(
        default=True,
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
    tensorrt_llm_parameters: str = Field(
        default="",
        description="Extra parameters of the C++ tensorrt_llm model as key:value,key:value "
        "(e.g. multi_block_mode:true); only TensorRT-LLM 1.2.1 parameter keys are accepted.",
    )
    preprocessing_instance_count: int = Field(
        default=1, ge=1, le=64, description="Instances of the ensemble's preprocessing model."
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

    # --- LoRA adapters (the lora_weights input) -------------------------------------------
    adapter_cache_dir: Path = Field(
        default=Path("build/adapters"),
        description="Local disk cache of LoRA adapters, shared by the stream processes (one folder per source).",
    )
    adapter_cache_bytes: int = Field(
        default=20 << 30, ge=1, description="Most bytes the cached adapters take together; least recently used "
        "ones are removed above it."
    )
    adapter_max_bytes: int = Field(
        default=4 << 30, ge=1, description="Most bytes one adapter may download and unpack to."
    )
    adapter_download_deadline_s: float = Field(default=600.0, gt=0, description="Deadline of one adapter's whole "
        "fetch from its request, waits for other fetches of it included; enforced from outside the reads (seconds).")
    lora_cache_optimal_adapter_size: Optional[int] = Field(
        default=None, ge=1, description="The C++ backend's lora_cache_optimal_adapter_size (rank an adapter page "
        "is sized for); default: the backend's, 8."
    )
    lora_cache_max_adapter_size: Optional[int] = Field(
        default=None, ge=1, description="The C++ backend's lora_cache_max_adapter_size; default: the engine's "
        "max_lora_rank."
    )
    # The backend's PeftCacheManager takes this share of (free GPU memory + the memory pool's free bytes) when it is
    # made (peftCacheManager.cpp getMaxNumSlots @ 9df6d722), which TrtGptModelInflightBatching's constructor does
    # before it sizes the KV cache (trtGptModelInflightBatching.cpp @ b35ac1b6, 1.2.0rc2, and @ 00825c4e), and the
    # KV cache takes kv_cache_free_gpu_mem_fraction of the memory free then (kvCacheManager.cpp
    # calculateFreeMemBytes @ b35ac1b6): not "of the memory left after the KV cache" (upstream's docs/lora.md).
    lora_cache_gpu_memory_fraction: Optional[float] = Field(
        default=None, gt=0, le=1, description="Share of the GPU memory free when the engine's LoRA cache is made, "
        "before the KV cache is sized, that the LoRA cache takes (so the KV cache's fraction applies to what is left "
        "after it); default: the backend's, 0.05."
    )
    lora_cache_host_memory_bytes: Optional[int] = Field(
        default=None, ge=1, description="Host LoRA cache, bytes (the CPU reference model's whole LoRA cache); "
        "default: room for the engine's lora.max_loras adapters of its max_lora_rank, in whole pages of the "
        "backend's cache; a value below one such adapter is refused at setup."
    )

    # --- Hugging Face checkpoints on TensorRT-LLM's PyTorch backend (LLM API) --------------
    checkpoint_backend: CheckpointBackend = Field(
        default=CheckpointBackend.AUTO,
        description="What serves a Hugging Face checkpoint: auto (the PyTorch backend when a GPU is visible, else "
        "the CPU reference model), pytorch (TensorRT-LLM's LLM API; needs a GPU) or reference (CPU).",
    )
    llm_tensor_parallel_size: int = Field(
        default=1, ge=1, le=64, description="PyTorch backend: tensor parallel size (GPUs per pipeline stage)."
    )
    llm_pipeline_parallel_size: int = Field(default=1, ge=1, le=64, description="PyTorch backend: pipeline stages.")
    llm_max_batch_size: Optional[int] = Field(
        default=None, ge=1, description="PyTorch backend: most requests batched together; default: the LLM API's, 2048."
    )
    llm_max_num_tokens: Optional[int] = Field(
        default=None, ge=1, description="PyTorch backend: most tokens in one batch; default: the LLM API's, 8192. "
        "Without chunked prefill it also caps the prompt (README: Inputs)."
    )
    llm_max_seq_len: Optional[int] = Field(
        default=None, ge=2, description="PyTorch backend: prompt + output tokens; default and maximum: the "
        "checkpoint's max_position_embeddings (times its rope scaling factor), as the backend infers it."
    )
    llm_guided_decoding_backend: GuidedDecodingBackend = Field(
        default=GuidedDecodingBackend.XGRAMMAR,
        description="PyTorch backend: guided decoding (structured output) backend: xgrammar, llguidance or none.",
    )
    llm_stream_interval: int = Field(
        default=1,
        ge=1,
        le=1000,
        description="PyTorch backend: the LLM API's stream_interval: a streaming request gets a response on its first "
        "step, then every this many steps, and on its last (1: every step, as the C++ backend). Each response is work "
        "for the one Python process that hosts the LLM (about 20,000 a second on a 16-core host): raise it (e.g. 4) "
        "when streams x steps per second exceed that (docs/performance.md).",
    )
    llm_sampler: LlmSampler = Field(
        default=LlmSampler.AUTO,
        description="PyTorch backend: the sampler (the LLM API's sampler_type): auto and TorchSampler (1.2.1's "
        "default) apply temperature, top_k and top_p, and predictions that set repetition/presence/frequency "
        "penalties, min_tokens or a seed are refused (TorchSampler would ignore them); TRTLLMSampler (the C++ "
        "decoder, deprecated after 1.2) applies every input as the C++ backend does (docs/deploy.md: Samplers).",
    )
    llm_enable_lora: bool = Field(
        default=False, description="PyTorch backend: serve per-request LoRA adapters (the LLM API's lora_config)."
    )
    llm_max_lora_rank: int = Field(
        default=64, ge=1, le=1024, description="PyTorch backend: largest adapter rank (r) served; a larger adapter "
        "is refused per request naming its rank and this limit."
    )
    llm_max_loras: int = Field(default=8, ge=1, description="PyTorch backend: adapters held on the GPU at once.")
    llm_max_cpu_loras: int = Field(default=16, ge=1, description="PyTorch backend: adapters held in host memory.")
    llm_lora_target_modules: str = Field(
        default="attn_q,attn_k,attn_v,attn_dense,mlp_h_to_4h,mlp_4h_to_h,mlp_gate",
        description="PyTorch backend: comma-separated TensorRT-LLM modules adapters may adapt.",
    )
    llm_trust_remote_code: bool = Field(
        default=False,
        description="PyTorch backend: run code a checkpoint brings (the configuration, model or processor classes "
        "its auto_map names, in *.py files beside it). Off: such a checkpoint is refused at setup, naming the file. "
        "On: LLM(trust_remote_code=True), and an hf:// source also fetches the repository's top-level *.py files. "
        "That code runs inside the server with its rights and environment (tokens included): only for a "
        "repository you trust, pinned to a commit.",
    )
    llm_args: str = Field(
        default="",
        description="PyTorch backend: further LLM API arguments as a JSON or YAML mapping (e.g. "
        "{\"kv_cache_config\": {\"dtype\": \"fp8\"}}), merged over the ones these settings make and checked "
        "against TensorRT-LLM 1.2.1's TorchLlmArgs fields before Triton starts; a key a setting covers is refused.",
    )

    lora_adapters: bool = Field(
        default=True, description="Accept the lora_weights input; false refuses every prediction that gives one "
        "(with a message saying so), and nothing is fetched."
    )

    # --- fetch rules: where inputs (lora_weights, cog train's checkpoint) may make the server fetch from ------
    fetch_allow_http: bool = Field(
        default=False, description="Let inputs fetch over plain http://; by default only https:// (each redirect "
        "included)."
    )
    fetch_allow_private: bool = Field(
        default=False, description="Let inputs fetch from every address: loopback, private networks, link-local "
        "(the cloud instance metadata service 169.254.169.254 included) and other non-public ones; by default only "
        "public addresses, checked on the address connected to. For tests; prefer COG_TRITON_FETCH_ALLOW_NETWORKS."
    )
    fetch_allow_networks: str = Field(
        default="", description="Comma-separated networks (CIDR, e.g. 10.1.2.0/24,fd00:1::/64) inputs may fetch "
        "from although they are not public (a private mirror)."
    )
    fetch_allow_hosts: str = Field(
        default="", description="Comma-separated hosts URLs in inputs may fetch from, each redirect included: "
        "names or IP addresses, *.example.com for its subdomains; empty: any host."
    )
    fetch_allow_hf_owners: str = Field(
        default="", description="Comma-separated Hugging Face Hub users or organizations whose repositories hf:// "
        "references (and cog train's Hub ids) may name; empty: any."
    )

    # --- CPU reference backend (Hugging Face checkpoints) ---------------------------------
    reference_max_batch_size: int = Field(default=8, ge=1, le=256, description="Concurrent requests it interleaves.")
    reference_max_seq_len: Optional[int] = Field(
        default=None, ge=2, description="Prompt + output tokens; default min(max_position_embeddings, 4096)."
    )
    reference_max_input_len: Optional[int] = Field(
        default=None, ge=1, description="Prompt tokens; default reference_max_seq_len - 1."
    )
    reference_torch_threads: int = Field(default=0, ge=0, description="torch threads; 0 = torch default.")

    # --- Triton process ------------------------------------------------------------------
    tritonserver: Optional[Path] = Field(default=None, description="tritonserver binary; default: auto-detect.")
    backend_dir: Optional[Path] = Field(default=None, description="--backend-directory; default: auto-detect.")
    http_port: int = Field(default=8000, ge=1, le=65535, description="Triton's HTTP port (bound to 127.0.0.1).")
    grpc_port: int = Field(default=8001, ge=1, le=65535, description="Triton's gRPC port (bound to 127.0.0.1).")
    metrics_port: int = Field(default=8002, ge=1, le=65535, description="Triton's metrics port (127.0.0.1).")
    startup_timeout_s: float = Field(default=600.0, gt=0, description="Deadline for /v2/health/ready.")
    stop_timeout_s: float = Field(default=15.0, gt=0, description="Grace period after SIGINT before SIGKILL.")
    request_timeout_s: float = Field(
        default=120.0, gt=0, description="Longest wait for the next streamed token before failing."
    )
    triton_log_file: Path = Field(default=Path("build/triton.log"), description="Where Triton's output is written.")
    log_verbose: int = Field(default=0, ge=0, le=5, description="tritonserver --log-verbose.")
    gpu_device_ids: Optional[str] = Field(default=None, description="Comma-separated GPU ids for the backend.")
    mpirun: str = Field(default="mpirun", description="mpirun binary for world_size > 1.")

    # --- Prometheus endpoint (cog_triton/worker/exporter.py; docs/operations.md, Metrics) ------------
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

    # --- streaming ------------------------------------------------------------------------
    stream_processes: Optional[int] = Field(
        default=None,
        ge=1,
        le=64,
        description="Processes that do the per-token work (gRPC receive, detokenizing, stop sequences) beside the "
        "Cog worker, 1 to 64; default: one per 5 CPUs of this container, 1 to 8.",
    )
    stream_interval_ms: float = Field(
        default=DEFAULT_STREAM_INTERVAL_MS,
        ge=0,
        le=1000,
        description="Stream interval: a prediction's text leaves at most every this many milliseconds (the first "
        "text at once); 0 = every token's text as it comes.",
    )
    stream_interval_streams: int = Field(
        default=64,
        ge=0,
        le=100000,
        description="Running predictions the stream interval serves; beyond, the interval grows in proportion to them "
        "(up to COG_TRITON_STREAM_INTERVAL_MAX_MS), so that the Cog worker relays about as many chunks per second "
        "and new predictions' first text is not held up behind them; 0 = never grows.",
    )
    stream_interval_max_ms: float = Field(
        default=200.0,
        ge=0,
        le=1000,
        description="The longest stream interval under load, milliseconds (at or below COG_TRITON_STREAM_INTERVAL_MS: "
        "it never grows).",
    )
    timing_metrics: bool = Field(
        default=False,
        description="Record one `timing` metric per prediction: when its start passed each step (inputs checked and the "
        "Start sent, its stream process reached, its prompt tokenized and sent, its first text sent, relayed and "
        "yielded to coglet), in seconds since predict() began; for scripts/benchmark's time-to-first-token steps.",
    )

    # --- predictor -----------------------------------------------------------------------
    self_test: bool = Field(default=True, description="Generate a few tokens at the end of setup().")
    max_concurrency: int = Field(
        default=DEFAULT_CONCURRENCY,
        ge=1,
        le=1024,
        description="Predictions served at once; default: Cog's COG_MAX_CONCURRENCY (cog.yaml concurrency.max).",
    )

    @model_validator(mode="before")
    @classmethod
    def _concurrency_from_cog(cls, values: object) -> object:
        """One source for the concurrency: Cog's own COG_MAX_CONCURRENCY unless ours is set."""
        if isinstance(values, dict) and "max_concurrency" not in values and os.environ.get("COG_MAX_CONCURRENCY"):
            if not os.environ.get(ENV_PREFIX + "MAX_CONCURRENCY"):
                values = {**values, "max_concurrency": os.environ["COG_MAX_CONCURRENCY"]}
        return values

    @model_validator(mode="after")
    def _prometheus_port_is_not_tritons(self) -> "Settings":
        """The endpoint cannot share a port with Triton (both would need it; Triton would not start)."""
        taken = {"COG_TRITON_HTTP_PORT": self.http_port, "COG_TRITON_GRPC_PORT": self.grpc_port,
                 "COG_TRITON_METRICS_PORT": self.metrics_port}
        for name, port in taken.items():
            if self.prometheus_port and self.prometheus_port == port:
                raise ValueError(
                    f"COG_TRITON_PROMETHEUS_PORT={port} is also {name}, Triton's; give the Prometheus endpoint "
                    "another port, or 0 to turn it off"
                )
        return self

    @field_validator("weights_sha256")
    @classmethod
    def _check_sha256(cls, value: Optional[str]) -> Optional[str]:
        if value is None or value == "":
            return None
        value = value.strip().lower()
        if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
            raise ValueError("must be 64 hexadecimal characters")
        return value

    @field_validator("llm_args")
    @classmethod
    def _check_llm_args(cls, value: str) -> str:
        try:
            parse_llm_args_text(value)
        except ConfigError as exc:
            raise ValueError(exc.message) from None
        return value

    @field_validator("fetch_allow_networks", "fetch_allow_hosts", "fetch_allow_hf_owners")
    @classmethod
    def _check_fetch_lists(cls, value: str, info: ValidationInfo) -> str:
        from cog_triton.fetch.rules import parse_hosts, parse_networks, parse_owners  # noqa: PLC0415

        parse = {"fetch_allow_networks": parse_networks, "fetch_allow_hosts": parse_hosts,
                 "fetch_allow_hf_owners": parse_owners}[info.field_name]
        return ",".join(str(item) for item in parse(value))

    @field_validator("weights", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("stream_processes", mode="before")
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

    def stream_process_count(self) -> int:
        """``stream_processes``, or by default one per 5 CPUs this process may run on, 1 to 8.

        Fewer, busier processes cost less CPU per token than many idle ones: each gRPC response wakes a
        process's poller thread and event loop, and a busy process handles several per wake-up (16-core
        GPU host, 128 streams: 2 processes 176 µs of CPU per token, 4 processes 226; README, Performance).
        """
        if self.stream_processes is not None:
            return self.stream_processes
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cpus = os.cpu_count() or 1
        return max(1, min(8, cpus // 5))

    def llm_api_options(self) -> LlmApiOptions:
        """The typed options the PyTorch backend's ``LLM(...)`` arguments are built from
        (:func:`tensorrtllm_backend.llmapi_args.build_llm_args`), with the setting behind each argument.

        Raises:
            ConfigError: COG_TRITON_LLM_ARGS is not a JSON/YAML mapping.
        """
        e = ENV_PREFIX
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
            "max_batch_size": (self.llm_max_batch_size, "LLM_MAX_BATCH_SIZE"),
            "max_num_tokens": (self.llm_max_num_tokens, "LLM_MAX_NUM_TOKENS"),
            "kv_cache_config.max_tokens": (self.max_tokens_in_paged_kv_cache, "MAX_TOKENS_IN_PAGED_KV_CACHE"),
        }
        sources.update({path: e + name for path, (value, name) in optional.items() if value is not None})
        if self.llm_enable_lora:
            sources.update({
                "lora_config.max_lora_rank": e + "LLM_MAX_LORA_RANK",
                "lora_config.max_loras": e + "LLM_MAX_LORAS",
                "lora_config.max_cpu_loras": e + "LLM_MAX_CPU_LORAS",
                "lora_config.lora_target_modules": e + "LLM_LORA_TARGET_MODULES",
            })
        guided = self.llm_guided_decoding_backend
        return LlmApiOptions(
            tensor_parallel_size=self.llm_tensor_parallel_size,
            pipeline_parallel_size=self.llm_pipeline_parallel_size,
            max_batch_size=self.llm_max_batch_size,
            max_num_tokens=self.llm_max_num_tokens,
            max_seq_len=self.llm_max_seq_len,
            free_gpu_memory_fraction=self.kv_cache_free_gpu_mem_fraction,
            enable_block_reuse=self.enable_kv_cache_reuse,
            kv_cache_max_tokens=self.max_tokens_in_paged_kv_cache,
            enable_chunked_prefill=self.enable_chunked_context,
            guided_decoding_backend=None if guided is GuidedDecodingBackend.NONE else guided.value,
            sampler_type=self.llm_sampler.value,
            stream_interval=self.llm_stream_interval,
            enable_lora=self.llm_enable_lora,
            max_lora_rank=self.llm_max_lora_rank,
            max_loras=self.llm_max_loras,
            max_cpu_loras=self.llm_max_cpu_loras,
            lora_target_modules=tuple(m.strip() for m in self.llm_lora_target_modules.split(",") if m.strip()),
            trust_remote_code=self.llm_trust_remote_code,
            extra=parse_llm_args_text(self.llm_args),
            sources=sources,
        )

    def path(self, value: Path) -> Path:
        """Resolve ``value`` against the repository root when it is relative."""
        return value if value.is_absolute() else (REPO_ROOT / value)

    @property
    def weights_path(self) -> Path:
        """Absolute ``weights_dir``."""
        return self.path(self.weights_dir)

    @property
    def template_path(self) -> Path:
        """Absolute ``template_dir``."""
        return self.path(self.template_dir)

    @property
    def model_repo_path(self) -> Path:
        """Absolute ``model_repo_dir``."""
        return self.path(self.model_repo_dir)

    def default_weights(self) -> Optional[str]:
        """The weights to use when setup() is given none: this setting, else Cog's ``COG_WEIGHTS``."""
        return self.weights or os.environ.get("COG_WEIGHTS") or None

    @classmethod
    def from_env(cls, **overrides: object) -> "Settings":
        """Read settings from the environment (``COG_TRITON_*``), then apply ``overrides``.

        Raises:
            ConfigError: a value is invalid or a variable is unknown; the message names the
                environment variable, the value and the constraint.
        """
        unknown = sorted(
            k for k in os.environ if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX):].lower() not in cls.model_fields
        )
        if unknown:
            raise ConfigError(
                f"unknown setting(s) {', '.join(unknown)}; known: "
                + ", ".join(ENV_PREFIX + name.upper() for name in cls.model_fields)
            )
        try:
            return cls(**overrides)  # type: ignore[arg-type]
        except ValidationError as exc:
            problems = []
            for err in exc.errors():
                field = ".".join(str(p) for p in err["loc"])
                if not field:  # a check of several settings together: its message names them
                    problems.append(str(err["msg"]).removeprefix("Value error, "))
                    continue
                env = ENV_PREFIX + field.upper()
                problems.append(f"{env}={err.get('input')!r}: {str(err['msg']).removeprefix('Value error, ')}")
            raise ConfigError("invalid settings: " + "; ".join(problems)) from None


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
    """The settings as a Markdown table (variable, default, meaning), from this module's :class:`Settings`:
    docs/settings.md is this text (tests/test_docs.py checks it), so the docs cannot drift from the code.
    Regenerate with ``python -m cog_triton.settings > docs/settings.md``."""
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
        "from `cog.yaml`), `PORT` (5000).",
        "",
        "| variable | default | meaning |",
        "|---|---|---|",
    ]
    for name, field in Settings.model_fields.items():
        meaning = " ".join((field.description or "").split()).replace("|", "\\|")
        lines.append(f"| `{ENV_PREFIX}{name.upper()}` | {_shown_default(field.default)} | {meaning} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(settings_markdown(), end="")
