"""``scripts/benchmark``: serving cost per token at GPU token rates, on the real stack.

Starts the stack as a user gets it (the weights archive served over HTTP, the real Cog HTTP server
running predict.py, Triton started by setup()) with ``tensorrt_llm`` served by the token-rate
stand-in (``benchmarks/standin``; ``--engine reference``: the CPU reference model), and sweeps the
number of concurrent streams over three paths in the same run:

* ``tensorrt_llm``: Triton's ``/v2/models/tensorrt_llm/generate_stream`` with token ids (the engine
  alone inside Triton);
* ``ensemble``: ``/v2/models/ensemble/generate_stream`` with ``input_ids`` (+ preprocessing and
  Triton's ensemble scheduling);
* ``cog``: ``POST /predictions`` streamed over SSE (+ the predictor: validation, tokenization,
  Triton client, incremental detokenization, coglet);
* ``floor``: a bare predictor under its own Cog HTTP server (``benchmarks/floor/predict.py``): no
  Triton, no tokenizer, one-character tokens at the stand-in's step through the product's stream
  interval and coglet bridge: what coglet itself carries, the floor the ``cog`` path is measured
  against (its ratio is to ``floor`` as well as to ``tensorrt_llm``);
* ``cog_json`` (``--engine reference`` only, where it is on by default): the same with a
  ``json_schema`` input, so the reference model enforces the guide with xgrammar (a token mask per
  step) and the predictor compiles and checks it; next to ``cog`` it gives the per-token cost of
  guidance. Its requests end when the document closes, so instead of the token count each output
  is checked to parse and validate against the schema.
* ``cog_lora`` (stand-in only, opt-in with ``--paths``): the ``cog`` requests with ``lora_weights``,
  ``--lora-adapters`` PEFT adapters of the default model (rank ``--lora-rank`` on every projection,
  made with peft, served over HTTP) assigned round-robin across the streams, so that every batch mixes
  them; the stand-in keeps them in its LoRA cache as the reference model does (its tokens do not depend on
  them), so next to ``cog`` it gives what carrying adapters costs the serving path per token. Each adapter is
  fetched and converted during the warm-up.

Points are (streams, stand-in step) pairs: ``--concurrency`` at ``--step-ms``, or ``--points
64@5,128@10,256@20`` (the stack restarts for each step; the stand-in runs ``--engine-instances``
Python model instances so that it is not what limits ``tensorrt_llm``: its "vs ideal" column).

Per point (path, streams): tokens/s and its ratio to ``tensorrt_llm`` at the same streams, time to
first token and the gap between token events (p50/p99), errors, the requests that did not get
exactly the requested tokens (every request asks for ``--tokens`` with ``min_tokens`` equal, so
each must get exactly that many; the stand-in's tokens and the text they decode to are also checked
one by one), and the CPU time of every process per streamed token (``/proc/<pid>/stat`` utime +
stime over the point): tritonserver, each Python backend stub (``stub:<model>``), the Cog server,
the Cog worker, the load generator and this harness. The load generator is a separate process
(:mod:`benchmarks.loadgen`).

``--soak``: 16 streams through Cog for 10 minutes; every 5th prediction is cancelled through Cog's
cancel endpoint part-way, and one Python backend stub is killed with SIGKILL part-way; reports
errors, recoveries and every process's RSS at start and end.

Writes ``results.json``, ``results.md`` and ``results.png`` (or ``soak.json``/``soak.md``) to
``--out`` (default ``build/benchmark``). Not imported by the predictor.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from cog_triton.local import CogServer, WeightsHTTPServer, free_port, serving_env
from cog_triton.prompt import PromptTokenizer
from cog_triton.settings import REPO_ROOT

log = logging.getLogger("benchmark")

ARCHIVE = REPO_ROOT / "build" / "default_model" / "smollm2-135m-instruct.tar.gz"
STANDIN_DIR = REPO_ROOT / "benchmarks" / "standin"
STANDIN_TEXT = STANDIN_DIR / "text.txt"
REFERENCE_MODEL = REPO_ROOT / "triton_model_repo" / "tensorrt_llm_reference" / "1" / "model.py"
PATHS = ("tensorrt_llm", "ensemble", "cog", "floor")
GUIDED_PATH = "cog_json"
LORA_PATH = "cog_lora"
FLOOR_PATH = "floor"
FLOOR_DIR = REPO_ROOT / "benchmarks" / "floor"
ALL_PATHS = PATHS + (GUIDED_PATH, LORA_PATH)
COG_PATHS = ("cog", GUIDED_PATH, FLOOR_PATH, LORA_PATH)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
DEFAULT_CONCURRENCY = (1, 8, 32, 64, 128)
REFERENCE_CONCURRENCY = (1, 2, 4)
SMOKE_CONCURRENCY = (1, 4)
PROMPT = "Write a short essay about the history of printing."
GUIDED_PROMPT = "Describe one famous early printed book as JSON."
#: The guide of ``cog_json`` requests: nested, with an array, an enum and bounded numbers; small
#: enough to close well within the default 64 tokens of --engine reference.
GUIDED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 24},
        "year": {"type": "integer", "minimum": 1400, "maximum": 1900},
        "language": {"type": "string", "enum": ["Latin", "German", "English", "other"]},
        "printer": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16}},
                    "required": ["name"], "additionalProperties": False},
    },
    "required": ["title", "year", "language", "printer"],
    "additionalProperties": False,
}
CLK_TCK = os.sysconf("SC_CLK_TCK")
# the processes every point reports (others found under the Cog server are reported too)
CORE_ROLES = ("tritonserver", "stub:tensorrt_llm", "stub:preprocessing", "cog_server", "cog_worker", "stream_proc",
              "loadgen")
SERVER_ROLES = ("tritonserver", "stub:tensorrt_llm", "stub:preprocessing", "cog_server", "cog_worker", "stream_proc")


# ------------------------------------------------------------------------------------------------
# Processes (/proc)
# ------------------------------------------------------------------------------------------------


def _read_stat(pid: int) -> Optional[tuple[int, int]]:
    """(ppid, utime + stime in clock ticks) of ``pid``, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[11]) + int(fields[12])


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode("utf-8", "replace").split("\0")[:-1]
    except OSError:
        return []


