"""What setup decides, as plain data both processes read (pure: no I/O, nothing started): the stream processes'
:class:`GeneratorConfig` (sent to each in :class:`cog_triton.ipc.Config`) and the LoRA adapter cache's
:class:`StoreLimits`.

The Cog worker (:mod:`cog_triton.worker`) makes these; the stream processes (:mod:`cog_triton.streaming`) build
their generator from them. Neither package imports the other: they share this module and :mod:`cog_triton.ipc`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

from cog_triton.fetch.rules import FetchRules
from tensorrtllm_backend.engine import ModelLimits
from tensorrtllm_backend.lora import LoraSpec


@dataclass(frozen=True)
class StoreLimits:
    """Where the cache lives and what bounds it.

    Attributes:
        root: the cache folder (created when missing).
        budget_bytes: most bytes the cached adapters may take together (LRU eviction above it).
        max_adapter_bytes: most bytes one adapter may download and unpack to (COG_TRITON_ADAPTER_MAX_BYTES); the
            store holds adapters to the smaller of this and the largest one the model serves plus ``extra_bytes``
            (:func:`cog_triton.streaming.lora.store.adapter_cap`).
        extra_bytes: bytes an adapter's files may take beyond the largest adapter_model.safetensors the model serves
            (COG_TRITON_ADAPTER_EXTRA_BYTES).
        max_members: most members an adapter archive may have (COG_TRITON_ADAPTER_MAX_MEMBERS).
        timeout_s / retries / deadline_s / min_rate_bytes_s / rate_grace_s: the download's bounds, as
            :func:`cog_triton.weights.fetch_weights` takes them (seconds, bytes/s). ``deadline_s`` bounds one
            adapter's whole fetch from the moment it is asked for: the wait for another fetch of the same adapter
            (in this process or another), every connection, header, body, redirect and retry, by URL or from the
            Hub (COG_TRITON_ADAPTER_DOWNLOAD_DEADLINE_S).
        rules: where adapters may be fetched from (default: https:// from public addresses only).
        fetches: adapters one stream process fetches at once, each on a thread of its own: one per prediction
            slot (COG_MAX_CONCURRENCY, the most predictions a process can have), so no prediction's adapter waits
            for a thread while slow sources hold others (each holds its thread until its deadline, at most).
    """

    root: Path
    budget_bytes: int = 20 << 30
    max_adapter_bytes: int = 4 << 30
    extra_bytes: int = 16 << 20
    max_members: int = 1000
    timeout_s: float = 60.0
    retries: int = 3
    deadline_s: float = 600.0
    min_rate_bytes_s: float = 100_000
    rate_grace_s: float = 60.0
    rules: FetchRules = FetchRules()
    fetches: int = 4


#: What image fetches are called in the fetch rules' messages (the worker's early check and the stream process's fetch).
IMAGE_URLS = "image URLs"


@dataclass(frozen=True)
class ImageLimits:
    """What one prediction's images may be (:mod:`cog_triton.streaming.images`; COG_TRITON_IMAGE_*).

    Attributes:
        max_count: images per prediction.
        max_pixels: width x height of one image, pixels.
        max_bytes: bytes of one image file.
        fetch_deadline_s: all of a prediction's image URLs, seconds.
        rules: the fetch rules of image URLs (None: URLs are refused, no rules were configured).
        fetches: predictions whose images one stream process reads, fetches and decodes at once, each on a thread of
            its own: one per prediction slot (COG_MAX_CONCURRENCY), so that a slow image URL (held until its deadline)
            or a large image delays no other prediction's start.
    """

    max_count: int = 8
    max_pixels: int = 4096 * 4096
    max_bytes: int = 20 << 20
    fetch_deadline_s: float = 30.0
    rules: Optional[FetchRules] = None
    fetches: int = 4

    @classmethod
    def from_settings(cls, settings: Any) -> "ImageLimits":
        """The limits of a :class:`cog_triton.settings.Settings` (``images`` and ``fetch`` groups)."""
        images = settings.images
        return cls(max_count=images.max_count, max_pixels=images.max_pixels, max_bytes=images.max_bytes,
                   fetch_deadline_s=images.fetch_deadline_s, rules=FetchRules.from_settings(settings),
                   fetches=settings.predictor.max_concurrency)


@dataclass(frozen=True)
class GeneratorConfig:
    """Everything needed to build a :class:`cog_triton.streaming.generation.Generator` in another process (picklable).

    Attributes:
        tokenizer_dir: the Hugging Face tokenizer folder.
        limits: the engine's limits (tokens).
        grpc_address: Triton's gRPC endpoint, ``host:port``.
        token_timeout_s: no-token timeout, seconds.
        add_special_tokens / special_tokens_in_user_text: :class:`cog_triton.streaming.prompt.PromptTokenizer`'s.
        guided: guided decoding is on (a :class:`cog_triton.streaming.guided.GuideChecker` is built).
        guided_off_reason: why it is off, for the error a guided request gets.
        lora: which LoRA adapters the model serves (None: none).
        adapter_limits: the adapter disk cache and download bounds (None: adapters are refused).
        backend: what serves ``tensorrt_llm``: "engine" (the C++ backend, or the CPU reference model with its
            tensors) or "pytorch" (the PyTorch backend over the LLM API: LoRA adapters go as folders).
        sampler: the PyTorch backend's sampler (:mod:`tensorrtllm_backend.samplers`), None for the engine: a seed is
            sent only where it does something (:func:`tensorrtllm_backend.samplers.takes_seed`).
        sends_stream_interval: the ``tensorrt_llm`` model takes ``stream_interval_ms`` (the PyTorch-backend model: its
            responses joined per interval, the first at once, so that one LLM instance's responses to Triton keep up
            with a GPU): each request carries the stream interval due when it starts
            (:attr:`cog_triton.streaming.coalesce.StreamLoad.ms`, milliseconds); False: not sent.
        images_off: why predictions may carry no images (:func:`cog_triton.worker.planning.images_off_reason`);
            None: they may (the PyTorch-backend model takes them, sent to it directly).
        image_limits: what a prediction's images may be.
    """

    tokenizer_dir: Path
    limits: ModelLimits
    grpc_address: str
    token_timeout_s: float = 120.0
    add_special_tokens: Optional[bool] = None
    special_tokens_in_user_text: bool = False
    guided: bool = False
    guided_off_reason: str = ""
    lora: Optional[LoraSpec] = None
    adapter_limits: Optional[StoreLimits] = None
    backend: Literal["engine", "pytorch"] = "engine"
    sampler: Optional[str] = None
    sends_stream_interval: bool = False
    images_off: Optional[str] = "images are not served"
    image_limits: ImageLimits = ImageLimits()


__all__ = ("IMAGE_URLS", "GeneratorConfig", "ImageLimits", "StoreLimits")
