"""The arguments of ``tensorrt_llm.LLM(**kwargs)`` for a checkpoint on the PyTorch backend, built from typed
options, checked against TensorRT-LLM 1.2.1's ``TorchLlmArgs`` before Triton starts, and the limits they imply.

Why check here: ``TorchLlmArgs`` and its nested configs are pydantic models with ``extra="forbid"``
(``StrictBaseModel``), and ``BaseLLM.__init__`` refuses any keyword outside the model's fields (see
../shared/upstream/llmapi-contract.md §1), so a misspelt option fails only inside the Triton model, after the
weights were fetched and the GPU was claimed. Refusing it at setup, naming the field and its close matches,
costs nothing.

Sources (NVIDIA/TensorRT-LLM; the search index holds no file of the v1.2.1 commit ``376f7e1b``, so each is the
nearest stored version):

* ``tensorrt_llm/llmapi/llm_args.py`` @``7b437aaa`` (the 1.1/1.2 line's layout): the fields of ``BaseLlmArgs``
  and ``TorchLlmArgs`` (:data:`TORCH_LLM_ARGS_FIELDS`) and of the nested ``KvCacheConfig``, ``CudaGraphConfig``,
  ``SchedulerConfig``, ``PeftCacheConfig``, ``MoeConfig``, ``AttentionDpConfig``, ``TorchCompileConfig``,
  ``CacheTransceiverConfig`` (:data:`NESTED_FIELDS`); defaults ``max_num_tokens=8192``,
  ``kv_cache_config.free_gpu_memory_fraction=0.9`` (validated to [0, 1]), ``enable_block_reuse=True``,
  ``guided_decoding_backend: Literal["xgrammar", "llguidance"] | None``; ``stream_interval`` must be positive;
  with ``lora_config`` given, the PyTorch backend ignores ``enable_lora`` (``validate_lora_config_consistency``).
* ``tests/unittest/api_stability/references_committed/llm.yaml`` @``029c15cb`` (the LLM API's committed, stable
  signature): ``max_batch_size`` default 2048, ``max_num_tokens`` 8192, ``max_seq_len`` None.
* ``tensorrt_llm/lora_helper.py`` @``585c7565``: ``LoraConfig`` fields (``lora_dir``, ``lora_ckpt_source``,
  ``max_lora_rank`` (64), ``lora_target_modules``, ``trtllm_modules_to_hf_modules``, ``max_loras``,
  ``max_cpu_loras``, ``swap_gate_up_proj_lora_b_weight``). Later main moved it to
  ``_torch/peft/lora/config.py``; a dict is passed, which either place accepts.
* The longest prompt: ``tensorrt_llm/llmapi/llm.py`` @``4c05a748`` ``_check_arguments``: with the PyTorch
  backend and chunked prefill off, a prompt longer than ``max_num_tokens`` raises ``ValueError("The sum of
  prompt length (...) ... should not exceed max_num_tokens (...)")`` in ``generate_async``; with it on, nothing
  is checked there. ``tensorrt_llm/executor/base_worker.py`` @``7b437aaa`` ``_deduce_max_tokens``: the tokens
  left to generate are ``max_seq_len - prompt length`` and must be positive. Hence
  ``min(max_seq_len - 1, max_num_tokens)`` without chunked prefill, ``max_seq_len - 1`` with it
  (:func:`pytorch_limits`).
* ``max_seq_len`` when not set: ``PyTorchModelEngine._init_max_seq_len``
  (``tensorrt_llm/_torch/pyexecutor/model_engine.py``, stored @``1a0dc5f7`` and earlier versions alike) takes
  the model's ``infer_max_seq_len()`` (``_torch/models/modeling_utils.py`` @``cb4c622c``: ``max_position_embeddings``,
  2048 without it, times the rope scaling ``factor`` unless the rope type is su, longrope, llama3 or yarn), and
  lowers a larger value that was set to it with a warning. Here a larger value is refused instead
  (:func:`build_llm_args`), so the limit the predictor enforces is the one the engine uses.
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence

from common.errors import ConfigError, IncompatibleWeightsError
from tensorrtllm_backend.checkpoint import FACTS_VERSION, check_pytorch_checkpoint
from tensorrtllm_backend.engine import ModelLimits
from tensorrtllm_backend.lora import DEFAULT_MAX_LORA_RANK, DEFAULT_MAX_LORAS, SUPPORTED_MODULES, LoraSpec, shape_of
from tensorrtllm_backend.samplers import AUTO, SAMPLER_TYPES, effective_sampler

if TYPE_CHECKING:
    from tensorrtllm_backend.engine import WeightsInfo
    from tensorrtllm_backend.gpus import GPU

SOURCE = "tensorrt_llm/llmapi/llm_args.py @7b437aaa (the nearest stored version to 1.2.1)"

#: BaseLlmArgs fields (llm_args.py @7b437aaa).
BASE_LLM_ARGS_FIELDS = frozenset({
    "model", "tokenizer", "tokenizer_mode", "skip_tokenizer_init", "trust_remote_code", "tensor_parallel_size",
    "dtype", "revision", "tokenizer_revision", "pipeline_parallel_size", "context_parallel_size", "gpus_per_node",
    "moe_cluster_parallel_size", "moe_tensor_parallel_size", "moe_expert_parallel_size", "enable_attention_dp",
    "enable_lm_head_tp_in_adp", "cp_config", "load_format", "fail_fast_on_attention_window_too_large",
    "enable_lora", "lora_config", "kv_cache_config", "enable_chunked_prefill", "guided_decoding_backend",
    "batched_logits_processor", "iter_stats_max_iterations", "request_stats_max_iterations", "peft_cache_config",
    "scheduler_config", "cache_transceiver_config", "sparse_attention_config", "speculative_config",
    "max_batch_size", "max_input_len", "max_seq_len", "max_beam_width", "max_num_tokens", "gather_generation_logits",
    "num_postprocess_workers", "postprocess_tokenizer_dir", "reasoning_parser", "decoding_config", "backend",
    "return_perf_metrics", "orchestrator_type",
})
#: TorchLlmArgs' own fields (llm_args.py @7b437aaa).
TORCH_ONLY_FIELDS = frozenset({
    "build_config", "garbage_collection_gen0_threshold", "cuda_graph_config", "attention_dp_config",
    "disable_overlap_scheduler", "moe_config", "attn_backend", "sampler_type", "enable_iter_perf_stats",
    "enable_iter_req_stats", "print_iter_log", "perf_metrics_max_requests", "batch_wait_timeout_ms",
    "batch_wait_timeout_iters", "batch_wait_max_tokens_ratio", "torch_compile_config", "enable_autotuner",
    "enable_layerwise_nvtx_marker", "enable_min_latency", "stream_interval", "force_dynamic_quantization",
    "allreduce_strategy", "checkpoint_loader", "checkpoint_format", "kv_connector_config", "mm_encoder_only",
})
#: Every keyword ``LLM(...)`` takes with the PyTorch backend (``mpi_session`` is passed as ``_mpi_session``).
TORCH_LLM_ARGS_FIELDS = BASE_LLM_ARGS_FIELDS | TORCH_ONLY_FIELDS | {"_mpi_session"}

#: Fields of the nested configs (each a StrictBaseModel, extra="forbid", but LoraConfig: a plain pydantic model in
#: lora_helper.py @585c7565 that drops unknown keys silently, so a misspelt key would be lost without this check).
NESTED_FIELDS: dict[str, frozenset[str]] = {
    "kv_cache_config": frozenset({
        "enable_block_reuse", "max_tokens", "max_attention_window", "sink_token_length", "free_gpu_memory_fraction",
        "host_cache_size", "onboard_blocks", "cross_kv_cache_fraction", "secondary_offload_min_priority",
        "event_buffer_max_size", "attention_dp_events_gather_period_ms", "enable_partial_reuse",
        "copy_on_partial_reuse", "use_uvm", "max_gpu_total_bytes", "dtype", "mamba_ssm_cache_dtype",
        "tokens_per_block",
    }),
    "lora_config": frozenset({
        "lora_dir", "lora_ckpt_source", "max_lora_rank", "lora_target_modules", "trtllm_modules_to_hf_modules",
        "max_loras", "max_cpu_loras", "swap_gate_up_proj_lora_b_weight",
    }),
    "cuda_graph_config": frozenset({"batch_sizes", "max_batch_size", "enable_padding"}),
    "scheduler_config": frozenset({"capacity_scheduler_policy", "context_chunking_policy", "dynamic_batch_config"}),
    "peft_cache_config": frozenset({
        "num_host_module_layer", "num_device_module_layer", "optimal_adapter_size", "max_adapter_size",
        "num_put_workers", "num_ensure_workers", "num_copy_streams", "max_pages_per_block_host",
        "max_pages_per_block_device", "device_cache_percent", "host_cache_size", "lora_prefetch_dir",
    }),
    "moe_config": frozenset({
        "backend", "max_num_tokens", "load_balancer", "disable_finalize_fusion", "use_low_precision_moe_combine",
    }),
    "attention_dp_config": frozenset({"enable_balance", "timeout_iters", "batching_wait_iters"}),
    "torch_compile_config": frozenset({
        "enable_fullgraph", "enable_inductor", "enable_piecewise_cuda_graph", "capture_num_tokens",
        "enable_userbuffers", "max_num_streams",
    }),
    "cache_transceiver_config": frozenset({"backend", "max_tokens_in_buffer", "kv_transfer_timeout_ms"}),
}
#: Fields this image sets itself: an operator cannot pass them through the extra options.
OWNED_FIELDS = {
    "model": "the weights (COG_WEIGHTS / setup(weights=...))",
    "tokenizer": "the weights' tokenizer (COG_TRITON_TOKENIZER_DIR)",
    "backend": "the PyTorch backend (LLM API)",
    "_mpi_session": "the Triton model (tensor parallelism under MPI)",
    "mpi_session": "the Triton model (tensor parallelism under MPI)",
    "skip_tokenizer_init": "the Triton model",
    "trust_remote_code": "COG_TRITON_LLM_TRUST_REMOTE_CODE, checked against the checkpoint's files at setup",
}
GUIDED_DECODING_BACKENDS = ("xgrammar", "llguidance")
#: LLM API defaults the limits fall back to (references_committed/llm.yaml @029c15cb; llm_args.py @7b437aaa).
DEFAULT_MAX_BATCH_SIZE = 2048
DEFAULT_MAX_NUM_TOKENS = 8192
#: infer_max_seq_len (modeling_utils.py): without max_position_embeddings, and the rope types not scaled.
DEFAULT_INFERRED_MAX_SEQ_LEN = 2048
UNSCALED_ROPE_TYPES = ("su", "longrope", "llama3", "yarn")


@dataclass(frozen=True)
class LlmApiOptions:
    """The typed options the ``LLM(...)`` arguments are built from (cog_triton.settings fills them).

    Sizes are in tokens (``max_batch_size``: requests); None means the LLM API's default (or, for
    ``max_seq_len``, the checkpoint's, as the PyTorch backend infers it).

    Attributes:
        trust_remote_code: let the checkpoint's own code run (``LLM(trust_remote_code=...)``; a checkpoint that
            names code is refused without it: :func:`tensorrtllm_backend.checkpoint.check_checkpoint_files`).
        extra: further ``LLM(...)`` keywords (an operator's JSON/YAML), deep-merged over the built ones; a key
            that a typed option already sets is refused, naming that option.
        sources: argument path ("max_seq_len", "kv_cache_config.free_gpu_memory_fraction", ...) -> the setting it
            comes from, for messages.
    """

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_batch_size: Optional[int] = None
    max_num_tokens: Optional[int] = None
    max_seq_len: Optional[int] = None
    free_gpu_memory_fraction: float = 0.9
    enable_block_reuse: bool = True
    kv_cache_max_tokens: Optional[int] = None
    enable_chunked_prefill: bool = False
    guided_decoding_backend: Optional[str] = "xgrammar"
    sampler_type: str = AUTO
    stream_interval: int = 1
    enable_lora: bool = False
    max_lora_rank: int = DEFAULT_MAX_LORA_RANK
    max_loras: int = DEFAULT_MAX_LORAS
    max_cpu_loras: int = 2 * DEFAULT_MAX_LORAS
    lora_target_modules: tuple[str, ...] = SUPPORTED_MODULES
    trust_remote_code: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)

    def name(self, path: str) -> str:
        """``path`` with the setting it comes from, for messages."""
        source = self.sources.get(path)
        return f"{path} ({source})" if source else path


def parse_llm_args_text(text: str, name: str = "COG_TRITON_LLM_ARGS") -> dict[str, Any]:
    """The mapping a JSON or YAML document ``text`` holds (an empty text: {}).

    Raises:
        ConfigError: neither JSON nor YAML, or not a mapping with string keys; the message names ``name``.
    """
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        import yaml  # noqa: PLC0415 - only for YAML documents

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{name} is neither JSON nor YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ConfigError(
            f"{name} must be a JSON or YAML mapping of LLM API arguments (e.g. {{\"kv_cache_config\": {{\"dtype\": "
            f"\"fp8\"}}}}), got {type(data).__name__}"
        )
    return data


def _close(name: str, known: Sequence[str]) -> str:
    matches = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    return f"; did you mean {', '.join(matches)}?" if matches else ""


def validate_llm_args(args: Mapping[str, Any], where: str = "LLM arguments") -> None:
    """Check ``args`` against TensorRT-LLM 1.2.1's ``TorchLlmArgs`` field names (and the nested configs') and the
    values this module relies on, as ``LLM(**args)`` would, before Triton starts.

    Raises:
        ConfigError: an unknown field (named, with its close matches and the source of the field list), a nested
            config that is not a mapping, or a value out of its range (named, with the value and the limit).
    """
    unknown = sorted(k for k in args if k not in TORCH_LLM_ARGS_FIELDS)
    if unknown:
        verb = "is not a field" if len(unknown) == 1 else "are not fields"
        close = _close(unknown[0], sorted(TORCH_LLM_ARGS_FIELDS))
        raise ConfigError(
            f"{where}: {', '.join(repr(k) for k in unknown)} {verb} of TensorRT-LLM {FACTS_VERSION}'s TorchLlmArgs, "
            f"which forbids unknown fields{close} (field names from {SOURCE})"
        )
    if not isinstance(args.get("model"), str) or not args["model"]:
        raise ConfigError(f"{where}: model must be the checkpoint folder, got {args.get('model')!r}")
    for section, known in NESTED_FIELDS.items():
        value = args.get(section)
        if value is None:
            continue
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: {section} must be a mapping of its fields, got {type(value).__name__}")
        bad = sorted(k for k in value if k not in known)
        if bad:
            raise ConfigError(
                f"{where}: {section}.{bad[0]} is not a field of {section} in TensorRT-LLM {FACTS_VERSION}"
                f"{_close(bad[0], sorted(known))}; its fields: {', '.join(sorted(known))} (from {SOURCE})"
            )
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "max_batch_size", "max_num_tokens", "max_seq_len",
                "stream_interval"):
        value = args.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ConfigError(f"{where}: {key} must be a positive integer, got {value!r}")
    sampler = args.get("sampler_type")
    if sampler is not None and sampler not in SAMPLER_TYPES:
        # 1.2.1 validates any string and takes one it does not know for TorchSampler (_util.py instantiate_sampler)
        raise ConfigError(f"{where}: sampler_type {sampler!r} is not one of {', '.join(SAMPLER_TYPES)}")
    backend = args.get("guided_decoding_backend")
    if backend is not None and backend not in GUIDED_DECODING_BACKENDS:
        raise ConfigError(f"{where}: guided_decoding_backend {backend!r} is not one of "
                          f"{', '.join(GUIDED_DECODING_BACKENDS)} (or null)")
    kv = args.get("kv_cache_config") or {}
    fraction = kv.get("free_gpu_memory_fraction")
    if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
                                 or not 0 <= fraction <= 1):
        raise ConfigError(f"{where}: kv_cache_config.free_gpu_memory_fraction must be between 0 and 1, got {fraction!r}")
    lora = args.get("lora_config") or {}
    rank = lora.get("max_lora_rank")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 1):
        raise ConfigError(f"{where}: lora_config.max_lora_rank must be a positive integer, got {rank!r}")
    for flag in ("enable_chunked_prefill", "enable_lora", "trust_remote_code"):
        if flag in args and not isinstance(args[flag], bool):
            raise ConfigError(f"{where}: {flag} must be true or false, got {args[flag]!r}")


def inferred_max_seq_len(config: Mapping[str, Any]) -> int:
    """The ``max_seq_len`` the PyTorch backend infers from a checkpoint's config.json (``infer_max_seq_len``,
    modeling_utils.py): ``max_position_embeddings`` (of ``text_config`` for multimodal configs; 2048 without it)
    times the rope scaling factor, unless the rope type is su, longrope, llama3 or yarn."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else None
    source = config if config.get("max_position_embeddings") is not None or text is None else text
    positions = source.get("max_position_embeddings")
    base = int(positions) if isinstance(positions, int) and positions > 0 else DEFAULT_INFERRED_MAX_SEQ_LEN
    rope = source.get("rope_scaling")
    if not isinstance(rope, Mapping):
        rope = source.get("rope_parameters") if isinstance(source.get("rope_parameters"), Mapping) else None
    factor = 1.0
    if rope is not None:
        rope_type = rope.get("type", rope.get("rope_type"))
        if rope_type not in UNSCALED_ROPE_TYPES:
            value = rope.get("factor", 1.0)
            factor = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 1.0
    return int(math.ceil(base * factor)) if factor != 1 else base


