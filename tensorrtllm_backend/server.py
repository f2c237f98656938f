"""Finding, launching, watching and stopping ``tritonserver``.

Replaces the upstream ``scripts/launch_triton_server.py`` of tensorrtllm_backend. Facts followed:

* Production image (NGC ``tritonserver:<YY.MM>-trtllm-python-py3``): the binary is
  ``/opt/tritonserver/bin/tritonserver`` with backends (``tensorrtllm``, ``python``) in
  ``/opt/tritonserver/backends``.
* Without the image, the ``nvidia-pytriton`` wheel bundles a complete ``tritonserver`` (Triton 2.51)
  with the Python backend and one backend stub per CPython 3.8-3.13; the stub matching the running
  interpreter must sit next to ``libtriton_python.so``, the bundle's libraries are found through
  ``LD_LIBRARY_PATH=<site-packages>/nvidia_pytriton.libs``, and ``PATH`` must start with the
  virtualenv's ``bin`` so the stub's embedded Python finds the venv's packages.
* Multi-GPU engines (the C++ backend; tensorrtllm_backend's launch script, leader mode): one ``tritonserver``
  per rank under ``mpirun``; ranks above 0 load only ``tensorrt_llm`` (``--model-control-mode=explicit
  --load-model=tensorrt_llm``) and each rank gets its own
  ``--backend-config=python,shm-region-prefix-name=<prefix><rank>_``. We also switch HTTP, gRPC and
  metrics off on ranks above 0 so that only rank 0 binds ports.
* Multi-GPU checkpoints (the PyTorch backend's ``llmapi`` model): one ``tritonserver`` under ``mpirun -n 1``,
  whose LLM spawns its ranks itself (tensorrtllm_backend ``docs/llmapi.md`` @08ed112e runs
  ``launch_triton_server.py --model_repo=...`` with its default world size 1, i.e. ``mpirun -n 1 tritonserver``;
  ``LaunchConfig.single_rank_mpirun``).
* The Python backend keeps one shared-memory region per model instance in ``/dev/shm``, named
  ``<shm-region-prefix-name><uuid>`` (python_backend src/python_be.cc; the default prefix is
  ``triton_python_backend_shm_region_``), and removes it only on a clean unload: a killed Triton
  leaves it behind. Our prefix is unique per server (``cogtriton<pid namespace>p<owner pid>x<n>r<rank>_``), so
  :meth:`TritonServer.stop`, the guardian process (when our process dies) and the next start
  (regions of owners that no longer exist) remove exactly what was ours. A pid means something only in its
  own PID namespace, and /dev/shm can be shared across them (``docker run --ipc=host``, which NVIDIA's
  container guides suggest, or ``unshare --pid`` as tests/test_init.py does): the next start judges only
  regions of its own namespace, so another container's live Triton never loses its regions to us.

Every endpoint binds 127.0.0.1 only.

Why one module: one concern, the life of the ``tritonserver`` process: where it is
installed, how it is launched (ranks, environment, shared-memory prefix), watched (its stubs, its state)
and stopped; :class:`TritonServer` is half of it, and the shared-memory cleanup is its own part of a stop.
"""

from __future__ import annotations

import collections
import importlib.util
import itertools
import ctypes
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Deque, Mapping, Optional

import httpx

from common.errors import ConfigError, TritonStartupError

log = logging.getLogger(__name__)

IMAGE_TRITONSERVER = Path("/opt/tritonserver/bin/tritonserver")
IMAGE_BACKEND_DIR = Path("/opt/tritonserver/backends")
LOOPBACK = "127.0.0.1"
LOG_TAIL_LINES = 60
LOG_TAIL_MAX_CHARS = 8000
STARTUP_ABORT_GRACE_S = 2.0  # grace period when stopping a Triton that never became ready
LOG_LINE_MAX_CHARS = 1200
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "cogtriton"
_SHM_OWNER_RE = re.compile(rf"^{SHM_PREFIX}(\d+)p(\d+)x\d+r\d+_")
_instances = itertools.count(1)


