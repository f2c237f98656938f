"""The benchmark's load generator: a separate process that streams requests and checks every token.

Run by :mod:`benchmarks.harness` as ``python -m benchmarks.loadgen`` with one JSON spec on stdin.
It prints ``started`` when the load begins, ``finished`` when the last request has ended (the
harness reads every process's CPU time at those two lines), then one JSON line with the results.

It is kept cheap so that it does not distort what it measures on a small machine: one asyncio
event loop, one plain TCP connection per request (``Connection: close``), and a small HTTP/1.1
response parser (status line, chunked transfer decoding, server-sent events) on
``asyncio.Protocol`` instead of an HTTP client library. Each event's JSON is parsed (the token ids
or text must be checked); time stamps are taken once per socket read, so events that arrive in one
read share it, as they would for any client.

Paths (``spec["path"]``):

* ``tensorrt_llm`` and ``ensemble``: Triton's ``generate_stream``; an event carries ``output_ids``
  (cut to ``sequence_length``) or ``error``. Tokens are counted and compared with the expected ids.
* ``cog``: coglet's ``POST /predictions`` with ``Accept: text/event-stream``; ``output`` events carry
  text chunks, ``completed`` the prediction (status, ``metrics.output_token_count``). The token
  count is the predictor's ``output_token_count``; the joined text is compared with the expected text.

Modes: ``sweep`` (``concurrency`` streams, each sending its share of ``requests`` one after the
other) and ``soak`` (``concurrency`` streams until ``duration_s``; every ``cancel_every``-th
prediction is cancelled through ``POST /predictions/<id>/cancel`` after ``cancel_after_tokens``
output events; one record per prediction).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any, Callable, Optional

perf = time.perf_counter
monotonic = time.monotonic


class StreamProtocol(asyncio.Protocol):
    """One HTTP/1.1 request whose response body is a server-sent event stream.

    ``on_event(name, data, t)`` is called for every complete event (``data`` is the joined
    ``data:`` lines as bytes, ``t`` the perf_counter time of the read that completed it).
    ``done`` resolves when the body ends (terminating chunk, or the connection closes).
    """

    def __init__(self, request: bytes, on_event: Callable[[str, bytes, float], None],
                 loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self.on_event = on_event
        self.done: asyncio.Future[None] = loop.create_future()
        self.status = 0
        self.error_body = b""
        self.transport: Optional[asyncio.Transport] = None
        self._head = bytearray()
        self._in_body = False
        self._chunked = False
        self._raw = bytearray()
        self._chunk_left = 0
        self._skip = 0
        self._sse = b""

    # -- asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        t = perf()
        if not self._in_body:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self._head[:end]).decode("latin-1")
            rest = bytes(self._head[end + 4:])
            self._head = bytearray()
            self._in_body = True
            lines = head.split("\r\n")
            parts = lines[0].split(" ", 2)
            try:
                self.status = int(parts[1])
            except (IndexError, ValueError):
                self._fail(RuntimeError(f"illegal status line: {lines[0][:100]!r}"))
                return
            for line in lines[1:]:
                key, _, value = line.partition(":")
                if key.strip().lower() == "transfer-encoding" and "chunked" in value.lower():
                    self._chunked = True
            data = rest
            if not data:
                return
        if self._chunked:
            self._feed_chunked(data, t)
        else:
            self._feed_body(data, t)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        if not self.done.done():
            if self.status == 0:
                self.done.set_exception(ConnectionError(f"connection closed before a response: {exc}"))
            elif self._chunked:
                self.done.set_exception(ConnectionError(f"connection closed inside the chunked body: {exc}"))
            else:
                self.done.set_result(None)

    # -- body ------------------------------------------------------------------------------------
    def _fail(self, exc: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)
        if self.transport is not None:
            self.transport.close()

    def _feed_chunked(self, data: bytes, t: float) -> None:
        raw = self._raw
        raw += data
        pos = 0
        out = []
        ended = False
        n = len(raw)
        while pos < n:
            if self._chunk_left:
                take = min(self._chunk_left, n - pos)
                out.append(bytes(raw[pos:pos + take]))
                pos += take
                self._chunk_left -= take
                if not self._chunk_left:
                    self._skip = 2
                continue
            if self._skip:
                take = min(self._skip, n - pos)
                pos += take
                self._skip -= take
                continue
            eol = raw.find(b"\r\n", pos)
            if eol < 0:
                break
            try:
                size = int(bytes(raw[pos:eol]).split(b";", 1)[0], 16)
            except ValueError:
                self._fail(RuntimeError(f"bad chunk size line {bytes(raw[pos:eol])[:40]!r}"))
                return
            pos = eol + 2
            if size == 0:
                ended = True
                break
            self._chunk_left = size
        del raw[:pos]
        if out:
            self._feed_body(b"".join(out), t)
        if ended:
            self._finish()

    def _feed_body(self, data: bytes, t: float) -> None:
        if self.status != 200:
            self.error_body += data
            return
        buf = self._sse + data
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        events = buf.split(b"\n\n")
        self._sse = events.pop()
        for raw_event in events:
            name = "message"
            datas = []
            for line in raw_event.split(b"\n"):
                if line.startswith(b"data:"):
                    datas.append(line[5:].lstrip(b" ") if line[5:6] == b" " else line[5:])
                elif line.startswith(b"event:"):
                    name = line[6:].strip().decode()
            if datas:
                self.on_event(name, b"\n".join(datas), t)


def request_bytes(method: str, host: str, port: int, path: str, body: Optional[dict], sse: bool = True) -> bytes:
    payload = json.dumps(body).encode() if body is not None else b""
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        + ("Accept: text/event-stream\r\n" if sse else "")
        + "\r\n"
    )
    return head.encode() + payload


def _flatten(value: Any) -> list:
    if isinstance(value, list):
        out: list = []
        for item in value:
            out.extend(_flatten(item))
        return out
    return [value]


class Result:
    """What one request got."""

    __slots__ = ("index", "start", "end", "ttft", "gaps", "tokens", "ids", "text", "status", "error",
                 "cancelled", "ok")

    def __init__(self, index: int) -> None:
        self.index = index
        self.start = 0.0
        self.end = 0.0
        self.ttft: Optional[float] = None
        self.gaps: list[float] = []
        self.tokens = 0
        self.ids: list[int] = []
        self.text: list[str] = []
        self.status = ""
        self.error: Optional[str] = None
        self.cancelled = False
        self.ok = False


async def stream_one(spec: dict, index: int, body: dict, *, cancel_after: int = 0,
                     prediction_id: str = "") -> Result:
    """Send one request and collect its events into a :class:`Result`."""
    loop = asyncio.get_running_loop()
    host, port, path = spec["host"], spec["port"], spec["url_path"]
    is_cog = spec["path"] == "cog"
    res = Result(index)
    last = [0.0]
    cancel_task: list[asyncio.Task] = []

    def on_event(name: str, data: bytes, t: float) -> None:
        if is_cog:
            if name == "output":
                chunk = json.loads(data).get("chunk", "")
                if not chunk:
                    return
                res.text.append(chunk)
                if res.ttft is None:
                    res.ttft = t - res.start
                else:
                    res.gaps.append(t - last[0])
                last[0] = t
                if cancel_after and not cancel_task and len(res.text) >= cancel_after:
                    cancel_task.append(loop.create_task(cancel(prediction_id)))
            elif name == "completed":
                doc = json.loads(data)
                res.status = doc.get("status", "")
                if doc.get("error"):
                    res.error = str(doc["error"])[:300]
                res.tokens = int((doc.get("metrics") or {}).get("output_token_count", -1))
            return
        doc = json.loads(data)
        if "error" in doc:
            res.error = str(doc["error"])[:300]
            return
        ids = _flatten(doc.get("output_ids", []))
        lengths = doc.get("sequence_length")
        if lengths is not None:
            ids = ids[: max(0, int(_flatten(lengths)[0]))]
        if not ids:
            return
        res.ids.extend(ids)
        if res.ttft is None:
            res.ttft = t - res.start
        else:
            res.gaps.append(t - last[0])
        last[0] = t

    async def cancel(pid: str) -> None:
        res.cancelled = True
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(request_bytes("POST", host, port, f"/predictions/{pid}/cancel", None, sse=False))
            await writer.drain()
            await reader.read(4096)
            writer.close()
        except OSError as exc:
            res.error = f"cancel failed: {exc}"

    if is_cog and prediction_id:
        body = {**body, "id": prediction_id}
    proto = StreamProtocol(request_bytes("POST", host, port, path, body), on_event, loop)
    res.start = perf()
    try:
        await loop.create_connection(lambda: proto, host, port)
        await asyncio.wait_for(proto.done, spec.get("timeout_s", 600))
    except asyncio.TimeoutError:
        res.error = f"timed out after {spec.get('timeout_s', 600)} s"
    except Exception as exc:  # noqa: BLE001 - every failure is a counted error
        res.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        if proto.transport is not None:
            proto.transport.close()
    res.end = perf()
    if proto.status and proto.status != 200 and res.error is None:
        res.error = f"HTTP {proto.status}: {proto.error_body[:300].decode('utf-8', 'replace')}"
    if cancel_task:
        await asyncio.gather(*cancel_task, return_exceptions=True)
    if not is_cog:
        res.tokens = len(res.ids)
        if res.error is None and proto.status == 200:
            res.status = "succeeded"
    elif res.error is None and res.status not in ("succeeded", "canceled"):
        res.error = f"prediction ended with status {res.status or 'none'}"
    res.ok = res.error is None and res.status == "succeeded"
    return res


def check(res: Result, request: dict, path: str, tokens: int) -> dict:
    """Compare one finished request with what it should have got."""
    expect_ids = request.get("expect_ids")
    expect_text = request.get("expect_text")
    count_ok = res.tokens == tokens
    content_ok = True
    if path == "cog":
        if expect_text is not None:
            content_ok = "".join(res.text) == expect_text
    elif expect_ids is not None:
        content_ok = res.ids == expect_ids
    return {"count_ok": count_ok, "content_ok": content_ok}


def mismatch_sample(res: Result, request: dict, path: str) -> dict:
    """Where a request's output first differs from the expected one (for the report)."""
    if path == "cog":
        got, want = "".join(res.text), request.get("expect_text") or ""
    else:
        got, want = res.ids, request.get("expect_ids") or []
    at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return {
        "index": res.index, "tokens": res.tokens, "events": len(res.gaps) + (res.ttft is not None),
        "first_difference_at": at, "got_length": len(got), "expected_length": len(want),
        "got": repr(got[max(0, at - 20):at + 40]), "expected": repr(want[max(0, at - 20):at + 40]),
    }


