#!/usr/bin/env python3
"""Launch Triton on a rendered model repository: our replacement for tensorrtllm_backend's
scripts/launch_triton_server.py.

    python scripts/launch_triton_server.py --model_repo build/model_repository [--world_size 4]
        [--http_port 8000 --grpc_port 8001 --metrics_port 8002] [--dry-run]

world_size > 1 starts one tritonserver per rank under mpirun (ranks above 0 load only
tensorrt_llm). Every endpoint binds 127.0.0.1. Runs in the foreground until Ctrl-C/SIGTERM, then
stops Triton (SIGINT, then SIGKILL after the grace period). ``--dry-run`` prints the command only.
Exit status: 0 after a clean stop, 1 if Triton failed to start or exited on its own, 2 for bad
arguments.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common.errors import CogTritonError  # noqa: E402
from cog_triton.settings import REPO_ROOT  # noqa: E402
from tensorrtllm_backend.server import LaunchConfig, TritonServer, build_command, locate_tritonserver  # noqa: E402

log = logging.getLogger("launch_triton_server")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_repo", "--model-repo", type=Path, required=True)
    parser.add_argument("--world_size", "--world-size", type=int, default=1)
    parser.add_argument("--http_port", "--http-port", type=int, default=8000)
    parser.add_argument("--grpc_port", "--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics_port", "--metrics-port", type=int, default=8002)
    parser.add_argument("--tritonserver", type=Path, default=None, help="binary (default: auto-detect)")
    parser.add_argument("--log_file", "--log-file", type=Path, default=REPO_ROOT / "build" / "triton.log")
    parser.add_argument("--log_verbose", "--log-verbose", type=int, default=0)
    parser.add_argument("--startup_timeout_s", type=float, default=600.0)
    parser.add_argument("--dry-run", action="store_true", help="print the command and exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.world_size < 1:
        parser.error(f"--world_size must be >= 1, got {args.world_size}")
    if not (args.model_repo / "ensemble_ids").is_dir() and not args.dry_run:
        parser.error(f"{args.model_repo} is not a rendered model repository (no ensemble_ids/ folder)")
    try:
        installation = locate_tritonserver(args.tritonserver, work_dir=REPO_ROOT / "build")
        cfg = LaunchConfig(
            model_repo=args.model_repo.resolve(),
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            metrics_port=args.metrics_port,
            world_size=args.world_size,
            log_verbose=args.log_verbose,
        )
        if args.dry_run:
            print(shlex.join(build_command(installation, cfg)))
            return 0
        server = TritonServer(installation, cfg, log_file=args.log_file)
        stop = threading.Event()
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        server.start()
        seconds = server.wait_ready(args.startup_timeout_s)
    except CogTritonError as exc:
        log.error("%s", exc)
        return 1
    log.info("Triton ready in %.1f s at %s (log: %s)", seconds, server.url, args.log_file)
    while not stop.wait(0.5):
        if not server.is_alive():
            log.error("Triton %s. Last log lines:\n%s", server.exit_description(), server.log_tail(20))
            return 1
    server.stop()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
