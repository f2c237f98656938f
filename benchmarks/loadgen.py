"""The benchmark's load generator: a separate process that streams requests and checks every token.

Run by :mod:`benchmarks.harness` as ``python -m benchmarks.loadgen`` with one JSON spec on stdin.
It prints ``started`` when the load begins, ``finished`` when the last request has ended (the
harness reads every process's CPU time at those two lines), then one JSON line with the results.

It is kept cheap so that it does not distort what it measures on a small machine: one thread
running its own ``selectors`` (epoll) loop over non-blocking sockets (no asyncio: its per-read
overhead was most of the cost), one plain TCP connection per request (``Connection: close``), and
a small HTTP/1.1 response parser (status line, chunked transfer decoding, server-sent events)
instead of an HTTP client library. Each event's JSON is parsed (the token ids or text must be
checked); time stamps are taken once per socket read, so events that arrive in one read share it,
as they would for any client.

Paths (``spec["path"]``):

* ``tensorrt_llm`` and ``ensemble_ids``: Triton's ``generate_stream``; an event carries ``output_ids``
  (cut to ``sequence_length``) or ``error``. Tokens are counted and compared with the expected ids.
* ``cog``: coglet's ``POST /predictions`` with ``Accept: text/event-stream``; ``output`` events carry
  text chunks, ``completed`` the prediction (status, ``metrics.output_token_count``). The token
  count is the predictor's ``output_token_count``; the joined text is compared with the expected text.

Modes: ``sweep`` (``concurrency`` streams, each sending its share of ``requests`` one after the
other) and ``soak`` (``concurrency`` streams until ``duration_s``; every ``cancel_every``-th
prediction is cancelled through ``POST /predictions/<id>/cancel`` after ``cancel_after_tokens``
output events; one record per prediction).

Why one module: it is one program, run as its own process, that imports nothing of the
harness so that its start-up and per-read cost stay small; its parts (the selector loop, the HTTP/SSE
parser, request starts, the checks and the summary) are used only together, by ``main``.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import json
import os
import re
import selectors
import socket
import sys
import time
from typing import Any, Callable, Optional

#: Paths answered by Cog's /predictions (the harness's ``cog``, ``cog_json``, ``cog_lora`` and ``floor``).
COG_PATHS = ("cog", "cog_json", "cog_lora", "floor")

perf = time.perf_counter
monotonic = time.monotonic


class SSEParser:
    """The response to one HTTP/1.1 request whose body is a server-sent event stream.

    ``on_event(name, data, t)`` is called for every complete event (``data`` is the joined
    ``data:`` lines as bytes, ``t`` the perf_counter time of the read that completed it);
    ``on_end(error)`` once, when the body ends (terminating chunk, or the connection closed) or
    the response could not be parsed.
    """

    def __init__(self, on_event: Callable[[str, bytes, float], None],
                 on_end: Callable[[Optional[str]], None]) -> None:
        self.on_event = on_event
        self.on_end = on_end
        self.status = 0
        self.error_body = b""
        self.ended = False
        self.incomplete_event = b""
        self._head = bytearray()
        self._in_body = False
        self._chunked = False
        self._raw = bytearray()
        self._chunk_left = 0
        self._skip = 0
        self._sse = b""

    def feed(self, data: bytes, t: float) -> None:
        if self.ended:
            return
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
                self._end(f"illegal status line: {lines[0][:100]!r}")
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

    def closed(self) -> None:
        """The server closed the connection."""
        if self.status == 0:
            self._end("connection closed before a response")
        elif self._chunked:
            self._end("connection closed inside the chunked body")
        else:
            self._end(None)

    def _end(self, error: Optional[str]) -> None:
        if not self.ended:
            self.ended = True
            if error is None and self._sse.strip():  # an event the server never finished (no blank line)
                self.incomplete_event = self._sse
            self.on_end(error)

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
                self._end(f"bad chunk size line {bytes(raw[pos:eol])[:40]!r}")
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
            self._end(None)

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
                    datas.append(line[6:] if line[5:6] == b" " else line[5:])
                elif line.startswith(b"event:"):
                    name = line[6:].strip().decode()
            if datas:
                self.on_event(name, b"\n".join(datas), t)


class Loop:
    """A minimal event loop: non-blocking sockets on one selector, plus timers."""

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self._timers: list = []
        self._seq = itertools.count()
        self.running = 0  # things that keep run() going (streams)

    def call_at(self, when: float, fn: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (when, next(self._seq), fn))

    def run(self) -> None:
        sel, timers = self.sel, self._timers
        while self.running > 0:
            timeout = 1.0
            if timers:
                timeout = max(0.0, min(timeout, timers[0][0] - perf()))
            for key, mask in sel.select(timeout):
                conn = key.data
                if mask & selectors.EVENT_WRITE:
                    conn.on_writable()
                elif mask & selectors.EVENT_READ:
                    conn.on_readable()
            now = perf()
            while timers and timers[0][0] <= now:
                heapq.heappop(timers)[2]()


class Connection:
    """One request on its own non-blocking TCP connection; the response goes to an SSEParser."""

    def __init__(self, loop: Loop, host: str, port: int, request: bytes, parser: SSEParser) -> None:
        self.loop = loop
        self.parser = parser
        self.out = request
        self.open = True
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setblocking(False)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        err = self.sock.connect_ex((host, port))
        if err not in (0, errno.EINPROGRESS):
            self.sock.close()
            self.open = False
            parser._end(f"connect failed: {os.strerror(err)}")
            return
        loop.sel.register(self.sock, selectors.EVENT_WRITE, self)

    def on_writable(self) -> None:
        err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err:
            self.close()
            self.parser._end(f"connect failed: {os.strerror(err)}")
            return
        try:
            sent = self.sock.send(self.out)
        except BlockingIOError:
            return
        except OSError as exc:
            self.close()
            self.parser._end(f"send failed: {exc}")
            return
        self.out = self.out[sent:]
        if not self.out:
            self.loop.sel.modify(self.sock, selectors.EVENT_READ, self)

    def on_readable(self) -> None:
        try:
            data = self.sock.recv(262144)
        except BlockingIOError:
            return
        except OSError as exc:
            self.close()
            self.parser._end(f"receive failed: {exc}")
            return
        if not data:
            self.close()
            self.parser.closed()
            return
        self.parser.feed(data, perf())
        if self.parser.ended:
            self.close()

    def close(self) -> None:
        if self.open:
            self.open = False
            self.loop.sel.unregister(self.sock)
            self.sock.close()


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


_OUTPUT_IDS = re.compile(rb'"output_ids":\[([-0-9, ]*)\]')
_SEQUENCE_LENGTH = re.compile(rb'"sequence_length":\[?(-?[0-9]+)')


def triton_ids(data: bytes) -> Optional[list]:
    """The token ids of a generate_stream event (``output_ids`` cut to ``sequence_length``) by a
    regular expression, or None when the event is anything else (then it is parsed as JSON)."""
    if b'"error"' in data:
        return None
    ids = _OUTPUT_IDS.search(data)
    if ids is None:
        return None
    values = [int(x) for x in ids.group(1).split(b",") if x.strip()]
    length = _SEQUENCE_LENGTH.search(data)
    return values[: max(0, int(length.group(1)))] if length is not None else values


class Result:
    """What one request got."""

    __slots__ = ("index", "start", "end", "ttft", "gaps", "tokens", "ids", "text", "status", "error",
                 "cancelled", "ok", "incomplete", "retried_409", "server_ttft", "timing")

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
        self.incomplete = False  # the stream ended inside an event
        self.retried_409 = 0  # spurious "409 At capacity" answers retried (see start_request)
        self.server_ttft: Optional[float] = None  # Cog paths: the predictor's time_to_first_token_s metric
        self.timing: dict[str, float] = {}  # Cog paths with COG_TRITON_TIMING_METRICS: the predictor's timing metric


#: coglet 0.23.1 answers "409 At capacity" to a prediction that arrives while another is taking a
#: slot, even with free slots: ``PermitPool::try_acquire`` gives up when ``try_lock`` of the pool's
#: receiver fails (replicate/cog crates/coglet/src/permit/pool.rs; service.rs ``submit_prediction``
#: maps None to AtCapacity). Reproduced here with 200 slots and 8 concurrent clients: 10 of 400
#: predictions got 409. A Cog client has to retry those; the load generator does, up to this many
#: times, a few milliseconds apart, and reports how many it retried.
RETRIES_409 = 50


def start_request(loop: Loop, spec: dict, index: int, body: dict, done: Callable[[Result], None], *,
                  cancel_after: int = 0, prediction_id: str = "", retried_409: int = 0, started: float = 0.0) -> None:
    """Send one request; ``done(result)`` is called once it has ended (or failed, or timed out).
    A retry after a 409 keeps the first attempt's ``started`` (its TTFT includes the retries)."""
    host, port, path = spec["host"], spec["port"], spec["url_path"]
    is_cog = spec["path"] in COG_PATHS
    timeout_s = spec.get("timeout_s", 600)
    res = Result(index)
    last = [0.0]
    state: dict[str, Any] = {"finished": False, "cancel": None, "conn": None}

    def arrived(t: float) -> None:  # an event with output: the first gives TTFT, the rest gaps
        if res.ttft is None:
            res.ttft = t - res.start
        else:
            res.gaps.append(t - last[0])
        last[0] = t

    def on_event(name: str, data: bytes, t: float) -> None:
        if is_cog:
            if name == "output":
                chunk = json.loads(data).get("chunk", "")
                if not chunk:
                    return
                res.text.append(chunk)
                arrived(t)
                if cancel_after and state["cancel"] is None and len(res.text) >= cancel_after:
                    send_cancel()
            elif name == "completed":
                doc = json.loads(data)
                res.status = doc.get("status", "")
                if doc.get("error"):
                    res.error = str(doc["error"])[:300]
                metrics = doc.get("metrics") or {}
                res.tokens = int(metrics.get("output_token_count", -1))
                if isinstance(metrics.get("time_to_first_token_s"), (int, float)):
                    res.server_ttft = float(metrics["time_to_first_token_s"])
                timing = metrics.get("timing")
                if isinstance(timing, dict):
                    res.timing = {k: float(v) for k, v in timing.items() if isinstance(v, (int, float))}
            return
        ids = triton_ids(data)
        if ids is None:
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
        arrived(t)

    def send_cancel() -> None:
        res.cancelled = True

        def cancel_end(error: Optional[str]) -> None:
            if error is not None or cancel_parser.status != 200:
                res.error = res.error or f"cancel failed: {error or cancel_parser.status}"

        cancel_parser = SSEParser(lambda *a: None, cancel_end)
        state["cancel"] = Connection(loop, host, port, request_bytes(
            "POST", host, port, f"/predictions/{prediction_id}/cancel", None, sse=False), cancel_parser)

    def on_end(error: Optional[str]) -> None:
        if state["finished"]:
            return
        state["finished"] = True
        if state["conn"] is not None:
            state["conn"].close()
        if is_cog and parser.status == 409 and error is None and retried_409 < RETRIES_409:
            loop.call_at(perf() + 0.005, lambda: start_request(
                loop, spec, index, body, done, cancel_after=cancel_after, prediction_id=prediction_id,
                retried_409=retried_409 + 1, started=res.start))
            return
        res.retried_409 = retried_409
        res.end = perf()
        if error is not None and res.error is None:
            res.error = error[:300]
        if parser.incomplete_event:
            res.incomplete = True
        if parser.status and parser.status != 200 and res.error is None:
            res.error = f"HTTP {parser.status}: {parser.error_body[:300].decode('utf-8', 'replace')}"
        if not is_cog:
            res.tokens = len(res.ids)
            if res.error is None and parser.status == 200:
                res.status = "succeeded"
        elif res.error is None and res.status not in ("succeeded", "canceled"):
            res.error = f"prediction ended with status {res.status or 'none'}"
        res.ok = res.error is None and res.status == "succeeded"
        done(res)

    def on_timeout() -> None:
        if not state["finished"]:
            parser._end(f"timed out after {timeout_s:g} s")

    if is_cog and prediction_id:
        body = {**body, "id": prediction_id}
    parser = SSEParser(on_event, on_end)
    res.start = started or perf()
    state["conn"] = Connection(loop, host, port, request_bytes("POST", host, port, path, body), parser)
    loop.call_at(res.start + timeout_s, on_timeout)


