"""``TorchLlmArgs``, the LLM constructor's arguments for the PyTorch backend (stand-in).

Facts followed (NVIDIA/TensorRT-LLM ``tensorrt_llm/llmapi/llm_args.py`` @7b437aaa, the nearest stored version
to v1.2.1 that has both classes whole):

* ``BaseLlmArgs`` is a ``StrictBaseModel`` with ``extra = "forbid"``, and so is every nested config
  (``KvCacheConfig``, ``PeftCacheConfig``, ``SchedulerConfig``, ``CudaGraphConfig``, ...): an unknown key at
  any level is a pydantic ``ValidationError`` ("Extra inputs are not permitted");
* the field names below are those of ``BaseLlmArgs`` plus ``TorchLlmArgs`` there; the LLM constructor refuses
  any other keyword before pydantic sees it (``llm.py`` ``BaseLLM.__init__``, see :mod:`.llm`);
* defaults the stand-in acts on: ``max_num_tokens`` 8192, ``max_batch_size`` / ``max_seq_len`` None (the
  runtime picks), ``enable_chunked_prefill`` False, ``guided_decoding_backend`` None ('xgrammar' or
  'llguidance' allowed), ``lora_config`` None, ``stream_interval`` 1 (must be positive:
  "stream_interval must be positive, got N"), ``kv_cache_config.free_gpu_memory_fraction`` in [0, 1];
* ``LoraConfig`` (``tensorrt_llm/lora_helper.py`` @585c7565, the 1.2-era form; earlier a dataclass @037d4ba1,
  later a ``StrictBaseModel`` with ``extra="forbid"`` by PR #11158, 2026-02, after the 1.2 cut) is a plain pydantic
  ``BaseModel`` with pydantic's default ``extra="ignore"``: ``lora_dir`` ([]), ``lora_ckpt_source``
  (``Literal["hf", "nemo"]``, "hf"), ``max_lora_rank`` (64), ``lora_target_modules`` ([]),
  ``trtllm_modules_to_hf_modules`` ({}), ``max_loras`` / ``max_cpu_loras`` (None),
  ``swap_gate_up_proj_lora_b_weight`` (True). An unknown key is dropped silently, whether the dict goes through
  ``update_llm_args_with_extra_dict`` or to ``TorchLlmArgs`` (so cog-triton checks the keys itself:
  ``tensorrtllm_backend/llmapi_args.py``);
* ``sampler_type``: ``Union[str, SamplerType]`` defaulting to ``auto`` (``SamplerType``: TRTLLMSampler,
  TorchSampler, auto); any string validates, and one that is none of them selects TorchSampler
  (``_torch/pyexecutor/_util.py`` ``instantiate_sampler`` compares for equality; see the engine's docstring).

Field types are kept loose where the stand-in does not act on a value.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class SamplerType(StrEnum):
    """The samplers ``sampler_type`` names (llm_args.py, 1.2-era)."""

    TRTLLMSampler = "TRTLLMSampler"
    TorchSampler = "TorchSampler"
    auto = "auto"


class StrictBaseModel(BaseModel):
    """Forbids unknown fields, as upstream's."""

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)


class LoraConfig(BaseModel):
    """``tensorrt_llm.lora_helper.LoraConfig``: a pydantic model that ignores unknown keys (see the module
    docstring)."""

    lora_dir: List[str] = Field(default_factory=list)
    lora_ckpt_source: Literal["hf", "nemo"] = "hf"
    max_lora_rank: int = 64
    lora_target_modules: List[str] = Field(default_factory=list)
    trtllm_modules_to_hf_modules: Dict[str, str] = Field(default_factory=dict)
    max_loras: Optional[int] = None
    max_cpu_loras: Optional[int] = None
    swap_gate_up_proj_lora_b_weight: bool = True


class KvCacheConfig(StrictBaseModel):
    enable_block_reuse: bool = True
    max_tokens: Optional[int] = None
    max_attention_window: Optional[List[int]] = None
    sink_token_length: Optional[int] = None
    free_gpu_memory_fraction: Optional[float] = 0.9
    host_cache_size: Optional[int] = None
    onboard_blocks: bool = True
    cross_kv_cache_fraction: Optional[float] = None
    secondary_offload_min_priority: Optional[int] = None
    event_buffer_max_size: int = 0
    attention_dp_events_gather_period_ms: int = 5
    enable_partial_reuse: bool = True
    copy_on_partial_reuse: bool = True
    use_uvm: bool = False
    max_gpu_total_bytes: int = 0
    dtype: str = "auto"
    mamba_ssm_cache_dtype: Literal["auto", "float16", "bfloat16", "float32"] = "auto"
    tokens_per_block: int = 32

    @field_validator("free_gpu_memory_fraction")
    @classmethod
    def _fraction(cls, v: Optional[float]) -> Optional[float]:
        if v is not None and not 0 <= v <= 1:
            raise ValueError("kv_cache_config.free_gpu_memory_fraction must be a float between 0 and 1")
        return v


class PeftCacheConfig(StrictBaseModel):
    num_host_module_layer: int = 0
    num_device_module_layer: int = 0
    optimal_adapter_size: int = 8
    max_adapter_size: int = 64
    num_put_workers: int = 1
    num_ensure_workers: int = 1
    num_copy_streams: int = 1
    max_pages_per_block_host: int = 24
    max_pages_per_block_device: int = 8
    device_cache_percent: float = 0.02
    host_cache_size: int = 1024**3
    lora_prefetch_dir: Optional[str] = None


