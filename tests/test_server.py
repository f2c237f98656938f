"""Tests of tensorrtllm_backend.server: command lines, locating tritonserver, and a real Triton
(the nvidia-pytriton bundle, CPU only) serving tiny Python-backend models written here."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Optional

import httpx
import pytest

from common.errors import ConfigError, TritonStartupError
from tests.proc import wait_for_pids_gone
from tensorrtllm_backend.server import (
    LaunchConfig,
    TritonInstallation,
    TritonServer,
    _check_embedded_libpython,
    _merged_env,
    _proc_state,
    build_command,
    locate_tritonserver,
    pid_namespace,
    remove_stale_shm_regions,
    shm_region_owner,
    unique_shm_prefix,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
PY_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"

# --- build_command (pure) --------------------------------------------------------------------

FIXED = TritonInstallation(binary=Path("/opt/tt/bin/tritonserver"), backend_dir=Path("/opt/tt/backends"))


def test_build_command_world_size_1_is_one_loopback_tritonserver() -> None:
    cfg = LaunchConfig(model_repo=Path("/srv/repo"), http_port=18000, grpc_port=18001, metrics_port=18002,
                       shm_prefix="prefix")
    assert build_command(FIXED, cfg) == [
        "/opt/tt/bin/tritonserver",
        "--model-repository=/srv/repo",
        "--backend-directory=/opt/tt/backends",
        "--disable-auto-complete-config",
        "--backend-config=python,shm-region-prefix-name=prefix0_",
        "--log-verbose=0",
        "--http-address=127.0.0.1",
        "--http-port=18000",
        "--grpc-address=127.0.0.1",
        "--grpc-port=18001",
        "--metrics-address=127.0.0.1",
        "--metrics-port=18002",
    ]


def test_build_command_single_rank_mpirun_is_one_tritonserver_under_mpirun_n_1() -> None:
    """The PyTorch backend's multi-GPU launch: one server under ``mpirun -n 1`` (its LLM spawns the ranks)."""
    cfg = LaunchConfig(model_repo=Path("/srv/repo"), single_rank_mpirun=True, mpirun="/usr/bin/mpirun",
                       shm_prefix="prefix")
    one = build_command(FIXED, LaunchConfig(model_repo=Path("/srv/repo"), shm_prefix="prefix"))
    assert build_command(FIXED, cfg) == ["/usr/bin/mpirun", "--allow-run-as-root", "-n", "1", *one]


def test_build_command_world_size_4_runs_ranks_under_mpirun() -> None:
    cfg = LaunchConfig(model_repo=Path("/srv/repo"), world_size=4, log_verbose=2, mpirun="/usr/bin/mpirun",
                       shm_prefix="prefix")
    common = [
        "/opt/tt/bin/tritonserver",
        "--model-repository=/srv/repo",
        "--backend-directory=/opt/tt/backends",
        "--disable-auto-complete-config",
    ]
    rank0 = [
        *common,
        "--backend-config=python,shm-region-prefix-name=prefix0_",
        "--log-verbose=2",
        "--http-address=127.0.0.1",
        "--http-port=8000",
        "--grpc-address=127.0.0.1",
        "--grpc-port=8001",
        "--metrics-address=127.0.0.1",
        "--metrics-port=8002",
    ]

    def worker(rank: int) -> list[str]:
        return [
            *common,
            f"--backend-config=python,shm-region-prefix-name=prefix{rank}_",
            "--log-verbose=2",
            "--model-control-mode=explicit",
            "--load-model=tensorrt_llm",
            "--allow-http=false",
            "--allow-grpc=false",
            "--allow-metrics=false",
        ]

    expected = ["/usr/bin/mpirun", "--allow-run-as-root", "-n", "1", *rank0]
    for rank in (1, 2, 3):
        expected += [":", "-n", "1", *worker(rank)]
    cmd = build_command(FIXED, cfg)
    assert cmd == expected
    # Only rank 0 binds ports.
    assert sum(arg.startswith("--http-port") for arg in cmd) == 1
    assert sum(arg.startswith(("--http-address", "--grpc-address", "--metrics-address")) for arg in cmd) == 3


