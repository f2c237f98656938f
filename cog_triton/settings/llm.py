"""Settings of Hugging Face checkpoints on TensorRT-LLM's PyTorch backend: the LLM API's arguments."""

from __future__ import annotations

from enum import Enum
from typing import Optional

from pydantic import Field, field_validator

from common.errors import ConfigError
from cog_triton.settings.base import Group
from tensorrtllm_backend.llmapi_args import parse_llm_args_text


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