def check(res: Result, request: dict, path: str, tokens: int) -> dict:
    """Compare one finished request with what it should have got.

    A guided request (``expect_json_schema``) ends when its document closes: its count must be in
    1..``tokens`` and its text a JSON document valid against the schema (validated with
    ``jsonschema`` where it is installed, requirements-dev.txt; else only parsed)."""
    expect_ids = request.get("expect_ids")
    expect_text = request.get("expect_text")
    schema = request.get("expect_json_schema")
    if schema is not None:
        return {"count_ok": 0 < res.tokens <= tokens, "content_ok": _valid_json("".join(res.text), schema)}
    count_ok = res.tokens == tokens
    content_ok = True
    if path in COG_PATHS:
        if expect_text is not None:
            content_ok = "".join(res.text) == expect_text
    elif expect_ids is not None:
        content_ok = res.ids == expect_ids
    return {"count_ok": count_ok, "content_ok": content_ok}


def _valid_json(text: str, schema: dict) -> bool:
    try:
        document = json.loads(text)
    except ValueError:
        return False
    try:
        import jsonschema  # noqa: PLC0415 - a development dependency
    except ImportError:
        return True
    try:
        jsonschema.validate(document, schema)
    except jsonschema.ValidationError:
        return False
    return True


def mismatch_sample(res: Result, request: dict, path: str) -> dict:
    """Where a request's output first differs from the expected one (for the report)."""
    if path in COG_PATHS:
        got, want = "".join(res.text), request.get("expect_text") or ""
    else:
        got, want = res.ids, request.get("expect_ids") or []
    at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    return {
        "index": res.index, "tokens": res.tokens, "events": len(res.gaps) + (res.ttft is not None),
        "first_difference_at": at, "got_length": len(got), "expected_length": len(want),
        "got": repr(got[max(0, at - 20):at + 40]), "expected": repr(want[max(0, at - 20):at + 40]),
    }


