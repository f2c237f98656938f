"""Cog training entry (``cog.yaml`` ``train: "train.py:train"``): build a weights archive with ``cog train``.

``cog train -i config=llama-3-8b-instruct-bf16 -i hf_token=...`` on a GPU machine runs
``scripts/build_engine``'s pipeline (the same code, :func:`tensorrtllm_backend.build.build`) inside
this image, so the TensorRT-LLM that builds the engine is the one that serves it, and returns the
archive (engine + tokenizer + manifest.json) as ``weights``: on Replicate the training's output
weights become the new version's ``COG_WEIGHTS``, as replicate/cog-vllm does it.
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
from cog_triton.fetch_rules import FetchRules
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


def fetch_checkpoint(checkpoint: str, work: FsPath, rules: Optional[FetchRules] = None) -> str:
    """A Hub id is returned as is; a URL or archive path is fetched and unpacked, its folder returned.

    ``rules``: the fetch rules an http(s) URL's download is held to (every redirect and connection); the
    training's input comes from an API caller, as ``lora_weights`` does.

    Raises:
        WeightsError: the download or extraction failed.
        FetchRefusedError: the fetch rules refuse the URL, a redirect or an address it resolves to.
    """
    from cog_triton.weights import fetch_weights  # noqa: PLC0415
    from tensorrtllm_backend.engine import find_model_root  # noqa: PLC0415

    looks_remote = checkpoint.startswith(("http://", "https://", "file://"))
    looks_archive = checkpoint.endswith((".tar", ".tar.gz", ".tgz"))
    if not (looks_remote or looks_archive):
        return checkpoint
    target = work / "checkpoint"
    fetch_weights(checkpoint, target, rules=rules, what=WHAT)
    return str(find_model_root(target).resolve())


def check_hub_owner(config_path: FsPath, override: Optional[str], rules: FetchRules) -> None:
    """Refuse a Hub id (the ``checkpoint`` input's, else the build config's ``source.checkpoint``) whose owner the
    Hub owner allow-list (COG_TRITON_FETCH_ALLOW_HF_OWNERS) does not name.

    Raises:
        FetchRefusedError: naming the owner and the list. BuildConfigError: the config is invalid.
    """
    from tensorrtllm_backend.build_config import load_build_config  # noqa: PLC0415

    if override is not None:
        hub_id = None if FsPath(override).expanduser().is_dir() else override
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
        description="Replaces the config's source.checkpoint: a Hugging Face Hub id (org/name), or an http(s) URL or path of a .tar/.tar.gz of a Hugging Face checkpoint folder.",  # noqa: E501 - one literal for cog's schema generator
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
        override = fetch_checkpoint(checkpoint, work, rules) if checkpoint else None
        check_hub_owner(config_path, override, rules)
        return build(
            config_path, work_dir=work / "build", output_dir=OUTPUT_DIR, checkpoint=override, runner=runner
        ).archive
