"""The error tree of cog-triton.

Every failure the predictor can report derives from :class:`CogTritonError` and carries a stable
``code`` (a short snake_case string, part of our interface: logs and failed predictions start with
``[code]``). Messages say what was wrong, the value seen, what is allowed, and how to fix it.

The tree::

    CogTritonError
    ├── ConfigError            bad settings, templates or engine metadata
    │   └── TemplateError      a model-repository template could not be filled or is invalid
    │   ├── BuildConfigError   an engine build config (YAML) is invalid
    │   └── IncompatibleWeightsError  the weights cannot run here (TensorRT-LLM version, GPUs)
    ├── WeightsError           downloading, verifying or extracting weights failed
    │   ├── DownloadError      HTTP status, timeout, connection failure, truncated transfer
    │   │   └── FetchDeadlineError  the fetch's one deadline passed (whatever the server was doing)
    │   ├── ChecksumError      sha256 mismatch
    │   ├── ArchiveError       corrupt, unsupported or hostile archive
    │   └── ManifestError      a file listed in manifest.json is missing, resized or altered
    ├── BuildError             building or packaging an engine failed (scripts/build_engine)
    ├── InputError             a prediction input is invalid (also raised for too-long prompts)
    │   ├── LoraAdapterError   lora_weights cannot be fetched, is not a PEFT LoRA adapter, or does not fit
    │   └── FetchRefusedError  the fetch rules refuse where an input would fetch from (address, http://, host)
    ├── IncompleteOutputError  a guided output reached the token limit before its document was complete
    ├── StreamProcessError     a stream process (cog_triton.streaming.streamer) died or could not be reached
    └── TritonError            the Triton Inference Server failed
        ├── TritonStartupError Triton did not become ready (carries the tail of its log)
        ├── TritonDiedError    Triton exited while running
        └── InferenceError     Triton answered a request with an error
            └── LoraCacheFullError  the engine's LoRA cache has no room: every adapter in it is in use (retryable)

Translation to a prediction failure happens once, at the boundary (``predict.py``).
"""

from __future__ import annotations


class CogTritonError(Exception):
    """Base of all cog-triton errors. ``code`` identifies the kind of failure."""

    code = "cog_triton_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class ConfigError(CogTritonError):
    """Invalid settings, engine metadata or model-repository configuration."""

    code = "config_error"


class TemplateError(ConfigError):
    """A template could not be filled (unfilled or unknown placeholder) or is not a valid ModelConfig."""

    code = "template_error"


class BuildConfigError(ConfigError):
    """An engine build config (YAML) is unreadable, has unknown keys or invalid values."""

    code = "build_config_error"


class WeightsError(CogTritonError):
    """Weights could not be fetched, verified or unpacked."""

    code = "weights_error"


class DownloadError(WeightsError):
    """The weights download failed: HTTP error status, timeout, connection error or short read."""

    code = "download_error"


class FetchDeadlineError(DownloadError):
    """A fetch did not finish within its deadline, which bounds all of it (connections, TLS, response headers,
    bodies, redirects, retries; ``cog_triton.fetch.deadline``). The message names the deadline and its setting."""

    code = "download_deadline"


class ChecksumError(WeightsError):
    """The sha256 of the downloaded weights differs from the expected one."""

    code = "checksum_mismatch"


class ArchiveError(WeightsError):
    """The weights archive is corrupt, truncated, of an unsupported kind, or tries to escape its target."""

    code = "archive_error"


class ManifestError(WeightsError):
    """manifest.json is unreadable, or a file it lists is missing or differs in size or sha256."""

    code = "manifest_mismatch"


class IncompatibleWeightsError(ConfigError):
    """The weights cannot run here: other TensorRT-LLM version, too few GPUs, other compute capability."""

    code = "incompatible_weights"


class BuildError(CogTritonError):
    """An engine build failed: no or too few GPUs, no TensorRT-LLM, or a failed build step."""

    code = "build_failed"


class InputError(CogTritonError):
    """A prediction input is invalid. The message names the input, the value and the allowed range."""

    code = "invalid_input"


class LoraAdapterError(InputError):
    """The ``lora_weights`` input cannot be served: unreachable or too large, not a PEFT LoRA adapter, or made for
    another model (architecture, rank above max_lora_rank, modules the engine was not built for), or the engine
    has no LoRA support. The message names the value and the limit."""

    code = "invalid_lora_adapter"


class FetchRefusedError(InputError):
    """A fetch that an input asks for goes where the fetch rules (``cog_triton.fetch.rules``) do not allow: a
    loopback, private, link-local or otherwise non-public address, plain http://, a host or Hub owner not on the
    allow-list. Raised before any byte is sent there; the message names the rule, the value and the setting
    that allows it."""

    code = "fetch_refused"


class ImageInputError(InputError):
    """An image of a prediction cannot be served: refused (count, size, format, animation, its URL), unreadable,
    or given to a model that takes none."""

    code = "invalid_image"


class IncompleteOutputError(CogTritonError):
    """Structured output: the generation reached its token limit before the guided document was complete."""

    code = "incomplete_output"


class StreamProcessError(CogTritonError):
    """A stream process (the per-token work, cog_triton.streaming.streamer) died with the prediction running, or none runs."""

    code = "stream_process_failed"


class TritonError(CogTritonError):
    """The Triton Inference Server failed."""

    code = "triton_error"


class TritonStartupError(TritonError):
    """Triton exited during startup or did not become ready before the deadline."""

    code = "triton_startup_failed"


class TritonDiedError(TritonError):
    """Triton exited while it was serving (for example killed or crashed mid-prediction)."""

    code = "triton_died"


class InferenceError(TritonError):
    """Triton answered an inference request with an error."""

    code = "inference_error"


class LoraCacheFullError(InferenceError):
    """The engine's LoRA cache could not take the adapter: all cached adapters are in use by running requests
    ("PEFT Cache is full", TensorRT-LLM's peftCacheManager.cpp). Retryable: room frees up as requests finish."""

    code = "lora_cache_full"