def _merge(base: dict[str, Any], extra: Mapping[str, Any], options: LlmApiOptions, prefix: str = "") -> None:
    """Deep-merge ``extra`` into ``base`` in place, refusing a key a typed option set (named with its setting)."""
    for key, value in extra.items():
        path = f"{prefix}{key}"
        if not prefix and key in OWNED_FIELDS:
            raise ConfigError(f"the extra LLM API arguments set {key!r}, which this image sets from {OWNED_FIELDS[key]}")
        if path in options.sources:
            raise ConfigError(
                f"the extra LLM API arguments set {path!r}, which the setting {options.sources[path]} already sets; "
                "use that setting"
            )
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value, options, prefix=f"{path}.")
        else:
            base[key] = json.loads(json.dumps(value)) if isinstance(value, (dict, list)) else value


#: Architectures whose PyTorch-backend model never hands a request's LoRA weights to its language model, so an
#: adapter would be silently ignored, for text and images alike: architecture -> the source read.
LORA_IGNORED_ARCHITECTURES: dict[str, str] = {
    arch: "modeling_qwen2vl.py Qwen2VLModelBase.forward calls self.llm.forward without lora_params (index copy "
          "2926488359, and @000a01de)"
    for arch in ("Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration")
}


def build_llm_args(options: LlmApiOptions, info: "WeightsInfo") -> dict[str, Any]:
    """The ``LLM(**kwargs)`` arguments for the checkpoint ``info`` describes on the PyTorch backend, validated.

    Returns:
        A JSON-serialisable dict: ``model``/``tokenizer`` (folders), parallel sizes, ``max_seq_len`` (the setting,
        else the checkpoint's as the backend infers it), ``max_batch_size``/``max_num_tokens`` when set,
        ``kv_cache_config`` (``free_gpu_memory_fraction``, ``enable_block_reuse``, ``max_tokens``),
        ``enable_chunked_prefill``, ``trust_remote_code``, ``guided_decoding_backend``, ``sampler_type`` unless auto,
        ``stream_interval`` unless 1, ``lora_config`` when LoRA is on, then ``options.extra`` deep-merged.

    Raises:
        ConfigError: the weights are an engine, ``max_seq_len`` exceeds what the checkpoint supports, a LoRA
            module is not one this image checks adapters for, an extra argument repeats a setting or is unknown
            to TorchLlmArgs (:func:`validate_llm_args`), or LoRA is on for an architecture whose model ignores
            adapters (:data:`LORA_IGNORED_ARCHITECTURES`); each message names the value and the limit.
    """
    if info.kind != "hf_checkpoint":
        raise ConfigError("LLM API arguments are built for Hugging Face checkpoints (the PyTorch backend); "
                          f"{info.weights_dir} holds a TensorRT-LLM engine")
    limit = inferred_max_seq_len(info.config)
    seq = options.max_seq_len or limit
    if seq > limit:
        raise ConfigError(
            f"{options.name('max_seq_len')} {seq} exceeds what the checkpoint supports, {limit} tokens "
            "(max_position_embeddings with its rope scaling: the PyTorch backend would lower it to that); set at most "
            f"{limit}"
        )
    if seq < 2:
        raise ConfigError(f"{options.name('max_seq_len')} must be at least 2 (one prompt token, one generated), got {seq}")
    args: dict[str, Any] = {
        "model": str(info.weights_dir),
        "tokenizer": str(info.tokenizer_dir),
        "tensor_parallel_size": options.tensor_parallel_size,
        "pipeline_parallel_size": options.pipeline_parallel_size,
        "max_seq_len": seq,
        "kv_cache_config": {
            "free_gpu_memory_fraction": options.free_gpu_memory_fraction,
            "enable_block_reuse": options.enable_block_reuse,
        },
        "enable_chunked_prefill": options.enable_chunked_prefill,
        "trust_remote_code": options.trust_remote_code,
    }
    if options.max_batch_size is not None:
        args["max_batch_size"] = options.max_batch_size
    if options.max_num_tokens is not None:
        args["max_num_tokens"] = options.max_num_tokens
    if options.kv_cache_max_tokens is not None:
        args["kv_cache_config"]["max_tokens"] = options.kv_cache_max_tokens
    if options.guided_decoding_backend:
        args["guided_decoding_backend"] = options.guided_decoding_backend
    if options.sampler_type != AUTO:
        args["sampler_type"] = options.sampler_type
    if options.stream_interval != 1:  # TorchLlmArgs' default is 1
        args["stream_interval"] = options.stream_interval
    if options.enable_lora:
        if info.architecture in LORA_IGNORED_ARCHITECTURES:
            raise ConfigError(
                "COG_TRITON_LLM_ENABLE_LORA is on, and TensorRT-LLM 1.2.1 would ignore every adapter on "
                f"{info.architecture} ({LORA_IGNORED_ARCHITECTURES[info.architecture]}); leave LoRA off for this "
                "checkpoint"
            )
        unknown = [m for m in options.lora_target_modules if m not in SUPPORTED_MODULES]
        if unknown or not options.lora_target_modules:
            raise ConfigError(
                f"{options.name('lora_config.lora_target_modules')} {', '.join(unknown) or '(empty)'}: give TensorRT-LLM "
                f"module names this image checks adapters for: {', '.join(SUPPORTED_MODULES)}"
            )
        args["lora_config"] = {
            "max_lora_rank": options.max_lora_rank,
            "max_loras": options.max_loras,
            "max_cpu_loras": options.max_cpu_loras,
            "lora_target_modules": list(options.lora_target_modules),
        }
    _merge(args, options.extra, options)
    validate_llm_args(args)
    return args


