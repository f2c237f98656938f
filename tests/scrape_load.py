"""Clients that loop ``GET /metrics`` as fast as they are answered, in a process of their own (so that they take
none of the test process's interpreter lock from the scraper it measures).

``python -m tests.scrape_load HOST PORT CLIENTS``: CLIENTS connections at a time, each one request (raw HTTP/1.1,
``Connection: close``), read to its end, then the next; it prints ``ready`` once every client has been answered
once (or failed once), runs until its standard input closes, then prints one JSON line: ``answered`` (complete 200
answers), ``failed`` (reset, refused, cut short or another status) and ``seconds``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

REQUEST = b"GET /metrics HTTP/1.1\r\nHost: load\r\nConnection: close\r\n\r\n"


async def _client(host: str, port: int, counts: dict[str, int], first: asyncio.Event, started: list[int],
                  clients: int, stop: asyncio.Event) -> None:
    once = False
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(REQUEST)
            data = await reader.read()  # to the end: the server closes after its answer
            writer.close()
            ok = data.startswith(b"HTTP/1.1 200 ") and b"\r\n\r\n" in data
            if ok:
                head, _, body = data.partition(b"\r\n\r\n")
                length = [line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
                ok = bool(length) and int(length[0].split(b":")[1]) == len(body)
        except OSError:
            ok = False
        counts["answered" if ok else "failed"] += 1
        if not once:
            once = True
            started[0] += 1
            if started[0] == clients:
                first.set()


async def main(host: str, port: int, clients: int) -> None:
    counts = {"answered": 0, "failed": 0}
    first, stop, started = asyncio.Event(), asyncio.Event(), [0]
    began = time.monotonic()
    tasks = [asyncio.create_task(_client(host, port, counts, first, started, clients, stop)) for _ in range(clients)]
    await first.wait()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the test closes our stdin
    stop.set()
    await asyncio.wait(tasks, timeout=30)
    print(json.dumps({**counts, "seconds": round(time.monotonic() - began, 3)}), flush=True)


class Looping:
    """``with Looping(host, port, clients) as load: ...``: :func:`main` in a subprocess, started when every client
    has been answered (or failed) once; ``load.result`` (its JSON line) once the block ends."""

    def __init__(self, host: str, port: int, clients: int) -> None:
        self.args = [sys.executable, "-m", "tests.scrape_load", host, str(port), str(clients)]
        self.result: dict[str, float] = {}
        self.proc: "subprocess.Popen[str] | None" = None

    def __enter__(self) -> "Looping":
        from cog_triton.settings import REPO_ROOT  # noqa: PLC0415 - the repository, for ``-m tests.scrape_load``

        self.proc = subprocess.Popen(  # noqa: S603
            self.args, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"the looping clients did not start: {line!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        out, _ = self.proc.communicate(timeout=120)  # closes stdin: the clients stop (only "not hung")
        lines = [line for line in out.splitlines() if line.startswith("{")]
        self.result = json.loads(lines[-1]) if lines else {}


def scrape_times(url: str, count: int) -> list[tuple[bool, float]]:
    """A real scraper: ``count`` scrapes one after another, each a new connection, as Prometheus makes them (10-s
    timeout, its default scrape_timeout); (answered whole with 200, seconds) of each."""
    import httpx  # noqa: PLC0415 - the test process's, not the looping clients'

    from common.http import default_ssl_context  # noqa: PLC0415 - one SSL context, not one per scrape

    out = []
    for _ in range(count):
        started = time.monotonic()
        try:
            response = httpx.get(url, timeout=10, trust_env=False, verify=default_ssl_context())
            ok = response.status_code == 200 and len(response.content) == int(response.headers["content-length"])
        except httpx.HTTPError:
            ok = False
        out.append((ok, time.monotonic() - started))
    return out


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
