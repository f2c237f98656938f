"""setup()'s first step: read the machine and the weights, once, into :class:`Facts` for the plan
(:func:`cog_triton.worker.planning.plan_serving`, which reads nothing itself).

What is read: the visible GPUs (``nvidia-smi``), the weights' manifest.json (verified: files hashed, TensorRT-LLM
version, GPU count and compute capability), the weights' own description
(:func:`tensorrtllm_backend.engine.inspect_weights`), a checkpoint's files beside its weights
(:func:`tensorrtllm_backend.checkpoint.check_checkpoint_files`), the CPUs this process may run on (its affinity) and
whether the xgrammar package is installed.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from common.errors import IncompatibleWeightsError, ManifestError
from cog_triton.settings import Settings, VerifyMode
from tensorrtllm_backend.checkpoint import check_checkpoint_files
from tensorrtllm_backend.engine import WeightsInfo, find_model_root, inspect_weights
from tensorrtllm_backend.gpus import GPU, visible_gpus
from tensorrtllm_backend.manifest import MANIFEST_NAME, Manifest, check_weights_match, reference_lora, verify_weights

# The setup's lines keep the logger name they have always had (what coglet's log shows).
log = logging.getLogger("cog_triton.worker.service")


@dataclass(frozen=True)
class Facts:
    """What setup found on this machine (see the module docstring).

    Attributes:
        info: the weights as inspected (limits in tokens, LoRA support, world size).
        manifest: their verified manifest.json, or None when there is none.
        gpus: the GPUs visible to this process.
        cpus: the CPUs this process may run on (its affinity; every CPU where that cannot be read).
        xgrammar: the xgrammar package is installed (guided decoding can be rendered on).
        checkpoint_files_refusal: for a Hugging Face checkpoint, what its folder's files beside the weights make
            the PyTorch backend refuse (:func:`tensorrtllm_backend.checkpoint.check_checkpoint_files`, with
            ``COG_TRITON_LLM_TRUST_REMOTE_CODE``); None: nothing (or weights that are an engine). The plan raises it
            if it chooses the PyTorch backend.
    """

    info: WeightsInfo
    manifest: Optional[Manifest]
    gpus: tuple[GPU, ...]
    cpus: int
    xgrammar: bool
    checkpoint_files_refusal: Optional[IncompatibleWeightsError] = None


def reference_limits(settings: Settings, manifest: Optional[Manifest]) -> dict[str, Optional[int]]:
    """Limits of the CPU reference backend: each ``COG_TRITON_REFERENCE_*`` setting that is set wins,
    else the ``limits`` of the archive's build config (reference-backend manifests), else the defaults.

    Returns:
        ``reference_max_batch_size`` (requests), ``reference_max_seq_len`` and
        ``reference_max_input_len`` (tokens; None = derive from the checkpoint), as
        :func:`tensorrtllm_backend.engine.inspect_weights` takes them.
    """
    packed = manifest.build_config.get("limits", {}) if manifest and manifest.backend == "reference" else {}
    reference = settings.reference
    batch = reference.max_batch_size
    if "max_batch_size" not in reference.model_fields_set and isinstance(packed.get("max_batch_size"), int):
        batch = packed["max_batch_size"]
    return {
        "reference_max_batch_size": batch,
        "reference_max_seq_len": reference.max_seq_len or packed.get("max_seq_len"),
        "reference_max_input_len": reference.max_input_len or packed.get("max_input_len"),
    }


def usable_cpus() -> int:
    """The CPUs this process may run on (``os.sched_getaffinity``; ``os.cpu_count`` where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def gather_facts(settings: Settings, reused: bool = False) -> Facts:
    """Read the machine and the weights in ``settings.weights.path`` (fetched already).

    ``reused``: the fetch was skipped; with COG_TRITON_VERIFY_WEIGHTS=fast (the default) files unchanged in size and
    mtime since the last successful full check are not hashed again.

    Raises:
        ManifestError: missing/resized/altered files, or no manifest with require_manifest set.
        IncompatibleWeightsError: other TensorRT-LLM version, too few GPUs, other compute capability.
        ConfigError: unusable weights metadata (:func:`tensorrtllm_backend.engine.inspect_weights`).
    """
    gpus = visible_gpus()
    manifest = verify(find_model_root(settings.weights.path), gpus, settings, reused)
    info = inspect_weights(
        settings.weights.path,
        tokenizer_dir=settings.path(settings.tokenizer.dir) if settings.tokenizer.dir else None,
        **reference_limits(settings, manifest),
        **reference_lora(manifest),
    )
    check_weights_match(info, manifest, gpus)
    refusal = None
    if info.kind == "hf_checkpoint":
        try:
            check_checkpoint_files(info, settings.llm.trust_remote_code)
        except IncompatibleWeightsError as exc:
            refusal = exc
    return Facts(info, manifest, tuple(gpus), usable_cpus(), importlib.util.find_spec("xgrammar") is not None,
                 refusal)


def verify(root: Path, gpus: list[GPU], settings: Settings, reused: bool = False) -> Optional[Manifest]:
    """Verify the weights in ``root`` against their manifest.json before Triton starts (see :func:`gather_facts`).

    Raises:
        ManifestError: missing/resized/altered files, or no manifest with require_manifest set.
        IncompatibleWeightsError: other TensorRT-LLM version, too few GPUs, other compute capability.
    """
    trust = reused and settings.weights.verify is VerifyMode.FAST
    verification = verify_weights(root, gpus, trust_record=trust)
    if verification is None:
        if settings.weights.require_manifest:
            raise ManifestError(
                f"no {MANIFEST_NAME} in {root} and COG_TRITON_REQUIRE_MANIFEST is set: package the weights "
                "with scripts/build_engine, or unset COG_TRITON_REQUIRE_MANIFEST"
            )
        log.warning(
            "no %s in %s: file integrity and GPU compatibility are not verified (package with scripts/build_engine)",
            MANIFEST_NAME,
            root,
        )
        return None
    manifest = verification.manifest
    log.info(
        "verified %d files of %s (%s backend, world size %d%s) against %s in %.1f s",
        len(manifest.files),
        manifest.name,
        manifest.backend,
        manifest.world_size,
        f", TensorRT-LLM {manifest.tensorrt_llm_version}" if manifest.tensorrt_llm_version else "",
        MANIFEST_NAME,
        verification.seconds,
    )
    return manifest


__all__ = ("Facts", "gather_facts", "reference_limits", "usable_cpus", "verify")