def rss_bytes(pid: int) -> Optional[int]:
    """Resident set size of ``pid`` (VmRSS), or None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def descendants(root: int) -> list[int]:
    """``root`` and every process below it (by parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _read_stat(int(entry.name))
            if stat is not None:
                children.setdefault(stat[0], []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def role_of(pid: int, root: int) -> str:
    """A process's name in the report: cog_server, cog_worker, tritonserver, stub:<model>, other:<exe>."""
    if pid == root:
        return "cog_server"
    cmd = _cmdline(pid)
    if not cmd:  # a zombie (e.g. a killed backend stub its parent has not reaped) or a kernel thread
        try:
            raw = Path(f"/proc/{pid}/stat").read_text()
            return f"defunct:{raw[raw.index('(') + 1:raw.rindex(')')]}"
        except (OSError, ValueError):
            return f"other:{pid}"
    exe = Path(cmd[0]).name
    if "triton_python_backend_stub" in exe:
        model_py = next((a for a in cmd[1:] if a.endswith("model.py")), "")
        return f"stub:{Path(model_py).parent.parent.name}" if model_py else "stub:?"
    if exe == "tritonserver":
        return "tritonserver"
    if "cog_triton.streamer" in cmd:  # the predictor's stream processes (cog_triton.stream_pool)
        return "stream_proc"
    if "-c" in cmd and "coglet" in " ".join(cmd):
        return "cog_worker"
    if "-c" in cmd and "-I" in cmd:  # tensorrtllm_backend.server's guardian of Triton's process group
        return "triton_guardian"
    return f"other:{exe}"


def server_processes(root: int) -> dict[str, list[int]]:
    """role -> pids of the Cog server's process tree."""
    roles: dict[str, list[int]] = {}
    for pid in descendants(root):
        roles.setdefault(role_of(pid, root), []).append(pid)
    return roles


def cpu_ticks(pids: Iterable[int]) -> int:
    total = 0
    for pid in pids:
        stat = _read_stat(pid)
        if stat is not None:
            total += stat[1]
    return total


def machine_busy_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    total = sum(values[:8])
    return total - idle, total


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


@dataclass
class CpuSnapshot:
    at: float
    ticks: dict[str, int]
    pids: dict[str, list[int]]
    machine_busy: int
    machine_total: int
    pid_ticks: dict[int, int]


def snapshot(roles: dict[str, list[int]]) -> CpuSnapshot:
    busy, total = machine_busy_ticks()
    pid_ticks = {pid: cpu_ticks([pid]) for pids in roles.values() for pid in pids}
    ticks = {r: sum(pid_ticks[pid] for pid in p) for r, p in roles.items()}
    return CpuSnapshot(time.monotonic(), ticks, roles, busy, total, pid_ticks)


# ------------------------------------------------------------------------------------------------
# Stack
# ------------------------------------------------------------------------------------------------


def fill_standin_template(text: str, values: dict[str, object]) -> str:
    """Fill the stand-in's own ``@name@`` fields; the product's ``${name}`` ones are left for setup().

    Raises:
        ValueError: a value names no field, or a field is left unfilled.
    """
    import re

    for key, value in values.items():
        token = f"@{key}@"
        if token not in text:
            raise ValueError(f"stand-in config.pbtxt has no field {token}")
        text = text.replace(token, str(value).replace("\\", "\\\\").replace('"', '\\"'))
    left = sorted(set(re.findall(r"@([a-z_]+)@", text)))
    if left:
        raise ValueError(f"stand-in config.pbtxt fields left unfilled: {', '.join(left)}")
    return text


def write_standin_templates(target: Path, *, step_ms: float, sender_threads: int, end_id_after: int = 0,
                            instances: int = 1,
                            cancellation_check_period_ms: float = 100.0, text_file: Path = STANDIN_TEXT,
                            reference_model: Path = REFERENCE_MODEL) -> Path:
    """A model-repository template folder (for COG_TRITON_TEMPLATE_DIR): the product's templates, with
    the stand-in as ``tensorrt_llm_reference`` (the folder setup() renders for a Hugging Face
    checkpoint as ``tensorrt_llm``)."""
    shutil.rmtree(target, ignore_errors=True)
    source = REPO_ROOT / "triton_model_repo"
    for folder in ("ensemble", "preprocessing", "tensorrt_llm"):
        shutil.copytree(source / folder, target / folder, ignore=shutil.ignore_patterns("__pycache__"))
    llm = target / "tensorrt_llm_reference"
    (llm / "1").mkdir(parents=True)
    shutil.copy2(STANDIN_DIR / "1" / "model.py", llm / "1" / "model.py")
    config = fill_standin_template(
        (STANDIN_DIR / "config.pbtxt").read_text(),
        {
            "reference_model": reference_model.resolve(),
            "text_file": text_file.resolve(),
            "step_ms": step_ms,
            "sender_threads": sender_threads,
            "cancellation_check_period_ms": cancellation_check_period_ms,
            "end_id_after": end_id_after,
            "instances": instances,
        },
    )
    (llm / "config.pbtxt").write_text(config)
    return target


def make_adapters(folder: Path, count: int, rank: int) -> list[Path]:
    """``count`` PEFT LoRA adapters of the default model (rank ``rank`` on every projection, random weights),
    packed as ``lora-<i>-r<rank>.tar.gz`` in ``folder``; kept between runs."""
    folder.mkdir(parents=True, exist_ok=True)
    archives = [folder / f"lora-{i}-r{rank}.tar.gz" for i in range(count)]
    missing = [(i, a) for i, a in enumerate(archives) if not a.is_file()]
    if not missing:
        return archives
    import tarfile  # noqa: PLC0415

    import torch  # noqa: PLC0415 - heavy
    from peft import LoraConfig, get_peft_model  # noqa: PLC0415
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    checkpoint = ARCHIVE.parent / "checkpoint"
    for i, archive in missing:
        model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32, local_files_only=True)
        torch.manual_seed(1000 + i)
        config = LoraConfig(r=rank, lora_alpha=rank, target_modules=LORA_TARGETS, init_lora_weights=False)
        adapter = folder / f"lora-{i}-r{rank}"
        get_peft_model(model, config).save_pretrained(str(adapter))
        with tarfile.open(archive.with_suffix(".tmp"), "w:gz") as tar:
            for name in ("adapter_config.json", "adapter_model.safetensors"):
                tar.add(adapter / name, name)
        archive.with_suffix(".tmp").rename(archive)
    log.info("made %d LoRA adapters (rank %d on %s) in %s", len(missing), rank, "/".join(LORA_TARGETS), folder)
    return archives


class Stack:
    """Weights HTTP server + Cog server (+ Triton under it) for one benchmark run."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.triton_port = free_port()
        self.cog: Optional[CogServer] = None
        self.floor: Optional[FloorServer] = None  # set by main() when the floor path runs
        self._weights: Optional[WeightsHTTPServer] = None
        self._adapters: Optional[WeightsHTTPServer] = None
        self.adapter_urls: list[str] = []

    def __enter__(self) -> "Stack":
        args = self.args
        self.work.mkdir(parents=True, exist_ok=True)
        for name in ("cog.log", "triton.log"):  # both servers append
            (self.work / name).unlink(missing_ok=True)
        self._weights = WeightsHTTPServer(args.archive.parent).__enter__()
        env = serving_env(
            f"{self._weights.url}/{args.archive.name}", work=self.work, triton_http_port=self.triton_port,
            COG_TRITON_REFERENCE_MAX_BATCH_SIZE=str(args.batch_limit), COG_TRITON_STOP_TIMEOUT_S="5",
            COG_TRITON_ADAPTER_CACHE_DIR=str(self.work / "adapter_cache"),
        )
        if LORA_PATH in args.paths:
            archives = make_adapters(args.out / "lora_adapters", args.lora_adapters, args.lora_rank)
            self._adapters = WeightsHTTPServer(archives[0].parent).__enter__()
            self.adapter_urls = [f"{self._adapters.url}/{a.name}" for a in archives]
        if args.engine == "standin":
            templates = write_standin_templates(
                self.work / "templates", step_ms=args.step_ms, sender_threads=args.sender_threads,
                end_id_after=args.end_id_after, instances=args.engine_instances,
            )
            env["COG_TRITON_TEMPLATE_DIR"] = str(templates)
        self.cog = CogServer(env, log_file=self.work / "cog.log", max_concurrency=args.cog_concurrency)
        log.info("starting the stack (%s engine); logs in %s", args.engine, self.work)
        started = time.monotonic()
        self.cog.start()
        try:
            self.cog.wait_ready(timeout_s=600)
        except BaseException:
            self.__exit__()
            raise
        log.info("stack ready in %.1f s: Cog %s, Triton http://127.0.0.1:%d", time.monotonic() - started,
                 self.cog.url, self.triton_port)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cog is not None:
            self.cog.stop()
        if self._weights is not None:
            self._weights.__exit__()
        if self._adapters is not None:
            self._adapters.__exit__()

    @property
    def root_pid(self) -> int:
        assert self.cog is not None and self.cog.proc is not None
        return self.cog.proc.pid

    def triton_log_size(self) -> int:
        try:
            return (self.work / "triton.log").stat().st_size
        except OSError:
            return 0

    def triton_log_since(self, offset: int) -> str:
        try:
            with open(self.work / "triton.log", "rb") as f:
                f.seek(offset)
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def processes(self, loadgen: Optional[int] = None) -> dict[str, list[int]]:
        roles = server_processes(self.root_pid)
        if loadgen is not None:
            roles["loadgen"] = [loadgen]
        roles["harness"] = [os.getpid()]
        return roles


class FloorServer:
    """The ``floor`` path: ``benchmarks/floor/predict.py`` under its own Cog HTTP server (no Triton), with the
    product's stream interval and COG_MAX_CONCURRENCY."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args = args
        self.work = work
        self.cog: Optional[CogServer] = None

    def __enter__(self) -> "FloorServer":
        shutil.rmtree(self.work, ignore_errors=True)
        (self.work / ".cog").mkdir(parents=True)
        shutil.copy2(FLOOR_DIR / "predict.py", self.work / "predict.py")
        shutil.copy2(FLOOR_DIR / "openapi_schema.json", self.work / ".cog" / "openapi_schema.json")
        env = {k: v for k, v in os.environ.items() if k == "COG_TRITON_STREAM_INTERVAL_MS"}
        self.cog = CogServer(env, log_file=self.work / "cog.log", max_concurrency=self.args.cog_concurrency,
                             work_dir=self.work)
        self.cog.start()
        try:
            self.cog.wait_ready(timeout_s=120)
        except BaseException:
            self.__exit__()
            raise
        log.info("floor predictor ready: Cog %s", self.cog.url)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cog is not None:
            self.cog.stop()

    @property
    def root_pid(self) -> int:
        assert self.cog is not None and self.cog.proc is not None
        return self.cog.proc.pid

    def processes(self, loadgen: Optional[int] = None) -> dict[str, list[int]]:
        roles = {f"floor_{role}": pids for role, pids in server_processes(self.root_pid).items()}
        if loadgen is not None:
            roles["loadgen"] = [loadgen]
        roles["harness"] = [os.getpid()]
        return roles


# ------------------------------------------------------------------------------------------------
# Requests and expectations
# ------------------------------------------------------------------------------------------------


class Workload:
    """The request bodies of each path and what each request must get back."""

    def __init__(self, args: argparse.Namespace) -> None:
        from transformers import AutoTokenizer  # noqa: PLC0415 - heavy

        self.args = args
        self.tokens = args.tokens
        checkpoint = args.archive.parent / "checkpoint"
        self.tokenizer = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
        self.prompt_ids = PromptTokenizer(self.tokenizer).encode(PROMPT).ids
        self.end_id = int(self.tokenizer.eos_token_id)
        self.cycle: list[int] = []
        self.seeds: list[int] = [0]
        self.reference_ids: Optional[list[int]] = None
        if args.engine == "standin":
            standin = _standin_module()
            self.cycle = standin.text_token_ids(self.tokenizer, STANDIN_TEXT.read_text(encoding="utf-8"))
            # start offsets on whole characters, so that the text a request decodes to is well defined
            self.seeds = [i for i, t in enumerate(self.cycle) if "\ufffd" not in self.tokenizer.decode([t])]
        self._texts: dict[int, str] = {}
        self.adapter_urls: list[str] = []  # set once the stack serves them (the cog_lora path)

    def seed(self, index: int) -> int:
        return self.seeds[(index * 97) % len(self.seeds)]

    def expected_ids(self, seed: int) -> Optional[list[int]]:
        if self.args.engine == "standin":
            return _standin_module().expected_tokens(self.cycle, seed, self.tokens)
        return self.reference_ids

    def expected_text(self, seed: int) -> Optional[str]:
        ids = self.expected_ids(seed)
        if ids is None:
            return None
        key = seed if self.args.engine == "standin" else -1
        if key not in self._texts:
            # the predictor never ends on U+FFFD (an incomplete character at the cut)
            self._texts[key] = self.tokenizer.decode(ids, skip_special_tokens=True).rstrip("\ufffd")
        return self._texts[key]

    def body(self, path: str, seed: int, tokens: Optional[int] = None, index: int = 0) -> dict[str, Any]:
        n = tokens or self.tokens
        if path == "tensorrt_llm":
            return {
                "input_ids": self.prompt_ids, "input_lengths": [len(self.prompt_ids)], "request_output_len": [n],
                "min_tokens": [n], "end_id": [self.end_id], "runtime_top_k": [1], "seed": [seed], "streaming": [True],
            }
        if path == "ensemble":
            return {"input_ids": self.prompt_ids, "max_tokens": n, "min_tokens": n, "top_k": 1, "seed": seed,
                    "stream": True}
        if path == FLOOR_PATH:
            return {"input": {"n": n, "step_ms": self.args.step_ms}}
        if path == GUIDED_PATH:  # ends when the document closes: no min_tokens
            return {"input": {"prompt": GUIDED_PROMPT, "json_schema": json.dumps(GUIDED_SCHEMA), "max_tokens": n,
                              "temperature": 0, "seed": seed}}
        body = {"input": {"prompt": PROMPT, "max_tokens": n, "min_tokens": n, "temperature": 0, "seed": seed}}
        if path == LORA_PATH:  # adapters round-robin over the requests: every batch mixes them
            body["input"]["lora_weights"] = self.adapter_urls[index % len(self.adapter_urls)]
        return body

    def request(self, path: str, index: int) -> dict[str, Any]:
        seed = self.seed(index)
        item: dict[str, Any] = {"body": self.body(path, seed, index=index)}
        if path == GUIDED_PATH:
            item["expect_json_schema"] = GUIDED_SCHEMA
        elif path == FLOOR_PATH:
            item["expect_text"] = _floor_module().expected_text(self.tokens)
        elif path in ("cog", LORA_PATH):  # the stand-in's tokens do not depend on the adapter
            item["expect_text"] = self.expected_text(seed)
        else:
            item["expect_ids"] = self.expected_ids(seed)
        return item


_STANDIN = None
_FLOOR = None


def _load_module(name: str, path: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _floor_module():
    """benchmarks/floor/predict.py as a module (for its expected text)."""
    global _FLOOR
    if _FLOOR is None:
        _FLOOR = _load_module("benchmark_floor_predictor", FLOOR_DIR / "predict.py")
    return _FLOOR


def _standin_module():
    """benchmarks/standin/1/model.py as a module (it imports nothing from Triton at import time)."""
    global _STANDIN
    if _STANDIN is None:
        _STANDIN = _load_module("benchmark_standin_model", STANDIN_DIR / "1" / "model.py")
    return _STANDIN


# ------------------------------------------------------------------------------------------------
# Running points
# ------------------------------------------------------------------------------------------------


def _endpoint(stack: Stack, path: str) -> tuple[int, str]:
    if path == FLOOR_PATH:
        assert stack.floor is not None and stack.floor.cog is not None
        return stack.floor.cog.port, "/predictions"
    if path in COG_PATHS:
        assert stack.cog is not None
        return stack.cog.port, "/predictions"
    return stack.triton_port, f"/v2/models/{path}/generate_stream"


def _expect_line(proc: subprocess.Popen, want: str) -> None:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if line != want:
        rest = proc.stdout.read() if proc.poll() is not None else ""
        raise RuntimeError(f"load generator said {line!r} instead of {want!r}: {rest[-2000:]}")


def run_loadgen(stack: Stack, spec: dict[str, Any], during=None) -> tuple[dict[str, Any], CpuSnapshot, CpuSnapshot]:
    """Run one load-generator process; return its results and the CPU snapshots at its start and end
    (of the floor server's processes for the floor path, else of the stack's).

    ``during(proc)`` (optional) is called after the start snapshot, while the load runs.
    """
    servers: Any = stack.floor if spec.get("path") == FLOOR_PATH else stack
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "benchmarks.loadgen"], cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(spec))
        proc.stdin.close()
        _expect_line(proc, "started")
        before = snapshot(servers.processes(proc.pid))
        if during is not None:
            during(proc)
        _expect_line(proc, "finished")
        after = snapshot(servers.processes(proc.pid))
        result = json.loads(proc.stdout.readline())
        proc.wait(timeout=60)
        return result, before, after
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def cpu_report(before: CpuSnapshot, after: CpuSnapshot, tokens: int) -> dict[str, Any]:
    """Per role: CPU seconds, µs per streamed token and share of one core over the point."""
    wall = after.at - before.at
    cpu_s: dict[str, float] = {}
    for role, ticks in after.ticks.items():
        if role in before.ticks and set(after.pids[role]) == set(before.pids.get(role, [])):
            cpu_s[role] = (ticks - before.ticks[role]) / CLK_TCK
    servers = sum(cpu_s.get(r, 0.0) for r in cpu_s if r not in ("loadgen", "harness"))
    busy = (after.machine_busy - before.machine_busy) / CLK_TCK
    ours = sum(cpu_s.values())
    # the busiest single server process: what limits a many-core host (one interpreter, one GIL)
    busiest: dict[str, Any] = {}
    if wall > 0:
        for role, pids in after.pids.items():
            if role in ("loadgen", "harness"):
                continue
            for pid in pids:
                if pid in before.pid_ticks and pid in after.pid_ticks:
                    cores = (after.pid_ticks[pid] - before.pid_ticks[pid]) / CLK_TCK / wall
                    if cores > busiest.get("cores", -1.0):
                        busiest = {"role": role, "pid": pid, "cores": round(cores, 3)}
    return {
        "busiest_process": busiest or None,
        "cpu_s": {r: round(v, 3) for r, v in sorted(cpu_s.items())},
        "cpu_us_per_token": {r: round(v * 1e6 / tokens, 1) if tokens else None for r, v in sorted(cpu_s.items())},
        "cpu_us_per_token_servers": round(servers * 1e6 / tokens, 1) if tokens else None,
        "cpu_cores": {r: round(v / wall, 3) for r, v in sorted(cpu_s.items())} if wall > 0 else {},
        "machine_busy_cores": round(busy / wall, 3) if wall > 0 else None,
        "others_busy_cores": round(max(0.0, busy - ours) / wall, 3) if wall > 0 else None,
        "pids": {r: p for r, p in sorted(after.pids.items())},
    }


