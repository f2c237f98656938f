"""Process helpers for tests: find processes by their command line (Linux /proc)."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path
from typing import Iterable, Optional, Sequence

from tensorrtllm_backend.server import TritonServer


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


def descendants_of(root: int) -> set[int]:
    """Every live process below ``root`` (by parent pid, /proc/<pid>/stat)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(raw[raw.rindex(")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


_pid_alive = TritonServer.process_alive  # one /proc reading of liveness, the server's own


def wait_for_pids_gone(pids: Sequence[int], timeout_s: float) -> bool:
    """True once none of ``pids`` exists (zombies count as gone), within ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(_pid_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return not any(_pid_alive(p) for p in pids)


def stop_at_once(server: TritonServer) -> None:
    """Stop a Triton a fixture started, at once: SIGKILL of its process group, then its shared-memory regions
    removed (:meth:`TritonServer.stop` with no grace).

    For fixtures whose tests are not about stopping (tests/test_server.py covers the graceful stop): after SIGINT,
    Triton waits for its in-flight requests and then its models' unloading in a loop that looks once a second
    (``InferenceServer::Stop``, triton-inference-server/core src/server.cc @2e347f08), which takes a Triton with
    the reference model 3-5 s here.
    """
    server.stop(timeout_s=0)


def listening_on(port: int) -> list[tuple[str, int]]:
    """(local address, socket inode) of every TCP socket listening on ``port``, IPv4 and IPv6, as the kernel lists
    them (/proc/net/tcp and tcp6: state 0A is LISTEN; addresses are hex in host byte order per 32-bit word)."""
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, _, hex_port = fields[1].partition(":")
            if fields[3] != "0A" or int(hex_port, 16) != port:
                continue
            words = [int(address[i:i + 8], 16) for i in range(0, len(address), 8)]
            packed = b"".join(struct.pack("<I", word) for word in words)
            found.append((socket.inet_ntop(family, packed), int(fields[9])))
    return found


def pid_holding_socket(inode: int, pids: Iterable[int]) -> Optional[int]:
    """The first of ``pids`` that has the socket ``inode`` open (/proc/<pid>/fd links read ``socket:[inode]``)."""
    target = f"socket:[{inode}]"
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if str(fd.readlink()) == target:
                    return pid
            except OSError:
                continue
    return None


def thread_count(pid: int) -> int:
    """The threads of process ``pid`` (/proc/<pid>/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise ValueError(f"no Threads line for {pid}")
