"""Stand-ins for GPU hardware, which this machine does not have (the only thing mocked).

:func:`fake_nvidia_smi` writes an executable ``nvidia-smi`` that prints the rows it is given in the
format of ``nvidia-smi --query-gpu=index,uuid,name,compute_cap --format=csv,noheader`` (and checks
that it was asked exactly that), so the real probe code runs as a real subprocess.
"""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path

from tensorrtllm_backend.gpus import GPU

H100 = ("NVIDIA H100 80GB HBM3", "9.0")
A100 = ("NVIDIA A100-SXM4-80GB", "8.0")
L4 = ("NVIDIA L4", "8.9")


def gpus(count: int, kind: tuple[str, str] = H100) -> list[GPU]:
    """``count`` GPU records of one kind, indices 0..count-1."""
    return [GPU(index=i, uuid=f"GPU-{i:08d}-aaaa", name=kind[0], compute_capability=kind[1]) for i in range(count)]


def fake_nvidia_smi(folder: Path, rows: list[GPU], exit_code: int = 0, stderr: str = "") -> Path:
    """Write ``folder/nvidia-smi`` printing ``rows``; return ``folder`` (put it first on PATH)."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = "".join(f"{g.index}, {g.uuid}, {g.name}, {g.compute_capability}\n" for g in rows)
    script = folder / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        '[ "$1" = "--query-gpu=index,uuid,name,compute_cap" ] && [ "$2" = "--format=csv,noheader" ] '
        '|| { echo "unexpected arguments: $*" >&2; exit 64; }\n'
        f"printf '%s' {shlex.quote(stderr)} >&2\n"
        f"printf '%s' {shlex.quote(lines)}\n"
        f"exit {exit_code}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


def path_with(folder: Path) -> str:
    """PATH with ``folder`` first."""
    return f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"