def pytorch_limits(args: Mapping[str, Any]) -> ModelLimits:
    """The sizes the PyTorch backend accepts with ``args`` (from :func:`build_llm_args`), as a :class:`ModelLimits`
    whose ``executor_max_input_len()`` is the longest prompt: ``min(max_seq_len - 1, max_num_tokens)`` with chunked
    prefill off, ``max_seq_len - 1`` with it on (module docstring: llm.py ``_check_arguments``, base_worker.py
    ``_deduce_max_tokens``; the rule is :meth:`ModelLimits.executor_max_input_len`'s ``pytorch_backend`` case).
    ``max_input_len`` is ``max_seq_len - 1``: the backend has no build-time input length."""
    seq = int(args["max_seq_len"])
    tokens = int(args.get("max_num_tokens") or DEFAULT_MAX_NUM_TOKENS)
    chunked = bool(args.get("enable_chunked_prefill", False))
    return ModelLimits(
        max_batch_size=int(args.get("max_batch_size") or DEFAULT_MAX_BATCH_SIZE),
        max_input_len=seq - 1,
        max_seq_len=seq,
        max_num_tokens=tokens,
        enable_chunked_context=chunked,
        pytorch_backend=True,
    )


def pytorch_lora_spec(info: "WeightsInfo", args: Mapping[str, Any], base_model: str = "") -> LoraSpec:
    """What LoRA adapters the checkpoint serves on the PyTorch backend with ``args``: off without ``lora_config``;
    else adapters of rank up to ``lora_config.max_lora_rank`` on ``lora_target_modules``, checked per request by
    :func:`cog_triton.streaming.lora.convert.convert` (an adapter of a larger rank is refused naming its rank and the limit)."""
    arch = info.architecture
    lora = args.get("lora_config")
    if not isinstance(lora, Mapping):
        return LoraSpec(False, "LoRA is off for this checkpoint: set COG_TRITON_LLM_ENABLE_LORA=true (and "
                        "COG_TRITON_LLM_MAX_LORA_RANK) to serve adapters", architecture=arch)
    try:
        shape = shape_of(info.config)
    except (ValueError, TypeError) as exc:
        return LoraSpec(False, f"the checkpoint's config.json lacks model sizes ({exc})", architecture=arch)
    dtype = info.dtype if info.dtype in ("float16", "bfloat16", "float32") else "bfloat16"
    return LoraSpec(
        True,
        dtype=dtype,
        max_rank=int(lora.get("max_lora_rank") or DEFAULT_MAX_LORA_RANK),
        target_modules=tuple(lora.get("lora_target_modules") or SUPPORTED_MODULES),
        shape=shape,
        max_loras=int(lora.get("max_loras") or DEFAULT_MAX_LORAS),
        architecture=arch,
        base_model=base_model,
        rank_limit="the max_lora_rank (COG_TRITON_LLM_MAX_LORA_RANK)",
        rank_fix="raise COG_TRITON_LLM_MAX_LORA_RANK",
    )


