"""Cog training entry (``cog.yaml`` ``train: "train.py:train"``): build a weights archive with ``cog train``.

``cog train -i config=llama-3-8b-instruct-bf16 -i hf_token=...`` on a GPU machine runs
``scripts/build_engine``'s pipeline (the same code, :func:`tensorrtllm_backend.build.build`) inside
this image, so the TensorRT-LLM that builds the engine is the one that serves it, and returns the
archive (engine + tokenizer + manifest.json) as ``weights``: on Replicate the training's output
weights become the new version's ``COG_WEIGHTS``, as replicate/cog-vllm does it.

For a checkpoint served by the PyTorch backend there is nothing to build: a build config with
``backend: pytorch`` (e.g. ``configs/engines/llama-3.1-8b-instruct-pytorch.yaml``) checks that TensorRT-LLM's
PyTorch backend serves the checkpoint (architecture, quantization, safetensors) and packs it as it is, with
manifest.json, into a ``.tar`` (no GPU needed). Serving ``COG_WEIGHTS=hf://owner/repo`` directly needs no
training at all; the archive pins the files and lets setup verify them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import tempfile
from functools import partial
from pathlib import Path as FsPath
from typing import Optional

from cog import BaseModel, Input, Path, Secret

from common.errors import BuildConfigError, FetchRefusedError
from cog_triton.fetch.redaction import errors_redacted
from cog_triton.fetch.rules import FetchRules
from cog_triton.settings import REPO_ROOT, Settings
from tensorrtllm_backend.build_config import NAME_PATTERN

CONFIG_DIR = REPO_ROOT / "configs" / "engines"
OUTPUT_DIR = REPO_ROOT / "build" / "train"


class TrainingOutput(BaseModel):
    """The built archive (``.tar`` engine or ``.tar.gz`` reference checkpoint, manifest.json inside)."""

    weights: Path


def resolve_config(config: str, work: FsPath) -> FsPath:
    """The build config file for ``config``: a name from configs/engines, or a whole YAML document.

    Raises:
        BuildConfigError: the name is unknown (the message lists the known ones).
    """
    text = config.strip()
    if NAME_PATTERN.match(text.removesuffix(".yaml")):
        path = CONFIG_DIR / f"{text.removesuffix('.yaml')}.yaml"
        if path.is_file():
            return path
        known = ", ".join(sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
        raise BuildConfigError(f"config {text!r} is not one of {known}; pass one of them or a whole YAML build config")
    path = work / "config.yaml"
    path.write_text(text + "\n")
    return path


#: What the fetch rules' messages call what a training fetches.
WHAT = "checkpoints"


def fetch_checkpoint(checkpoint: str, work: FsPath, hf_token: Optional[str] = None,
                     rules: Optional[FetchRules] = None) -> str:
    """A Hub id is returned as is (the build's fetch step downloads it); a URL, an archive path or an
    ``hf://owner/repo[@revision]`` reference (only a checkpoint's files, at one commit: cog_triton.weights.hub)
    is fetched here, its folder returned.

    ``rules``: the fetch rules an http(s) URL's download is held to (every redirect and connection); the
    training's input comes from an API caller, as ``lora_weights`` does.

    Raises:
        WeightsError: the download or extraction failed, or the hf:// repository is not a safetensors checkpoint.
        FetchRefusedError: the fetch rules refuse the URL, a redirect or an address it resolves to.
    """
    from cog_triton.weights import fetch_weights  # noqa: PLC0415
    from tensorrtllm_backend.engine import find_model_root  # noqa: PLC0415

    looks_remote = checkpoint.startswith(("http://", "https://", "file://", "hf://"))
    looks_archive = checkpoint.endswith((".tar", ".tar.gz", ".tgz"))
    if not (looks_remote or looks_archive):
        return checkpoint
    target = work / "checkpoint"
    fetch_weights(checkpoint, target, hf_token=hf_token, rules=rules, what=WHAT)
    return str(find_model_root(target).resolve())


def check_hub_owner(config_path: FsPath, checkpoint: str, rules: FetchRules) -> None:
    """Refuse a Hub id (the ``checkpoint`` input's, as ``owner/repo`` or ``hf://owner/repo[@revision]``, else the
    build config's ``source.checkpoint``) whose owner the Hub owner allow-list (COG_TRITON_FETCH_ALLOW_HF_OWNERS)
    does not name. Called before anything is fetched; a URL or a local path has no Hub owner.

    Raises:
        FetchRefusedError: naming the owner and the list. BuildConfigError: the config is invalid.
    """
    from tensorrtllm_backend.build_config import load_build_config  # noqa: PLC0415

    if checkpoint:
        if checkpoint.startswith("hf://"):
            hub_id: Optional[str] = checkpoint[len("hf://"):].partition("@")[0]
        elif (checkpoint.startswith(("http://", "https://", "file://")) or checkpoint.endswith((".tar", ".tar.gz", ".tgz"))
              or FsPath(checkpoint).expanduser().exists()):
            hub_id = None
        else:
            hub_id = checkpoint
    else:
        source = load_build_config(config_path).source
        hub_id = None if source.is_local else source.checkpoint
    refusal = rules.hf_owner_refusal(hub_id, WHAT) if hub_id else None
    if refusal is not None:
        raise FetchRefusedError(f"checkpoint {hub_id}: {refusal}")


async def train(
    config: str = Input(
        description="Build config: the name of one in configs/engines (e.g. llama-3-8b-instruct-bf16, gpt2-medium-fp16) or a whole YAML build config (see README, 'Engines').",  # noqa: E501 - one literal for cog's schema generator
    ),
    checkpoint: str = Input(
        default="",
        description="Replaces the config's source.checkpoint: a Hugging Face Hub id (org/name) or hf://owner/repo[@revision], or an http(s) URL or path of a .tar/.tar.gz of a Hugging Face checkpoint folder.",  # noqa: E501 - one literal for cog's schema generator
    ),
    hf_token: Optional[Secret] = Input(
        default=None, description="Hugging Face token for gated or private checkpoints (Llama, Gemma)."
    ),
) -> TrainingOutput:
    """Build the archive for ``config`` and return it as the training's ``weights``.

    Async (the build runs in a worker thread) because the image sets ``COG_MAX_CONCURRENCY`` > 1,
    which coglet only allows for async entry points.

    Raises:
        CogTritonError: invalid config, no/too few GPUs for an engine, or a failed build step;
            the message says what was wrong and how to fix it.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    token = hf_token.get_secret_value() if hf_token is not None else ""
    with errors_redacted():  # the caller and coglet's log get the message: no URL's secret in it
        archive = await asyncio.to_thread(build_archive, config, checkpoint.strip(), hf_token=token or None)
    return TrainingOutput(weights=Path(archive))


def build_archive(config: str, checkpoint: str = "", hf_token: Optional[str] = None) -> FsPath:
    """The blocking body of :func:`train`: resolve the config, fetch the checkpoint, build; return the archive.

    Args:
        hf_token: Hugging Face token for this build only: it is put into the environment of this
            build's steps (``HF_TOKEN``, which ``tensorrtllm_backend.convert`` passes to
            ``snapshot_download(token=...)``), never into this process's ``os.environ``, so a later
            training without a token does not inherit it.

    Raises:
        BuildConfigError, BuildError, WeightsError: see :func:`tensorrtllm_backend.build.build`.
        FetchRefusedError: the fetch rules (COG_TRITON_FETCH_*) refuse the checkpoint's URL or Hub owner.
        ConfigError: a COG_TRITON_* setting is invalid.
    """
    from tensorrtllm_backend.build import build, run_subprocess  # noqa: PLC0415 - keeps the worker's start fast

    runner = run_subprocess if not hf_token else partial(run_subprocess, env={**os.environ, "HF_TOKEN": hf_token})
    OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cog-triton-train-", dir=OUTPUT_DIR) as scratch:
        work = FsPath(scratch)
        config_path = resolve_config(config, work)
        rules = FetchRules.from_settings(Settings.from_env())
        check_hub_owner(config_path, checkpoint, rules)
        override = fetch_checkpoint(checkpoint, work, hf_token, rules) if checkpoint else None
        return build(
            config_path, work_dir=work / "build", output_dir=OUTPUT_DIR, checkpoint=override, runner=runner
        ).archive