class DynamicBatchConfig(StrictBaseModel):
    enable_batch_size_tuning: bool
    enable_max_num_tokens_tuning: bool
    dynamic_batch_moving_average_window: int


class SchedulerConfig(StrictBaseModel):
    capacity_scheduler_policy: Literal["MAX_UTILIZATION", "GUARANTEED_NO_EVICT", "STATIC_BATCH"] = (
        "GUARANTEED_NO_EVICT")
    context_chunking_policy: Optional[Literal["FIRST_COME_FIRST_SERVED", "EQUAL_PROGRESS"]] = None
    dynamic_batch_config: Optional[DynamicBatchConfig] = None


class CudaGraphConfig(StrictBaseModel):
    batch_sizes: Optional[List[int]] = None
    max_batch_size: int = 0
    enable_padding: bool = False


class TorchLlmArgs(StrictBaseModel):
    """The PyTorch backend's LLM arguments (``BaseLlmArgs`` + ``TorchLlmArgs`` fields; see the module docstring)."""

    # BaseLlmArgs
    model: Union[str, Path]
    tokenizer: Optional[Any] = None
    tokenizer_mode: Literal["auto", "slow"] = "auto"
    skip_tokenizer_init: bool = False
    trust_remote_code: bool = False
    tensor_parallel_size: int = 1
    dtype: str = "auto"
    revision: Optional[str] = None
    tokenizer_revision: Optional[str] = None
    pipeline_parallel_size: int = 1
    context_parallel_size: int = 1
    gpus_per_node: Optional[int] = None
    moe_cluster_parallel_size: Optional[int] = None
    moe_tensor_parallel_size: Optional[int] = None
    moe_expert_parallel_size: Optional[int] = None
    enable_attention_dp: bool = False
    enable_lm_head_tp_in_adp: bool = False
    cp_config: Optional[dict] = Field(default_factory=dict)
    fail_fast_on_attention_window_too_large: bool = False
    enable_lora: bool = False
    lora_config: Optional[LoraConfig] = None
    kv_cache_config: KvCacheConfig = Field(default_factory=KvCacheConfig)
    enable_chunked_prefill: bool = False
    guided_decoding_backend: Optional[Literal["xgrammar", "llguidance"]] = None
    batched_logits_processor: Optional[Any] = None
    iter_stats_max_iterations: Optional[int] = None
    request_stats_max_iterations: Optional[int] = None
    peft_cache_config: Optional[PeftCacheConfig] = None
    scheduler_config: SchedulerConfig = Field(default_factory=SchedulerConfig)
    cache_transceiver_config: Optional[Any] = None
    sparse_attention_config: Optional[Any] = None
    speculative_config: Optional[Any] = None
    max_batch_size: Optional[int] = None
    max_input_len: Optional[int] = None
    max_seq_len: Optional[int] = None
    max_beam_width: Optional[int] = None
    max_num_tokens: Optional[int] = 8192
    gather_generation_logits: bool = False
    num_postprocess_workers: int = 0
    postprocess_tokenizer_dir: Optional[str] = None
    reasoning_parser: Optional[str] = None
    decoding_config: Optional[Any] = None
    mpi_session: Optional[Any] = Field(default=None, alias="_mpi_session")
    backend: Optional[str] = Field(default=None, validate_default=True)
    return_perf_metrics: bool = False
    orchestrator_type: Optional[Literal["rpc", "ray"]] = None
    # TorchLlmArgs
    build_config: Optional[Any] = None
    garbage_collection_gen0_threshold: int = 20000
    cuda_graph_config: Optional[CudaGraphConfig] = Field(default_factory=CudaGraphConfig)
    attention_dp_config: Optional[Any] = None
    disable_overlap_scheduler: bool = False
    moe_config: Optional[Any] = None
    attn_backend: str = "TRTLLM"
    sampler_type: Union[str, SamplerType] = SamplerType.auto
    enable_iter_perf_stats: bool = False
    enable_iter_req_stats: bool = False
    print_iter_log: bool = False
    perf_metrics_max_requests: int = 0
    batch_wait_timeout_ms: float = 0
    batch_wait_timeout_iters: int = 0
    batch_wait_max_tokens_ratio: float = 0
    torch_compile_config: Optional[Any] = None
    enable_autotuner: bool = True
    enable_layerwise_nvtx_marker: bool = False
    load_format: Union[str, Any] = "AUTO"
    enable_min_latency: bool = False
    stream_interval: int = 1
    force_dynamic_quantization: bool = False
    allreduce_strategy: Optional[str] = "AUTO"
    checkpoint_loader: Optional[Any] = None
    checkpoint_format: Optional[str] = None
    kv_connector_config: Optional[Any] = None
    mm_encoder_only: bool = False

    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, populate_by_name=True)

    @field_validator("backend", mode="before")
    @classmethod
    def _init_backend(cls, v: Optional[str]) -> str:
        return "pytorch" if v is None else v

    @model_validator(mode="after")
    def _stream_interval(self) -> "TorchLlmArgs":
        if self.stream_interval <= 0:
            raise ValueError(f"stream_interval must be positive, got {self.stream_interval}")
        return self

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "TorchLlmArgs":
        return cls(**kwargs)

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.context_parallel_size


__all__ = ["CudaGraphConfig", "KvCacheConfig", "LoraConfig", "PeftCacheConfig", "SamplerType", "SchedulerConfig",
           "TorchLlmArgs"]
