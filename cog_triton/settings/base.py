"""What every settings group shares: the repository root relative paths are resolved against, the variables'
prefix, and :class:`Group`, the base of the groups."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

REPO_ROOT = Path(__file__).resolve().parents[2]
ENV_PREFIX = "COG_TRITON_"


def resolve(path: Path) -> Path:
    """``path`` resolved against the repository root when it is relative."""
    return path if path.is_absolute() else (REPO_ROOT / path)


class Group(BaseModel):
    """A group of settings: each field is read from ``COG_TRITON_<its validation_alias, else its name>``."""

    model_config = ConfigDict(extra="forbid", validate_default=True, validate_by_name=True, validate_by_alias=True)