def base_spec(stack: Stack, path: str, args: argparse.Namespace) -> dict[str, Any]:
    port, url_path = _endpoint(stack, path)
    return {"host": "127.0.0.1", "port": port, "url_path": url_path, "path": path, "tokens": args.tokens,
            "timeout_s": args.timeout_s}


def run_point(stack: Stack, work: Workload, path: str, streams: int, args: argparse.Namespace) -> dict[str, Any]:
    n_requests = streams * args.rounds
    spec = {**base_spec(stack, path, args), "mode": "sweep", "concurrency": streams,
            "requests": [work.request(path, i) for i in range(n_requests)]}
    log_offset = stack.triton_log_size()
    result, before, after = run_loadgen(stack, spec)
    point = {"path": path, "streams": streams, **result, **cpu_report(before, after, result["tokens"])}
    # guided requests end when their document closes: each is checked against the schema instead
    point["expected_tokens"] = None if path == GUIDED_PATH else n_requests * args.tokens
    # the stand-in logs every response it could not send; the tokens it did send are the requested ones
    point["engine_send_failures"] = stack.triton_log_since(log_offset).count("stand-in sender: could not send")
    log.info(
        "%-12s %4d streams: %8.0f tok/s, TTFT p50 %s, gap p99 %s, errors %d, count mismatches %d, servers %s µs/token",
        path, streams, point["tokens_per_s"], _ms(point["ttft_s"]["p50"]), _ms(point["gap_s"]["p99"]),
        point["errors"], point["count_mismatches"], point["cpu_us_per_token_servers"],
    )
    return point