@dataclass(frozen=True)
class PyTorchServing:
    """Everything setup needs to serve a checkpoint on the PyTorch backend (:func:`plan_pytorch_serving`).

    Attributes:
        args: the validated ``LLM(**args)`` keywords (JSON-serialisable), for the Triton model.
        limits: what the predictor holds requests to (``executor_max_input_len()`` is the longest prompt).
        lora: what adapters requests may carry (rank limit checked per request).
        world_size: GPUs used, tensor_parallel_size x pipeline_parallel_size.
    """

    args: dict[str, Any]
    limits: ModelLimits
    lora: LoraSpec
    world_size: int

    @property
    def sampler(self) -> str:
        """The sampler the LLM samples with (:func:`tensorrtllm_backend.samplers.effective_sampler`)."""
        return effective_sampler(self.args)

    def describe(self, info: "WeightsInfo") -> str:
        """One line for setup's log: the checkpoint, its quantization and the serving limits."""
        a, lim = self.args, self.limits
        quant = info.quantization.describe() if info.quantization else "none"
        reason = lim.input_limit_reason()
        return (
            f"Hugging Face checkpoint {info.architecture} ({info.dtype}), quantization {quant}, on the PyTorch backend "
            f"(LLM API) with tp {a['tensor_parallel_size']} x pp {a['pipeline_parallel_size']}: max_seq_len "
            f"{lim.max_seq_len}, longest prompt {lim.executor_max_input_len()}{f' ({reason})' if reason else ''}, "
            f"max_batch_size {lim.max_batch_size}, max_num_tokens {lim.max_num_tokens}, guided decoding "
            f"{a.get('guided_decoding_backend') or 'off'}, sampler {self.sampler}, {self.lora.describe()}"
        )


