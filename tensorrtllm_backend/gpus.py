"""The GPUs this process can use, as ``nvidia-smi`` reports them.

``nvidia-smi --query-gpu=index,uuid,name,compute_cap --format=csv,noheader`` lists every GPU of
the host (``compute_cap`` needs driver 510 or later); ``nvidia-smi`` ignores
``CUDA_VISIBLE_DEVICES``, so the list is filtered here the way the CUDA runtime does it
(comma-separated indices or ``GPU-`` UUID prefixes; the list ends at the first entry that names no
GPU; an empty value hides every GPU). No ``nvidia-smi`` on ``PATH`` means no GPU.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Mapping, Optional

from common.errors import ConfigError

log = logging.getLogger(__name__)

QUERY = ("index", "uuid", "name", "compute_cap")


@dataclass(frozen=True)
class GPU:
    """One GPU: ``index`` as nvidia-smi numbers it, ``compute_capability`` as "major.minor"."""

    index: int
    uuid: str
    name: str
    compute_capability: str

    @property
    def capability(self) -> tuple[int, int]:
        """Compute capability as (major, minor), e.g. (9, 0) for H100."""
        major, _, minor = self.compute_capability.partition(".")
        return int(major), int(minor or 0)


def parse_nvidia_smi(output: str) -> list[GPU]:
    """Parse ``nvidia-smi --query-gpu=index,uuid,name,compute_cap --format=csv,noheader`` output.

    Raises:
        ConfigError: a line does not have the four fields or a number is malformed.
    """
    gpus = []
    for row in csv.reader(io.StringIO(output), skipinitialspace=True):
        if not row or not "".join(row).strip():
            continue
        if len(row) != len(QUERY):
            raise ConfigError(f"unexpected nvidia-smi output line {','.join(row)!r}: expected {', '.join(QUERY)}")
        index, uuid, name, cap = (field.strip() for field in row)
        try:
            gpu = GPU(index=int(index), uuid=uuid, name=name, compute_capability=cap)
            gpu.capability  # noqa: B018 - validates the number
        except ValueError:
            raise ConfigError(f"unexpected nvidia-smi output line {','.join(row)!r}: bad index or compute_cap") from None
        gpus.append(gpu)
    return gpus


def filter_visible(gpus: list[GPU], cuda_visible_devices: Optional[str]) -> list[GPU]:
    """Apply ``CUDA_VISIBLE_DEVICES`` (None = unset = all GPUs) the way the CUDA runtime does."""
    if cuda_visible_devices is None:
        return list(gpus)
    visible: list[GPU] = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        match: Optional[GPU] = None
        if entry.isdigit():
            match = next((g for g in gpus if g.index == int(entry)), None)
        elif entry:
            prefix = entry if entry.startswith("GPU-") else None
            candidates = [g for g in gpus if prefix and g.uuid.startswith(prefix)]
            match = candidates[0] if len(candidates) == 1 else None
        if match is None or match in visible:
            break  # CUDA stops at the first invalid entry
        visible.append(match)
    return visible


def visible_gpus(env: Optional[Mapping[str, str]] = None, timeout_s: float = 30.0) -> list[GPU]:
    """The GPUs this process may use, in CUDA's order (empty when there is no NVIDIA driver).

    Raises:
        ConfigError: ``nvidia-smi`` exists but fails (driver problem); the message has its output.
    """
    env = os.environ if env is None else env
    binary = shutil.which("nvidia-smi", path=env.get("PATH"))
    if binary is None:
        return []
    try:
        result = subprocess.run(
            [binary, f"--query-gpu={','.join(QUERY)}", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"nvidia-smi failed: {exc}") from None
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip()
        if "No devices were found" in detail:
            return []
        raise ConfigError(f"nvidia-smi exited with {result.returncode}: {detail[-500:]}")
    gpus = parse_nvidia_smi(result.stdout)
    return filter_visible(gpus, env.get("CUDA_VISIBLE_DEVICES"))


def describe(gpus: list[GPU]) -> str:
    """Human summary, e.g. ``2 GPUs (0: NVIDIA H100 80GB HBM3, sm 9.0; 1: ...)`` or ``no GPU``."""
    if not gpus:
        return "no GPU"
    parts = "; ".join(f"{g.index}: {g.name}, compute capability {g.compute_capability}" for g in gpus)
    return f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''} ({parts})"
