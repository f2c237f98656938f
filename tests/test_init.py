"""The image's init: tini in front of NGC's entrypoint reaps what a killed Triton leaves behind.

`cog build` labels every image ``run.cog.has_init=true`` (replicate/cog pkg/image/build.go) and the
images it generates run ``tini`` as ENTRYPOINT (pkg/dockerfile/standard_generator.go), so Replicate adds
no init of its own. Without one, coglet is PID 1 (NGC's ``nvidia_entrypoint.sh`` ends in ``exec "$@"``:
triton-inference-server/server docker/cpu_only/nvidia_entrypoint.sh, the CPU copy of the GPU images'
script) and the backend stubs of a Triton that was killed and restarted, orphaned to PID 1, stay zombies.

Here the Dockerfile's ENTRYPOINT runs for real as PID 1 of a new PID namespace (``unshare``), with tini
from the distribution (scripts/setup installs it) and a stand-in for NGC's script that does what the
real one does last (``exec "$@"``). Under it a real Triton (the nvidia-pytriton bundle, a Python-backend
model) is started by ``TritonServer``, killed with SIGKILL and restarted as the supervisor does; the old
Python stub must then be reaped. The same run without tini (the command as PID 1) must leave it a
zombie: that control shows the check bites.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cog_triton.settings import REPO_ROOT
from tensorrtllm_backend.server import SHM_DIR, SHM_PREFIX, pid_namespace
from tests.test_packaging import dockerfile_instructions
from tests.test_server import ECHO_MODEL, launch_config, write_repo

pytestmark = pytest.mark.integration
NGC_ENTRYPOINT = "/opt/nvidia/nvidia_entrypoint.sh"
_probes = itertools.count(900_000)

OWNER = """\
import json, os, signal, sys, time
from pathlib import Path

import httpx

from tensorrtllm_backend.server import LaunchConfig, TritonServer, locate_tritonserver

repo, work, log_file, http, grpc, metrics = sys.argv[1:]


def state(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None  # gone: reaped


server = TritonServer(
    locate_tritonserver(work_dir=Path(work)),
    LaunchConfig(model_repo=Path(repo), http_port=int(http), grpc_port=int(grpc), metrics_port=int(metrics)),
    Path(log_file),
)
server.start()
server.wait_ready(120)
assert httpx.post(server.url + "/v2/models/echo/generate_stream", json={"INPUT": "x"}, timeout=60).status_code == 200
stubs = [stub.pid for stub in server.stub_processes()]
assert stubs, "no Python backend stub under tritonserver"
os.kill(server.pid, signal.SIGKILL)  # Triton dies; its stubs are orphaned to PID 1
deadline = time.monotonic() + 30
while server.is_alive() and time.monotonic() < deadline:
    time.sleep(0.05)
server.start()  # the supervisor's restart: kills the old process group, starts a new Triton
server.wait_ready(120)
deadline = time.monotonic() + 30  # generous: only "not hung"
while any(state(p) not in (None, "Z") for p in stubs) and time.monotonic() < deadline:
    time.sleep(0.05)
deadline = time.monotonic() + 5  # an init reaps at once (SIGCHLD); without one nothing ever does
while any(state(p) == "Z" for p in stubs) and time.monotonic() < deadline:
    time.sleep(0.05)
report = {"pid1": Path("/proc/1/comm").read_text().strip(), "stubs": stubs,
          "zombies": [p for p in stubs if state(p) == "Z"], "alive": [p for p in stubs if state(p) not in (None, "Z")]}
server.stop()
print(json.dumps(report), flush=True)
"""


def entrypoint() -> list[str]:
    entries = [json.loads(rest) for keyword, rest in dockerfile_instructions() if keyword == "ENTRYPOINT"]
    assert len(entries) == 1, "the Dockerfile needs exactly one ENTRYPOINT"
    return entries[0]


def test_the_entrypoint_is_tini_in_front_of_ngcs_entrypoint() -> None:
    assert entrypoint() == ["/usr/bin/tini", "--", NGC_ENTRYPOINT]
    runs = " ".join(rest for keyword, rest in dockerfile_instructions() if keyword == "RUN")
    assert "apt-get install -y --no-install-recommends tini=" in runs and "/usr/bin/tini --version" in runs


def run_as_pid1(prefix: list[str], tmp_path: Path) -> dict:
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed to run a command as PID 1 of a new PID namespace", pytrace=False)
    repo = write_repo(tmp_path / "repo", ECHO_MODEL)
    cfg = launch_config(repo)
    command = ["unshare", "--pid", "--fork", "--mount-proc", *prefix, sys.executable, "-c", OWNER, str(repo),
               str(tmp_path / "work"), str(tmp_path / "triton.log"), str(cfg.http_port), str(cfg.grpc_port),
               str(cfg.metrics_port)]
    # A live region of a server of this namespace (owner: this process, which the new namespace cannot see).
    # /dev/shm is shared with the new namespace; the Triton starts in there must leave it alone.
    live = SHM_DIR / f"{SHM_PREFIX}{pid_namespace()}p{os.getpid()}x{next(_probes)}r0_live-region-probe"
    live.write_bytes(b"")
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO_ROOT,
                                env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
        assert live.exists(), "a Triton started in another PID namespace removed a live region of this one"
    finally:
        live.unlink(missing_ok=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def stand_in_ngc_entrypoint(tmp_path: Path) -> Path:
    script = tmp_path / "nvidia_entrypoint.sh"
    script.write_text('#!/bin/bash\nexec "$@"\n')  # what NGC's script does after its banner and checks
    script.chmod(0o755)
    return script


def test_a_killed_tritons_stub_is_reaped_under_the_images_init(tmp_path: Path) -> None:
    tini = entrypoint()[0]
    if not Path(tini).is_file():
        pytest.fail(f"{tini} is missing: scripts/setup installs tini (apt-get install tini)", pytrace=False)
    prefix = [part if part != NGC_ENTRYPOINT else str(stand_in_ngc_entrypoint(tmp_path)) for part in entrypoint()]
    report = run_as_pid1(prefix, tmp_path / "tini")
    assert report["pid1"] == "tini", report
    assert report["zombies"] == [] and report["alive"] == [], report


def test_without_the_init_the_stub_stays_a_zombie(tmp_path: Path) -> None:
    """The control: NGC's entrypoint alone execs the command, which becomes PID 1 and reaps nothing."""
    report = run_as_pid1([str(stand_in_ngc_entrypoint(tmp_path))], tmp_path / "bare")
    assert report["pid1"] != "tini" and report["zombies"] == report["stubs"], report