def run_sweep(spec: dict) -> tuple[list[Result], float, float]:
    """``concurrency`` streams, each sending the next not-yet-sent request when its last one ends."""
    requests = spec["requests"]
    results: list[Optional[Result]] = [None] * len(requests)
    loop = Loop()
    next_index = itertools.count()

    def start_next(_: Optional[Result] = None) -> None:
        if _ is not None:
            results[_.index] = _
        i = next(next_index)
        if i < len(requests):
            start_request(loop, spec, i, requests[i]["body"], start_next)
        else:
            loop.running -= 1

    print("started", flush=True)
    t0 = perf()
    loop.running = spec["concurrency"]
    for _ in range(spec["concurrency"]):
        start_next()
    loop.run()
    t1 = perf()
    print("finished", flush=True)
    return [r for r in results if r is not None], t0, t1


def run_soak(spec: dict) -> tuple[list[Result], float, float]:
    """``concurrency`` streams until ``duration_s``; every ``cancel_every``-th prediction is cancelled."""
    templates = spec["requests"]
    every = spec.get("cancel_every", 0)
    after = spec.get("cancel_after_tokens", 0)
    results: list[Result] = []
    loop = Loop()
    counter = itertools.count()
    run_id = f"{os.getpid()}-{int(time.time())}"
    deadline = perf() + spec["duration_s"]

    def start_next(_: Optional[Result] = None) -> None:
        if _ is not None:
            results.append(_)
        if perf() >= deadline:
            loop.running -= 1
            return
        i = next(counter)
        cancel = bool(every) and i % every == every - 1
        start_request(loop, spec, i, templates[i % len(templates)]["body"], start_next,
                      cancel_after=after if cancel else 0, prediction_id=f"soak-{run_id}-{i}")

    print("started", flush=True)
    t0 = perf()
    loop.running = spec["concurrency"]
    for _ in range(spec["concurrency"]):
        start_next()
    loop.run()
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
    ttfts, gaps, server_ttfts = [], [], []
    for res in results:
        if res.server_ttft is not None:
            server_ttfts.append(res.server_ttft)
        delivered += max(0, res.tokens) if path in COG_PATHS else len(res.ids)
        if res.ttft is not None:
            ttfts.append(res.ttft)
        gaps.extend(res.gaps)
        if res.error is not None:
            key = res.error[:300]
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
    server_ttfts.sort()
    phases = ttft_phases(results)
    wall = t1 - t0
    return {
        "requests": len(results),
        "succeeded": sum(1 for r in results if r.ok),
        "errors": sum(errors.values()),
        "error_messages": errors,
        "count_mismatches": count_mismatches,
        "mismatched_counts": mismatch_counts,
        "content_mismatches": content_mismatches,
        "incomplete_events": sum(1 for r in results if r.incomplete),
        "retried_409": sum(r.retried_409 for r in results),
        "mismatch_samples": samples,
        "tokens": delivered,
        "wall_s": wall,
        "tokens_per_s": delivered / wall if wall > 0 else 0.0,
        "ttft_s": {"p50": percentile(ttfts, 50), "p99": percentile(ttfts, 99), "max": ttfts[-1] if ttfts else None},
        "gap_s": {"p50": percentile(gaps, 50), "p99": percentile(gaps, 99), "max": gaps[-1] if gaps else None},
        # Cog paths: from predict() starting to the first token reaching the predictor (its own metric); the
        # rest of the client's TTFT is coglet's (queueing the prediction, starting it, relaying the first chunk)
        "server_ttft_s": {"p50": percentile(server_ttfts, 50), "p99": percentile(server_ttfts, 99)},
        # Cog paths with the predictor's timing metrics: the time to first token split into its steps
        "ttft_phases_s": {name: {"p50": percentile(sorted(values), 50), "p99": percentile(sorted(values), 99)}
                          for name, values in phases.items()},
        "events_with_tokens": len(gaps) + len(ttfts),
        "loadgen_cpu_s": cpu_s,
    }


