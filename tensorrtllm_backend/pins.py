"""The one place where the serving image and its TensorRT-LLM version are pinned.

The Dockerfile's ``FROM`` line, the model-repository templates (tensor names) and engine checks
all follow these values; ``tests/test_packaging.py`` fails when the Dockerfile drifts from them.

Source of the pairing: Triton's compatibility matrix (triton-inference-server/server,
docs/introduction/compatibility.md): NGC ``tritonserver:26.02-trtllm-python-py3`` ships
TensorRT-LLM 1.1.0 (TensorRT 10.13.3.9, CUDA 13.0.2). The ``inflight_batcher_llm`` tensor names of
that release (``seed``, ``min_tokens``, ``stop_words_list`` ...) are the ones our templates use.
"""

TRITON_IMAGE_REPOSITORY = "nvcr.io/nvidia/tritonserver"
TRITON_IMAGE_TAG = "26.02-trtllm-python-py3"
TRITON_IMAGE = f"{TRITON_IMAGE_REPOSITORY}:{TRITON_IMAGE_TAG}"
TENSORRT_LLM_VERSION = "1.1.0"


def installed_tensorrt_llm_version() -> "str | None":
    """The version of the installed ``tensorrt_llm`` package, or None when it is not installed."""
    from importlib import metadata  # noqa: PLC0415

    try:
        return metadata.version("tensorrt_llm")
    except metadata.PackageNotFoundError:
        return None


def check_installed() -> str:
    """Fail unless the installed ``tensorrt_llm`` is :data:`TENSORRT_LLM_VERSION`; return that version.

    Run by the Dockerfile (``python3 -m tensorrtllm_backend.pins``) so an image whose base ships
    another TensorRT-LLM fails to build instead of serving engines it cannot load.

    Raises:
        RuntimeError: tensorrt_llm is not installed, or is another version.
    """
    installed = installed_tensorrt_llm_version()
    if installed is None:
        raise RuntimeError(f"tensorrt_llm is not installed; {TRITON_IMAGE} should ship {TENSORRT_LLM_VERSION}")
    if installed != TENSORRT_LLM_VERSION:
        raise RuntimeError(
            f"the base image ships TensorRT-LLM {installed}, but tensorrtllm_backend/pins.py pins "
            f"{TENSORRT_LLM_VERSION} ({TRITON_IMAGE}): update the pin and the Dockerfile's FROM together"
        )
    return installed


if __name__ == "__main__":
    import sys

    try:
        print(f"TensorRT-LLM {check_installed()} matches the pin ({TRITON_IMAGE})")
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
