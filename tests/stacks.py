"""The real Cog server + Triton stack of the integration tests (tests/conftest.py shares two of them per session:
``shared_stack`` and ``fault_stack``)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

import pytest

from cog_triton.dev.local import CogServer, WeightsHTTPServer, serving_env
from tests.proc import descendants_of, pids_mentioning

#: The settings of the shared stacks: the default model with a 384-token input and 768-token sequence limit
#: (tests/test_integration.py and tests/test_structured_output.py count on them), a 5-s stop timeout, two
#: stream processes (tests/test_faults.py kills one of them), four prediction slots.
STACK_SETTINGS = {
    "COG_TRITON_REFERENCE_MAX_INPUT_LEN": "384",
    "COG_TRITON_REFERENCE_MAX_SEQ_LEN": "768",
    "COG_TRITON_STOP_TIMEOUT_S": "5",
    "COG_TRITON_STREAM_PROCESSES": "2",
    # each scrape answered by a rendering that starts after it arrives: tests compare metrics before and after a
    # prediction, which the default 1-s shared rendering (cog_triton.worker.metrics_endpoint) may not show yet
    "COG_TRITON_PROMETHEUS_REUSE_S": "0",
}
STACK_SLOTS = 4


@contextlib.contextmanager
def cog_stack(tmp_path_factory: pytest.TempPathFactory, archive: Path, name: str, *, slots: int = STACK_SLOTS,
              **settings: str) -> Iterator[dict[str, Any]]:
    """The real Cog server running predict.py, whose setup() downloads ``archive`` (checked against its .sha256)
    from a local HTTP server and starts Triton, with ``settings`` (COG_TRITON_* variables) on free ports.

    Yields a dict: ``cog`` (the :class:`CogServer`), ``weights`` (the HTTP server, counting downloads), ``env``,
    ``work`` (weights, model repository, triton.log, cog.log), ``repo`` (the model repository), ``triton``
    (Triton's HTTP URL), ``health`` (the READY health document), ``archive``. Stops the Cog server (and Triton
    with it) at the end.
    """
    work = tmp_path_factory.mktemp(name)
    sha256 = archive.with_name(archive.name + ".sha256").read_text().split()[0]
    with WeightsHTTPServer(archive.parent) as weights:
        env = serving_env(f"{weights.url}/{archive.name}", sha256=sha256, work=work, **settings)
        stack: dict[str, Any] = {"weights": weights, "env": env, "work": work, "repo": work / "model_repository",
                                 "triton": f"http://127.0.0.1:{env['COG_TRITON_HTTP_PORT']}", "archive": archive,
                                 "slots": slots}
        stack["cog"] = CogServer(env, log_file=work / "cog.log", max_concurrency=slots)
        stack["cog"].start()
        try:
            stack["health"] = stack["cog"].wait_ready(timeout_s=400)
            yield stack
        finally:
            stack["cog"].stop()  # the one serving at the end (a test may have replaced it: see fault_stack)


def stack_processes(stack: dict[str, Any]) -> dict[str, Any]:
    """What a test that breaks nothing leaves as it was: the Cog server, Triton, its Python backend stubs and the
    stream processes (their pids), read from /proc."""
    cog = stack["cog"]
    below = descendants_of(cog.proc.pid) if cog.proc is not None and cog.proc.poll() is None else set()
    return {
        "cog": cog.proc.pid if cog.proc is not None and cog.proc.poll() is None else None,
        "tritonserver": sorted(pids_mentioning("tritonserver", f"--model-repository={stack['repo']}")),
        "stubs": sorted(set(pids_mentioning("triton_python_backend_stub", str(stack["repo"]))) & below),
        "stream processes": sorted(set(pids_mentioning("cog_triton.streaming.streamer")) & below),
    }
