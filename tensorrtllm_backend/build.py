"""``scripts/build_engine``: one command from a build config to the archive that setup() downloads.

Steps (each logged with its wall time; the plan is printed first and by ``--dry-run``):

1. **fetch** (Hub ids only): ``python3 -m tensorrtllm_backend.convert download`` into
   ``<work>/hf`` (``huggingface_hub.snapshot_download``; ``HF_TOKEN`` is used when set).
2. **convert** (tensorrtllm backend): ``python3 -m tensorrtllm_backend.convert checkpoint`` (in-wheel
   ``from_hugging_face`` + ``save_checkpoint`` per rank; no or weight-only quantization) or
   ``... convert quantize`` (ModelOpt calibration via ``quantize_and_export``) into
   ``<work>/trtllm_checkpoint``.
3. **build** (tensorrtllm backend): ``trtllm-build`` into ``<work>/engine``.
4. **tokenizer-info** (tensorrtllm backend): ``python3 -m tensorrtllm_backend.convert xgrammar-info``
   writes ``<work>/xgrammar_tokenizer_info.json`` with TensorRT-LLM's own ``_xgrammar_tokenizer_info``
   (what its ``examples/generate_xgrammar_tokenizer_info.py`` does): the file the C++ backend's guided
   decoding (structured output) needs. It is made here, in the image whose TensorRT-LLM serves the
   engine, so that setup() needs no TensorRT-LLM import; a tokenizer it does not support gets none.
5. **verify** (pytorch backend): the checkpoint is one TensorRT-LLM's PyTorch backend serves
   (:func:`verify_pytorch_checkpoint`); nothing is built for it.
6. **package**: engine + tokenizer (with the tokenizer info, when made) or the checkpoint as is, for
   the reference and pytorch backends, are staged in ``<work>/package`` with ``manifest.json`` and packed into
   ``<output>/<name>.tar[.gz]`` with a ``.sha256`` beside it.

The tensorrtllm backend must run inside the image built from our Dockerfile, so the TensorRT-LLM
that builds is the one that serves (:data:`tensorrtllm_backend.pins.TENSORRT_LLM_VERSION`). Before
any work it fails with :class:`~common.errors.BuildError` when no GPU is visible, when fewer
GPUs than ``tp_size * pp_size`` are, when their compute capability is too low for the chosen
quantization, or when the installed TensorRT-LLM is missing or another version.

``trtllm-build`` flags follow TensorRT-LLM 1.1.0 and 1.2.1, which has the same flags (``tensorrt_llm/commands/build.py``
and the plugin flags of ``tensorrt_llm/plugin/plugin.py``; re-audit in docs/engines.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional, Sequence

from common.errors import BuildError, CogTritonError, ConfigError
from tensorrtllm_backend.build_config import (
    CALIBRATED_QFORMAT,
    KV_CACHE_QUANT_ALGO,
    QUANT_ALGO,
    Backend,
    EngineBuildConfig,
    load_build_config,
)
from tensorrtllm_backend.checkpoint import FACTS_VERSION, check_pytorch_checkpoint
from tensorrtllm_backend.engine import XGRAMMAR_TOKENIZER_INFO_NAME, WeightsInfo, inspect_weights
from tensorrtllm_backend.gpus import GPU, describe, visible_gpus
from tensorrtllm_backend.manifest import pack_archive, write_manifest
from tensorrtllm_backend.pins import (
    TENSORRT_LLM_VERSION,
    TRITON_IMAGE,
    describe_version,
    installed_tensorrt_llm_version,
    same_release,
)

log = logging.getLogger("build_engine")

# Files of a Hugging Face checkpoint folder that the tokenizer (and chat template) need.
TOKENIZER_PATTERNS = (
    "tokenizer.json",
    "tokenizer.model",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "config.json",
)
CHECKPOINT_SKIP = ("*.bin", "*.pth", "*.pt", "*.gguf", "*.msgpack", "*.h5", "*.onnx", ".git*", ".cache")


@dataclass(frozen=True)
class Step:
    """One build step: ``argv`` is run as a subprocess; ``argv is None`` means done in-process."""

    name: str
    description: str
    argv: Optional[tuple[str, ...]] = None

    def render(self) -> str:
        """The step as shown in the plan: a shell-quoted command line or a description."""
        body = shlex.join(self.argv) if self.argv else self.description
        return f"[{self.name}] {body}"


@dataclass(frozen=True)
class BuildPlan:
    """The ordered steps that turn ``config`` into ``archive``.

    Attributes:
        checkpoint_dir: the Hugging Face folder conversion reads (local source, or ``<work>/hf``).
        engine_dir: where ``trtllm-build`` writes (tensorrtllm backend only).
        package_dir: the staging folder that becomes the archive.
        archive: ``<output>/<name>.tar`` (engines) or ``.tar.gz`` (reference checkpoints).
    """

    config: EngineBuildConfig
    steps: tuple[Step, ...]
    work_dir: Path
    checkpoint_dir: Path
    engine_dir: Optional[Path]
    package_dir: Path
    archive: Path

    def render(self) -> str:
        """The plan as text, one step per line (what ``--dry-run`` prints; golden-tested)."""
        return "\n".join(step.render() for step in self.steps) + "\n"


@dataclass
class BuildResult:
    """What a build produced: the archive, its sha256 and size (bytes), and seconds per step."""

    archive: Path
    sha256: str
    size: int
    timings: dict[str, float] = field(default_factory=dict)


def _flag(enabled: bool) -> str:
    return "enable" if enabled else "disable"


def trtllm_build_argv(config: EngineBuildConfig, checkpoint_dir: Path, engine_dir: Path) -> tuple[str, ...]:
    """The ``trtllm-build`` command line (TensorRT-LLM 1.1.0 and 1.2.1 flags) for ``config``."""
    limits, features = config.limits, config.features
    argv = [
        "trtllm-build",
        "--checkpoint_dir", str(checkpoint_dir),
        "--output_dir", str(engine_dir),
        "--max_batch_size", str(limits.max_batch_size),
        "--max_input_len", str(limits.max_input_len),
        "--max_seq_len", str(limits.max_seq_len),
        "--max_beam_width", str(limits.max_beam_width),
    ]  # fmt: skip
    if limits.max_num_tokens is not None:
        argv += ["--max_num_tokens", str(limits.max_num_tokens)]
    argv += [
        "--kv_cache_type", "paged" if features.paged_kv_cache else "continuous",
        "--context_fmha", _flag(features.context_fmha),
        "--use_paged_context_fmha", _flag(features.paged_context_fmha),
        "--remove_input_padding", _flag(features.remove_input_padding),
        "--multiple_profiles", _flag(features.multiple_profiles),
        "--use_fused_mlp", _flag(features.use_fused_mlp),
        "--reduce_fusion", _flag(features.reduce_fusion),
    ]  # fmt: skip
    for plugin, value in config.plugins.items():
        argv += [f"--{plugin}", value]
    if config.lora is not None:  # "LoRA arguments" of tensorrt_llm/commands/build.py, and its lora_plugin flag
        lora = config.lora
        argv += ["--lora_plugin", lora.lora_plugin, "--max_lora_rank", str(lora.max_lora_rank),
                 "--lora_target_modules", *lora.lora_target_modules]
    argv += ["--workers", str(config.workers), "--log_level", "info"]
    return tuple(argv)


def convert_argv(config: EngineBuildConfig, checkpoint_dir: Path, output_dir: Path, python: str) -> tuple[str, ...]:
    """The conversion command (``tensorrtllm_backend.convert``) for ``config``."""
    par = config.parallelism
    common = [
        "--model-dir", str(checkpoint_dir),
        "--output-dir", str(output_dir),
        "--dtype", config.dtype.value,
        "--tp-size", str(par.tp_size),
        "--pp-size", str(par.pp_size),
    ]  # fmt: skip
    if not config.needs_calibration:
        argv = [python, "-m", "tensorrtllm_backend.convert", "checkpoint", *common]
        algo = QUANT_ALGO[config.quantization]
        if algo:
            argv += ["--quant-algo", algo]
        return tuple(argv)
    calib = config.calibration
    assert calib is not None  # set by validation whenever calibration is needed
    qformat = CALIBRATED_QFORMAT.get(config.quantization, "full_prec")
    argv = [python, "-m", "tensorrtllm_backend.convert", "quantize", *common, "--qformat", qformat]
    kv = KV_CACHE_QUANT_ALGO[config.kv_cache_quantization]
    if kv:
        argv += ["--kv-cache-dtype", kv.lower()]
    argv += [
        "--calib-dataset", calib.dataset,
        "--calib-size", str(calib.size),
        "--batch-size", str(calib.batch_size),
        "--calib-max-seq-length", str(calib.max_seq_len),
        "--awq-block-size", str(calib.awq_block_size),
        "--seed", str(calib.seed),
    ]  # fmt: skip
    return tuple(argv)


def plan_build(
    config: EngineBuildConfig,
    *,
    config_dir: Path,
    work_dir: Path,
    output_dir: Path,
    python: str = "python3",
) -> BuildPlan:
    """Lay out the steps for ``config`` (no side effects).

    Args:
        config_dir: folder that relative local checkpoint paths are resolved against.
        work_dir: scratch folder for the download, converted checkpoint, engine and staging.
        output_dir: where the archive is written.
        python: interpreter for the conversion subprocesses.
    """
    steps: list[Step] = []
    local = config.checkpoint_path(config_dir)
    checkpoint_dir = local if local is not None else work_dir / "hf"
    if local is None:
        fetch = [python, "-m", "tensorrtllm_backend.convert", "download", "--repo-id", config.source.checkpoint]
        if config.source.revision:
            fetch += ["--revision", config.source.revision]
        fetch += ["--output-dir", str(checkpoint_dir)]
        steps.append(Step("fetch", f"download {config.source.checkpoint} from the Hugging Face Hub", tuple(fetch)))
    package_dir = work_dir / "package"
    engine_dir: Optional[Path] = None
    if config.backend is Backend.TENSORRTLLM:
        trt_checkpoint = work_dir / "trtllm_checkpoint"
        engine_dir = work_dir / "engine"
        steps.append(Step("convert", "convert the checkpoint", convert_argv(config, checkpoint_dir, trt_checkpoint, python)))
        steps.append(Step("build", "build the engine", trtllm_build_argv(config, trt_checkpoint, engine_dir)))
        info_argv = (
            python, "-m", "tensorrtllm_backend.convert", "xgrammar-info",
            "--tokenizer-dir", str(checkpoint_dir), "--output", str(work_dir / XGRAMMAR_TOKENIZER_INFO_NAME),
        )  # fmt: skip
        steps.append(Step("tokenizer-info", "write the xgrammar tokenizer info (guided decoding)", info_argv))
        archive = output_dir / f"{config.name}.tar"
        what = f"{engine_dir} (config.json, rank*.engine) + tokenizer of {checkpoint_dir} as tokenizer/"
    elif config.backend is Backend.PYTORCH:
        steps.append(Step("verify", f"check that TensorRT-LLM {FACTS_VERSION}'s PyTorch backend serves the checkpoint "
                          f"{checkpoint_dir} (architecture, quantization, safetensors weights)"))
        archive = output_dir / f"{config.name}.tar"  # safetensors do not compress: no gzip pass over GBs
        what = f"checkpoint {checkpoint_dir} as is (PyTorch backend)"
    else:
        archive = output_dir / f"{config.name}.tar.gz"
        what = f"checkpoint {checkpoint_dir} as is (reference backend)"
    steps.append(Step("package", f"stage {what} in {package_dir}, write manifest.json, pack {archive}"))
    return BuildPlan(
        config=config,
        steps=tuple(steps),
        work_dir=work_dir,
        checkpoint_dir=checkpoint_dir,
        engine_dir=engine_dir,
        package_dir=package_dir,
        archive=archive,
    )


def preflight(config: EngineBuildConfig, gpus: list[GPU], trtllm_version: Optional[str]) -> Optional[GPU]:
    """Check that this machine can build ``config``; return the GPU whose architecture the engine targets.

    The reference backend needs nothing (returns None).

    Raises:
        BuildError: no GPU; fewer GPUs than tp_size * pp_size; GPUs of mixed compute capability;
            a compute capability below what the quantization needs; TensorRT-LLM missing or not
            the pinned version. Each message names what was found and how to fix it.
    """
    if config.backend in (Backend.REFERENCE, Backend.PYTORCH):
        return None
    need = config.parallelism.world_size
    if not gpus:
        raise BuildError(
            "building a TensorRT-LLM engine needs an NVIDIA GPU, and none is visible (no nvidia-smi, no device, "
            "or CUDA_VISIBLE_DEVICES hides them): run scripts/build_engine on a GPU machine inside the image built "
            "from our Dockerfile (docker run --gpus all ...), or use backend: reference to package a checkpoint "
            "for the CPU reference backend"
        )
    if len(gpus) < need:
        raise BuildError(
            f"{config.name} has tp_size {config.parallelism.tp_size} x pp_size {config.parallelism.pp_size} = "
            f"{need} ranks and needs {need} GPUs, but {describe(gpus)} {'is' if len(gpus) == 1 else 'are'} visible: run on a machine with {need} GPUs, "
            f"or lower tp_size * pp_size to {len(gpus)} or fewer"
        )
    used = gpus[:need]
    capabilities = sorted({g.compute_capability for g in used})
    if len(capabilities) > 1:
        raise BuildError(
            f"the {need} GPUs for this build have different compute capabilities ({', '.join(capabilities)}): "
            "an engine targets one architecture; choose GPUs of one kind with CUDA_VISIBLE_DEVICES"
        )
    minimum = config.min_compute_capability
    if minimum is not None and used[0].capability < minimum:
        raise BuildError(
            f"quantization {config.quantization.value} / kv_cache_quantization {config.kv_cache_quantization.value} "
            f"needs compute capability {minimum[0]}.{minimum[1]} or newer, but GPU {used[0].index} ({used[0].name}) "
            f"has {used[0].compute_capability}: choose another quantization (int8_wo, int4_wo, int4_awq) or a newer GPU"
        )
    if trtllm_version is None:
        raise BuildError(
            f"TensorRT-LLM is not installed in this Python: run scripts/build_engine inside the image built from "
            f"our Dockerfile (FROM {TRITON_IMAGE}, TensorRT-LLM {TENSORRT_LLM_VERSION}), so the version that "
            f"builds the engine is the one that serves it"
        )
    if not same_release(trtllm_version, TENSORRT_LLM_VERSION):
        raise BuildError(
            f"installed TensorRT-LLM is {describe_version(trtllm_version)} but this project serves {TENSORRT_LLM_VERSION} "
            f"({TRITON_IMAGE}); an engine only loads in the version that built it: build inside the image built "
            f"from our Dockerfile"
        )
    if shutil.which("trtllm-build") is None:
        raise BuildError("trtllm-build is not on PATH although tensorrt_llm is installed: is the image complete?")
    return used[0]


def _link_or_copy(source: str, target: str) -> None:
    """Hard-link when source and target share a filesystem (engines are many GB), else copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _copy_tree(source: Path, target: Path, skip: Sequence[str] = CHECKPOINT_SKIP) -> None:
    shutil.copytree(
        source, target, ignore=shutil.ignore_patterns(*skip), copy_function=_link_or_copy, dirs_exist_ok=False
    )