def plan_pytorch_serving(info: "WeightsInfo", options: LlmApiOptions, gpus: Sequence["GPU"],
                         base_model: str = "", *, read_files: bool = True,
                         files_refusal: Optional[IncompatibleWeightsError] = None) -> PyTorchServing:
    """Check the checkpoint and the machine, and build the arguments, limits and LoRA support to serve it on the
    PyTorch backend (what setup calls once the weights are inspected, before Triton starts).

    Raises:
        IncompatibleWeightsError: the checkpoint's architecture or quantization is not served, it lacks a file its
            architecture needs, or it needs code ``options.trust_remote_code`` does not allow
            (:func:`tensorrtllm_backend.checkpoint.check_pytorch_checkpoint`, with ``gpus``' compute capability), or
            fewer GPUs are visible than tensor_parallel_size x pipeline_parallel_size. ``read_files`` /
            ``files_refusal``: as :func:`tensorrtllm_backend.checkpoint.check_pytorch_checkpoint` takes them.
        ConfigError: see :func:`build_llm_args`.
    """
    check_pytorch_checkpoint(info, gpus, trust_remote_code=options.trust_remote_code, read_files=read_files,
                             files_refusal=files_refusal)
    args = build_llm_args(options, info)
    world = int(args["tensor_parallel_size"]) * int(args["pipeline_parallel_size"])
    if world > len(gpus):
        raise IncompatibleWeightsError(
            f"{options.name('tensor_parallel_size')} {args['tensor_parallel_size']} x "
            f"{options.name('pipeline_parallel_size')} {args['pipeline_parallel_size']} = {world} ranks need {world} "
            f"GPUs, but {len(gpus)} {'is' if len(gpus) == 1 else 'are'} visible: lower them, or run on a machine with "
            f"{world} GPUs (check CUDA_VISIBLE_DEVICES)"
        )
    return PyTorchServing(args, pytorch_limits(args), pytorch_lora_spec(info, args, base_model), world)


