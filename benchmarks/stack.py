"""The stack a benchmark runs against: weights server, Cog server (Triton under it) with the stand-in
engine's templates, LoRA adapters for the cog_lora path, and the floor path's bare predictor.

Part of ``scripts/benchmark`` (:mod:`benchmarks.harness`).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Optional

from benchmarks.paths import (
    ARCHIVE,
    FLOOR_DIR,
    LLMAPI_STANDIN_ROOT,
    LORA_PATH,
    LORA_TARGETS,
    PYTORCH_MODEL_DIR,
    PYTORCH_STANDIN_DIR,
    REFERENCE_MODEL,
    STANDIN_DIR,
    STANDIN_TEXT,
)
from benchmarks.procs import server_processes
from cog_triton.dev.local import CogServer, WeightsHTTPServer, free_port, serving_env
from cog_triton.settings import REPO_ROOT

log = logging.getLogger("benchmark")


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
                            reference_model: Path = REFERENCE_MODEL, script_file: Optional[Path] = None) -> Path:
    """A model-repository template folder (for COG_TRITON_TEMPLATE_DIR): the product's templates, with
    the stand-in as ``tensorrt_llm_reference`` (the folder setup() renders for a Hugging Face
    checkpoint as ``tensorrt_llm``). ``script_file``: the stand-in's scripted mode (tests only;
    ``benchmarks/standin/1/model.py``)."""
    shutil.rmtree(target, ignore_errors=True)
    source = REPO_ROOT / "triton_model_repo"
    for folder in ("ensemble", "ensemble_ids", "preprocessing", "tensorrt_llm"):
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
            "script_file": script_file.resolve() if script_file is not None else "",
        },
    )
    (llm / "config.pbtxt").write_text(config)
    return target


def pytorch_standin_config(*, pytorch_model: Path, step_ms: float, text_file: Path = STANDIN_TEXT,
                           cancellation_check_period_ms: float = 100.0, llm_stream_interval: int = 1) -> str:
    """The config.pbtxt of the ``--engine pytorch`` wrapper (``benchmarks/standin_pytorch``), made from the
    product's PyTorch-backend template: its tensors and parameters as they are, its own placeholders that setup()
    fills for the reference model kept as placeholders, the rest filled here, and a parameter for every other
    placeholder of the reference template (setup() renders this folder as ``tensorrt_llm_reference``, and refuses
    a value that names no placeholder), plus the wrapper's own parameters. ``pytorch_model``: the product model.py the
    wrapper loads, in a folder with the code it shares (:func:`write_pytorch_standin_templates`).

    Raises:
        ValueError: the product template has a placeholder this function does not know.
    """
    import string  # noqa: PLC0415

    from tensorrtllm_backend.templates import placeholders  # noqa: PLC0415

    product = (PYTORCH_MODEL_DIR / "config.pbtxt").read_text()
    reference = placeholders((REFERENCE_MODEL.parent.parent / "config.pbtxt").read_text())
    # the model's own defaults for the rest (empty parameters are dropped when rendered); the benchmark sends no adapter;
    # images off: the benchmark's requests are text (the product renders it on only for an image checkpoint)
    own = {"cancellation_check_period_ms": cancellation_check_period_ms, "unanswered_stop_timeout_ms": "",
           "max_adapters_per_llm": "", "adapter_snapshot_dir": "", "images": "false"}
    unknown = placeholders(product) - reference - set(own)
    if unknown:
        raise ValueError(f"tensorrt_llm_pytorch/config.pbtxt has placeholders the benchmark does not fill: {unknown}")
    text = string.Template(product).safe_substitute(own)
    lines = [text.rstrip("\n")]
    for name in sorted(reference - placeholders(product)):
        lines.append(f'parameters: {{ key: "{name}" value: {{ string_value: "${{{name}}}" }} }}')
    # sampler_type TRTLLMSampler: the benchmark's requests carry min_tokens (every request exactly --tokens) and a
    # seed (the paced stand-in's token cycle starts there), which TorchSampler would refuse (tensorrtllm_backend/
    # samplers.py); the paced stand-in does the same work under either sampler.
    for key, value in (("pytorch_model", pytorch_model.resolve()),
                       ("standin_root", LLMAPI_STANDIN_ROOT.resolve()), ("step_ms", step_ms),
                       ("text_file", text_file.resolve()), ("sampler_type", "TRTLLMSampler"),
                       ("stream_interval", llm_stream_interval)):
        escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'parameters: {{ key: "{key}" value: {{ string_value: "{escaped}" }} }}')
    return "\n".join(lines) + "\n"


def write_pytorch_standin_templates(target: Path, *, step_ms: float, text_file: Path = STANDIN_TEXT,
                                    llm_stream_interval: int = 1) -> Path:
    """A template folder (for COG_TRITON_TEMPLATE_DIR): the product's templates, with the PyTorch-backend model's
    benchmark wrapper as ``tensorrt_llm_reference`` (the folder setup() renders for a checkpoint), and the product
    model's code as the renderer puts it together, in ``tensorrt_llm_pytorch_code/1`` (which the wrapper loads)."""
    from tensorrtllm_backend.templates import copy_model_code  # noqa: PLC0415

    shutil.rmtree(target, ignore_errors=True)
    source = REPO_ROOT / "triton_model_repo"
    for folder in ("ensemble", "ensemble_ids", "preprocessing", "tensorrt_llm"):
        shutil.copytree(source / folder, target / folder, ignore=shutil.ignore_patterns("__pycache__"))
    llm = target / "tensorrt_llm_reference"
    (llm / "1").mkdir(parents=True)
    shutil.copy2(PYTORCH_STANDIN_DIR / "1" / "model.py", llm / "1" / "model.py")
    product = target / "tensorrt_llm_pytorch_code" / "1"
    product.mkdir(parents=True)
    copy_model_code(source, PYTORCH_MODEL_DIR.name, product)
    (llm / "config.pbtxt").write_text(pytorch_standin_config(pytorch_model=product / "model.py", step_ms=step_ms,
                                                            text_file=text_file,
                                                            llm_stream_interval=llm_stream_interval))
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
            # Every engine here is rendered from the reference model's template folder (the stand-ins replace it),
            # also on a GPU host, where a checkpoint would otherwise go to the PyTorch backend's template.
            COG_TRITON_CHECKPOINT_BACKEND="reference",
            # each prediction's start in its steps (the timing metric): the results' TTFT phases table
            COG_TRITON_TIMING_METRICS="true",
        )
        if LORA_PATH in args.paths:
            archives = make_adapters(args.out / "lora_adapters", args.lora_adapters, args.lora_rank)
            self._adapters = WeightsHTTPServer(archives[0].parent).__enter__()
            self.adapter_urls = [f"{self._adapters.url}/{a.name}" for a in archives]
            # the adapters are served from 127.0.0.1 over http://: the fetch rules' opt-ins (cog_triton.fetch.rules)
            env.update(COG_TRITON_FETCH_ALLOW_PRIVATE="true", COG_TRITON_FETCH_ALLOW_HTTP="true")
        if args.engine == "standin":
            templates = write_standin_templates(
                self.work / "templates", step_ms=args.step_ms, sender_threads=args.sender_threads,
                end_id_after=args.end_id_after, instances=args.engine_instances,
            )
            env["COG_TRITON_TEMPLATE_DIR"] = str(templates)
        elif args.engine == "pytorch":
            templates = write_pytorch_standin_templates(self.work / "templates", step_ms=args.step_ms,
                                                        llm_stream_interval=args.llm_stream_interval)
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
