#!/usr/bin/env python3
"""How much the serving layer adds to the model's own speed.

Starts the full stack on the default model (or ``--weights``) and times the same greedy
generation (``--tokens`` tokens, ``--runs`` times each) at three layers:

1. ``tensorrt_llm`` — the model alone inside Triton (token ids in, token ids out, streamed);
2. ``ensemble``     — + preprocessing/postprocessing (Triton's /generate_stream);
3. ``cog``          — + the predictor: validation, prompt formatting, SSE client, incremental
                      detokenization, stop-sequence matching, and the Cog HTTP server.

Prints median wall time, tokens/s and the overhead of each layer over the one below, in
milliseconds per request and per token. On the CPU reference backend the model dominates; the
numbers to watch are the per-token overheads (target: well under 1 ms/token).

    .venv/bin/python scripts/benchmark_overhead.py [--tokens 64] [--runs 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cog_triton.prompt import PromptTokenizer  # noqa: E402
from cog_triton.local import CogServer, WeightsHTTPServer, free_port  # noqa: E402
from cog_triton.settings import REPO_ROOT  # noqa: E402

ARCHIVE = REPO_ROOT / "build" / "default_model" / "smollm2-135m-instruct.tar.gz"
PROMPT = "What is machine learning?"


def _sse_events(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    events = []
    with httpx.stream("POST", url, json=body, timeout=300) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if "error" in event:
                    raise RuntimeError(event["error"])
                events.append(event)
    return events


def _time(fn: Callable[[], int], runs: int) -> tuple[float, int]:
    fn()  # warm-up
    times, tokens = [], 0
    for _ in range(runs):
        started = time.perf_counter()
        tokens = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(ARCHIVE.parent / "checkpoint"), local_files_only=True)
    ids = PromptTokenizer(tokenizer).encode(PROMPT).ids
    n = args.tokens
    triton_port = free_port()
    results: dict[str, dict[str, float]] = {}
    with WeightsHTTPServer(ARCHIVE.parent) as weights:
        env = {
            "COG_WEIGHTS": f"{weights.url}/{ARCHIVE.name}",
            "COG_TRITON_HTTP_PORT": str(triton_port),
            "COG_TRITON_GRPC_PORT": str(free_port()),
            "COG_TRITON_METRICS_PORT": str(free_port()),
        }
        with CogServer(env) as cog:
            cog.wait_ready()
            base = f"http://127.0.0.1:{triton_port}/v2/models"

            def raw_model() -> int:
                body = {
                    "input_ids": ids,
                    "input_lengths": [len(ids)],
                    "request_output_len": [n],
                    "runtime_top_k": [1],
                    "end_id": [tokenizer.eos_token_id],
                    "min_tokens": [n],
                    "streaming": [True],
                }
                return len(_sse_events(f"{base}/tensorrt_llm/generate_stream", body))

            def ensemble() -> int:
                body = {"input_ids": ids, "max_tokens": n, "top_k": 1, "min_tokens": n, "stream": True}
                return len(_sse_events(f"{base}/ensemble/generate_stream", body))

            def through_cog() -> int:
                doc = cog.predict({"prompt": PROMPT, "max_tokens": n, "min_tokens": n, "temperature": 0})
                if doc["status"] != "succeeded":
                    raise RuntimeError(doc.get("error"))
                return int(doc["metrics"]["output_token_count"])

            for name, fn in (("tensorrt_llm", raw_model), ("ensemble", ensemble), ("cog", through_cog)):
                seconds, tokens = _time(fn, args.runs)
                results[name] = {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}
    print(f"{'layer':<14}{'median s':>10}{'tokens':>8}{'tok/s':>9}{'+ms/req':>10}{'+ms/token':>11}")
    below = None
    for name, row in results.items():
        extra = "" if below is None else f"{(row['seconds'] - below['seconds']) * 1e3:>10.1f}{(row['seconds'] - below['seconds']) * 1e3 / n:>11.2f}"
        print(f"{name:<14}{row['seconds']:>10.3f}{row['tokens']:>8}{row['tokens_per_s']:>9.1f}{extra}")
        below = row
    total = (results["cog"]["seconds"] - results["tensorrt_llm"]["seconds"]) / results["tensorrt_llm"]["seconds"]
    print(f"\nserving layer total: {total * 100:+.1f}% over the model alone inside Triton")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
