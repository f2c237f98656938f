#!/usr/bin/env python3
"""The main job on the bundled default model, end to end, without a GPU.

Serves the SmolLM2-135M-Instruct weights archive (made by scripts/setup) from a local HTTP server,
starts the real Cog HTTP server (coglet, with the Cog schema bundled as `cog build` does) whose
setup() downloads it, renders the model repository and starts a real Triton Inference Server, then
POSTs a prediction with ``Accept: text/event-stream`` and prints the answer as coglet streams it
over server-sent events.

    .venv/bin/python scripts/demo.py [--prompt "What is machine learning?"] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cog_triton.dev.local import CogServer, WeightsHTTPServer, serving_env  # noqa: E402
from cog_triton.settings import REPO_ROOT  # noqa: E402

ARCHIVE = REPO_ROOT / "build" / "default_model" / "smollm2-135m-instruct.tar.gz"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Stream an answer from the default model through Cog + Triton.")
    parser.add_argument("--prompt", default="What is machine learning?")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if not ARCHIVE.is_file():
        print(f"{ARCHIVE} is missing: run scripts/setup first", file=sys.stderr)
        return 1
    sha256 = ARCHIVE.with_name(ARCHIVE.name + ".sha256").read_text().split()[0]
    started = time.monotonic()
    with WeightsHTTPServer(ARCHIVE.parent) as weights:
        env = serving_env(f"{weights.url}/{ARCHIVE.name}", sha256=sha256)
        with CogServer(env) as cog:
            print(f"Cog server {cog.url}: running setup (download weights, render model repository, start Triton)...")
            cog.wait_ready()
            print(f"ready after {time.monotonic() - started:.1f} s\n")
            print(f"> {args.prompt}\n", flush=True)
            inputs = {"prompt": args.prompt, "max_tokens": args.max_tokens, "temperature": args.temperature}
            final: dict[str, Any] = {}
            for event, data in cog.stream(inputs, timeout_s=600):
                if event == "output":
                    print(data["chunk"], end="", flush=True)
                elif event == "completed":
                    final = data
            print("\n")
            if final.get("status") != "succeeded":
                print(f"prediction {final.get('status')}: {final.get('error')}", file=sys.stderr)
                return 1
            print(f"metrics: {json.dumps(final.get('metrics', {}))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
