"""Process helpers for tests: find processes by their command line (Linux /proc)."""

from __future__ import annotations

from pathlib import Path


def pids_mentioning(*texts: str) -> list[int]:
    """PIDs whose command line contains every one of ``texts``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:  # the process ended while we looked
            continue
        if all(text in cmdline for text in texts):
            pids.append(int(entry.name))
    return pids