def warm_up(stack: Stack, work: Workload, args: argparse.Namespace) -> None:
    """One short request per path (connections, first-call costs); with the reference engine, also
    the greedy output every request must reproduce."""
    if args.engine == "reference":
        spec = {**base_spec(stack, "tensorrt_llm", args), "mode": "sweep", "concurrency": 1,
                "requests": [{"body": work.body("tensorrt_llm", 0)}]}
        spec_result = _raw_ids(stack, spec)
        work.reference_ids = spec_result
        log.info("reference output for the benchmark prompt: %r", work.tokenizer.decode(spec_result)[:80])
    work.adapter_urls = stack.adapter_urls
    for path in args.paths:
        tokens = args.tokens if path == GUIDED_PATH else 4  # a guided document needs room to close
        # the cog_lora warm-up sends each adapter once: its download and conversion are not measured
        count = len(work.adapter_urls) if path == LORA_PATH else 1
        spec = {**base_spec(stack, path, args), "tokens": tokens, "mode": "sweep", "concurrency": 1,
                "requests": [{"body": work.body(path, work.seed(0), tokens=tokens, index=i)} for i in range(count)]}
        result, _, _ = run_loadgen(stack, spec)
        if result["errors"]:
            raise RuntimeError(f"warm-up request on {path} failed: {result['error_messages']}")


def _raw_ids(stack: Stack, spec: dict[str, Any]) -> list[int]:
    import httpx

    port, url_path = spec["port"], spec["url_path"]
    ids: list[int] = []
    with httpx.stream("POST", f"http://127.0.0.1:{port}{url_path}", json=spec["requests"][0]["body"],
                      timeout=spec["timeout_s"]) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data:"):
                doc = json.loads(line[5:])
                if "error" in doc:
                    raise RuntimeError(doc["error"])
                ids.extend(int(x) for x in _flatten(doc.get("output_ids", [])))
    return ids


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [x for item in value for x in _flatten(item)]
    return [value]


def sweep(stack: Stack, work: Workload, args: argparse.Namespace, concurrency: Sequence[int]) -> list[dict[str, Any]]:
    """Every path at each stream count of ``concurrency``, at the stand-in's current ``args.step_ms``.

    Each point gets ``ratio_to_direct`` (tokens/s over ``tensorrt_llm``'s at the same streams),
    ``ratio_to_ideal`` (over streams x 1000 / step_ms, the stand-in's rate; stand-in only) and, for
    ``cog``, ``ratio_to_floor`` (over the ``floor`` path's)."""
    warm_up(stack, work, args)
    points = []
    for streams in concurrency:
        group = {}
        for path in args.paths:
            point = run_point(stack, work, path, streams, args)
            point["step_ms"] = args.step_ms if args.engine == "standin" else None
            ideal = streams * 1e3 / args.step_ms if args.engine == "standin" else None
            point["ratio_to_ideal"] = round(point["tokens_per_s"] / ideal, 3) if ideal else None
            group[path] = point
            points.append(point)
        direct = group.get("tensorrt_llm", {}).get("tokens_per_s")
        floor = group.get(FLOOR_PATH, {}).get("tokens_per_s")
        for path, point in group.items():
            point["ratio_to_direct"] = round(point["tokens_per_s"] / direct, 3) if direct else None
            if path in ("cog", GUIDED_PATH, LORA_PATH):
                point["ratio_to_floor"] = round(point["tokens_per_s"] / floor, 3) if floor else None
    return points


