#!/usr/bin/env python3
"""The main job on the bundled default model, end to end, without a GPU.

Serves the SmolLM2-135M-Instruct weights archive (made by scripts/setup) from a local HTTP server,
starts the real Cog HTTP server (coglet) whose setup() downloads it, renders the model repository
and starts a real Triton Inference Server, then POSTs a prediction and prints the answer as it
streams (through Cog's async prediction webhooks, the way Replicate streams).

    .venv/bin/python scripts/demo.py [--prompt "What is machine learning?"] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import http.server
import json
import logging
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cog_triton.local import CogServer, WeightsHTTPServer, free_port  # noqa: E402
from cog_triton.settings import REPO_ROOT  # noqa: E402

ARCHIVE = REPO_ROOT / "build" / "default_model" / "smollm2-135m-instruct.tar.gz"


class _Webhooks(http.server.ThreadingHTTPServer):
    events: "queue.Queue[dict[str, Any]]"


class _WebhookHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.events.put(json.loads(body))  # type: ignore[attr-defined]
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


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
    hooks = _Webhooks(("127.0.0.1", 0), _WebhookHandler)
    hooks.events = queue.Queue()
    threading.Thread(target=hooks.serve_forever, daemon=True).start()
    started = time.monotonic()
    with WeightsHTTPServer(ARCHIVE.parent) as weights:
        env = {
            "COG_WEIGHTS": f"{weights.url}/{ARCHIVE.name}",
            "COG_TRITON_WEIGHTS_SHA256": sha256,
            "COG_TRITON_HTTP_PORT": str(free_port()),
            "COG_TRITON_GRPC_PORT": str(free_port()),
            "COG_TRITON_METRICS_PORT": str(free_port()),
            "COG_THROTTLE_RESPONSE_INTERVAL": "0.05",
        }
        with CogServer(env) as cog:
            print(f"Cog server {cog.url}: running setup (download weights, render model repository, start Triton)...")
            cog.wait_ready()
            print(f"ready after {time.monotonic() - started:.1f} s\n")
            print(f"> {args.prompt}\n", flush=True)
            body = {
                "input": {"prompt": args.prompt, "max_tokens": args.max_tokens, "temperature": args.temperature},
                "webhook": f"http://127.0.0.1:{hooks.server_address[1]}/hook",
                "webhook_events_filter": ["start", "output", "completed"],
            }
            response = httpx.post(f"{cog.url}/predictions", json=body, headers={"Prefer": "respond-async"}, timeout=30)
            response.raise_for_status()
            printed = 0
            while True:
                event = hooks.events.get(timeout=600)
                output = event.get("output") or []
                for chunk in output[printed:]:
                    print(chunk, end="", flush=True)
                printed = max(printed, len(output))
                if event.get("status") in ("succeeded", "failed", "canceled"):
                    break
            print("\n")
            if event["status"] != "succeeded":
                print(f"prediction {event['status']}: {event.get('error')}", file=sys.stderr)
                return 1
            print(f"metrics: {json.dumps(event.get('metrics', {}))}")
    hooks.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
