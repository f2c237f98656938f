#!/usr/bin/env python3
"""Run the Cog HTTP server with the default model in the foreground (Ctrl-C stops everything).

    scripts/serve [--port 5000] [--host 127.0.0.1] [--weights URL-or-path]

By default the weights are the bundled SmolLM2-135M-Instruct archive, served from a local HTTP
server so setup() exercises the real download path. Logs "ready" with the URL when setup is done.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cog_triton.dev.local import CogServer, WeightsHTTPServer, serving_env  # noqa: E402
from cog_triton.settings import REPO_ROOT  # noqa: E402

ARCHIVE = REPO_ROOT / "build" / "default_model" / "smollm2-135m-instruct.tar.gz"
log = logging.getLogger("serve")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=5000, help="Cog HTTP port (default 5000)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--weights", default=None, help="weights URL or path (default: the bundled model)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.weights is None and not ARCHIVE.is_file():
        log.error("%s is missing: run scripts/setup first", ARCHIVE)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with WeightsHTTPServer(ARCHIVE.parent) as weights:
        env = serving_env(args.weights or f"{weights.url}/{ARCHIVE.name}")
        with CogServer(env, port=args.port, host=args.host) as cog:
            log.info("setting up (logs: %s)", cog.log_file)
            try:
                cog.wait_ready()
            except RuntimeError as exc:
                log.error("%s", exc)
                return 1
            log.info("ready: POST %s/predictions  (stream it: curl -N %s/predictions -H 'Accept: text/event-stream' "
                     "-H 'Content-Type: application/json' -d '{\"input\": {\"prompt\": \"What is machine learning?\"}}')",
                     cog.url, cog.url)
            while not stop.wait(1.0):
                if cog.proc is not None and cog.proc.poll() is not None:
                    log.error("Cog server exited with %s", cog.proc.returncode)
                    return 1
            log.info("stopping")
    return 0


if __name__ == "__main__":
    sys.exit(main())
