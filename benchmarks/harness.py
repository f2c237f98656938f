"""``scripts/benchmark``: serving cost per token at GPU token rates, on the real stack.

Starts the stack as a user gets it (the weights archive served over HTTP, the real Cog HTTP server
running predict.py, Triton started by setup()) with ``tensorrt_llm`` served by the token-rate
stand-in (``benchmarks/standin``; ``--engine reference``: the CPU reference model; ``--engine pytorch``: the
PyTorch-backend model over the paced LLM API stand-in), and sweeps the number of concurrent streams over three
paths in the same run:

* ``tensorrt_llm``: Triton's ``/v2/models/tensorrt_llm/generate_stream`` with token ids (the engine
  alone inside Triton);
* ``ensemble_ids``: the predictor's ids ensemble, ``/v2/models/ensemble_ids/generate_stream`` with ``input_ids``
  (+ preprocessing and Triton's ensemble scheduling);
* ``cog``: ``POST /predictions`` streamed over SSE (+ the predictor: validation, tokenization,
  Triton client, incremental detokenization, coglet);
* ``floor``: a bare predictor under its own Cog HTTP server (``benchmarks/floor/predict.py``): no
  Triton, no tokenizer, one-character tokens at the stand-in's step through the product's stream
  interval and coglet bridge: what coglet itself carries, the floor the ``cog`` path is measured
  against (its ratio is to ``floor`` as well as to ``tensorrt_llm``);
* ``cog_json`` (``--engine reference`` only, where it is on by default): the same with a
  ``json_schema`` input, so the reference model enforces the guide with xgrammar (a token mask per
  step) and the predictor compiles and checks it; next to ``cog`` it gives the per-token cost of
  guidance. Its requests end when the document closes, so instead of the token count each output
  is checked to parse and validate against the schema.
* ``cog_lora`` (stand-in only, opt-in with ``--paths``): the ``cog`` requests with ``lora_weights``,
  ``--lora-adapters`` PEFT adapters of the default model (rank ``--lora-rank`` on every projection,
  made with peft, served over HTTP) assigned round-robin across the streams, so that every batch mixes
  them; the stand-in keeps them in its LoRA cache as the reference model does (its tokens do not depend on
  them), so next to ``cog`` it gives what carrying adapters costs the serving path per token. Each adapter is
  fetched and converted during the warm-up.

Points are (streams, stand-in step) pairs: ``--concurrency`` at ``--step-ms``, or ``--points
64@5,128@10,256@20`` (the stack restarts for each step; the stand-in runs ``--engine-instances``
Python model instances so that it is not what limits ``tensorrt_llm``: its "vs ideal" column).

Per point (path, streams): tokens/s and its ratio to ``tensorrt_llm`` at the same streams, time to
first token and the gap between token events (p50/p99), errors, the requests that did not get
exactly the requested tokens (every request asks for ``--tokens`` with ``min_tokens`` equal, so
each must get exactly that many; the stand-in's tokens and the text they decode to are also checked
one by one), and the CPU time of every process per streamed token (``/proc/<pid>/stat`` utime +
stime over the point): tritonserver, each Python backend stub (``stub:<model>``), the Cog server,
the Cog worker, the load generator and this harness. The load generator is a separate process
(:mod:`benchmarks.loadgen`).

``--soak``: 16 streams through Cog for 10 minutes; every 5th prediction is cancelled through Cog's
cancel endpoint part-way, and one Python backend stub is killed with SIGKILL part-way; reports
errors, recoveries and every process's RSS at start and end.

Writes ``results.json``, ``results.md`` and ``results.png`` (or ``soak.json``/``soak.md``) to
``--out`` (default ``build/benchmark``). Not imported by the predictor.

Modules: :mod:`benchmarks.paths` (paths, points, roles), :mod:`benchmarks.procs` (/proc: processes and
CPU), :mod:`benchmarks.stack` (the servers), :mod:`benchmarks.workload` (requests and expectations),
:mod:`benchmarks.report` (tables and plot), :mod:`benchmarks.loadgen` (the load generator process), and
this one: running points, the soak, the command line.

Why one module: one concern, running the benchmark: its command line (about a quarter of it,
each option's help with the fact behind its default), a point's runs and the soak; what a run needs (servers,
requests, reports, processes) lives in the modules above.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from benchmarks.paths import (
    ALL_PATHS,
    ARCHIVE,
    CLK_TCK,
    COG_PATHS,
    DEFAULT_CONCURRENCY,
    FLOOR_PATH,
    GUIDED_PATH,
    LORA_PATH,
    PATHS,
    REFERENCE_CONCURRENCY,
    SMOKE_CONCURRENCY,
)
from benchmarks.procs import CpuSnapshot, loadavg, rss_bytes, snapshot
from benchmarks.report import FAULT_DETECTION_S, _cpu_model, _git, _gpu, _ms, _setting, markdown, plot, soak_markdown
from benchmarks.stack import FloorServer, Stack
from benchmarks.workload import Workload
from cog_triton.settings import REPO_ROOT
# the harness's public face (tests and other scripts use these through it)
from benchmarks.paths import CORE_ROLES, GUIDED_SCHEMA  # noqa: F401,E402
from benchmarks.report import lora_lines  # noqa: F401,E402
from benchmarks.stack import fill_standin_template, write_pytorch_standin_templates, write_standin_templates  # noqa: F401,E402,E501

log = logging.getLogger("benchmark")


def _endpoint(stack: Stack, path: str) -> tuple[int, str]:
    if path == FLOOR_PATH:
        assert stack.floor is not None and stack.floor.cog is not None
        return stack.floor.cog.port, "/predictions"
    if path in COG_PATHS:
        assert stack.cog is not None
        return stack.cog.port, "/predictions"
    return stack.triton_port, f"/v2/models/{path}/generate_stream"


def _expect_line(proc: subprocess.Popen, want: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != want:
        rest = proc.stdout.read() if proc.poll() is not None else ""
        raise RuntimeError(f"load generator said {line!r} instead of {want!r}: {rest[-2000:]}")


def run_loadgen(stack: Stack, spec: dict[str, Any], during=None) -> tuple[dict[str, Any], CpuSnapshot, CpuSnapshot]:
    """Run one load-generator process; return its results and the CPU snapshots at its start and end
    (of the floor server's processes for the floor path, else of the stack's).

    ``during(proc)`` (optional) is called after the start snapshot, while the load runs.
    """
    servers: Any = stack.floor if spec.get("path") == FLOOR_PATH else stack
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "benchmarks.loadgen"], cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(spec))
        proc.stdin.close()
        _expect_line(proc, "started")
        before = snapshot(servers.processes(proc.pid))
        if during is not None:
            during(proc)
        _expect_line(proc, "finished")
        after = snapshot(servers.processes(proc.pid))
        result = json.loads(proc.stdout.readline())
        proc.wait(timeout=60)
        return result, before, after
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def cpu_report(before: CpuSnapshot, after: CpuSnapshot, tokens: int) -> dict[str, Any]:
    """Per role: CPU seconds, µs per streamed token and share of one core over the point."""
    wall = after.at - before.at
    cpu_s: dict[str, float] = {}
    for role, ticks in after.ticks.items():
        if role in before.ticks and set(after.pids[role]) == set(before.pids.get(role, [])):
            cpu_s[role] = (ticks - before.ticks[role]) / CLK_TCK
    servers = sum(cpu_s.get(r, 0.0) for r in cpu_s if r not in ("loadgen", "harness"))
    busy = (after.machine_busy - before.machine_busy) / CLK_TCK
    ours = sum(cpu_s.values())
    # the busiest single server process: what limits a many-core host (one interpreter, one GIL)
    busiest: dict[str, Any] = {}
    if wall > 0:
        for role, pids in after.pids.items():
            if role in ("loadgen", "harness"):
                continue
            for pid in pids:
                if pid in before.pid_ticks and pid in after.pid_ticks:
                    cores = (after.pid_ticks[pid] - before.pid_ticks[pid]) / CLK_TCK / wall
                    if cores > busiest.get("cores", -1.0):
                        busiest = {"role": role, "pid": pid, "cores": round(cores, 3)}
    return {
        "busiest_process": busiest or None,
        "cpu_s": {r: round(v, 3) for r, v in sorted(cpu_s.items())},
        "cpu_us_per_token": {r: round(v * 1e6 / tokens, 1) if tokens else None for r, v in sorted(cpu_s.items())},
        "cpu_us_per_token_servers": round(servers * 1e6 / tokens, 1) if tokens else None,
        "cpu_cores": {r: round(v / wall, 3) for r, v in sorted(cpu_s.items())} if wall > 0 else {},
        "machine_busy_cores": round(busy / wall, 3) if wall > 0 else None,
        "others_busy_cores": round(max(0.0, busy - ours) / wall, 3) if wall > 0 else None,
        # a virtual machine's CPUs its host gave to others meanwhile (/proc/stat steal), in cores
        "steal_cores": round((after.machine_steal - before.machine_steal) / CLK_TCK / wall, 3) if wall > 0 else None,
        "pids": {r: p for r, p in sorted(after.pids.items())},
    }


def base_spec(stack: Stack, path: str, args: argparse.Namespace) -> dict[str, Any]:
    port, url_path = _endpoint(stack, path)
    return {"host": "127.0.0.1", "port": port, "url_path": url_path, "path": path, "tokens": args.tokens,
            "timeout_s": args.timeout_s}


def run_point(stack: Stack, work: Workload, path: str, streams: int, args: argparse.Namespace) -> dict[str, Any]:
    n_requests = streams * args.rounds
    spec = {**base_spec(stack, path, args), "mode": "sweep", "concurrency": streams,
            "requests": [work.request(path, i) for i in range(n_requests)]}
    log_offset = stack.triton_log_size()
    result, before, after = run_loadgen(stack, spec)
    point = {"path": path, "streams": streams, **result, **cpu_report(before, after, result["tokens"])}
    # guided requests end when their document closes: each is checked against the schema instead
    point["expected_tokens"] = None if path == GUIDED_PATH else n_requests * args.tokens
    # the stand-in logs every response it could not send; the tokens it did send are the requested ones
    point["engine_send_failures"] = stack.triton_log_since(log_offset).count("stand-in sender: could not send")
    log.info(
        "%-12s %4d streams: %8.0f tok/s, TTFT p50 %s, gap p99 %s, errors %d, count mismatches %d, servers %s µs/token",
        path, streams, point["tokens_per_s"], _ms(point["ttft_s"]["p50"]), _ms(point["gap_s"]["p99"]),
        point["errors"], point["count_mismatches"], point["cpu_us_per_token_servers"],
    )
    return point


def warm_up(stack: Stack, work: Workload, args: argparse.Namespace) -> None:
    """One short request per path (connections, first-call costs); with the reference engine, also
    the greedy output every request must reproduce."""
    if args.engine == "reference":
        spec = {**base_spec(stack, "tensorrt_llm", args), "mode": "sweep", "concurrency": 1,
                "requests": [{"body": work.body("tensorrt_llm", 0)}]}
        spec_result = _raw_ids(stack, spec)
        work.reference_ids = spec_result
        log.info("reference output for the benchmark prompt: %r", work.tokenizer.decode(spec_result)[:80])
    work.adapter_urls = stack.adapter_urls
    for path in args.paths:
        tokens = args.tokens if path == GUIDED_PATH else 4  # a guided document needs room to close
        # the cog_lora warm-up sends each adapter once: its download and conversion are not measured
        count = len(work.adapter_urls) if path == LORA_PATH else 1
        spec = {**base_spec(stack, path, args), "tokens": tokens, "mode": "sweep", "concurrency": 1,
                "requests": [{"body": work.body(path, work.seed(0), tokens=tokens, index=i)} for i in range(count)]}
        result, _, _ = run_loadgen(stack, spec)
        if result["errors"]:
            raise RuntimeError(f"warm-up request on {path} failed: {result['error_messages']}")


def _raw_ids(stack: Stack, spec: dict[str, Any]) -> list[int]:
    import httpx

    port, url_path = spec["port"], spec["url_path"]
    ids: list[int] = []
    with httpx.stream("POST", f"http://127.0.0.1:{port}{url_path}", json=spec["requests"][0]["body"],
                      timeout=spec["timeout_s"]) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data:"):
                doc = json.loads(line[5:])
                if "error" in doc:
                    raise RuntimeError(doc["error"])
                ids.extend(int(x) for x in _flatten(doc.get("output_ids", [])))
    return ids


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [x for item in value for x in _flatten(item)]
    return [value]


def sweep(stack: Stack, work: Workload, args: argparse.Namespace, concurrency: Sequence[int]) -> list[dict[str, Any]]:
    """Every path at each stream count of ``concurrency``, at the stand-in's current ``args.step_ms``.

    Each point gets ``ratio_to_direct`` (tokens/s over ``tensorrt_llm``'s at the same streams),
    ``ratio_to_ideal`` (over streams x 1000 / step_ms, the stand-in's rate; stand-in only) and, for
    ``cog``, ``ratio_to_floor`` (over the ``floor`` path's)."""
    warm_up(stack, work, args)
    points = []
    for streams in concurrency:
        group = {}
        for path in args.paths:
            point = run_point(stack, work, path, streams, args)
            point["step_ms"] = args.step_ms if args.engine != "reference" else None
            ideal = streams * 1e3 / args.step_ms if args.engine != "reference" else None
            point["ratio_to_ideal"] = round(point["tokens_per_s"] / ideal, 3) if ideal else None
            group[path] = point
            points.append(point)
        direct = group.get("tensorrt_llm", {}).get("tokens_per_s")
        floor = group.get(FLOOR_PATH, {}).get("tokens_per_s")
        for path, point in group.items():
            point["ratio_to_direct"] = round(point["tokens_per_s"] / direct, 3) if direct else None
            if path in ("cog", GUIDED_PATH, LORA_PATH):
                point["ratio_to_floor"] = round(point["tokens_per_s"] / floor, 3) if floor else None
    return points


def rss_report(roles: dict[str, list[int]]) -> dict[str, Optional[int]]:
    out: dict[str, Optional[int]] = {}
    for role, pids in sorted(roles.items()):
        values = [v for v in (rss_bytes(p) for p in pids) if v is not None]
        out[role] = sum(values) if values else None
    return out


def soak(stack: Stack, work: Workload, args: argparse.Namespace) -> dict[str, Any]:
    warm_up(stack, work, argparse.Namespace(**{**vars(args), "paths": ["cog"]}))
    duration = args.soak_minutes * 60.0
    spec = {
        **base_spec(stack, "cog", args), "mode": "soak", "concurrency": args.soak_streams, "duration_s": duration,
        "cancel_every": args.soak_cancel_every, "cancel_after_tokens": max(1, args.tokens // 8),
        "requests": [work.request("cog", i) for i in range(64)],
    }
    kill: dict[str, Any] = {}
    rss: dict[str, Any] = {"start": rss_report(stack.processes())}

    def during(proc: subprocess.Popen) -> None:
        kill_at = time.monotonic() + duration * args.soak_kill_at
        if args.soak_kill == "none":
            return
        while time.monotonic() < kill_at and proc.poll() is None:
            time.sleep(0.2)
        role = f"stub:{args.soak_kill}"
        pids = stack.processes().get(role, [])
        if not pids:
            kill["error"] = f"no {role} process found"
            return
        kill.update({"role": role, "pid": pids[0], "at": time.monotonic()})
        os.kill(pids[0], signal.SIGKILL)
        log.info("soak: killed %s (pid %d) with SIGKILL", role, pids[0])

    log.info("soak: %d streams through Cog for %.1f min, every %dth prediction cancelled, %s killed at %.0f%%",
             args.soak_streams, args.soak_minutes, args.soak_cancel_every, args.soak_kill, args.soak_kill_at * 100)
    result, before, after = run_loadgen(stack, spec, during=during)
    rss["end"] = rss_report(stack.processes())
    records = result.pop("records")
    summary = soak_summary(records, kill, args)
    summary["triton_restarts"] = triton_restarts(stack.work / "cog.log")
    return {"kill": kill, "rss_bytes": rss, "summary": summary, "loadgen": result,
            **cpu_report(before, after, result["tokens"])}


def triton_restarts(cog_log: Path) -> int:
    """How many times the predictor's supervisor restarted Triton, from its log line
    ``Triton restarted (<n> restarts so far)`` in the Cog server's log."""
    try:
        text = cog_log.read_text(errors="replace")
    except OSError:
        return 0
    return len(re.findall(r"Triton restarted \(\d+ restarts so far\)", text))


def soak_summary(records: list[dict[str, Any]], kill: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    kill_at = kill.get("at")
    cancel_requested = [r for r in records if r["cancelled"]]
    plain = [r for r in records if not r["cancelled"]]
    errors: dict[str, int] = {}
    for r in records:
        if r["error"]:
            errors[r["error"][:300]] = errors.get(r["error"][:300], 0) + 1
    out: dict[str, Any] = {
        "predictions": len(records),
        "succeeded": sum(1 for r in records if r["status"] == "succeeded"),
        "cancel_requested": len(cancel_requested),
        "canceled": sum(1 for r in cancel_requested if r["status"] == "canceled"),
        "cancel_too_late": sum(1 for r in cancel_requested if r["status"] == "succeeded"),
        "errors": sum(errors.values()),
        "error_messages": errors,
        "retried_409": sum(r.get("retried_409", 0) for r in records),
        "count_mismatches": sum(1 for r in plain if r["status"] == "succeeded" and not r["count_ok"]),
        "content_mismatches": sum(1 for r in plain if r["status"] == "succeeded" and not r["content_ok"]),
    }
    if kill_at is not None:
        # In flight at the fault: started before the supervisor could have found it (it polls every 0.5 s,
        # cog_triton/worker/supervisor.py), ended after the kill. A prediction sent in that window meets the dead
        # stub just like one that was running.
        found_by = kill_at + FAULT_DETECTION_S
        after = [r for r in records if r["start"] >= kill_at]
        recovered = [r for r in after if r["status"] == "succeeded"]
        out["errors_after_kill"] = sum(1 for r in records if r["error"] and r["end"] >= kill_at)
        out["in_flight_at_kill"] = sum(1 for r in records if r["start"] < found_by and kill_at <= r["end"])
        out["in_flight_at_kill_failed"] = sum(
            1 for r in records
            if r["start"] < found_by and kill_at <= r["end"] and r["status"] not in ("succeeded", "canceled"))
        out["recoveries"] = len(recovered)
        out["started_after_kill"] = len(after)
        out["first_success_after_kill_s"] = (
            round(min(r["end"] for r in recovered) - kill_at, 2) if recovered else None)
    t0 = min((r["start"] for r in records), default=0.0)
    minutes: dict[int, dict[str, int]] = {}
    for r in records:
        m = minutes.setdefault(int((r["end"] - t0) // 60), {"succeeded": 0, "canceled": 0, "errors": 0})
        key = "errors" if r["error"] else ("succeeded" if r["status"] == "succeeded" else "canceled")
        m[key] += 1
    out["per_minute"] = {str(k): v for k, v in sorted(minutes.items())}
    return out


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _points(text: str) -> list[tuple[int, float]]:
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        streams, _, step = item.partition("@")
        try:
            point = (int(streams), float(step))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected streams@step_ms pairs such as 128@10, got {item!r}") from None
        if point[0] < 1 or point[1] <= 0:
            raise argparse.ArgumentTypeError(f"streams and step_ms must be positive, got {item!r}")
        out.append(point)
    if not out:
        raise argparse.ArgumentTypeError("expected at least one streams@step_ms pair")
    return out


def _paths(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in values if x not in ALL_PATHS]
    if bad or not values:
        raise argparse.ArgumentTypeError(f"paths are {', '.join(ALL_PATHS)}; got {text!r}")
    return values


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/benchmark",
        description="Serving cost per token on the real stack (Triton + Cog) with a token-rate stand-in engine: "
        "tensorrt_llm direct vs ensemble_ids vs Cog /predictions, swept over concurrent streams.",
    )
    parser.add_argument("--concurrency", type=_int_list, default=None,
                        help="comma-separated stream counts (default 1,8,32,64,128; --engine reference 1,2,4; "
                        "--smoke 1,4)")
    parser.add_argument("--tokens", type=int, default=None,
                        help="tokens per request (default 256; --engine reference 64; --smoke 32)")
    parser.add_argument("--step-ms", type=float, default=10.0, help="stand-in step time, ms (default 10)")
    parser.add_argument("--points", type=_points, default=None,
                        help="streams@step_ms pairs, e.g. 64@5,128@10,256@20 (the stack restarts for each step); "
                        "instead of --concurrency and --step-ms")
    parser.add_argument("--engine-instances", type=int, default=None,
                        help="stand-in model instances (processes; default: one per 4 CPUs, 1 to 4; --engine standin "
                        "only), so that the Python stand-in is not what limits the direct path on a many-core host")
    parser.add_argument("--paths", type=_paths, default=None,
                        help="comma-separated, of " + ",".join(ALL_PATHS) + f" (default {','.join(PATHS)}; "
                        f"--engine reference adds {GUIDED_PATH}, Cog with a json_schema)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="requests per stream per point (default 2; --engine reference and --smoke 1)")
    parser.add_argument("--batch-limit", type=int, default=None,
                        help="engine batch limit, max active requests (default: the largest concurrency, >= 8)")
    parser.add_argument("--cog-concurrency", type=int, default=None,
                        help="COG_MAX_CONCURRENCY (default: the largest concurrency + 25%%, at least + 8)")
    # The C++ backend sends every response from one WaitForResponse thread, at C++ cost; one Python
    # thread sending through pb_utils is the limit at 128 streams (measured: 3,496 tok/s direct with 1
    # thread against 8,766 with 4, of 12,800 ideal), so the default uses 4 to measure the serving layer.
    parser.add_argument("--sender-threads", type=int, default=4,
                        help="stand-in response sender threads (default 4; 1 is the C++ backend's thread "
                             "count, but one Python sender caps direct at ~3,500 tok/s here)")
    parser.add_argument("--end-id-after", type=int, default=0,
                        help="stand-in: end requests on the end token after this many tokens (default 0: never; "
                        "the benchmark's min_tokens keeps every request at --tokens anyway)")
    parser.add_argument("--lora-adapters", type=int, default=4,
                        help=f"adapters of the {LORA_PATH} path, round-robin over its streams (default 4)")
    parser.add_argument("--lora-rank", type=int, default=16, help="their rank (default 16)")
    parser.add_argument("--engine", choices=("standin", "reference", "pytorch"), default="standin",
                        help="standin (default), reference (the CPU reference model, ~18 tok/s) or pytorch (paced)")
    parser.add_argument("--model-interval-ms", type=int, default=None,
                        help="--engine pytorch: the direct tensorrt_llm path's stream_interval_ms (the model joins a "
                        "request's tokens per interval, the first at once, as the predictor asks it to with "
                        "COG_TRITON_STREAM_INTERVAL_MS); default: none, each step's tokens")
    parser.add_argument("--llm-stream-interval", type=int, default=1,
                        help="--engine pytorch: the LLM API's stream_interval (COG_TRITON_LLM_STREAM_INTERVAL): a "
                        "response on a request's first step, then every this many steps (default 1: every step)")
    parser.add_argument("--smoke", action="store_true", help="a short run for tests")
    parser.add_argument("--soak", action="store_true",
                        help="soak run: 16 streams through Cog, 1 in 5 cancelled, a backend stub SIGKILLed part-way")
    parser.add_argument("--soak-minutes", type=float, default=10.0, help="soak duration, minutes (default 10)")
    parser.add_argument("--soak-streams", type=int, default=16, help="soak streams (default 16)")
    parser.add_argument("--soak-cancel-every", type=int, default=5, help="cancel every Nth prediction (default 5)")
    parser.add_argument("--soak-kill", choices=("tensorrt_llm", "preprocessing", "none"), default="tensorrt_llm",
                        help="Python backend stub to SIGKILL during the soak (default tensorrt_llm)")
    parser.add_argument("--soak-kill-at", type=float, default=0.4, help="when to kill, share of the run (default 0.4)")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per-request timeout, seconds")
    parser.add_argument("--archive", type=Path, default=ARCHIVE, help="weights archive (default: the default model)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "build" / "benchmark",
                        help="output folder (default build/benchmark)")
    args = parser.parse_args(argv)
    reference = args.engine == "reference"
    if args.paths is None:
        skipped = (FLOOR_PATH, LORA_PATH) if reference else ()
        args.paths = [p for p in (ALL_PATHS if reference else PATHS) if p not in skipped]
    if GUIDED_PATH in args.paths and not reference:
        parser.error(f"--paths {GUIDED_PATH} needs --engine reference: the stand-in does not enforce guides")
    if FLOOR_PATH in args.paths and reference:
        parser.error(f"--paths {FLOOR_PATH} needs the stand-in engine (it runs at the stand-in's step)")
    if LORA_PATH in args.paths and args.engine != "standin":
        parser.error(f"--paths {LORA_PATH} needs --engine standin (it caches the adapters; its tokens are checked)")
    if not 1 <= args.lora_adapters <= 64 or not 1 <= args.lora_rank <= 64:
        parser.error("--lora-adapters and --lora-rank must be in 1..64")
    if args.points is not None and (args.concurrency is not None or reference or args.soak):
        parser.error("--points replaces --concurrency and --step-ms, with the stand-in engine and not with --soak")
    if args.points is not None:
        args.concurrency = sorted({streams for streams, _ in args.points})
    if args.concurrency is None:
        args.concurrency = list(SMOKE_CONCURRENCY if args.smoke else REFERENCE_CONCURRENCY if reference
                                else DEFAULT_CONCURRENCY)
    # (step_ms, [streams...]) in order of first appearance: one stack start per step
    pairs = args.points or [(n, args.step_ms) for n in args.concurrency]
    args.groups = []
    for streams, step in pairs:
        for group in args.groups:
            if group[0] == step:
                group[1].append(streams)
                break
        else:
            args.groups.append((step, [streams]))
    if args.llm_stream_interval != 1 and (args.engine != "pytorch" or args.llm_stream_interval < 1):
        parser.error("--llm-stream-interval needs --engine pytorch and a positive number of steps")
    if args.model_interval_ms is not None and (args.engine != "pytorch" or not 0 <= args.model_interval_ms <= 10_000):
        parser.error("--model-interval-ms needs --engine pytorch and 0..10000 (the PyTorch-backend model's input)")
    if args.engine_instances is None:
        args.engine_instances = 1 if args.engine == "pytorch" else max(1, min(4, _cpus() // 4))
    if args.engine_instances < 1:
        parser.error("--engine-instances must be positive")
    if args.engine == "pytorch" and args.engine_instances != 1:
        # the PyTorch-backend wrapper's config.pbtxt has one instance (one LLM): more was silently ignored before
        parser.error("--engine-instances applies to the stand-in engine only; --engine pytorch runs one LLM instance")
    if args.tokens is None:
        args.tokens = 32 if args.smoke else 64 if reference else 256
    if args.rounds is None:
        args.rounds = 1 if args.smoke or reference else 2
    if args.smoke and args.soak:
        args.soak_minutes = min(args.soak_minutes, 0.5)
        args.soak_streams = min(args.soak_streams, 4)
    if args.tokens < 1 or args.rounds < 1 or args.step_ms <= 0 or args.sender_threads < 1:
        parser.error("--tokens, --rounds, --step-ms and --sender-threads must be positive")
    top = max(args.concurrency + ([args.soak_streams] if args.soak else []))
    args.batch_limit = args.batch_limit or max(8, top)
    if not 1 <= args.batch_limit <= 256:
        parser.error("--batch-limit must be in 1..256 (COG_TRITON_REFERENCE_MAX_BATCH_SIZE)")
    # coglet returns a prediction's slot only once the worker reports it idle, a moment after
    # `completed`, so a client that starts its next prediction at once can find every slot taken when
    # the slots equal the streams: leave headroom. (Spurious 409s with free slots are retried by the
    # load generator: benchmarks/loadgen.py RETRIES_409.)
    args.cog_concurrency = args.cog_concurrency or max(8, top + max(8, top // 4))
    args.out = args.out if args.out.is_absolute() else Path.cwd() / args.out
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = parse_args(argv)
    if not args.archive.is_file():
        log.error("%s is missing: run scripts/setup first", args.archive)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now().isoformat(timespec="seconds")
    meta: dict[str, Any] = {
        "started": started,
        "command": "scripts/benchmark " + " ".join(sys.argv[1:] if argv is None else argv),
        "git": _git(),
        "engine": args.engine,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "step_ms": args.step_ms,
        "points": [[n, step] for step, group in args.groups for n in group],
        "engine_instances": args.engine_instances,
        "stream_interval_ms": _setting("stream.interval_ms"),
        "stream_processes": _setting("stream.process_count"),
        "sender_threads": args.sender_threads,
        "model_interval_ms": args.model_interval_ms,
        "llm_stream_interval": args.llm_stream_interval,
        "end_id_after": args.end_id_after,
        "batch_limit": args.batch_limit,
        "cog_concurrency": args.cog_concurrency,
        "concurrency": args.concurrency,
        "paths": args.paths,
        "machine": {"cpus": os.cpu_count(), "cpu_model": _cpu_model(), "gpu": _gpu(), "loadavg_before": loadavg()},
        **({"lora_adapters": args.lora_adapters, "lora_rank": args.lora_rank} if LORA_PATH in args.paths else {}),
    }
    if args.soak:
        meta.update({k: getattr(args, k) for k in ("soak_minutes", "soak_streams", "soak_cancel_every",
                                                  "soak_kill", "soak_kill_at")})
    work = Workload(args)
    if args.soak:
        with Stack(args, args.out / "work") as stack:
            meta["processes"] = {r: p for r, p in stack.processes().items()}
            doc: dict[str, Any] = {"meta": meta, "soak": soak(stack, work, args)}
    else:
        doc = {"meta": meta, "points": []}
        floor = FloorServer(args, args.out / "floor") if FLOOR_PATH in args.paths else None
        try:
            if floor is not None:
                floor.__enter__()
            for step_ms, concurrency in args.groups:
                args.step_ms = step_ms
                log.info("stand-in step %g ms: %s streams", step_ms, ", ".join(map(str, concurrency)))
                with Stack(args, args.out / "work") as stack:
                    stack.floor = floor
                    meta.setdefault("processes", {r: p for r, p in stack.processes().items()})
                    doc["points"] += sweep(stack, work, args, concurrency)
        finally:
            if floor is not None:
                floor.__exit__()
    meta["machine"]["loadavg_after"] = loadavg()
    meta["finished"] = dt.datetime.now().isoformat(timespec="seconds")
    if args.soak:
        (args.out / "soak.json").write_text(json.dumps(doc, indent=2))
        (args.out / "soak.md").write_text(soak_markdown(doc))
        print(soak_markdown(doc))
        log.info("wrote %s and soak.md", args.out / "soak.json")
        return 0
    (args.out / "results.json").write_text(json.dumps(doc, indent=2))
    text = markdown(doc)
    (args.out / "results.md").write_text(text)
    plot(doc, args.out / "results.png")
    print(text)
    log.info("wrote %s, results.md and results.png", args.out / "results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
