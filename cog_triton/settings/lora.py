"""Settings of LoRA adapters: the lora_weights input, the adapters' download and disk cache, and the engine's LoRA
caches."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from pydantic import Field

from cog_triton.settings.base import Group


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
