"""Settings of the weights: which, where they are unpacked, how they are checked, and how they are downloaded."""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import Optional

from pydantic import Field, field_validator

from cog_triton.fetch.deadline import (
    DEFAULT_DOWNLOAD_DEADLINE_S,
    DEFAULT_DOWNLOAD_MIN_RATE_BYTES_S,
    DEFAULT_DOWNLOAD_RATE_GRACE_S,
)
from cog_triton.settings.base import Group, resolve


class VerifyMode(str, Enum):
    """How setup checks weights it reuses against their manifest.json (weights it just fetched are
    always hashed in full)."""

    FAST = "fast"  # hash only files whose size or mtime changed since the last successful full hash
    FULL = "full"  # hash every file on every setup


class WeightsSettings(Group):
    """The weights: which, where they are unpacked, and how they are checked."""

    source: Optional[str] = Field(
        default=None,
        validation_alias="weights",
        description="Default weights when setup() gets none: http(s)/file URL or local path to a "
        ".tar/.tar.gz archive or a directory, or hf://owner/repo[@revision] (a Hugging Face checkpoint fetched "
        "from the Hub with HF_TOKEN). Cog's COG_WEIGHTS is used when this is unset.",
    )
    sha256: Optional[str] = Field(
        default=None, validation_alias="weights_sha256",
        description="Expected sha256 (hex) of the weights archive; checked when set."
    )
    dir: Path = Field(
        default=Path("triton_model_repo/tensorrt_llm/1"),
        validation_alias="weights_dir",
        description="Where weights are unpacked: engine files (rank*.engine + config.json) or a "
        "Hugging Face checkpoint, plus tokenizer files.",
    )
    require_manifest: bool = Field(
        default=False,
        description="Refuse weights without manifest.json (archives from scripts/build_engine always have one; "
        "with it, files, TensorRT-LLM version, world size and GPU compute capability are verified).",
    )
    max_extracted_bytes: Optional[int] = Field(
        default=None,
        ge=1,
        description="Most bytes an archive may unpack to; default: its manifest.json's file sizes plus 1 MiB, "
        "without one 20 times the archive's size, at least 1 GiB.",
    )
    verify: VerifyMode = Field(
        default=VerifyMode.FAST,
        validation_alias="verify_weights",
        description="Reused weights: 'fast' hashes only files whose size or mtime changed since the last full "
        "check; 'full' hashes every file on every setup. Freshly fetched weights are always hashed in full.",
    )

    @field_validator("source", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("sha256")
    @classmethod
    def _check_sha256(cls, value: Optional[str]) -> Optional[str]:
        if value is None or value == "":
            return None
        value = value.strip().lower()
        if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
            raise ValueError("must be 64 hexadecimal characters")
        return value

    @property
    def path(self) -> Path:
        """Absolute ``dir``."""
        return resolve(self.dir)

    def default_source(self) -> Optional[str]:
        """The weights to use when setup() is given none: ``source``, else Cog's ``COG_WEIGHTS`` (read now)."""
        return self.source or os.environ.get("COG_WEIGHTS") or None


class DownloadSettings(Group):
    """Network fetches of the weights (all of these) and of LoRA adapters (all but the deadline)."""

    timeout_s: float = Field(default=60.0, gt=0, validation_alias="download_timeout_s",
                             description="Connect/read timeout per network operation.")
    retries: int = Field(default=3, ge=0, le=20, validation_alias="download_retries",
                         description="Retries on connection errors and 5xx.")
    # the defaults equal cog_triton.weights.DEFAULT_DOWNLOAD_* (tests/test_settings.py checks)
    deadline_s: float = Field(default=DEFAULT_DOWNLOAD_DEADLINE_S, ge=0, validation_alias="download_deadline_s",
        description="Deadline of the weights' whole fetch, "
        "enforced from outside the reads: connections, TLS, headers, body, redirects, retries, hf:// too; 0: none.")
    min_rate_bytes_s: int = Field(
        default=DEFAULT_DOWNLOAD_MIN_RATE_BYTES_S, ge=0, validation_alias="download_min_rate_bytes_s",
        description="An attempt slower than this (bytes/s) over the grace window fails; 0: off."
    )
    rate_grace_s: float = Field(
        default=DEFAULT_DOWNLOAD_RATE_GRACE_S, gt=0, le=86400, validation_alias="download_rate_grace_s",
        description="Window (seconds) over which the download rate is measured."
    )