@dataclass(frozen=True)
class TritonInstallation:
    """Where a usable ``tritonserver`` lives and the environment it needs.

    Attributes:
        binary: the ``tritonserver`` executable.
        backend_dir: value for ``--backend-directory``.
        env: variables to set for the process (``LD_LIBRARY_PATH``, ``PATH`` prefixes are merged).
        source: "env", "image" or "pytriton" (for logs and error messages).
    """

    binary: Path
    backend_dir: Path
    env: Mapping[str, str] = field(default_factory=dict)
    source: str = "env"


def _check_embedded_libpython(stub: Path, version: str) -> None:
    """The stub embeds the system ``libpython<version>.so.1.0`` but imports the running interpreter's
    standard library; a different patch release breaks extension modules (``_ssl``: undefined symbol).

    The library is found with ``ldd`` (what the stub will load) and its ``PY_VERSION`` string read
    from the file, since loading it here would return the interpreter's own copy.

    Raises:
        ConfigError: the library is missing, or its version differs from the running Python.
    """
    soname = f"libpython{version}.so.1.0"
    try:
        ldd = subprocess.run(["ldd", str(stub)], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return  # cannot tell; Triton's own error will show
    match = re.search(rf"{re.escape(soname)} => (\S+)", ldd)
    if not match or match.group(1) == "not":
        raise ConfigError(
            f"Triton's Python backend stub needs the system library {soname} "
            f"(Debian/Ubuntu package libpython{version}); install it"
        )
    data = Path(match.group(1)).read_bytes()
    found = re.search(rb"\x00(" + re.escape(version).encode() + rb"\.\d+)\x00", data)
    if not found:
        return
    embedded = found.group(1).decode()
    running = ".".join(str(p) for p in sys.version_info[:3])
    if embedded != running:
        raise ConfigError(
            f"Triton's Python backend stub embeds the system libpython {embedded} ({match.group(1)}), but this "
            f"environment runs Python {running} ({sys.executable}); extension modules such as _ssl then fail "
            f"inside Triton. Create the virtualenv with the system Python {embedded} (scripts/setup uses /usr/bin/python3)"
        )


def _pytriton_installation(work_dir: Path) -> Optional[TritonInstallation]:
    """Build a backend directory from the nvidia-pytriton bundle for the running Python, if installed."""
    # Found, not imported: the pytriton package imports its Triton clients (tritonclient's gRPC and HTTP, aiohttp,
    # gevent), which the Cog worker, where this runs, never uses (the stream processes talk to Triton).
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    dist = Path(list(spec.submodule_search_locations)[0]).resolve() / "tritonserver"
    binary = dist / "bin" / "tritonserver"
    if not binary.is_file():
        return None
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = dist / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise ConfigError(
            f"nvidia-pytriton has no Python backend stub for Python {version} ({stub} missing); "
            "use Python 3.8-3.13 or set COG_TRITON_TRITONSERVER and COG_TRITON_BACKEND_DIR"
        )
    _check_embedded_libpython(stub, version)
    backend_dir = work_dir / f"triton_backends_py{version}"
    python_dir = backend_dir / "python"
    if not (python_dir / "triton_python_backend_stub").is_file():
        tmp = backend_dir.with_name(backend_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(dist / "backends" / "python", tmp / "python")
        shutil.copy2(stub, tmp / "python" / "triton_python_backend_stub")
        shutil.rmtree(backend_dir, ignore_errors=True)
        tmp.rename(backend_dir)
    site = dist.parent.parent
    venv_bin = Path(sys.executable).parent
    return TritonInstallation(
        binary=binary,
        backend_dir=backend_dir,
        env={"LD_LIBRARY_PATH": str(site / "nvidia_pytriton.libs"), "PATH": str(venv_bin)},
        source="pytriton",
    )


def locate_tritonserver(
    binary: Optional[Path] = None, backend_dir: Optional[Path] = None, work_dir: Path = Path("build")
) -> TritonInstallation:
    """Find ``tritonserver``: explicit setting, then the NGC image path, then the nvidia-pytriton wheel.

    Args:
        binary: explicit binary (``COG_TRITON_TRITONSERVER``); its backends default to
            ``<binary>/../../backends``.
        backend_dir: explicit ``--backend-directory`` (``COG_TRITON_BACKEND_DIR``).
        work_dir: where the pytriton backend directory with the matching stub is assembled.

    Raises:
        ConfigError: nothing usable found, or an explicit path does not exist.
    """
    if binary is not None:
        if not binary.is_file() or not os.access(binary, os.X_OK):
            raise ConfigError(f"COG_TRITON_TRITONSERVER={binary} is not an executable file")
        backends = backend_dir or binary.resolve().parent.parent / "backends"
        if not backends.is_dir():
            raise ConfigError(f"backend directory {backends} does not exist; set COG_TRITON_BACKEND_DIR")
        return TritonInstallation(binary=binary, backend_dir=backends, source="env")
    if IMAGE_TRITONSERVER.is_file():
        return TritonInstallation(binary=IMAGE_TRITONSERVER, backend_dir=backend_dir or IMAGE_BACKEND_DIR, source="image")
    found = _pytriton_installation(work_dir)
    if found is not None:
        if backend_dir is not None:
            found = TritonInstallation(found.binary, backend_dir, found.env, found.source)
        return found
    raise ConfigError(
        f"no tritonserver found: not at {IMAGE_TRITONSERVER} (NGC image) and nvidia-pytriton is not "
        "installed; set COG_TRITON_TRITONSERVER or `pip install nvidia-pytriton`"
    )


def pid_namespace() -> int:
    """The inode of this process's PID namespace (``/proc/self/ns/pid``), or 0 where it cannot be read."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def unique_shm_prefix() -> str:
    """A shared-memory region prefix for one server of this process: ``cogtriton<ns>p<pid>x<n>r``, where
    ``<ns>`` is :func:`pid_namespace` (the launch appends ``<rank>_``)."""
    return f"{SHM_PREFIX}{pid_namespace()}p{os.getpid()}x{next(_instances)}r"


def remove_shm_regions(prefix: str, shm_dir: Path = SHM_DIR) -> list[str]:
    """Delete the shared-memory regions whose names start with ``prefix``; return their names."""
    removed = []
    for path in shm_dir.glob(f"{prefix}*"):
        try:
            path.unlink()
            removed.append(path.name)
        except OSError:
            pass
    return sorted(removed)


def shm_region_owner(name: str) -> Optional[tuple[int, int]]:
    """The (PID namespace inode, owner pid) named in one of our region names (``cogtriton<ns>p<pid>x<n>r<rank>_...``,
    see :func:`unique_shm_prefix`); None for any other name, a region of an older format included."""
    match = _SHM_OWNER_RE.match(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def remove_stale_shm_regions(shm_dir: Path = SHM_DIR) -> list[str]:
    """Delete our regions (``cogtriton<ns>p<pid>x...``) of this PID namespace whose owner process no longer
    exists; return their names. Regions of another namespace are left alone: their owner's pid cannot be
    looked up from here, and taking it for dead would delete a live server's regions. Without a readable
    namespace (:func:`pid_namespace` is 0) nothing is judged stale."""
    namespace = pid_namespace()
    if not namespace:
        return []
    removed = []
    for path in shm_dir.glob(f"{SHM_PREFIX}*"):
        owner = shm_region_owner(path.name)
        if owner is not None and owner[0] == namespace and not _pid_alive(owner[1]):
            try:
                path.unlink()
                removed.append(path.name)
            except OSError:
                pass
    return sorted(removed)


@dataclass(frozen=True)
class StubProcess:
    """A Python backend stub of one model instance, found among Triton's child processes."""

    pid: int
    instance: str  # e.g. "preprocessing_0_0": <model>_<instance group>_<index>

    @property
    def model(self) -> str:
        """The model's name (the instance name less its two trailing numbers)."""
        return self.instance.rsplit("_", 2)[0]


@dataclass(frozen=True)
class LaunchConfig:
    """Arguments of one Triton launch.

    Attributes:
        model_repo: live model repository.
        http_port / grpc_port / metrics_port: TCP ports on 127.0.0.1.
        world_size: number of ranks (tensor x pipeline parallelism); > 1 runs one server per rank under mpirun.
        single_rank_mpirun: with world_size 1, run the one server under ``mpirun -n 1`` (the PyTorch backend's
            multi-GPU launch: its LLM spawns its own ranks).
        log_verbose: ``--log-verbose`` level.
        mpirun: the mpirun executable for world_size > 1 or ``single_rank_mpirun``.
        shm_prefix: start of the Python backend's shared-memory region names; rank r uses
            ``<shm_prefix><r>_``. Unique per launch by default (:func:`unique_shm_prefix`), because
            stopping a server removes every region under its prefix; upstream's launch script uses
            ``prefix``, which two servers on one host would share.
    """

    model_repo: Path
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    world_size: int = 1
    single_rank_mpirun: bool = False
    log_verbose: int = 0
    mpirun: str = "mpirun"
    shm_prefix: str = field(default_factory=lambda: unique_shm_prefix())


def _rank_args(installation: TritonInstallation, cfg: LaunchConfig, rank: int) -> list[str]:
    args = [
        str(installation.binary),
        f"--model-repository={cfg.model_repo}",
        f"--backend-directory={installation.backend_dir}",
        "--disable-auto-complete-config",
        f"--backend-config=python,shm-region-prefix-name={cfg.shm_prefix}{rank}_",
        f"--log-verbose={cfg.log_verbose}",
    ]
    if rank == 0:
        args += [
            f"--http-address={LOOPBACK}",
            f"--http-port={cfg.http_port}",
            f"--grpc-address={LOOPBACK}",
            f"--grpc-port={cfg.grpc_port}",
            f"--metrics-address={LOOPBACK}",
            f"--metrics-port={cfg.metrics_port}",
        ]
    else:
        args += [
            "--model-control-mode=explicit",
            "--load-model=tensorrt_llm",
            "--allow-http=false",
            "--allow-grpc=false",
            "--allow-metrics=false",
        ]
    return args


def build_command(installation: TritonInstallation, cfg: LaunchConfig) -> list[str]:
    """The argv that starts Triton: one ``tritonserver`` (under ``mpirun -n 1`` with ``single_rank_mpirun``), or one
    per rank under ``mpirun``.

    Raises:
        ConfigError: world_size < 1.
    """
    if cfg.world_size < 1:
        raise ConfigError(f"world_size must be >= 1, got {cfg.world_size}")
    if cfg.world_size == 1:
        if cfg.single_rank_mpirun:
            return [cfg.mpirun, "--allow-run-as-root", "-n", "1", *_rank_args(installation, cfg, 0)]
        return _rank_args(installation, cfg, 0)
    cmd = [cfg.mpirun, "--allow-run-as-root"]
    for rank in range(cfg.world_size):
        if rank:
            cmd.append(":")
        cmd += ["-n", "1", *_rank_args(installation, cfg, rank)]
    return cmd


def _merged_env(extra: Mapping[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    for key, value in extra.items():
        if key in ("PATH", "LD_LIBRARY_PATH") and env.get(key):
            env[key] = f"{value}{os.pathsep}{env[key]}"
        else:
            env[key] = value
    return env


_PR_SET_PDEATHSIG = 1

# Kills Triton's process group when our process dies. PR_SET_PDEATHSIG reaches only tritonserver
# itself; its Python backend stubs, once they have served a request, hang instead of exiting when
# tritonserver is killed. The guardian reads its stdin, whose write end only we hold: end of file
# without the byte b"d" (disarm, sent when the process group has ended) means we died.
_GUARDIAN = (
    "import glob, os, signal, sys, time\n"
    "if sys.stdin.buffer.read(1) != b'd':\n"
    "    try:\n"
    "        os.killpg(int(sys.argv[1]), signal.SIGKILL)\n"
    "    except OSError:\n"
    "        pass\n"
    "    time.sleep(0.5)\n"
    "    for path in glob.glob(os.path.join(sys.argv[2], sys.argv[3] + '*')) if sys.argv[3] else []:\n"
    "        try:\n"
    "            os.unlink(path)\n"
    "        except OSError:\n"
    "            pass\n"
)


def _child_setup() -> None:  # runs in the child between fork and exec
    os.setsid()  # own process group: we signal the whole group (mpirun ranks, backend stubs)
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)  # die with the thread that spawned us
    except OSError:
        pass


class TritonServer:
    """Owns one Triton process (or an mpirun of ranks): start, wait_ready, is_alive, stop, log tail.

    The process runs in its own process group; it is spawned from a dedicated thread that lives
    until the process ends, and carries PR_SET_PDEATHSIG, so it dies if our process dies; a small
    guardian process then kills the rest of its group (backend stubs), so there are no orphans.
    ``start()`` after a crash kills what is left of the previous group first. ``stop()`` sends
    SIGINT to the group, waits ``stop_timeout_s``, then SIGKILLs it. Output goes to ``log_file`` and a
    ring buffer of the last lines used in error messages.
    """

    def __init__(
        self,
        installation: TritonInstallation,
        cfg: LaunchConfig,
        log_file: Path,
        stop_timeout_s: float = 15.0,
    ) -> None:
        self.installation = installation
        self.cfg = cfg
        self.log_file = log_file
        self.stop_timeout_s = stop_timeout_s
        self._proc: Optional[subprocess.Popen[bytes]] = None
        self._tail: Deque[str] = collections.deque(maxlen=400)
        self._lock = threading.Lock()
        self._started = threading.Event()
        self._spawn_error: Optional[BaseException] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def command(self) -> list[str]:
        """The argv used to start Triton."""
        return build_command(self.installation, self.cfg)

    @property
    def url(self) -> str:
        """Base URL of Triton's HTTP endpoint, e.g. ``http://127.0.0.1:8000``."""
        return f"http://{LOOPBACK}:{self.cfg.http_port}"

    @property
    def grpc_address(self) -> str:
        """Triton's gRPC endpoint, ``127.0.0.1:<port>``."""
        return f"{LOOPBACK}:{self.cfg.grpc_port}"

    @property
    def pid(self) -> Optional[int]:
        """PID of the Triton (or mpirun) process, None before start."""
        return self._proc.pid if self._proc else None

    def _run(self) -> None:
        try:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            proc = subprocess.Popen(  # noqa: S603
                self.command,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=_merged_env(self.installation.env),
                preexec_fn=_child_setup,  # noqa: PLW1509
            )
        except OSError as exc:
            self._spawn_error = exc
            self._started.set()
            return
        self._proc = proc
        guardian = self._spawn_guardian(proc.pid)
        self._started.set()
        assert proc.stdout is not None
        with open(self.log_file, "ab") as sink:
            for raw in proc.stdout:  # ends when every holder of the pipe has exited
                sink.write(raw)
                sink.flush()
                self._tail.append(raw.decode("utf-8", "replace").rstrip("\n"))
        if guardian is not None:
            try:
                guardian.communicate(b"d", timeout=10)  # disarm: the group has ended
            except (OSError, subprocess.TimeoutExpired):
                guardian.kill()
                guardian.wait()
        proc.wait()

    def _spawn_guardian(self, pgid: int) -> Optional[subprocess.Popen[bytes]]:
        try:
            return subprocess.Popen(  # noqa: S603
                [sys.executable, "-I", "-S", "-c", _GUARDIAN, str(pgid), str(SHM_DIR), self.cfg.shm_prefix],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # terminal signals meant for us do not reach it
            )
        except OSError as exc:
            log.warning("could not start the guardian of Triton's process group: %s", exc)
            return None

    def start(self) -> None:
        """Start Triton in the background (returns at once; see :meth:`wait_ready`).

        Raises:
            TritonStartupError: the binary could not be executed.
        """
        with self._lock:
            if self.is_alive():
                return
            if self._proc is not None and self._thread is not None and self._thread.is_alive():
                # The previous run's group still holds the log pipe: backend stubs left behind
                # by a Triton that died (they hang rather than exit). Kill them before restarting.
                self._signal_group(self._proc.pid, signal.SIGKILL)
                self._thread.join(timeout=10)
            self._started.clear()
            self._spawn_error = None
            self._tail.clear()
            self.remove_shm_regions()  # left by a previous run of this server that was killed
            stale = remove_stale_shm_regions()
            if stale:
                log.info("removed %d shared-memory regions of Triton servers whose owner has exited", len(stale))
            log.info("starting Triton (%s): %s", self.installation.source, " ".join(self.command))
            thread = threading.Thread(target=self._run, name="tritonserver", daemon=True)
            self._thread = thread
            thread.start()
            self._started.wait()
            if self._spawn_error is not None:
                raise TritonStartupError(f"could not execute {self.command[0]}: {self._spawn_error}")

    def is_alive(self) -> bool:
        """True while the Triton process runs (also when it is stopped or hung: see :meth:`is_stopped`).

        ``Popen.poll()`` alone is not enough: it answers None ("running") whenever another thread is inside
        ``waitpid`` for the same child, giving up at once on the lock that thread holds (CPython
        Lib/subprocess.py, ``Popen._internal_poll``: "Something else is busy calling waitpid"). The supervisor's
        round and a prediction's ``wait_ready`` both ask, and the one that lost sent its request to a Triton that had
        exited. So None is checked with :func:`_child_exited`.
        """
        proc = self._proc
        return proc is not None and proc.poll() is None and not _child_exited(proc.pid)

    def is_stopped(self) -> bool:
        """True when the Triton process is stopped (state T, e.g. SIGSTOP): alive, but serving nothing."""
        if not self.is_alive():
            return False
        assert self._proc is not None
        return _proc_state(self._proc.pid) in (b"T", b"t")

    def stub_processes(self) -> list[StubProcess]:
        """The Python backend stubs Triton has started (children whose program is
        ``triton_python_backend_stub``; argv[8] is the model instance's name, python_backend
        src/stub_launcher.cc), excluding exited ones."""
        if not self.is_alive():
            return []
        assert self._proc is not None
        stubs = []
        for pid in _children(self._proc.pid):
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"triton_python_backend_stub") and len(argv) > 8 and _pid_alive(pid):
                stubs.append(StubProcess(pid=pid, instance=argv[8].decode("utf-8", "replace")))
        return stubs

    @staticmethod
    def process_alive(pid: int) -> bool:
        """Whether process ``pid`` exists and has not exited (a zombie whose threads have all exited has; /proc)."""
        return _pid_alive(pid)

    def remove_shm_regions(self) -> list[str]:
        """Delete this server's shared-memory regions (call once its processes are gone)."""
        return remove_shm_regions(self.cfg.shm_prefix)

    @property
    def returncode(self) -> Optional[int]:
        """Exit status once exited (negative: killed by that signal), else None.

        When another thread is collecting the status (see :meth:`is_alive`), waits its turn for up to 1 s.
        """
        proc = self._proc
        if proc is None:
            return None
        code = proc.poll()
        if code is None and _child_exited(proc.pid):
            try:
                code = proc.wait(timeout=1.0)  # waits at the lock the other thread holds for a moment
            except subprocess.TimeoutExpired:
                pass
        return code

    def log_tail(self, lines: int = LOG_TAIL_LINES, max_chars: int = LOG_TAIL_MAX_CHARS) -> str:
        """The last ``lines`` lines Triton printed, at most ``max_chars`` characters in all.

        Triton logs a model's Python traceback as one long escaped line; each line is shortened
        to its start and end so the error text stays readable.
        """
        picked: list[str] = []
        total = 0
        for line in reversed(list(self._tail)[-lines:]):
            if len(line) > LOG_LINE_MAX_CHARS:
                half = LOG_LINE_MAX_CHARS // 2
                line = f"{line[:half]} [...] {line[-half:]}"
            if total + len(line) > max_chars and picked:
                break
            picked.append(line)
            total += len(line) + 1
        return "\n".join(reversed(picked))

    def exit_description(self) -> str:
        """Human-readable exit status, e.g. "exited with status 1" or "was killed by SIGKILL"."""
        code = self.returncode
        if code is None:
            return "is running"
        if code < 0:
            try:
                return f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with status {code}"

    def wait_ready(self, timeout_s: float, poll_s: float = 0.25) -> float:
        """Wait until ``GET /v2/health/ready`` answers 200; return the seconds it took.

        Only connection errors and non-200 answers are retried.

        Raises:
            TritonStartupError: Triton exited, or was not ready within ``timeout_s`` seconds; the
                message carries the tail of Triton's log.
        """
        started = time.monotonic()
        deadline = started + timeout_s
        with httpx.Client(timeout=5.0) as client:
            while True:
                if not self.is_alive():
                    time.sleep(0.2)  # let the pump thread collect the last lines
                    raise TritonStartupError(
                        f"Triton {self.exit_description()} during startup. Last log lines:\n{self.log_tail()}"
                    )
                try:
                    if client.get(f"{self.url}/v2/health/ready").status_code == 200:
                        return time.monotonic() - started
                except httpx.TransportError:
                    pass
                if time.monotonic() >= deadline:
                    tail = self.log_tail()
                    self.stop(timeout_s=STARTUP_ABORT_GRACE_S)  # it serves nothing yet
                    raise TritonStartupError(
                        f"Triton was not ready after {timeout_s:g} s (COG_TRITON_STARTUP_TIMEOUT_S); "
                        f"it was stopped. Last log lines:\n{tail}"
                    )
                time.sleep(poll_s)

    def stop(self, timeout_s: Optional[float] = None) -> Optional[int]:
        """Stop Triton: SIGINT to its process group, then SIGKILL after the grace period.

        Args:
            timeout_s: grace period in seconds; default ``stop_timeout_s``.

        Returns the exit status (None if it was never started). Safe to call repeatedly.
        """
        proc = self._proc
        if proc is None:
            return None
        grace = self.stop_timeout_s if timeout_s is None else timeout_s
        if proc.poll() is None:
            log.info("stopping Triton (pid %d)", proc.pid)
            self._signal_group(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                log.warning("Triton did not stop within %.0f s; killing it", grace)
                self._signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        # Ranks or backend stubs that outlived the leader go too, then their shared memory.
        self._signal_group(proc.pid, signal.SIGKILL)
        self._wait_group_gone(proc.pid, 5.0)
        removed = self.remove_shm_regions()
        if removed:
            log.info("removed %d shared-memory regions Triton left in %s", len(removed), SHM_DIR)
        return proc.returncode

    @staticmethod
    def _wait_group_gone(pgid: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.05)

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _proc_state(pid: int) -> Optional[bytes]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                out.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
    except OSError:
        pass
    return out


def _child_exited(pid: int) -> bool:
    """Whether our child ``pid`` has exited, asked without reaping it: ``waitid`` with ``WNOWAIT`` reports a zombie and
    leaves it for ``Popen`` to collect (waitid(2)); ECHILD means another thread has already reaped it. One system call
    (about 1 µs here, against 11 µs for reading /proc/<pid>/stat): ``wait_ready`` asks once per prediction."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and has not exited (from /proc).

    A thread-group leader shows state Z as soon as its own thread has exited, while the process's other threads may
    still be running or exiting (the many threads of a SIGKILLed Triton take a moment): the process has exited only
    once the leader is the only task left in /proc/<pid>/task (proc(5)). Until then the kernel does not report it to
    ``waitpid`` either.
    """
    state = _proc_state(pid)
    if state is None or state == b"X":
        return False
    if state != b"Z":
        return True
    try:
        return any(task != str(pid) for task in os.listdir(f"/proc/{pid}/task"))
    except FileNotFoundError:
        return False
