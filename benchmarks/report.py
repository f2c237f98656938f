"""The benchmark's reports: results.md (tables), the soak's, and results.png.

Part of ``scripts/benchmark`` (:mod:`benchmarks.harness`).
"""

from __future__ import annotations

import logging
import os
import platform
import subprocess
from pathlib import Path
from typing import Any, Optional

from benchmarks.paths import CORE_ROLES, GUIDED_PATH, LORA_PATH
from cog_triton.settings import REPO_ROOT

log = logging.getLogger("benchmark")


def _ms(value: Optional[float]) -> str:
    return "—" if value is None else f"{value * 1e3:.1f} ms"


def _scaled(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else seconds * 1e3


def _num(value: Optional[float], fmt: str = "{:.0f}") -> str:
    return "—" if value is None else fmt.format(value)


def markdown(doc: dict[str, Any]) -> str:
    meta = doc["meta"]
    lines = [
        f"# scripts/benchmark: {meta['engine']} engine",
        "",
        f"{meta['started']} · `{meta['command']}` · commit {meta['git']} · {meta['machine']['cpus']} CPUs "
        f"({meta['machine']['cpu_model']})" + (f", {meta['machine']['gpu']}" if meta["machine"].get("gpu") else "")
        + f", load average {meta['machine']['loadavg_before']} before, "
        f"{meta['machine']['loadavg_after']} after",
        "",
        f"{meta['tokens']} tokens per request, {meta['rounds']} request(s) per stream per point"
        + (f", stand-in ({meta.get('engine_instances', 1)} instance(s), {meta['sender_threads']} sender thread(s) "
           "each)" if meta["engine"] == "standin" else "")
        + (", the PyTorch-backend model over the paced LLM API stand-in (one instance; the direct path's "
           f"stream_interval_ms {_num(meta.get('model_interval_ms'), '{:g}')}, the predictor's its stream interval; "
           f"the LLM's stream_interval {meta.get('llm_stream_interval', 1)})"
           if meta["engine"] == "pytorch" else "")
        + f", engine batch limit {meta['batch_limit']}, COG_MAX_CONCURRENCY {meta['cog_concurrency']}, "
        f"stream interval {_num(meta.get('stream_interval_ms'), '{:g}')} ms, "
        f"{_num(meta.get('stream_processes'))} stream process(es).",
        "",
        "`vs ideal`: tokens/s over streams × 1000 / step (the stand-in's rate); `vs direct`: over `tensorrt_llm` "
        "at the same point; `vs floor`: `cog` over the bare predictor under coglet (`floor`). Cog paths: TTFT p50 "
        "(in parentheses) from predict() starting to the first token reaching the predictor (its "
        "`time_to_first_token_s` metric); the rest is coglet's (queueing and starting the prediction, relaying "
        "the first chunk).",
        "",
        "| path | streams | step | tokens/s | vs ideal | vs direct | vs floor | TTFT p50 | TTFT p99 | gap p50 "
        "| gap p99 | errors | count mismatches |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in doc["points"]:
        mism = str(p["count_mismatches"])
        if p["mismatched_counts"]:
            mism += " (" + ", ".join(f"{k}×{v}" for k, v in sorted(p["mismatched_counts"].items())) + ")"
        if p.get("content_mismatches"):
            mism += f", {p['content_mismatches']} content"
        if p.get("incomplete_events"):
            mism += f", {p['incomplete_events']} cut inside an event"
        ratio = lambda key: "—" if p.get(key) is None else f"{p[key]:.2f}"  # noqa: E731
        step = "—" if p.get("step_ms") is None else f"{p['step_ms']:g} ms"
        server = (p.get("server_ttft_s") or {}).get("p50")
        ttft = _ms(p["ttft_s"]["p50"]) + (f" ({server * 1e3:.1f})" if server is not None else "")
        lines.append(
            f"| {p['path']} | {p['streams']} | {step} | {p['tokens_per_s']:.0f} | {ratio('ratio_to_ideal')} | "
            f"{ratio('ratio_to_direct')} | {ratio('ratio_to_floor')} | {ttft} | "
            f"{_ms(p['ttft_s']['p99'])} | {_ms(p['gap_s']['p50'])} | {_ms(p['gap_s']['p99'])} | {p['errors']}"
            + (f" ({p['retried_409']} × 409 retried)" if p.get("retried_409") else "")
            + f" | {mism} |"
        )
    roles = list(CORE_ROLES) + sorted(
        {r for p in doc["points"] for r in p["cpu_us_per_token"]} - set(CORE_ROLES) - {"harness"})
    lines += [
        "",
        "CPU µs per streamed token (utime + stime over the point / tokens delivered); `servers` sums all but the "
        "load generator and the harness; `busy cores` is the whole machine's, `others` what processes outside "
        "this benchmark used, `steal` what a virtual machine's host took from its CPUs for others (/proc/stat).",
        "",
        "| path | streams | " + " | ".join(roles)
        + " | servers | busiest process (cores) | busy cores | others | steal |",
        "|---|---:|" + "---:|" * (len(roles) + 5),
    ]
    for p in doc["points"]:
        cells = [_num(p["cpu_us_per_token"].get(r)) for r in roles]
        busiest = p.get("busiest_process") or {}
        top = f"{busiest['role']} ({busiest['cores']:.2f})" if busiest else "—"
        lines.append(
            f"| {p['path']} | {p['streams']} | " + " | ".join(cells)
            + f" | {_num(p['cpu_us_per_token_servers'])} | {top} | {_num(p['machine_busy_cores'], '{:.2f}')} | "
            f"{_num(p['others_busy_cores'], '{:.2f}')} | {_num(p.get('steal_cores'), '{:.2f}')} |"
        )
    lines += phase_lines(doc)
    lines += guidance_lines(doc)
    lines += lora_lines(doc)
    errors = {(p["path"], p["streams"]): p["error_messages"] for p in doc["points"] if p["error_messages"]}
    if errors:
        lines += ["", "Errors:", ""]
        for (path, streams), messages in errors.items():
            for message, count in messages.items():
                lines.append(f"- {path} × {streams}: {count} × `{message}`")
    return "\n".join(lines) + "\n"


def guidance_lines(doc: dict[str, Any]) -> list[str]:
    """The cost of guided decoding: ``cog_json`` next to ``cog`` at each stream count (both present)."""
    by = {(p["path"], p["streams"]): p for p in doc["points"]}
    pairs = [(by[("cog", n)], by[(GUIDED_PATH, n)]) for n in doc["meta"]["concurrency"]
             if ("cog", n) in by and (GUIDED_PATH, n) in by]
    if not pairs:
        return []
    lines = [
        "",
        f"Guided decoding (`{GUIDED_PATH}`: a `json_schema`, enforced by the reference model with xgrammar) next to "
        "unguided (`cog`). Guided requests end when the document closes; each output parsed and validated against "
        "the schema (a failure counts as a content mismatch above). Per-stream rate, and CPU µs per token of the "
        "model (`stub:tensorrt_llm`: token mask per step) and of the predictor (`cog_worker`: the guide compiled "
        "and checked, the document checked at the end):",
        "",
        "| streams | tok/s per stream unguided | guided | ratio | stub µs/token unguided | guided | "
        "worker µs/token unguided | guided |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for plain, guided in pairs:
        n = plain["streams"]
        rate_plain, rate_guided = plain["tokens_per_s"] / n, guided["tokens_per_s"] / n
        ratio = f"{rate_guided / rate_plain:.2f}" if rate_plain else "—"
        cells = [_num(x.get("cpu_us_per_token", {}).get(role)) for role in ("stub:tensorrt_llm", "cog_worker")
                 for x in (plain, guided)]
        lines.append(f"| {n} | {rate_plain:.1f} | {rate_guided:.1f} | {ratio} | " + " | ".join(cells) + " |")
    return lines


def phase_lines(doc: dict[str, Any]) -> list[str]:
    """The Cog paths' time to first token in its steps (p50, ms), from the predictor's timing metric
    (COG_TRITON_TIMING_METRICS) and the client's clock: where a prediction's start spends its time."""
    from benchmarks.loadgen import TTFT_PHASES  # noqa: PLC0415

    rows = [p for p in doc["points"] if p.get("ttft_phases_s")]
    if not rows:
        return []
    names = [name for name, _ in TTFT_PHASES]
    lines = [
        "",
        "Time to first token of the Cog paths in its steps, p50 in ms (each step's own median, so the medians need "
        "not add up to the TTFT's): from the client's request to predict() beginning (coglet), through the "
        "predictor's steps (its `timing` metric), to the first chunk reaching the client (coglet again).",
        "",
        "| path | streams | step | TTFT p50 | " + " | ".join(names) + " |",
        "|---|---:|---:|---:|" + "---:|" * len(names),
    ]
    for p in rows:
        phases = p["ttft_phases_s"]
        cells = [_num(_scaled((phases.get(name) or {}).get("p50")), "{:.1f}") for name in names]  # "—": not measured
        lines.append(f"| {p['path']} | {p['streams']} | {_num(p.get('step_ms'), '{:g}')} ms | "
                     f"{_num(_scaled(p['ttft_s']['p50']), '{:.1f}')} | " + " | ".join(cells) + " |")
    return lines


def lora_lines(doc: dict[str, Any]) -> list[str]:
    """What adapters cost: ``cog_lora`` next to ``cog`` at each stream count (both present)."""
    by = {(p["path"], p["streams"]): p for p in doc["points"]}
    pairs = [(by[("cog", n)], by[(LORA_PATH, n)]) for n in doc["meta"]["concurrency"]
             if ("cog", n) in by and (LORA_PATH, n) in by]
    if not pairs:
        return []
    meta = doc["meta"]
    lines = [
        "",
        f"LoRA adapters (`{LORA_PATH}`: {meta.get('lora_adapters')} adapters of rank {meta.get('lora_rank')} on every "
        "projection, round-robin over the streams, each fetched and converted in the warm-up) next to no adapter "
        "(`cog`): the same requests and tokens. Per-stream rate, and CPU µs per streamed token of the servers "
        "together, of the stream processes and of the engine (`stub:tensorrt_llm`: the stand-in's LoRA cache):",
        "",
        "| streams | tok/s no adapter | with | ratio | servers µs/token no adapter | with | difference | "
        "stream_proc no adapter | with | stub no adapter | with |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for plain, lora in pairs:
        n = plain["streams"]
        ratio = f"{lora['tokens_per_s'] / plain['tokens_per_s']:.2f}" if plain["tokens_per_s"] else "—"
        a, b = plain.get("cpu_us_per_token_servers"), lora.get("cpu_us_per_token_servers")
        diff = _num(b - a, "{:+.0f}") if a is not None and b is not None else "—"
        cells = [_num(x.get("cpu_us_per_token", {}).get(role)) for role in ("stream_proc", "stub:tensorrt_llm")
                 for x in (plain, lora)]
        lines.append(f"| {n} | {plain['tokens_per_s'] / n:.1f} | {lora['tokens_per_s'] / n:.1f} | {ratio} | "
                     f"{_num(a)} | {_num(b)} | {diff} | " + " | ".join(cells) + " |")
    return lines


#: How long after the kill a prediction still counts as in flight at the fault, seconds: the supervisor's
#: polling period (0.5 s) twice.
FAULT_DETECTION_S = 1.0


SOAK_LABELS = {
    "in_flight_at_kill": f"in flight at the kill (started before it + {FAULT_DETECTION_S:g} s of detection)",
    "recoveries": "recoveries (started after the kill, succeeded)",
    "first_success_after_kill_s": "first success after the kill, s",
    "triton_restarts": "Triton restarts (supervisor log)",
}


def soak_markdown(doc: dict[str, Any]) -> str:
    meta, s = doc["meta"], doc["soak"]
    summary = s["summary"]
    lines = [
        f"# scripts/benchmark --soak: {meta['engine']} engine",
        "",
        f"{meta['started']} · `{meta['command']}` · commit {meta['git']} · load average "
        f"{meta['machine']['loadavg_before']} before, {meta['machine']['loadavg_after']} after",
        "",
        f"{meta['soak_streams']} streams through Cog for {meta['soak_minutes']:g} min, {meta['tokens']} tokens per "
        f"prediction, every {meta['soak_cancel_every']}th cancelled part-way; killed: "
        f"{s['kill'].get('role', 'nothing')} (pid {s['kill'].get('pid', '—')}) at "
        f"{meta['soak_kill_at'] * 100:.0f}% of the run.",
        "",
        "| | |",
        "|---|---:|",
    ]
    for key in ("predictions", "succeeded", "cancel_requested", "canceled", "cancel_too_late", "errors",
                "retried_409", "count_mismatches", "content_mismatches", "in_flight_at_kill", "in_flight_at_kill_failed",
                "errors_after_kill", "started_after_kill", "recoveries", "first_success_after_kill_s", "triton_restarts"):
        if key in summary:
            lines.append(f"| {SOAK_LABELS.get(key, key.replace('_', ' '))} | {summary[key]} |")
    lines += ["", "| process | RSS start | RSS end |", "|---|---:|---:|"]
    start, end = s["rss_bytes"]["start"], s["rss_bytes"]["end"]
    for role in sorted(set(start) | set(end)):
        fmt = lambda v: "—" if v is None else f"{v / 2**20:.0f} MiB"  # noqa: E731
        lines.append(f"| {role} | {fmt(start.get(role))} | {fmt(end.get(role))} |")
    if summary["error_messages"]:
        lines += ["", "Errors:", ""] + [f"- {n} × `{m}`" for m, n in summary["error_messages"].items()]
    lines += ["", "Per minute (by end time): " + ", ".join(
        f"{k}: {v['succeeded']} ok / {v['canceled']} canceled / {v['errors']} errors"
        for k, v in summary["per_minute"].items())]
    return "\n".join(lines) + "\n"


def plot(doc: dict[str, Any], target: Path) -> Optional[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed (requirements-dev.txt): no plot")
        return None
    meta = doc["meta"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for path in meta["paths"]:
        points = [p for p in doc["points"] if p["path"] == path]
        xs = [p["streams"] for p in points]
        axes[0].plot(xs, [p["tokens_per_s"] for p in points], marker="o", label=path)
        axes[1].plot(xs, [p["cpu_us_per_token_servers"] for p in points], marker="o", label=path)
        axes[2].plot(xs, [(p["ttft_s"]["p99"] or 0) * 1e3 for p in points], marker="o", label=f"{path} TTFT p99")
        axes[2].plot(xs, [(p["gap_s"]["p99"] or 0) * 1e3 for p in points], marker="x", linestyle="--",
                     label=f"{path} gap p99")
    ideal = sorted({(p["streams"], p["streams"] * 1e3 / p["step_ms"]) for p in doc["points"] if p.get("step_ms")})
    if ideal:
        axes[0].plot([x for x, _ in ideal], [y for _, y in ideal], color="grey", linestyle=":", label="engine rate")
    axes[0].set(title="tokens/s", xlabel="streams", xscale="log", yscale="log")
    axes[1].set(title="server CPU µs per token", xlabel="streams", xscale="log")
    axes[2].set(title="latency p99 (ms)", xlabel="streams", xscale="log", yscale="log")
    axes[1].set_ylim(bottom=0)
    for ax in axes:
        ax.set_xticks(sorted(meta["concurrency"]))
        ax.set_xticklabels([str(x) for x in sorted(meta["concurrency"])])
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"scripts/benchmark ({meta['engine']}, {meta['tokens']} tokens/request, {meta['started']})")
    fig.tight_layout()
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target


def _setting(name: str) -> Any:
    """A predictor setting as the stack will see it (COG_TRITON_* in this environment); ``name``: its attribute path
    (``stream.interval_ms``), or a method's (``stream.process_count``), which is called."""
    from cog_triton.settings import Settings  # noqa: PLC0415

    value: Any = Settings.from_env()
    for part in name.split("."):
        value = getattr(value, part)
    return value() if callable(value) else value


def _gpu() -> str:
    """The GPUs of this host (nvidia-smi), or "" without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return f"{len(names)} x {names[0]}" if names else ""


def _git() -> str:
    """The checkout's commit (+dirty); in a copy without git (the GPU host's bundle), $BENCHMARK_GIT_COMMIT."""
    if not (REPO_ROOT / ".git").exists() and os.environ.get("BENCHMARK_GIT_COMMIT"):
        return os.environ["BENCHMARK_GIT_COMMIT"]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