CHECKPOINT_BACKENDS = ("auto", "pytorch", "reference")


def choose_checkpoint_backend(choice: str, gpus: Sequence["GPU"]) -> str:
    """Which backend serves a checkpoint: "pytorch" (TensorRT-LLM's LLM API on the GPU) or "reference" (the CPU
    reference model). ``auto``: pytorch when a GPU is visible, else reference.

    Raises:
        ConfigError: an unknown choice, or "pytorch" with no GPU visible.
    """
    if choice not in CHECKPOINT_BACKENDS:
        raise ConfigError(f"COG_TRITON_CHECKPOINT_BACKEND={choice!r} is not one of {', '.join(CHECKPOINT_BACKENDS)}")
    if choice == "auto":
        return "pytorch" if gpus else "reference"
    if choice == "pytorch" and not gpus:
        raise ConfigError(
            "COG_TRITON_CHECKPOINT_BACKEND=pytorch needs an NVIDIA GPU, and none is visible (no nvidia-smi, or "
            "CUDA_VISIBLE_DEVICES hides them); run on a GPU machine, or use auto or reference (the CPU reference model)"
        )
    return choice


__all__ = (
    "CHECKPOINT_BACKENDS", "DEFAULT_MAX_BATCH_SIZE", "DEFAULT_MAX_NUM_TOKENS", "NESTED_FIELDS", "TORCH_LLM_ARGS_FIELDS",
    "LORA_IGNORED_ARCHITECTURES", "LlmApiOptions", "PyTorchServing", "build_llm_args", "choose_checkpoint_backend", "inferred_max_seq_len",
    "parse_llm_args_text", "plan_pytorch_serving", "pytorch_limits", "pytorch_lora_spec", "validate_llm_args",
)