def stage_package(plan: BuildPlan) -> None:
    """Fill ``plan.package_dir``: engine files + ``tokenizer/``, or the reference checkpoint as is.

    Raises:
        BuildError: the engine has no config.json or rank files, or the checkpoint no tokenizer.
    """
    package = plan.package_dir
    shutil.rmtree(package, ignore_errors=True)
    source = plan.checkpoint_dir
    if plan.engine_dir is None:
        if not (source / "config.json").is_file():
            raise BuildError(f"{source} has no config.json: not a Hugging Face checkpoint folder")
        _copy_tree(source, package)
    else:
        engine = plan.engine_dir
        ranks = sorted(engine.glob("rank*.engine"))
        if not (engine / "config.json").is_file() or len(ranks) != plan.config.parallelism.world_size:
            raise BuildError(
                f"{engine} should hold config.json and {plan.config.parallelism.world_size} rank*.engine files after "
                f"trtllm-build, found {', '.join(p.name for p in engine.iterdir()) if engine.is_dir() else 'nothing'}"
            )
        _copy_tree(engine, package, skip=("*.cache", "timing.cache"))
        tokenizer = package / "tokenizer"
        tokenizer.mkdir()
        copied = [name for name in TOKENIZER_PATTERNS if (source / name).is_file()]
        for name in copied:
            _link_or_copy(str(source / name), str(tokenizer / name))
        if not any(name in copied for name in ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")):
            raise BuildError(f"{source} holds no tokenizer files (tokenizer.json, tokenizer.model or vocab.json)")
        info = plan.work_dir / XGRAMMAR_TOKENIZER_INFO_NAME
        if info.is_file():  # absent when the tokenizer-info step found the tokenizer unsupported
            shutil.copy2(info, tokenizer / XGRAMMAR_TOKENIZER_INFO_NAME)


def verify_pytorch_checkpoint(folder: Path) -> WeightsInfo:
    """The ``verify`` step of a ``pytorch`` build: the checkpoint in ``folder`` is one TensorRT-LLM 1.2.1's PyTorch
    backend serves (:func:`tensorrtllm_backend.checkpoint.check_pytorch_checkpoint`: architecture, quantization)
    and has safetensors weights (the package leaves ``*.bin`` duplicates out). No GPU is needed; whether the
    serving GPU runs its quantization is checked at setup.

    Raises:
        BuildError: naming the folder and why it cannot be served.
    """
    try:
        info = inspect_weights(folder)
        check_pytorch_checkpoint(info)
    except ConfigError as exc:
        raise BuildError(f"the checkpoint cannot be served by the PyTorch backend: {exc.message}") from None
    if not any(info.weights_dir.glob("*.safetensors")):
        raise BuildError(f"{info.weights_dir} has no *.safetensors weights, which the PyTorch backend archive needs "
                         "(*.bin files are not packed); convert them to safetensors")
    quant = info.quantization.describe() if info.quantization else "none"
    log.info("checkpoint %s (%s, %s) is served by the PyTorch backend; quantization %s",
             info.weights_dir, info.architecture, info.dtype, quant)
    return info


Runner = Callable[[Sequence[str]], None]


def run_subprocess(argv: Sequence[str], env: Optional[Mapping[str, str]] = None) -> None:
    """Run one build step, streaming its output; raise BuildError naming the step when it fails.

    ``env``: the step's whole environment (default: this process's), e.g. with one build's HF_TOKEN.
    """
    log.info("$ %s", shlex.join(argv))
    try:
        result = subprocess.run(list(argv), check=False, env=None if env is None else dict(env))
    except OSError as exc:
        raise BuildError(f"could not run {argv[0]}: {exc}") from None
    if result.returncode != 0:
        raise BuildError(f"{shlex.join(argv[:4])} ... exited with status {result.returncode}; see its output above")


def execute(plan: BuildPlan, *, gpu: Optional[GPU], runner: Runner = run_subprocess) -> BuildResult:
    """Run the plan's steps, then stage, write the manifest and pack.

    Args:
        gpu: the GPU the engine targets (from :func:`preflight`; None for the reference backend).
        runner: runs a command step (tests pass a recorder for the GPU-only steps).

    Raises:
        BuildError: a step failed, or its output is not what the next step needs.
    """
    config = plan.config
    timings: dict[str, float] = {}
    plan.work_dir.mkdir(parents=True, exist_ok=True)
    for step in plan.steps:
        if step.name == "verify":
            started = time.monotonic()
            verify_pytorch_checkpoint(plan.checkpoint_dir)
            timings[step.name] = time.monotonic() - started
            continue
        if step.argv is None:
            continue
        started = time.monotonic()
        log.info("step %s: %s", step.name, step.description)
        runner(step.argv)
        timings[step.name] = time.monotonic() - started
        log.info("step %s done in %.1f s", step.name, timings[step.name])
    started = time.monotonic()
    stage_package(plan)
    par = config.parallelism
    write_manifest(
        plan.package_dir,
        name=config.name,
        backend=config.backend.value,
        build_config=config.to_manifest(),
        world_size=par.world_size,
        tp_size=par.tp_size,
        pp_size=par.pp_size,
        gpu=gpu,
        tensorrt_llm_version=TENSORRT_LLM_VERSION if config.backend is Backend.TENSORRTLLM else None,
    )
    digest, size = pack_archive(plan.package_dir, plan.archive, gzip=plan.archive.name.endswith(".gz"))
    shutil.rmtree(plan.package_dir, ignore_errors=True)
    if plan.work_dir.is_dir() and not any(plan.work_dir.iterdir()):
        plan.work_dir.rmdir()
    timings["package"] = time.monotonic() - started
    return BuildResult(archive=plan.archive, sha256=digest, size=size, timings=timings)


def build(
    config_path: Path,
    *,
    work_dir: Path,
    output_dir: Path,
    checkpoint: Optional[str] = None,
    gpus: Optional[list[GPU]] = None,
    runner: Runner = run_subprocess,
) -> BuildResult:
    """Load ``config_path``, check the machine, and build the archive (the CLI's body).

    Args:
        checkpoint: replaces the config's ``source.checkpoint`` (a Hub id or local folder).
        gpus: the visible GPUs (default: :func:`~tensorrtllm_backend.gpus.visible_gpus`).

    Raises:
        BuildConfigError: invalid config. BuildError: see :func:`preflight` and :func:`execute`.
    """
    config = load_build_config(config_path)
    config_dir = config_path.resolve().parent
    if checkpoint:
        config = override_checkpoint(config, checkpoint)
        config_dir = Path.cwd()
    plan = plan_build(config, config_dir=config_dir, work_dir=work_dir, output_dir=output_dir, python=sys.executable)
    log.info("plan for %s (%s backend):\n%s", config.name, config.backend.value, plan.render().rstrip())
    started = time.monotonic()
    gpu = preflight(config, visible_gpus() if gpus is None else gpus, installed_tensorrt_llm_version())
    if gpu is not None:
        log.info("building on GPU %d: %s (compute capability %s)", gpu.index, gpu.name, gpu.compute_capability)
    result = execute(plan, gpu=gpu, runner=runner)
    log.info(
        "built %s (%.1f MB, sha256 %s) in %.1f s: %s",
        result.archive,
        result.size / 1e6,
        result.sha256,
        time.monotonic() - started,
        ", ".join(f"{k} {v:.1f} s" for k, v in result.timings.items()),
    )
    return result


def override_checkpoint(config: EngineBuildConfig, checkpoint: str) -> EngineBuildConfig:
    """``config`` with ``source.checkpoint`` replaced (revision dropped); revalidated.

    Raises:
        BuildConfigError: the new checkpoint is neither a local folder nor a Hub id.
    """
    from tensorrtllm_backend.build_config import parse_build_config  # noqa: PLC0415

    data = config.to_manifest()
    if Path(checkpoint).expanduser().is_dir() and not checkpoint.startswith(("/", "./", "../", "~")):
        checkpoint = "./" + checkpoint
    data["source"] = {"checkpoint": checkpoint}
    return parse_build_config(data, where="--checkpoint")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI entry point of ``scripts/build_engine``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="scripts/build_engine",
        description="Build the weights archive that setup() downloads from a YAML build config.",
    )
    parser.add_argument("config", type=Path, help="build config, e.g. configs/engines/gpt2-medium-fp16.yaml")
    parser.add_argument("--output-dir", type=Path, default=Path("build/engines"), help="where the archive goes")
    parser.add_argument("--work-dir", type=Path, default=None, help="scratch folder (default: build/work/<name>)")
    parser.add_argument("--checkpoint", default=None, help="override source.checkpoint (Hub id or local folder)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit; needs no GPU")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = load_build_config(args.config)
        work_dir = args.work_dir or Path("build/work") / config.name
        if args.dry_run:
            config_dir = args.config.resolve().parent
            if args.checkpoint:
                config, config_dir = override_checkpoint(config, args.checkpoint), Path.cwd()
            plan = plan_build(config, config_dir=config_dir, work_dir=work_dir, output_dir=args.output_dir)
            sys.stdout.write(plan.render())
            return 0
        result = build(args.config, work_dir=work_dir, output_dir=args.output_dir, checkpoint=args.checkpoint)
    except CogTritonError as exc:
        log.error("%s", exc)
        return 2
    print(result.archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
