"""scripts/launch_triton_server.py: the command it prints, argument errors, and a real run."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cog_triton.dev.local import free_port
from cog_triton.settings import REPO_ROOT
from tensorrtllm_backend.engine import inspect_weights
from tests.proc import wait_for_pids_gone
from tensorrtllm_backend.templates import RenderOptions, render_model_repository
from tests.proc import pids_mentioning

SCRIPT = [sys.executable, str(REPO_ROOT / "scripts" / "launch_triton_server.py")]


def test_dry_run_prints_the_mpirun_command(tmp_path: Path) -> None:
    out = subprocess.run(
        [*SCRIPT, "--model_repo", str(tmp_path), "--world_size", "2", "--http_port", "9100", "--dry-run"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert out.startswith("mpirun --allow-run-as-root -n 1 ")
    rank0, rank1 = out.split(" : ")
    assert "--http-address=127.0.0.1" in rank0 and "--http-port=9100" in rank0
    assert f"--model-repository={tmp_path}" in rank0
    assert "--load-model=tensorrt_llm" in rank1 and "--allow-http=false" in rank1
    assert "--http-port" not in rank1
    # Each rank gets its own shared-memory prefix: <launch prefix><rank>_, unique per launch.
    prefixes = [re.search(r"shm-region-prefix-name=(\S+)", rank).group(1) for rank in (rank0, rank1)]
    assert prefixes[0].endswith("r0_") and prefixes[1].endswith("r1_")
    assert prefixes[0][:-3] == prefixes[1][:-3]


@pytest.mark.parametrize(
    "args, message",
    [(["--world_size", "0"], "--world_size must be >= 1"), ([], "is not a rendered model repository")],
)
def test_bad_arguments_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    result = subprocess.run([*SCRIPT, "--model_repo", str(tmp_path), *args], capture_output=True, text=True)
    assert result.returncode == 2
    assert message in result.stderr


@pytest.mark.integration
def test_runs_in_foreground_until_sigint(tmp_path: Path, checkpoint_dir: Path) -> None:
    info = inspect_weights(checkpoint_dir, reference_max_seq_len=256)
    repo = tmp_path / "repo"
    render_model_repository(RenderOptions(template_dir=REPO_ROOT / "triton_model_repo", model_repo_dir=repo), info)
    http = free_port()
    proc = subprocess.Popen(
        [*SCRIPT, "--model_repo", str(repo), "--http_port", str(http), "--grpc_port", str(free_port()),
         "--metrics_port", str(free_port()), "--log_file", str(tmp_path / "triton.log")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        lines = []
        deadline = time.monotonic() + 180
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "Triton ready" in line or not line:
                break
        assert any(f"http://127.0.0.1:{http}" in line for line in lines), "".join(lines)
        triton_pids = pids_mentioning(str(repo))
        assert triton_pids
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert wait_for_pids_gone(triton_pids, timeout_s=10)
    finally:
        if proc.poll() is None:
            proc.kill()