# ------------------------------------------------------------------------------------------------
# Soak
# ------------------------------------------------------------------------------------------------


def rss_report(roles: dict[str, list[int]]) -> dict[str, Optional[int]]:
    out: dict[str, Optional[int]] = {}
    for role, pids in sorted(roles.items()):
        values = [v for v in (rss_bytes(p) for p in pids) if v is not None]
        out[role] = sum(values) if values else None
    return out


def soak(stack: Stack, work: Workload, args: argparse.Namespace) -> dict[str, Any]:
    warm_up(stack, work, argparse.Namespace(**{**vars(args), "paths": ["cog"]}))
    duration = args.soak_minutes * 60.0
    spec = {
        **base_spec(stack, "cog", args), "mode": "soak", "concurrency": args.soak_streams, "duration_s": duration,
        "cancel_every": args.soak_cancel_every, "cancel_after_tokens": max(1, args.tokens // 8),
        "requests": [work.request("cog", i) for i in range(64)],
    }
    kill: dict[str, Any] = {}
    rss: dict[str, Any] = {"start": rss_report(stack.processes())}

    def during(proc: subprocess.Popen) -> None:
        kill_at = time.monotonic() + duration * args.soak_kill_at
        if args.soak_kill == "none":
            return
        while time.monotonic() < kill_at and proc.poll() is None:
            time.sleep(0.2)
        role = f"stub:{args.soak_kill}"
        pids = stack.processes().get(role, [])
        if not pids:
            kill["error"] = f"no {role} process found"
            return
        kill.update({"role": role, "pid": pids[0], "at": time.monotonic()})
        os.kill(pids[0], signal.SIGKILL)
        log.info("soak: killed %s (pid %d) with SIGKILL", role, pids[0])

    log.info("soak: %d streams through Cog for %.1f min, every %dth prediction cancelled, %s killed at %.0f%%",
             args.soak_streams, args.soak_minutes, args.soak_cancel_every, args.soak_kill, args.soak_kill_at * 100)
    result, before, after = run_loadgen(stack, spec, during=during)
    rss["end"] = rss_report(stack.processes())
    records = result.pop("records")
    summary = soak_summary(records, kill, args)
    summary["triton_restarts"] = triton_restarts(stack.work / "cog.log")
    return {"kill": kill, "rss_bytes": rss, "summary": summary, "loadgen": result,
            **cpu_report(before, after, result["tokens"])}


def triton_restarts(cog_log: Path) -> int:
    """How many times the predictor's supervisor restarted Triton, from its log line
    ``Triton restarted (<n> restarts so far)`` in the Cog server's log."""
    try:
        text = cog_log.read_text(errors="replace")
    except OSError:
        return 0
    return len(re.findall(r"Triton restarted \(\d+ restarts so far\)", text))


def soak_summary(records: list[dict[str, Any]], kill: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    kill_at = kill.get("at")
    cancel_requested = [r for r in records if r["cancelled"]]
    plain = [r for r in records if not r["cancelled"]]
    errors: dict[str, int] = {}
    for r in records:
        if r["error"]:
            errors[r["error"][:300]] = errors.get(r["error"][:300], 0) + 1
    out: dict[str, Any] = {
        "predictions": len(records),
        "succeeded": sum(1 for r in records if r["status"] == "succeeded"),
        "cancel_requested": len(cancel_requested),
        "canceled": sum(1 for r in cancel_requested if r["status"] == "canceled"),
        "cancel_too_late": sum(1 for r in cancel_requested if r["status"] == "succeeded"),
        "errors": sum(errors.values()),
        "error_messages": errors,
        "retried_409": sum(r.get("retried_409", 0) for r in records),
        "count_mismatches": sum(1 for r in plain if r["status"] == "succeeded" and not r["count_ok"]),
        "content_mismatches": sum(1 for r in plain if r["status"] == "succeeded" and not r["content_ok"]),
    }
    if kill_at is not None:
        # In flight at the fault: started before the supervisor could have found it (it polls every 0.5 s,
        # cog_triton/supervisor.py), ended after the kill. A prediction sent in that window meets the dead
        # stub just like one that was running.
        found_by = kill_at + FAULT_DETECTION_S
        after = [r for r in records if r["start"] >= kill_at]
        recovered = [r for r in after if r["status"] == "succeeded"]
        out["errors_after_kill"] = sum(1 for r in records if r["error"] and r["end"] >= kill_at)
        out["in_flight_at_kill"] = sum(1 for r in records if r["start"] < found_by and kill_at <= r["end"])
        out["in_flight_at_kill_failed"] = sum(
            1 for r in records
            if r["start"] < found_by and kill_at <= r["end"] and r["status"] not in ("succeeded", "canceled"))
        out["recoveries"] = len(recovered)
        out["started_after_kill"] = len(after)
        out["first_success_after_kill_s"] = (
            round(min(r["end"] for r in recovered) - kill_at, 2) if recovered else None)
    t0 = min((r["start"] for r in records), default=0.0)
    minutes: dict[int, dict[str, int]] = {}
    for r in records:
        m = minutes.setdefault(int((r["end"] - t0) // 60), {"succeeded": 0, "canceled": 0, "errors": 0})
        key = "errors" if r["error"] else ("succeeded" if r["status"] == "succeeded" else "canceled")
        m[key] += 1
    out["per_minute"] = {str(k): v for k, v in sorted(minutes.items())}
    return out


# ------------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------------


def _ms(value: Optional[float]) -> str:
    return "—" if value is None else f"{value * 1e3:.1f} ms"


def _num(value: Optional[float], fmt: str = "{:.0f}") -> str:
    return "—" if value is None else fmt.format(value)


def markdown(doc: dict[str, Any]) -> str:
    meta = doc["meta"]
    lines = [
        f"# scripts/benchmark: {meta['engine']} engine",
        "",
        f"{meta['started']} · `{meta['command']}` · commit {meta['git']} · {meta['machine']['cpus']} CPUs "
        f"({meta['machine']['cpu_model']})" + (f", {meta['machine']['gpu']}" if meta["machine"].get("gpu") else "")
        + f", load average {meta['machine']['loadavg_before']} before, "
        f"{meta['machine']['loadavg_after']} after",
        "",
        f"{meta['tokens']} tokens per request, {meta['rounds']} request(s) per stream per point"
        + (f", stand-in ({meta.get('engine_instances', 1)} instance(s), {meta['sender_threads']} sender thread(s) "
           "each)" if meta["engine"] == "standin" else "")
        + f", engine batch limit {meta['batch_limit']}, COG_MAX_CONCURRENCY {meta['cog_concurrency']}, "
        f"stream interval {_num(meta.get('stream_interval_ms'), '{:g}')} ms, "
        f"{_num(meta.get('stream_processes'))} stream process(es).",
        "",
        "`vs ideal`: tokens/s over streams × 1000 / step (the stand-in's rate); `vs direct`: over `tensorrt_llm` "
        "at the same point; `vs floor`: `cog` over the bare predictor under coglet (`floor`). Cog paths: TTFT p50 "
        "(in parentheses) from predict() starting to the first token reaching the predictor (its "
        "`time_to_first_token_s` metric); the rest is coglet's (queueing and starting the prediction, relaying "
        "the first chunk).",
        "",
        "| path | streams | step | tokens/s | vs ideal | vs direct | vs floor | TTFT p50 | TTFT p99 | gap p50 "
        "| gap p99 | errors | count mismatches |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in doc["points"]:
        mism = str(p["count_mismatches"])
        if p["mismatched_counts"]:
            mism += " (" + ", ".join(f"{k}×{v}" for k, v in sorted(p["mismatched_counts"].items())) + ")"
        if p.get("content_mismatches"):
            mism += f", {p['content_mismatches']} content"
        if p.get("incomplete_events"):
            mism += f", {p['incomplete_events']} cut inside an event"
        ratio = lambda key: "—" if p.get(key) is None else f"{p[key]:.2f}"  # noqa: E731
        step = "—" if p.get("step_ms") is None else f"{p['step_ms']:g} ms"
        server = (p.get("server_ttft_s") or {}).get("p50")
        ttft = _ms(p["ttft_s"]["p50"]) + (f" ({server * 1e3:.1f})" if server is not None else "")
        lines.append(
            f"| {p['path']} | {p['streams']} | {step} | {p['tokens_per_s']:.0f} | {ratio('ratio_to_ideal')} | "
            f"{ratio('ratio_to_direct')} | {ratio('ratio_to_floor')} | {ttft} | "
            f"{_ms(p['ttft_s']['p99'])} | {_ms(p['gap_s']['p50'])} | {_ms(p['gap_s']['p99'])} | {p['errors']}"
            + (f" ({p['retried_409']} × 409 retried)" if p.get("retried_409") else "")
            + f" | {mism} |"
        )
    roles = list(CORE_ROLES) + sorted(
        {r for p in doc["points"] for r in p["cpu_us_per_token"]} - set(CORE_ROLES) - {"harness"})
    lines += [
        "",
        "CPU µs per streamed token (utime + stime over the point / tokens delivered); `servers` sums all but the "
        "load generator and the harness; `busy cores` is the whole machine's, `others` what processes outside "
        "this benchmark used.",
        "",
        "| path | streams | " + " | ".join(roles) + " | servers | busiest process (cores) | busy cores | others |",
        "|---|---:|" + "---:|" * (len(roles) + 4),
    ]
    for p in doc["points"]:
        cells = [_num(p["cpu_us_per_token"].get(r)) for r in roles]
        busiest = p.get("busiest_process") or {}
        top = f"{busiest['role']} ({busiest['cores']:.2f})" if busiest else "—"
        lines.append(
            f"| {p['path']} | {p['streams']} | " + " | ".join(cells)
            + f" | {_num(p['cpu_us_per_token_servers'])} | {top} | {_num(p['machine_busy_cores'], '{:.2f}')} | "
            f"{_num(p['others_busy_cores'], '{:.2f}')} |"
        )
    lines += guidance_lines(doc)
    lines += lora_lines(doc)
    errors = {(p["path"], p["streams"]): p["error_messages"] for p in doc["points"] if p["error_messages"]}
    if errors:
        lines += ["", "Errors:", ""]
        for (path, streams), messages in errors.items():
            for message, count in messages.items():
                lines.append(f"- {path} × {streams}: {count} × `{message}`")
    return "\n".join(lines) + "\n"


def guidance_lines(doc: dict[str, Any]) -> list[str]:
    """The cost of guided decoding: ``cog_json`` next to ``cog`` at each stream count (both present)."""
    by = {(p["path"], p["streams"]): p for p in doc["points"]}
    pairs = [(by[("cog", n)], by[(GUIDED_PATH, n)]) for n in doc["meta"]["concurrency"]
             if ("cog", n) in by and (GUIDED_PATH, n) in by]
    if not pairs:
        return []
    lines = [
        "",
        f"Guided decoding (`{GUIDED_PATH}`: a `json_schema`, enforced by the reference model with xgrammar) next to "
        "unguided (`cog`). Guided requests end when the document closes; each output parsed and validated against "
        "the schema (a failure counts as a content mismatch above). Per-stream rate, and CPU µs per token of the "
        "model (`stub:tensorrt_llm`: token mask per step) and of the predictor (`cog_worker`: the guide compiled "
        "and checked, the document checked at the end):",
        "",
        "| streams | tok/s per stream unguided | guided | ratio | stub µs/token unguided | guided | "
        "worker µs/token unguided | guided |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for plain, guided in pairs:
        n = plain["streams"]
        rate_plain, rate_guided = plain["tokens_per_s"] / n, guided["tokens_per_s"] / n
        ratio = f"{rate_guided / rate_plain:.2f}" if rate_plain else "—"
        cells = [_num(x.get("cpu_us_per_token", {}).get(role)) for role in ("stub:tensorrt_llm", "cog_worker")
                 for x in (plain, guided)]
        lines.append(f"| {n} | {rate_plain:.1f} | {rate_guided:.1f} | {ratio} | " + " | ".join(cells) + " |")
    return lines


def lora_lines(doc: dict[str, Any]) -> list[str]:
    """What adapters cost: ``cog_lora`` next to ``cog`` at each stream count (both present)."""
    by = {(p["path"], p["streams"]): p for p in doc["points"]}
    pairs = [(by[("cog", n)], by[(LORA_PATH, n)]) for n in doc["meta"]["concurrency"]
             if ("cog", n) in by and (LORA_PATH, n) in by]
    if not pairs:
        return []
    meta = doc["meta"]
    lines = [
        "",
        f"LoRA adapters (`{LORA_PATH}`: {meta.get('lora_adapters')} adapters of rank {meta.get('lora_rank')} on every "
        "projection, round-robin over the streams, each fetched and converted in the warm-up) next to no adapter "
        "(`cog`): the same requests and tokens. Per-stream rate, and CPU µs per streamed token of the servers "
        "together, of the stream processes and of the engine (`stub:tensorrt_llm`: the stand-in's LoRA cache):",
        "",
        "| streams | tok/s no adapter | with | ratio | servers µs/token no adapter | with | difference | "
        "stream_proc no adapter | with | stub no adapter | with |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for plain, lora in pairs:
        n = plain["streams"]
        ratio = f"{lora['tokens_per_s'] / plain['tokens_per_s']:.2f}" if plain["tokens_per_s"] else "—"
        a, b = plain.get("cpu_us_per_token_servers"), lora.get("cpu_us_per_token_servers")
        diff = _num(b - a, "{:+.0f}") if a is not None and b is not None else "—"
        cells = [_num(x.get("cpu_us_per_token", {}).get(role)) for role in ("stream_proc", "stub:tensorrt_llm")
                 for x in (plain, lora)]
        lines.append(f"| {n} | {plain['tokens_per_s'] / n:.1f} | {lora['tokens_per_s'] / n:.1f} | {ratio} | "
                     f"{_num(a)} | {_num(b)} | {diff} | " + " | ".join(cells) + " |")
    return lines


#: How long after the kill a prediction still counts as in flight at the fault, seconds: the supervisor's
#: polling period (0.5 s) twice.
FAULT_DETECTION_S = 1.0

SOAK_LABELS = {
    "in_flight_at_kill": f"in flight at the kill (started before it + {FAULT_DETECTION_S:g} s of detection)",
    "recoveries": "recoveries (started after the kill, succeeded)",
    "first_success_after_kill_s": "first success after the kill, s",
    "triton_restarts": "Triton restarts (supervisor log)",
}


def soak_markdown(doc: dict[str, Any]) -> str:
    meta, s = doc["meta"], doc["soak"]
    summary = s["summary"]
    lines = [
        f"# scripts/benchmark --soak: {meta['engine']} engine",
        "",
        f"{meta['started']} · `{meta['command']}` · commit {meta['git']} · load average "
        f"{meta['machine']['loadavg_before']} before, {meta['machine']['loadavg_after']} after",
        "",
        f"{meta['soak_streams']} streams through Cog for {meta['soak_minutes']:g} min, {meta['tokens']} tokens per "
        f"prediction, every {meta['soak_cancel_every']}th cancelled part-way; killed: "
        f"{s['kill'].get('role', 'nothing')} (pid {s['kill'].get('pid', '—')}) at "
        f"{meta['soak_kill_at'] * 100:.0f}% of the run.",
        "",
        "| | |",
        "|---|---:|",
    ]
    for key in ("predictions", "succeeded", "cancel_requested", "canceled", "cancel_too_late", "errors",
                "retried_409", "count_mismatches", "content_mismatches", "in_flight_at_kill", "in_flight_at_kill_failed",
                "errors_after_kill", "started_after_kill", "recoveries", "first_success_after_kill_s", "triton_restarts"):
        if key in summary:
            lines.append(f"| {SOAK_LABELS.get(key, key.replace('_', ' '))} | {summary[key]} |")
    lines += ["", "| process | RSS start | RSS end |", "|---|---:|---:|"]
    start, end = s["rss_bytes"]["start"], s["rss_bytes"]["end"]
    for role in sorted(set(start) | set(end)):
        fmt = lambda v: "—" if v is None else f"{v / 2**20:.0f} MiB"  # noqa: E731
        lines.append(f"| {role} | {fmt(start.get(role))} | {fmt(end.get(role))} |")
    if summary["error_messages"]:
        lines += ["", "Errors:", ""] + [f"- {n} × `{m}`" for m, n in summary["error_messages"].items()]
    lines += ["", "Per minute (by end time): " + ", ".join(
        f"{k}: {v['succeeded']} ok / {v['canceled']} canceled / {v['errors']} errors"
        for k, v in summary["per_minute"].items())]
    return "\n".join(lines) + "\n"


def plot(doc: dict[str, Any], target: Path) -> Optional[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed (requirements-dev.txt): no plot")
        return None
    meta = doc["meta"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for path in meta["paths"]:
        points = [p for p in doc["points"] if p["path"] == path]
        xs = [p["streams"] for p in points]
        axes[0].plot(xs, [p["tokens_per_s"] for p in points], marker="o", label=path)
        axes[1].plot(xs, [p["cpu_us_per_token_servers"] for p in points], marker="o", label=path)
        axes[2].plot(xs, [(p["ttft_s"]["p99"] or 0) * 1e3 for p in points], marker="o", label=f"{path} TTFT p99")
        axes[2].plot(xs, [(p["gap_s"]["p99"] or 0) * 1e3 for p in points], marker="x", linestyle="--",
                     label=f"{path} gap p99")
    ideal = sorted({(p["streams"], p["streams"] * 1e3 / p["step_ms"]) for p in doc["points"] if p.get("step_ms")})
    if ideal:
        axes[0].plot([x for x, _ in ideal], [y for _, y in ideal], color="grey", linestyle=":", label="engine rate")
    axes[0].set(title="tokens/s", xlabel="streams", xscale="log", yscale="log")
    axes[1].set(title="server CPU µs per token", xlabel="streams", xscale="log")
    axes[2].set(title="latency p99 (ms)", xlabel="streams", xscale="log", yscale="log")
    axes[1].set_ylim(bottom=0)
    for ax in axes:
        ax.set_xticks(sorted(meta["concurrency"]))
        ax.set_xticklabels([str(x) for x in sorted(meta["concurrency"])])
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"scripts/benchmark ({meta['engine']}, {meta['tokens']} tokens/request, {meta['started']})")
    fig.tight_layout()
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target


def _setting(name: str) -> Any:
    """A predictor setting as the stack will see it (COG_TRITON_* in this environment)."""
    from cog_triton.settings import Settings  # noqa: PLC0415

    value = getattr(Settings.from_env(), name)
    return value() if callable(value) else value


def _gpu() -> str:
    """The GPUs of this host (nvidia-smi), or "" without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return f"{len(names)} x {names[0]}" if names else ""


def _git() -> str:
    """The checkout's commit (+dirty); in a copy without git (the GPU host's bundle), $BENCHMARK_GIT_COMMIT."""
    if not (REPO_ROOT / ".git").exists() and os.environ.get("BENCHMARK_GIT_COMMIT"):
        return os.environ["BENCHMARK_GIT_COMMIT"]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                                text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ------------------------------------------------------------------------------------------------
# CLI
# ------------------------------------------------------------------------------------------------


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _points(text: str) -> list[tuple[int, float]]:
    out = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        streams, _, step = item.partition("@")
        try:
            point = (int(streams), float(step))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected streams@step_ms pairs such as 128@10, got {item!r}") from None
        if point[0] < 1 or point[1] <= 0:
            raise argparse.ArgumentTypeError(f"streams and step_ms must be positive, got {item!r}")
        out.append(point)
    if not out:
        raise argparse.ArgumentTypeError("expected at least one streams@step_ms pair")
    return out


def _paths(text: str) -> list[str]:
    values = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in values if x not in ALL_PATHS]
    if bad or not values:
        raise argparse.ArgumentTypeError(f"paths are {', '.join(ALL_PATHS)}; got {text!r}")
    return values


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/benchmark",
        description="Serving cost per token on the real stack (Triton + Cog) with a token-rate stand-in engine: "
        "tensorrt_llm direct vs ensemble vs Cog /predictions, swept over concurrent streams.",
    )
    parser.add_argument("--concurrency", type=_int_list, default=None,
                        help="comma-separated stream counts (default 1,8,32,64,128; --engine reference 1,2,4; "
                        "--smoke 1,4)")
    parser.add_argument("--tokens", type=int, default=None,
                        help="tokens per request (default 256; --engine reference 64; --smoke 32)")
    parser.add_argument("--step-ms", type=float, default=10.0, help="stand-in step time, ms (default 10)")
    parser.add_argument("--points", type=_points, default=None,
                        help="streams@step_ms pairs, e.g. 64@5,128@10,256@20 (the stack restarts for each step); "
                        "instead of --concurrency and --step-ms")
    parser.add_argument("--engine-instances", type=int, default=None,
                        help="stand-in model instances (processes; default: one per 4 CPUs, 1 to 4), so that the "
                        "Python stand-in is not what limits the direct path on a many-core host")
    parser.add_argument("--paths", type=_paths, default=None,
                        help="comma-separated, of " + ",".join(ALL_PATHS) + f" (default {','.join(PATHS)}; "
                        f"--engine reference adds {GUIDED_PATH}, Cog with a json_schema)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="requests per stream per point (default 2; --engine reference and --smoke 1)")
    parser.add_argument("--batch-limit", type=int, default=None,
                        help="engine batch limit, max active requests (default: the largest concurrency, >= 8)")
    parser.add_argument("--cog-concurrency", type=int, default=None,
                        help="COG_MAX_CONCURRENCY (default: the largest concurrency + 25%%, at least + 8)")
    # The C++ backend sends every response from one WaitForResponse thread, at C++ cost; one Python
    # thread sending through pb_utils is the limit at 128 streams (measured: 3,496 tok/s direct with 1
    # thread against 8,766 with 4, of 12,800 ideal), so the default uses 4 to measure the serving layer.
    parser.add_argument("--sender-threads", type=int, default=4,
                        help="stand-in response sender threads (default 4; 1 is the C++ backend's thread "
                             "count, but one Python sender caps direct at ~3,500 tok/s here)")
    parser.add_argument("--end-id-after", type=int, default=0,
                        help="stand-in: end requests on the end token after this many tokens (default 0: never; "
                        "the benchmark's min_tokens keeps every request at --tokens anyway)")
    parser.add_argument("--lora-adapters", type=int, default=4,
                        help=f"adapters of the {LORA_PATH} path, round-robin over its streams (default 4)")
    parser.add_argument("--lora-rank", type=int, default=16, help="their rank (default 16)")
    parser.add_argument("--engine", choices=("standin", "reference"), default="standin",
                        help="standin (default) or reference: the real CPU reference model (~18 tok/s)")
    parser.add_argument("--smoke", action="store_true", help="a short run for tests")
    parser.add_argument("--soak", action="store_true",
                        help="soak run: 16 streams through Cog, 1 in 5 cancelled, a backend stub SIGKILLed part-way")
    parser.add_argument("--soak-minutes", type=float, default=10.0, help="soak duration, minutes (default 10)")
    parser.add_argument("--soak-streams", type=int, default=16, help="soak streams (default 16)")
    parser.add_argument("--soak-cancel-every", type=int, default=5, help="cancel every Nth prediction (default 5)")
    parser.add_argument("--soak-kill", choices=("tensorrt_llm", "preprocessing", "none"), default="tensorrt_llm",
                        help="Python backend stub to SIGKILL during the soak (default tensorrt_llm)")
    parser.add_argument("--soak-kill-at", type=float, default=0.4, help="when to kill, share of the run (default 0.4)")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per-request timeout, seconds")
    parser.add_argument("--archive", type=Path, default=ARCHIVE, help="weights archive (default: the default model)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "build" / "benchmark",
                        help="output folder (default build/benchmark)")
    args = parser.parse_args(argv)
    reference = args.engine == "reference"
    if args.paths is None:
        skipped = (FLOOR_PATH, LORA_PATH) if reference else ()
        args.paths = [p for p in (ALL_PATHS if reference else PATHS) if p not in skipped]
    if GUIDED_PATH in args.paths and not reference:
        parser.error(f"--paths {GUIDED_PATH} needs --engine reference: the stand-in does not enforce guides")
    if FLOOR_PATH in args.paths and reference:
        parser.error(f"--paths {FLOOR_PATH} needs the stand-in engine (it runs at the stand-in's step)")
    if LORA_PATH in args.paths and reference:
        parser.error(f"--paths {LORA_PATH} needs the stand-in engine (whose tokens every request can check)")
    if not 1 <= args.lora_adapters <= 64 or not 1 <= args.lora_rank <= 64:
        parser.error("--lora-adapters and --lora-rank must be in 1..64")
    if args.points is not None and (args.concurrency is not None or reference or args.soak):
        parser.error("--points replaces --concurrency and --step-ms, with the stand-in engine and not with --soak")
    if args.points is not None:
        args.concurrency = sorted({streams for streams, _ in args.points})
    if args.concurrency is None:
        args.concurrency = list(SMOKE_CONCURRENCY if args.smoke else REFERENCE_CONCURRENCY if reference
                                else DEFAULT_CONCURRENCY)
    # (step_ms, [streams...]) in order of first appearance: one stack start per step
    pairs = args.points or [(n, args.step_ms) for n in args.concurrency]
    args.groups = []
    for streams, step in pairs:
        for group in args.groups:
            if group[0] == step:
                group[1].append(streams)
                break
        else:
            args.groups.append((step, [streams]))
    if args.engine_instances is None:
        args.engine_instances = max(1, min(4, _cpus() // 4))
    if args.engine_instances < 1:
        parser.error("--engine-instances must be positive")
    if args.tokens is None:
        args.tokens = 32 if args.smoke else 64 if reference else 256
    if args.rounds is None:
        args.rounds = 1 if args.smoke or reference else 2
    if args.smoke and args.soak:
        args.soak_minutes = min(args.soak_minutes, 0.5)
        args.soak_streams = min(args.soak_streams, 4)
    if args.tokens < 1 or args.rounds < 1 or args.step_ms <= 0 or args.sender_threads < 1:
        parser.error("--tokens, --rounds, --step-ms and --sender-threads must be positive")
    top = max(args.concurrency + ([args.soak_streams] if args.soak else []))
    args.batch_limit = args.batch_limit or max(8, top)
    if not 1 <= args.batch_limit <= 256:
        parser.error("--batch-limit must be in 1..256 (COG_TRITON_REFERENCE_MAX_BATCH_SIZE)")
    # coglet returns a prediction's slot only once the worker reports it idle, a moment after
    # `completed`, so a client that starts its next prediction at once can find every slot taken when
    # the slots equal the streams: leave headroom. (Spurious 409s with free slots are retried by the
    # load generator: benchmarks/loadgen.py RETRIES_409.)
    args.cog_concurrency = args.cog_concurrency or max(8, top + max(8, top // 4))
    args.out = args.out if args.out.is_absolute() else Path.cwd() / args.out
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args = parse_args(argv)
    if not args.archive.is_file():
        log.error("%s is missing: run scripts/setup first", args.archive)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now().isoformat(timespec="seconds")
    meta: dict[str, Any] = {
        "started": started,
        "command": "scripts/benchmark " + " ".join(sys.argv[1:] if argv is None else argv),
        "git": _git(),
        "engine": args.engine,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "step_ms": args.step_ms,
        "points": [[n, step] for step, group in args.groups for n in group],
        "engine_instances": args.engine_instances,
        "stream_interval_ms": _setting("stream_interval_ms"),
        "stream_processes": _setting("stream_process_count"),
        "sender_threads": args.sender_threads,
        "end_id_after": args.end_id_after,
        "batch_limit": args.batch_limit,
        "cog_concurrency": args.cog_concurrency,
        "concurrency": args.concurrency,
        "paths": args.paths,
        "machine": {"cpus": os.cpu_count(), "cpu_model": _cpu_model(), "gpu": _gpu(), "loadavg_before": loadavg()},
        **({"lora_adapters": args.lora_adapters, "lora_rank": args.lora_rank} if LORA_PATH in args.paths else {}),
    }
    if args.soak:
        meta.update({k: getattr(args, k) for k in ("soak_minutes", "soak_streams", "soak_cancel_every",
                                                  "soak_kill", "soak_kill_at")})
    work = Workload(args)
    if args.soak:
        with Stack(args, args.out / "work") as stack:
            meta["processes"] = {r: p for r, p in stack.processes().items()}
            doc: dict[str, Any] = {"meta": meta, "soak": soak(stack, work, args)}
    else:
        doc = {"meta": meta, "points": []}
        floor = FloorServer(args, args.out / "floor") if FLOOR_PATH in args.paths else None
        try:
            if floor is not None:
                floor.__enter__()
            for step_ms, concurrency in args.groups:
                args.step_ms = step_ms
                log.info("stand-in step %g ms: %s streams", step_ms, ", ".join(map(str, concurrency)))
                with Stack(args, args.out / "work") as stack:
                    stack.floor = floor
                    meta.setdefault("processes", {r: p for r, p in stack.processes().items()})
                    doc["points"] += sweep(stack, work, args, concurrency)
        finally:
            if floor is not None:
                floor.__exit__()
    meta["machine"]["loadavg_after"] = loadavg()
    meta["finished"] = dt.datetime.now().isoformat(timespec="seconds")
    if args.soak:
        (args.out / "soak.json").write_text(json.dumps(doc, indent=2))
        (args.out / "soak.md").write_text(soak_markdown(doc))
        print(soak_markdown(doc))
        log.info("wrote %s and soak.md", args.out / "soak.json")
        return 0
    (args.out / "results.json").write_text(json.dumps(doc, indent=2))
    text = markdown(doc)
    (args.out / "results.md").write_text(text)
    plot(doc, args.out / "results.png")
    print(text)
    log.info("wrote %s, results.md and results.png", args.out / "results.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