async def run_sweep(spec: dict) -> tuple[list[Result], float, float]:
    requests = spec["requests"]
    concurrency = spec["concurrency"]
    results: list[Optional[Result]] = [None] * len(requests)
    next_index = [0]

    async def worker() -> None:
        while next_index[0] < len(requests):
            i = next_index[0]
            next_index[0] += 1
            results[i] = await stream_one(spec, i, requests[i]["body"])

    print("started", flush=True)
    t0 = perf()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    t1 = perf()
    print("finished", flush=True)
    return [r for r in results if r is not None], t0, t1


async def run_soak(spec: dict) -> tuple[list[Result], float, float]:
    templates = spec["requests"]
    deadline = perf() + spec["duration_s"]
    every = spec.get("cancel_every", 0)
    after = spec.get("cancel_after_tokens", 0)
    results: list[Result] = []
    counter = [0]
    run_id = f"{os.getpid()}-{int(time.time())}"

    async def worker() -> None:
        while perf() < deadline:
            i = counter[0]
            counter[0] += 1
            template = templates[i % len(templates)]
            cancel = bool(every) and i % every == every - 1
            res = await stream_one(spec, i, template["body"], cancel_after=after if cancel else 0,
                                   prediction_id=f"soak-{run_id}-{i}")
            results.append(res)

    print("started", flush=True)
    t0 = perf()
    await asyncio.gather(*(worker() for _ in range(spec["concurrency"])))
    t1 = perf()
    print("finished", flush=True)
    return results, t0, t1


