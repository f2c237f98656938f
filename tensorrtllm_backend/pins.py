"""The one place where the serving image and its TensorRT-LLM version are pinned.

The Dockerfile's ``FROM`` line, the model-repository templates (tensor names) and engine checks
all follow these values; ``tests/test_packaging.py`` fails when the Dockerfile drifts from them.

Source of the pairing: Triton's compatibility matrix (triton-inference-server/server,
docs/introduction/compatibility.md @ r26.07 819ee377): NGC ``tritonserver:26.07-trtllm-python-py3`` is
Triton 2.71.0 (``TRITON_VERSION`` @ r26.07) with TensorRT-LLM 1.2.1, TensorRT 10.14.1.48, CUDA 13.1.0.036
(driver 590.44.01), Python 3.12.3 and torch 2.10.0a0+b4e4ee81d3.nv25.12. TensorRT-LLM 1.2.1 is the tag
``v1.2.1`` (commit 376f7e1b); its ``inflight_batcher_llm`` tensor names (``seed``, ``min_tokens``,
``stop_words_list`` ...) are those of 1.1.0, re-audited in docs/engines.md ("TensorRT-LLM 1.2.1 re-audit").
"""

import re
from typing import Mapping

TRITON_IMAGE_REPOSITORY = "nvcr.io/nvidia/tritonserver"
TRITON_IMAGE_TAG = "26.07-trtllm-python-py3"
TRITON_IMAGE = f"{TRITON_IMAGE_REPOSITORY}:{TRITON_IMAGE_TAG}"
TENSORRT_LLM_VERSION = "1.2.1"
# The Triton release in that image (server TRITON_VERSION @ r26.07). Its build sets TRITON_SERVER_VERSION in
# the image's environment (server build.py @ r26.07, dockerfile_prepare_container_linux), which
# :func:`check_triton_server` compares at image build time.
TRITON_SERVER_VERSION = "2.71.0"
# The xgrammar release TensorRT-LLM 1.2.1 depends on: NVIDIA/TensorRT-LLM PR #12016 (merged 2026-03-09)
# raised requirements.txt and 3rdparty/fetch_content.json from xgrammar 0.1.25 to 0.1.32, and PR #12811
# (2026-04-07, before the v1.2.1 tag of 2026-04-16) bumped it to 0.1.32 with its build patches. The nearest
# stored requirements.txt (@000867d9, late 2025: transformers 4.57.1, tensorrt 10.13.3) still has 0.1.25 and
# none is stored at 376f7e1b, so `pip show xgrammar` in the image confirms it (docs/engines.md). The GPU
# image ships it with tensorrt_llm; scripts/setup installs the same release for the CPU reference backend
# and the predictor's guide checks (cog_triton/streaming/guided.py), so guides compile identically.
XGRAMMAR_VERSION = "0.1.32"
# The Hugging Face libraries of the GPU image's Python, as far as our Hub code sees them: that requirements.txt
# (@000867d9) pins transformers 4.57.1, whose METADATA requires huggingface-hub>=0.34.0,<1.0 and
# tokenizers>=0.22.0,<=0.23.0, so the image has a huggingface_hub 0.x (over requests) where this venv has 2.x
# (over httpx2); `pip show huggingface_hub` in the image gives the exact one. scripts/setup installs these beside
# .venv, into build/hub0 (--no-deps: the rest is in .venv), and tests/test_weights_hub_0x.py runs the Hub tests
# with that folder first on PYTHONPATH. huggingface_hub 0.36.0 is the release the 0.x defects were found with
# (0.36.2 is the last 0.x).
HUB0_PACKAGES = ("huggingface_hub==0.36.0", "transformers==4.57.1", "tokenizers==0.22.1")
HUB0_DIR = "build/hub0"

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

    "1.2.1" equals "1.2.1.2607" and "1.2.1.post1"; "1.2.1" differs from "1.2.1rc5" and "1.2.0".
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


def release_name(version: str) -> str:
    """The release a version string names, without build suffix ("1.2.1.2607" -> "1.2.1"); unparsable ones as given."""
    release = release_of(version)
    return version.strip() if release is None else ".".join(str(part) for part in release)


def describe_version(version: str) -> str:
    """The version as reported, with its release when a build suffix hides it ("1.0.3.2510 (release 1.0.3)")."""
    if release_of(version) is None:
        return version
    plain = release_name(version)
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


def check_triton_server(environ: "Mapping[str, str]") -> "str | None":
    """Fail when the image's ``TRITON_SERVER_VERSION`` is set and is not :data:`TRITON_SERVER_VERSION`.

    Returns the version found, or None when the variable is not set (a base image that does not set it
    is not refused for that alone; the TensorRT-LLM check still runs).

    Raises:
        RuntimeError: the image reports another Triton release.
    """
    found = environ.get("TRITON_SERVER_VERSION", "").strip()
    if not found:
        return None
    if found != TRITON_SERVER_VERSION:
        raise RuntimeError(
            f"the base image reports Triton {found} (TRITON_SERVER_VERSION), but tensorrtllm_backend/pins.py pins "
            f"Triton {TRITON_SERVER_VERSION} ({TRITON_IMAGE}): update the pin and the Dockerfile's FROM together"
        )
    return found


if __name__ == "__main__":
    import os
    import sys

    try:
        triton = check_triton_server(os.environ)
        print(f"TensorRT-LLM {check_installed()} matches the pin ({TRITON_IMAGE})")
        if triton is not None:
            print(f"Triton {triton} matches the pin")
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