def test_build_command_default_mpirun() -> None:
    cmd = build_command(FIXED, LaunchConfig(model_repo=Path("/r"), world_size=2))
    assert cmd[:4] == ["mpirun", "--allow-run-as-root", "-n", "1"]
    assert cmd.count(":") == 1


def test_every_launch_gets_its_own_shm_prefix() -> None:
    """Stopping a server removes every region under its prefix, so two servers of one host (tests,
    the benchmark, a restart) must never share one; upstream's fixed ``prefix`` would."""
    first, second = LaunchConfig(model_repo=Path("/r")), LaunchConfig(model_repo=Path("/r"))
    assert first.shm_prefix != second.shm_prefix
    assert first.shm_prefix.startswith(f"cogtriton{os.stat('/proc/self/ns/pid').st_ino}p{os.getpid()}x")
    assert f"--backend-config=python,shm-region-prefix-name={first.shm_prefix}0_" in build_command(FIXED, first)


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])  # noqa: S607
    child.wait()
    return child.pid


def test_stale_regions_are_only_those_of_dead_owners_of_this_pid_namespace(tmp_path: Path) -> None:
    """A pid names a process only in its own PID namespace, and /dev/shm can be shared across namespaces
    (``docker run --ipc=host``; tests/test_init.py's ``unshare --pid``). A region of another namespace is never
    stale to us, whatever its pid is here: before, a Triton started under ``unshare --pid`` removed every live
    region of the host's servers, whose owners it could not see."""
    here, dead, alive = pid_namespace(), _dead_pid(), os.getpid()
    assert here == os.stat("/proc/self/ns/pid").st_ino
    names = {
        "ours, dead owner": f"cogtriton{here}p{dead}x1r0_a",
        "ours, live owner": f"cogtriton{here}p{alive}x1r0_b",
        "other namespace, pid dead here": f"cogtriton{here + 1}p{dead}x1r0_c",
        "other namespace, pid alive here": f"cogtriton{here + 1}p{alive}x1r0_d",
        "old naming": f"cogtriton{dead}x1r0_e",
        "not ours": "triton_python_backend_shm_region_f",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"")
    assert remove_stale_shm_regions(tmp_path) == [names["ours, dead owner"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(v for k, v in names.items() if k != "ours, dead owner")


def test_a_region_name_gives_back_the_namespace_and_owner_its_prefix_was_made_with() -> None:
    name = f"{unique_shm_prefix()}0_triton_python_backend_shm_region_abc"
    assert shm_region_owner(name) == (pid_namespace(), os.getpid())
    assert shm_region_owner(f"cogtriton{os.getpid()}x1r0_old") is None  # the format before PID namespaces
    assert shm_region_owner("triton_python_backend_shm_region_1") is None


@pytest.mark.parametrize("world_size", [0, -1])
def test_build_command_rejects_world_size_below_1(world_size: int) -> None:
    with pytest.raises(ConfigError, match=rf"world_size must be >= 1, got {world_size}"):
        build_command(FIXED, LaunchConfig(model_repo=Path("/r"), world_size=world_size))


def test_server_command_and_url_follow_the_config(tmp_path: Path) -> None:
    cfg = LaunchConfig(model_repo=Path("/r"), http_port=18123)
    server = TritonServer(FIXED, cfg, tmp_path / "t.log")
    assert server.command == build_command(FIXED, cfg)
    assert server.url == "http://127.0.0.1:18123"
    assert server.pid is None and server.returncode is None and not server.is_alive()
    assert server.exit_description() == "is running"  # not started: no exit status
    assert server.stop() is None  # never started: nothing to stop


def test_merged_env_prefixes_path_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin")
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    env = _merged_env({"PATH": "/venv/bin", "LD_LIBRARY_PATH": "/libs", "OTHER": "x"})
    assert env["PATH"] == f"/venv/bin{os.pathsep}/usr/bin"
    assert env["LD_LIBRARY_PATH"] == "/libs"
    assert env["OTHER"] == "x"


# --- locate_tritonserver ---------------------------------------------------------------------


def test_locate_explicit_binary_missing(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "tritonserver"
    with pytest.raises(ConfigError) as info:
        locate_tritonserver(binary=missing, work_dir=tmp_path)
    assert str(missing) in str(info.value)
    assert "not an executable file" in str(info.value)


def test_locate_explicit_binary_not_executable(tmp_path: Path) -> None:
    binary = tmp_path / "bin" / "tritonserver"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o644)
    with pytest.raises(ConfigError, match="not an executable file"):
        locate_tritonserver(binary=binary, work_dir=tmp_path)


def _fake_binary(root: Path) -> Path:
    binary = root / "bin" / "tritonserver"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\nexit 0\n")
    binary.chmod(0o755)
    return binary


def test_locate_explicit_binary_without_backends(tmp_path: Path) -> None:
    binary = _fake_binary(tmp_path / "tt")
    with pytest.raises(ConfigError) as info:
        locate_tritonserver(binary=binary, work_dir=tmp_path)
    assert str(tmp_path / "tt" / "backends") in str(info.value)
    assert "COG_TRITON_BACKEND_DIR" in str(info.value)
    # An explicit backend directory that does not exist is reported too.
    with pytest.raises(ConfigError, match=str(tmp_path / "elsewhere")):
        locate_tritonserver(binary=binary, backend_dir=tmp_path / "elsewhere", work_dir=tmp_path)


def test_locate_explicit_binary_with_backends(tmp_path: Path) -> None:
    binary = _fake_binary(tmp_path / "tt")
    (tmp_path / "tt" / "backends").mkdir()
    found = locate_tritonserver(binary=binary, work_dir=tmp_path)
    assert found == TritonInstallation(binary=binary, backend_dir=(tmp_path / "tt" / "backends").resolve(), source="env")
    other = tmp_path / "other_backends"
    other.mkdir()
    assert locate_tritonserver(binary=binary, backend_dir=other, work_dir=tmp_path).backend_dir == other


@pytest.fixture(scope="module")
def installation(tmp_path_factory: pytest.TempPathFactory) -> TritonInstallation:
    return locate_tritonserver(work_dir=tmp_path_factory.mktemp("triton_work"))


def test_locate_pytriton_bundle(installation: TritonInstallation, tmp_path: Path) -> None:
    assert installation.source == "pytriton"
    assert installation.binary.is_file() and os.access(installation.binary, os.X_OK)
    python_dir = installation.backend_dir / "python"
    assert (python_dir / "triton_python_backend_stub").is_file()
    assert os.access(python_dir / "triton_python_backend_stub", os.X_OK)
    assert (python_dir / "libtriton_python.so").is_file()
    assert installation.backend_dir.name == f"triton_backends_py{PY_VERSION}"
    assert Path(installation.env["LD_LIBRARY_PATH"]).is_dir()
    assert installation.env["PATH"] == str(Path(sys.executable).parent)
    # The stub copied is the one for this interpreter.
    bundled = installation.binary.parent.parent / "python_backend_stubs" / PY_VERSION / "triton_python_backend_stub"
    assert (python_dir / "triton_python_backend_stub").read_bytes() == bundled.read_bytes()
    # Located again into the same work dir: same answer (the assembled directory is reused).
    again = locate_tritonserver(work_dir=installation.backend_dir.parent)
    assert again == installation
    # An explicit backend directory overrides the assembled one, keeping the bundle's environment.
    override = locate_tritonserver(backend_dir=tmp_path, work_dir=installation.backend_dir.parent)
    assert override.backend_dir == tmp_path and override.source == "pytriton" and override.env == installation.env


def test_check_embedded_libpython_passes_in_this_venv(installation: TritonInstallation) -> None:
    stub = installation.backend_dir / "python" / "triton_python_backend_stub"
    _check_embedded_libpython(stub, PY_VERSION)  # must not raise


def test_check_embedded_libpython_reports_missing_library() -> None:
    # /bin/true links no libpython: the same error a stub sees when the library is not installed.
    with pytest.raises(ConfigError) as info:
        _check_embedded_libpython(Path("/bin/true"), PY_VERSION)
    assert f"libpython{PY_VERSION}.so.1.0" in str(info.value)
    assert "install it" in str(info.value)


# --- real Triton -----------------------------------------------------------------------------

CONFIG_PBTXT = """\
name: "echo"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "INPUT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

ECHO_MODEL = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pass

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT")
            for _ in range(3):
                sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", tensor.as_numpy())]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

FAILING_MODEL = """\
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("echo-init-exploded-4711")

    def execute(self, requests):
        return None
"""

SLOW_MODEL = """\
import time
from pathlib import Path


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(15)
        Path(__file__).with_name("loaded").write_text("the slow model finished loading")

    def execute(self, requests):
        return None
"""


def write_repo(root: Path, model_py: str) -> Path:
    version = root / "echo" / "1"
    version.mkdir(parents=True)
    (root / "echo" / "config.pbtxt").write_text(CONFIG_PBTXT)
    (version / "model.py").write_text(model_py)
    return root


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_config(repo: Path) -> LaunchConfig:
    ports: set[int] = set()
    while len(ports) < 3:
        ports.add(free_port())
    http, grpc, metrics = sorted(ports)
    return LaunchConfig(model_repo=repo, http_port=http, grpc_port=grpc, metrics_port=metrics)


def _ppid(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def descendants(pid: int) -> list[int]:
    """PIDs of every live descendant of ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parent = _ppid(int(entry))
            if parent is not None:
                children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _decode_address(hex_address: str) -> str:
    """An address of /proc/net/tcp[6] (host-order 32-bit words in hex) as text; v4-mapped -> IPv4."""
    raw = b"".join(int(hex_address[i : i + 8], 16).to_bytes(4, "little") for i in range(0, len(hex_address), 8))
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw)
    if raw[:12] == b"\0" * 10 + b"\xff\xff":
        return socket.inet_ntop(socket.AF_INET, raw[12:])
    return socket.inet_ntop(socket.AF_INET6, raw)


def listening_addresses(port: int) -> list[str]:
    """Local addresses of the sockets listening on ``port`` (IPv4, or IPv4-mapped IPv6, as IPv4 text)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if fields[3] == "0A" and int(hex_port, 16) == port:  # 0A: TCP_LISTEN
                found.append(_decode_address(address))
    return found


def non_loopback_ip() -> Optional[str]:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect(("192.0.2.123", 9))  # no packet is sent; picks the outgoing interface
            ip = sock.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") else ip


def stream_echo(server: TritonServer, text: str) -> list[dict]:
    response = httpx.post(f"{server.url}/v2/models/echo/generate_stream", json={"INPUT": text}, timeout=30)
    assert response.status_code == 200, response.text
    return [json.loads(line[len("data: ") :]) for line in response.text.splitlines() if line.startswith("data: ")]


@pytest.fixture
def servers() -> Iterator[list[TritonServer]]:
    """Servers a test started; stopped afterwards whatever happened."""
    started: list[TritonServer] = []
    yield started
    for server in started:
        server.stop()


def make_server(installation: TritonInstallation, repo: Path, log_file: Path, servers: list[TritonServer]) -> TritonServer:
    server = TritonServer(installation, launch_config(repo), log_file, stop_timeout_s=10)
    servers.append(server)
    return server


@pytest.mark.integration
def test_real_triton_serves_on_loopback_and_stops_cleanly(
    installation: TritonInstallation, tmp_path: Path, servers: list[TritonServer]
) -> None:
    server = make_server(installation, write_repo(tmp_path / "repo", ECHO_MODEL), tmp_path / "logs" / "t.log", servers)
    server.start()
    assert server.is_alive()
    before = time.monotonic()
    took = server.wait_ready(timeout_s=60)
    waited = time.monotonic() - before
    # wait_ready returns the seconds it waited: Triton takes a while to start (not 0), the figure is this
    # call's own wait (not the deadline, not a time since some other start), measured by the same clock.
    assert 0 < took <= waited and took >= waited / 2, (took, waited)
    assert httpx.get(f"{server.url}/v2/health/ready", timeout=5).status_code == 200

    # The Python backend works: the decoupled echo model answers three times.
    events = stream_echo(server, "hello")
    assert [e["OUTPUT"] for e in events] == ["hello", "hello", "hello"]

    # Every endpoint listens on 127.0.0.1 only.
    cfg = server.cfg
    for port in (cfg.http_port, cfg.grpc_port, cfg.metrics_port):
        assert listening_addresses(port) == ["127.0.0.1"], f"port {port}"
    ip = non_loopback_ip()
    if ip is not None:
        with pytest.raises(OSError):
            socket.create_connection((ip, cfg.http_port), timeout=2).close()

    children = descendants(server.pid)
    assert children, "the Python backend stub should run as a child of tritonserver"
    pid = server.pid
    status = server.stop()
    assert status is not None
    assert wait_for_pids_gone([pid, *children], timeout_s=10)
    assert not server.is_alive()
    assert server.exit_description() != "is running"
    assert server.stop() == status  # idempotent
    log_text = (tmp_path / "logs" / "t.log").read_text()
    assert "Started HTTPService at 127.0.0.1" in log_text
    assert "Started HTTPService at 127.0.0.1" in server.log_tail(400)


@pytest.mark.integration
def test_startup_failure_reports_model_error(
    installation: TritonInstallation, tmp_path: Path, servers: list[TritonServer]
) -> None:
    server = make_server(installation, write_repo(tmp_path / "repo", FAILING_MODEL), tmp_path / "t.log", servers)
    server.start()
    with pytest.raises(TritonStartupError) as info:
        server.wait_ready(timeout_s=60)
    message = str(info.value)
    assert "during startup" in message and "exited with status 1" in message
    assert "Last log lines:" in message
    assert "echo-init-exploded-4711" in message
    assert "failed to load all models" in message
    assert not server.is_alive()


@pytest.mark.integration
def test_startup_failure_port_in_use(
    installation: TritonInstallation, tmp_path: Path, servers: list[TritonServer]
) -> None:
    server = make_server(installation, write_repo(tmp_path / "repo", ECHO_MODEL), tmp_path / "t.log", servers)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as blocker:
        blocker.bind(("127.0.0.1", server.cfg.http_port))
        blocker.listen()
        server.start()
        with pytest.raises(TritonStartupError) as info:
            server.wait_ready(timeout_s=60)
    message = str(info.value)
    assert "during startup" in message
    assert f"127.0.0.1:{server.cfg.http_port}' already in use" in message
    assert not server.is_alive()


@pytest.mark.integration
def test_startup_deadline_stops_triton(
    installation: TritonInstallation, tmp_path: Path, servers: list[TritonServer]
) -> None:
    server = make_server(installation, write_repo(tmp_path / "repo", SLOW_MODEL), tmp_path / "t.log", servers)
    server.start()
    pid = server.pid
    loaded = tmp_path / "repo" / "echo" / "1" / "loaded"  # written when the model's initialize() ends (15 s)
    with pytest.raises(TritonStartupError) as info:
        server.wait_ready(timeout_s=0.01)
    message = str(info.value)
    assert "not ready after 0.01 s" in message
    assert "COG_TRITON_STARTUP_TIMEOUT_S" in message and "it was stopped" in message
    # Stopped at the deadline, not after the slow model loaded: when wait_ready returns, the model has not
    # finished initialize(), and it never will (Triton and its stub are gone).
    assert not loaded.exists(), "wait_ready waited for the slow model to load"
    assert not server.is_alive()
    assert wait_for_pids_gone([pid], timeout_s=5)


@pytest.mark.integration
def test_killed_triton_is_detected_and_restarts(
    installation: TritonInstallation, tmp_path: Path, servers: list[TritonServer]
) -> None:
    server = make_server(installation, write_repo(tmp_path / "repo", ECHO_MODEL), tmp_path / "t.log", servers)
    server.start()
    server.wait_ready(timeout_s=60)
    assert len(stream_echo(server, "before")) == 3  # a stub that served a request hangs when orphaned
    old_pid = server.pid
    old_children = descendants(old_pid)
    assert old_children
    assert [stub.model for stub in server.stub_processes()] == ["echo"]  # the Python stub, named by model

    os.kill(old_pid, signal.SIGKILL)
    deadline = time.monotonic() + 2
    while server.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not server.is_alive()
    assert server.returncode == -signal.SIGKILL
    assert server.exit_description() == "was killed by SIGKILL"
    assert server.stub_processes() == []

    server.start()  # recovery
    server.wait_ready(timeout_s=60)
    assert server.pid != old_pid and server.is_alive()
    assert [e["OUTPUT"] for e in stream_echo(server, "after")] == ["after"] * 3
    # The stubs of the killed Triton do not linger next to the new one.
    assert wait_for_pids_gone(old_children, timeout_s=5), f"leftover stubs {old_children}"
    assert server.is_alive() and not server.is_stopped()


@pytest.mark.parametrize("reaped", [False, True], ids=["zombie", "reaped"])
def test_an_exited_triton_is_not_alive_while_another_thread_waits_for_it(
    tmp_path: Path, servers: list[TritonServer], reaped: bool
) -> None:
    """``Popen.poll()`` answers None ("running") while another thread is inside ``waitpid`` for the same child
    (CPython Lib/subprocess.py, ``Popen._internal_poll``). The supervisor's round and a prediction's ``wait_ready``
    both ask: before, a prediction that asked in that moment would have been sent to the exited Triton. (Found while
    looking into tests/test_faults.py's restart flake, whose cause was another: the leader-thread test below.)
    The "tritonserver" here is a shell script that sleeps (only the process matters), with a child that keeps its
    output pipe open as Triton's backend stubs do. The other thread is simulated by holding the lock that CPython's ``wait`` holds (``_waitpid_lock``,
    private to CPython), before it has reaped the process (a zombie) or after (``reaped``: the pid is gone, and the
    status is recorded just before the lock is let go, as ``wait`` does)."""
    binary = tmp_path / "bin" / "tritonserver"
    binary.parent.mkdir()
    binary.write_text("#!/bin/sh\nsleep 600 &\nexec sleep 600\n")
    binary.chmod(0o755)
    server = make_server(TritonInstallation(binary=binary, backend_dir=tmp_path), tmp_path, tmp_path / "t.log",
                         servers)
    server.start()
    pid = server.pid
    assert pid is not None and server.is_alive()
    proc = server._proc
    assert proc is not None
    deadline = time.monotonic() + 30  # the script has run its child and exec'd sleep: the pipe stays open
    while not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sleep") and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    assert wait_for_pids_gone([pid], 10)  # a zombie, not yet reaped: nobody has asked
    held, release = threading.Event(), threading.Event()

    def another_waiter() -> None:
        with proc._waitpid_lock:  # type: ignore[attr-defined]
            status = os.waitpid(pid, 0)[1] if reaped else None
            held.set()
            release.wait(10)
            if status is not None:
                proc.returncode = os.waitstatus_to_exitcode(status)

    waiter = threading.Thread(target=another_waiter)
    waiter.start()
    try:
        assert held.wait(10)
        assert proc.poll() is None  # the premise: poll() alone still calls it running
        assert os.path.exists(f"/proc/{pid}") is not reaped
        assert not server.is_alive()
        threading.Timer(0.2, release.set).start()  # the other thread is done in a moment; the status is then taken
        assert server.exit_description() == "was killed by SIGKILL"
        assert server.returncode == -signal.SIGKILL
    finally:
        release.set()
        waiter.join(10)


OWNER_SCRIPT = """\
import sys, time
from pathlib import Path

import httpx

from tensorrtllm_backend.server import LaunchConfig, TritonServer, locate_tritonserver

repo, work, log_file, http, grpc, metrics = sys.argv[1:]
server = TritonServer(
    locate_tritonserver(work_dir=Path(work)),
    LaunchConfig(model_repo=Path(repo), http_port=int(http), grpc_port=int(grpc), metrics_port=int(metrics)),
    Path(log_file),
)
server.start()
server.wait_ready(60)
assert httpx.post(server.url + "/v2/models/echo/generate_stream", json={"INPUT": "x"}, timeout=30).status_code == 200
print(server.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.integration
def test_no_orphans_when_the_owner_is_killed(installation: TritonInstallation, tmp_path: Path) -> None:
    repo = write_repo(tmp_path / "repo", ECHO_MODEL)
    cfg = launch_config(repo)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            OWNER_SCRIPT,
            str(repo),
            str(installation.backend_dir.parent),
            str(tmp_path / "t.log"),
            str(cfg.http_port),
            str(cfg.grpc_port),
            str(cfg.metrics_port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=REPO_ROOT,
    )
    triton_pid: Optional[int] = None
    family: list[int] = []
    try:
        assert owner.stdout is not None
        ready, _, _ = select.select([owner.stdout], [], [], 60)
        line = owner.stdout.readline() if ready else b""
        assert line.strip().isdigit(), f"owner did not report a pid: {line!r}, stderr: {owner.stderr.read1(4000)!r}"
        triton_pid = int(line)
        family = [triton_pid, *descendants(triton_pid)]
        assert len(family) > 1, "expected the Python backend stub under tritonserver"
        owner.kill()
        owner.wait(timeout=10)
        assert wait_for_pids_gone([triton_pid], timeout_s=10), "tritonserver outlived its owner"
        assert wait_for_pids_gone(family, timeout_s=10), f"backend stubs outlived their owner: {family}"
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        if triton_pid is not None and not wait_for_pids_gone(family, timeout_s=0):
            try:
                os.killpg(triton_pid, signal.SIGKILL)  # our own group (tritonserver called setsid)
            except (ProcessLookupError, PermissionError):
                pass
        for stream in (owner.stdout, owner.stderr):
            if stream is not None:
                stream.close()


def test_wait_for_pids_gone_counts_zombies_as_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        assert wait_for_pids_gone([child.pid], timeout_s=10)  # exited, not yet reaped: a zombie
    finally:
        child.wait()
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        started = time.monotonic()
        assert not wait_for_pids_gone([sleeper.pid], timeout_s=0.3)
        assert time.monotonic() - started >= 0.3
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_process_whose_leader_thread_exited_is_not_gone_while_another_thread_runs() -> None:
    """/proc shows a thread-group leader as Z once its own thread has exited, while the process's other threads still
    run (or are exiting, as a SIGKILLed Triton's many threads are for a moment). tests/test_faults.py's restart test
    took that Z for an exited Triton, and sent its prediction to a Triton that was still exiting (it failed so in a
    fresh clone). The process here ends its main thread with ``pthread_exit`` while a thread waits for stdin."""
    script = ("import ctypes, sys, threading\n"
              "threading.Thread(target=sys.stdin.read).start()\n"
              "ctypes.CDLL(None).pthread_exit(None)\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while _proc_state(child.pid) != b"Z" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _proc_state(child.pid) == b"Z" and len(os.listdir(f"/proc/{child.pid}/task")) == 2
        assert not wait_for_pids_gone([child.pid], timeout_s=0.3)
        assert TritonServer.process_alive(child.pid)
        assert child.stdin is not None
        child.stdin.close()  # the thread returns: the process exits
        assert wait_for_pids_gone([child.pid], timeout_s=10)
        assert not TritonServer.process_alive(child.pid)
    finally:
        child.kill()
        child.wait()


def test_log_tail_is_bounded_and_keeps_the_end_of_long_lines(tmp_path: Path) -> None:
    from tensorrtllm_backend.server import LOG_LINE_MAX_CHARS, LOG_TAIL_MAX_CHARS

    server = TritonServer(
        TritonInstallation(binary=tmp_path / "tritonserver", backend_dir=tmp_path),
        LaunchConfig(model_repo=tmp_path),
        log_file=tmp_path / "triton.log",
    )
    traceback_line = "E1121 model.py failed: " + "x" * 50_000 + " ImportError: the real cause"
    for i in range(100):
        server._tail.append(f"I line {i}")
    server._tail.append(traceback_line)
    tail = server.log_tail()
    assert len(tail) <= LOG_TAIL_MAX_CHARS + LOG_LINE_MAX_CHARS
    assert tail.endswith("ImportError: the real cause")
    assert "E1121 model.py failed" in tail and "[...]" in tail
    assert "I line 99" in tail and "I line 0\n" not in tail