#: The steps of a Cog prediction's time to first token, in order, from the client's request to its first chunk:
#: (name, the key of the predictor's ``timing`` metric that ends it: seconds since predict() began,
#: cog_triton/worker/timing.py TIMING_STEPS); the first and last steps are measured against the client's clock.
TTFT_PHASES = (
    ("coglet to predict()", None),  # the request to predict() beginning: coglet's HTTP, queue, IPC to the worker
    ("inputs checked, Start sent", "start_sent_s"),
    ("Start to stream process", "start_received_s"),
    ("prompt prepared, request sent", "prepared_s"),
    ("engine's first token", "time_to_first_token_s"),
    ("first text leaves", "first_text_sent_s"),
    ("text to the worker", "first_text_relayed_s"),
    ("worker to coglet's thread", "first_text_yielded_s"),
    ("coglet to the client", None),  # coglet's IPC from the worker and its HTTP
)


def ttft_phases(results: list[Result]) -> dict[str, list[float]]:
    """Each TTFT step's durations, seconds, over the results whose ``timing`` metric has every step (the first,
    "coglet to predict()", over those that have when predict() began: the floor predictor's too); empty when none
    has."""
    offset = monotonic() - perf()  # the loadgen's clock (perf_counter) to time.monotonic, the predictor's
    out: dict[str, list[float]] = {name: [] for name, _ in TTFT_PHASES}
    for res in results:
        timing = dict(res.timing)
        if res.server_ttft is not None:
            timing["time_to_first_token_s"] = res.server_ttft
        if res.ttft is None or "run_at_monotonic" not in timing:
            continue
        run_at = timing["run_at_monotonic"]
        out[TTFT_PHASES[0][0]].append(run_at - (res.start + offset))  # the floor predictor gives this one only
        if any(metric not in timing for _, metric in TTFT_PHASES if metric):
            continue
        marks = [0.0] + [timing[metric] for _, metric in TTFT_PHASES if metric]
        for (name, _), before, after in zip(TTFT_PHASES[1:-1], marks, marks[1:]):
            out[name].append(after - before)
        out[TTFT_PHASES[-1][0]].append((res.start + offset + res.ttft) - (run_at + marks[-1]))
    return out if out[TTFT_PHASES[0][0]] else {}


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
            "retried_409": res.retried_409,
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
    results, t0, t1 = run_soak(spec) if mode == "soak" else run_sweep(spec)
    cpu1 = os.times()
    cpu_s = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    out = summarize(spec, results, t0, t1, cpu_s)
    if mode == "soak":
        out["records"] = soak_records(results, spec)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
