"""The one place where the serving image and its TensorRT-LLM version are pinned.

The Dockerfile's ``FROM`` line, the model-repository templates (tensor names) and engine checks
all follow these values; ``tests/test_packaging.py`` fails when the Dockerfile drifts from them.

Source of the pairing: Triton's compatibility matrix (triton-inference-server/server,
docs/introduction/compatibility.md): NGC ``tritonserver:26.02-trtllm-python-py3`` ships
TensorRT-LLM 1.1.0 (TensorRT 10.13.3.9, CUDA 13.0.2). The ``inflight_batcher_llm`` tensor names of
that release (``seed``, ``min_tokens``, ``stop_words_list`` ...) are the ones our templates use.
"""

import re

TRITON_IMAGE_REPOSITORY = "nvcr.io/nvidia/tritonserver"
TRITON_IMAGE_TAG = "26.02-trtllm-python-py3"
TRITON_IMAGE = f"{TRITON_IMAGE_REPOSITORY}:{TRITON_IMAGE_TAG}"
TENSORRT_LLM_VERSION = "1.1.0"
# The xgrammar release TensorRT-LLM 1.1 depends on (its docs/source/release-notes.md, "Release 1.1":
# "The dependent xgrammar version is updated to 0.1.25"; requirements.txt xgrammar==0.1.25). The GPU
# image ships it with tensorrt_llm; scripts/setup installs the same release for the CPU reference
# backend and the predictor's guide checks (cog_triton/guided.py), so guides compile identically.
XGRAMMAR_VERSION = "0.1.25"

_VERSION_RE = re.compile(r"^\s*v?(\d+)\.(\d+)\.(\d+)(.*?)\s*$")
# What may follow major.minor.patch without making another release: NGC builds append the
# container's year and month ("1.0.3.2510" in tritonserver 25.11, Triton's compatibility matrix),
# and PEP 440 allows post and local labels. A pre-release (rc, a, b, dev) is another release.
_BUILD_SUFFIX_RE = re.compile(r"^((\.\d+)*|\.post\d+|\+[\w.]+)$")


def release_of(version: str) -> "tuple[int, int, int] | None":
    """(major, minor, patch) of a TensorRT-LLM version string, or None when it has no such prefix.

    Build suffixes are ignored ("1.0.3.2510" -> (1, 0, 3)); pre-releases keep their place in
    :func:`same_release`, which compares them whole.
    """
    match = _VERSION_RE.match(version)
    return (int(match.group(1)), int(match.group(2)), int(match.group(3))) if match else None


def same_release(a: str, b: str) -> bool:
    """True when two TensorRT-LLM version strings name the same release.

    "1.1.0" equals "1.1.0.2601" and "1.1.0.post1"; "1.1.0" differs from "1.1.0rc5" and "1.2.0".
    Strings without a major.minor.patch prefix are compared as they are.
    """
    ma, mb = _VERSION_RE.match(a), _VERSION_RE.match(b)
    if not ma or not mb:
        return a.strip() == b.strip()
    if ma.groups()[:3] != mb.groups()[:3]:
        return False
    suffix_a, suffix_b = ma.group(4), mb.group(4)
    if _BUILD_SUFFIX_RE.match(suffix_a) and _BUILD_SUFFIX_RE.match(suffix_b):
        return True
    return suffix_a == suffix_b


def describe_version(version: str) -> str:
    """The version as reported, with its release when a build suffix hides it ("1.0.3.2510 (release 1.0.3)")."""
    release = release_of(version)
    if release is None:
        return version
    plain = ".".join(str(part) for part in release)
    return version if version.strip() == plain else f"{version} (release {plain})"


def installed_tensorrt_llm_version() -> "str | None":
    """The version of the installed ``tensorrt_llm`` package, or None when it is not installed."""
    from importlib import metadata  # noqa: PLC0415

    try:
        return metadata.version("tensorrt_llm")
    except metadata.PackageNotFoundError:
        return None


def check_installed() -> str:
    """Fail unless the installed ``tensorrt_llm`` is :data:`TENSORRT_LLM_VERSION`; return that version.

    Versions are compared by release (:func:`same_release`), since NGC builds report suffixed
    versions. Run by the Dockerfile (``python -m tensorrtllm_backend.pins``) so an image whose base ships
    another TensorRT-LLM fails to build instead of serving engines it cannot load.

    Raises:
        RuntimeError: tensorrt_llm is not installed, or is another version.
    """
    installed = installed_tensorrt_llm_version()
    if installed is None:
        raise RuntimeError(f"tensorrt_llm is not installed; {TRITON_IMAGE} should ship {TENSORRT_LLM_VERSION}")
    if not same_release(installed, TENSORRT_LLM_VERSION):
        raise RuntimeError(
            f"the base image ships TensorRT-LLM {describe_version(installed)}, but tensorrtllm_backend/pins.py pins "
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
