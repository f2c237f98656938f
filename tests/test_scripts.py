"""The README's main job (scripts/demo.py) and scripts/serve, run as a user runs them."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from cog_triton.dev.local import free_port
from cog_triton.settings import REPO_ROOT
from tests.proc import pids_mentioning

pytestmark = pytest.mark.integration


DEFAULT_REPO = str(REPO_ROOT / "build" / "model_repository")


def _no_triton_left(timeout_s: float = 20.0) -> bool:
    """True once no tritonserver serving the default model repository is running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not [p for p in pids_mentioning(f"--model-repository={DEFAULT_REPO}")]:
            return True
        time.sleep(0.2)
    return False


def test_demo_streams_the_answer(default_archive: Path) -> None:
    result = subprocess.run(
        [sys.executable, "scripts/demo.py", "--max-tokens", "16"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "> What is machine learning?" in result.stdout
    assert "Machine learning is a subset of artificial intelligence" in result.stdout
    assert '"output_token_count": 16' in result.stdout
    assert _no_triton_left(), "the demo left tritonserver running"


def test_serve_logs_ready_serves_and_stops_on_sigint(default_archive: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [str(REPO_ROOT / "scripts" / "serve"), "--port", str(port)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "ready: POST" in line:
                break
        assert any(f"ready: POST http://127.0.0.1:{port}/predictions" in line for line in lines), "".join(lines)
        doc = httpx.post(
            f"http://127.0.0.1:{port}/predictions",
            json={"input": {"prompt": "What is machine learning?", "max_tokens": 8, "temperature": 0}},
            timeout=120,
        ).json()
        assert doc["status"] == "succeeded", doc
        assert "".join(doc["output"]).startswith("Machine learning is")
        # served as the built image serves: schema bundled, so SSE streaming and /openapi.json work
        assert httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=10).status_code == 200
        with httpx.stream("POST", f"http://127.0.0.1:{port}/predictions", timeout=120,
                          json={"input": {"prompt": "Hi", "max_tokens": 4, "temperature": 0}},
                          headers={"Accept": "text/event-stream"}) as response:
            assert response.status_code == 200
            events = [line for line in response.iter_lines() if line.startswith("event:")]
        assert "event: output" in events and events[-1] == "event: completed", events
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{port}/health-check", timeout=2)
        assert _no_triton_left(), "scripts/serve left tritonserver running"
    finally:
        if proc.poll() is None:
            proc.kill()
