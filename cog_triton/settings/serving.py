"""Settings of what serves the model: the model repository, the KV cache, the Triton process and the CPU reference
backend."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Optional

from pydantic import Field

from cog_triton.settings.base import Group, resolve


class BatchingStrategy(str, Enum):
    """``gpt_model_type`` of the TensorRT-LLM backend."""

    INFLIGHT_FUSED = "inflight_fused_batching"
    V1 = "V1"


class SchedulerPolicy(str, Enum):
    """``batch_scheduler_policy`` of the TensorRT-LLM backend."""

    MAX_UTILIZATION = "max_utilization"
    GUARANTEED_NO_EVICT = "guaranteed_no_evict"


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
