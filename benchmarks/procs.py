"""Processes as /proc shows them: the stack's process tree by role, CPU ticks, RSS, machine load.

Part of ``scripts/benchmark`` (:mod:`benchmarks.harness`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

log = logging.getLogger("benchmark")


def _read_stat(pid: int) -> Optional[tuple[int, int]]:
    """(ppid, utime + stime in clock ticks) of ``pid``, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[11]) + int(fields[12])


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")[:-1]
    except OSError:
        return []


def rss_bytes(pid: int) -> Optional[int]:
    """Resident set size of ``pid`` (VmRSS), or None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (by parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _read_stat(int(entry.name))
            if stat is not None:
                children.setdefault(stat[0], []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def role_of(pid: int, root: int) -> str:
    """A process's name in the report: cog_server, cog_worker, tritonserver, stub:<model>, other:<exe>."""
    if pid == root:
        return "cog_server"
    cmd = _cmdline(pid)
    if not cmd:  # a zombie (e.g. a killed backend stub its parent has not reaped) or a kernel thread
        try:
            raw = Path(f"/proc/{pid}/stat").read_text()
            return f"defunct:{raw[raw.index('(') + 1:raw.rindex(')')]}"
        except (OSError, ValueError):
            return f"other:{pid}"
    exe = Path(cmd[0]).name
    if "triton_python_backend_stub" in exe:
        model_py = next((a for a in cmd[1:] if a.endswith("model.py")), "")
        return f"stub:{Path(model_py).parent.parent.name}" if model_py else "stub:?"
    if exe == "tritonserver":
        return "tritonserver"
    if "cog_triton.streaming.streamer" in cmd:  # the predictor's stream processes (cog_triton.worker.stream_pool)
        return "stream_proc"
    if "-c" in cmd and "coglet" in " ".join(cmd):
        return "cog_worker"
    if "-c" in cmd and "-I" in cmd:  # tensorrtllm_backend.server's guardian of Triton's process group
        return "triton_guardian"
    return f"other:{exe}"


def server_processes(root: int) -> dict[str, list[int]]:
    """role -> pids of the Cog server's process tree."""
    roles: dict[str, list[int]] = {}
    for pid in descendants(root):
        roles.setdefault(role_of(pid, root), []).append(pid)
    return roles


def cpu_ticks(pids: Iterable[int]) -> int:
    total = 0
    for pid in pids:
        stat = _read_stat(pid)
        if stat is not None:
            total += stat[1]
    return total


def machine_busy_ticks() -> tuple[int, int, int]:
    """(busy, total, steal) clock ticks of all CPUs from /proc/stat. Steal (a virtual machine's CPUs taken by
    its host for others) is not counted as busy: it is time this machine's processes could not run."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    steal = values[7] if len(values) > 7 else 0
    total = sum(values[:8])
    return total - idle - steal, total, steal


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


@dataclass
class CpuSnapshot:
    at: float
    ticks: dict[str, int]
    pids: dict[str, list[int]]
    machine_busy: int
    machine_total: int
    pid_ticks: dict[int, int]
    machine_steal: int = 0


def snapshot(roles: dict[str, list[int]]) -> CpuSnapshot:
    busy, total, steal = machine_busy_ticks()
    pid_ticks = {pid: cpu_ticks([pid]) for pids in roles.values() for pid in pids}
    ticks = {r: sum(pid_ticks[pid] for pid in p) for r, p in roles.items()}
    return CpuSnapshot(time.monotonic(), ticks, roles, busy, total, pid_ticks, steal)