def percentile(sorted_values: list[float], q: float) -> Optional[float]:
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, max(0, int(round(q / 100.0 * (len(sorted_values) - 1)))))
    return sorted_values[k]


def summarize(spec: dict, results: list[Result], t0: float, t1: float, cpu_s: float) -> dict:
    path, tokens = spec["path"], spec["tokens"]
    requests = spec["requests"]
    errors: dict[str, int] = {}
    count_mismatches = content_mismatches = 0
    mismatch_counts: dict[str, int] = {}
    samples: list[dict] = []
    delivered = 0
    ttfts, gaps = [], []
    for res in results:
        delivered += max(0, res.tokens) if path == "cog" else len(res.ids)
        if res.ttft is not None:
            ttfts.append(res.ttft)
        gaps.extend(res.gaps)
        if res.error is not None:
            key = res.error[:160]
            errors[key] = errors.get(key, 0) + 1
            continue
        if res.cancelled:
            continue
        verdict = check(res, requests[res.index % len(requests)], path, tokens)
        if not verdict["count_ok"]:
            count_mismatches += 1
            mismatch_counts[str(res.tokens)] = mismatch_counts.get(str(res.tokens), 0) + 1
        if not verdict["content_ok"]:
            content_mismatches += 1
        if (not verdict["count_ok"] or not verdict["content_ok"]) and len(samples) < 3:
            samples.append(mismatch_sample(res, requests[res.index % len(requests)], path))
    ttfts.sort()
    gaps.sort()
    wall = t1 - t0
    return {
        "requests": len(results),
        "succeeded": sum(1 for r in results if r.ok),
        "errors": sum(errors.values()),
        "error_messages": errors,
        "count_mismatches": count_mismatches,
        "mismatched_counts": mismatch_counts,
        "content_mismatches": content_mismatches,
        "mismatch_samples": samples,
        "tokens": delivered,
        "wall_s": wall,
        "tokens_per_s": delivered / wall if wall > 0 else 0.0,
        "ttft_s": {"p50": percentile(ttfts, 50), "p99": percentile(ttfts, 99), "max": ttfts[-1] if ttfts else None},
        "gap_s": {"p50": percentile(gaps, 50), "p99": percentile(gaps, 99), "max": gaps[-1] if gaps else None},
        "events_with_tokens": len(gaps) + len(ttfts),
        "loadgen_cpu_s": cpu_s,
    }


def soak_records(results: list[Result], spec: dict) -> list[dict]:
    """One small record per prediction (monotonic times, comparable with the harness's)."""
    offset = monotonic() - perf()
    tokens = spec["tokens"]
    out = []
    for res in results:
        request = spec["requests"][res.index % len(spec["requests"])]
        verdict = check(res, request, spec["path"], tokens) if res.error is None else {}
        out.append({
            "start": res.start + offset,
            "end": res.end + offset,
            "status": res.status or "error",
            "cancelled": res.cancelled,
            "tokens": res.tokens,
            "count_ok": verdict.get("count_ok", False),
            "content_ok": verdict.get("content_ok", False),
            "error": res.error,
        })
    return out


def main() -> int:
    spec = json.loads(sys.stdin.read())
    mode = spec.get("mode", "sweep")
    cpu0 = os.times()
    results, t0, t1 = asyncio.run(run_soak(spec) if mode == "soak" else run_sweep(spec))
    cpu1 = os.times()
    cpu_s = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    out = summarize(spec, results, t0, t1, cpu_s)
    if mode == "soak":
        out["records"] = soak_records(results, spec)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
