"""scripts/build_engine: golden plans and TensorRT-LLM calls, preflight failures, a full (stand-in) GPU
build, and the real CPU path: package SmolLM2 for the reference backend, serve it, setup(), predict.

What cannot run here is replaced, and only that: GPUs (a fake nvidia-smi, tests/gpu_fakes.py) and
TensorRT-LLM (a recording stand-in package and trtllm-build, tests/fake_tensorrt_llm). The planner,
preflight, subprocess orchestration, staging, manifest, packing, download, verification, Triton
and the model are the real code.

Golden files live in tests/golden/; regenerate them with ``UPDATE_GOLDEN=1 pytest tests/test_build_engine.py``
and review the diff. The goldens are not only compared with themselves: every ``trtllm-build`` line in them
is parsed by the stand-in's copy of TensorRT-LLM 1.2.1's argument parser (tests/fake_tensorrt_llm/tensorrt_llm/
commands/build.py, which cites the upstream files), and the parsed values are checked against the config.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import types
from pathlib import Path
from typing import Any

import pytest

from common.errors import BuildError, IncompatibleWeightsError, ManifestError, TritonStartupError
from cog_triton.ipc import PredictInputs
from cog_triton.worker.inputs import validate_inputs
from cog_triton.dev.local import WeightsHTTPServer, free_port
from cog_triton.worker.service import LLMService
from cog_triton.settings import REPO_ROOT, Settings
from cog_triton.weights import fetch_weights
from tensorrtllm_backend.build import plan_build, preflight, trtllm_build_argv
from tensorrtllm_backend.build_config import PLUGINS, Features, load_build_config, parse_build_config
from tensorrtllm_backend.manifest import MANIFEST_NAME, read_manifest, verify_weights
from tensorrtllm_backend.pins import TENSORRT_LLM_VERSION, TRITON_IMAGE
from tests.gpu_fakes import A100, H100, L4, fake_nvidia_smi, gpus, path_with
from tests.proc import pids_mentioning

EXAMPLES_DIR = REPO_ROOT / "configs" / "engines"
EXAMPLES = sorted(EXAMPLES_DIR.glob("*.yaml"))
ENGINE_EXAMPLES = [p for p in EXAMPLES if load_build_config(p).backend.value == "tensorrtllm"]
GOLDEN = REPO_ROOT / "tests" / "golden"
FAKE = REPO_ROOT / "tests" / "fake_tensorrt_llm"
BUILD_ENGINE = REPO_ROOT / "scripts" / "build_engine"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "gpt2": "GPT2LMHeadModel", "gemma": "GemmaForCausalLM"}


def check_golden(path: Path, actual: str) -> None:
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
    assert path.is_file(), f"{path} missing: run with UPDATE_GOLDEN=1 and review it"
    assert actual == path.read_text(), f"differs from {path} (UPDATE_GOLDEN=1 to regenerate after review)"


def architecture_for(stem: str) -> str:
    return next(arch for prefix, arch in ARCHITECTURES.items() if stem.startswith(prefix))


def make_checkpoint(folder: Path, architecture: str, tokenizer_source: Path) -> Path:
    """A Hugging Face folder with config.json and the SmolLM2 tokenizer (the stand-in reads no weights)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"architectures": [architecture], "model_type": "llama"}))
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer_source / name, folder / name)
    (folder / "model.safetensors").write_bytes(b"not read by the stand-in")
    return folder


def run_cli(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BUILD_ENGINE), *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "PYTHONPATH")}
    env["PYTHON"] = sys.executable
    env.update(extra)
    return env


# --- plans ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_plan_matches_golden(path: Path) -> None:
    plan = plan_build(load_build_config(path), config_dir=EXAMPLES_DIR, work_dir=Path("/work/build"), output_dir=Path("/out"))
    # build/ may be a link to a shared folder (git worktrees share one): its target is written as <repo>/build too
    rendered = plan.render().replace(str((REPO_ROOT / "build").resolve()), "<repo>/build")
    check_golden(GOLDEN / "build_plans" / f"{path.stem}.txt", rendered.replace(str(REPO_ROOT), "<repo>"))


def test_dry_run_prints_the_plan_without_a_gpu() -> None:
    path = EXAMPLES_DIR / "llama-2-7b-fp16-tp4.yaml"
    result = run_cli([str(path), "--dry-run", "--work-dir", "/work/build", "--output-dir", "/out"], base_env(PATH="/usr/bin:/bin"))
    assert result.returncode == 0, result.stderr
    assert result.stdout == (GOLDEN / "build_plans" / "llama-2-7b-fp16-tp4.txt").read_text()


def test_plan_shapes() -> None:
    tp4 = plan_build(
        load_build_config(EXAMPLES_DIR / "llama-2-7b-fp16-tp4.yaml"), config_dir=EXAMPLES_DIR, work_dir=Path("/w"), output_dir=Path("/o")
    )
    assert [s.name for s in tp4.steps] == ["fetch", "convert", "build", "tokenizer-info", "package"]
    assert tp4.archive == Path("/o/llama-2-7b-chat-fp16-tp4.tar")
    build = tp4.steps[2].argv
    assert build is not None and build[build.index("--workers") + 1] == "4"
    assert build[build.index("--kv_cache_type") + 1] == "paged"
    reference = plan_build(
        load_build_config(EXAMPLES_DIR / "smollm2-135m-instruct-reference.yaml"),
        config_dir=EXAMPLES_DIR,
        work_dir=Path("/w"),
        output_dir=Path("/o"),
    )
    assert [s.name for s in reference.steps] == ["package"]  # local checkpoint, no GPU steps
    assert reference.archive == Path("/o/smollm2-135m-instruct.tar.gz")
    pinned = parse_build_config({"name": "x", "source": {"checkpoint": "org/m", "revision": "abc123"}})
    fetch = plan_build(pinned, config_dir=Path("/"), work_dir=Path("/w"), output_dir=Path("/o")).steps[0].argv
    assert fetch is not None and fetch[fetch.index("--revision") + 1] == "abc123"


# --- the trtllm-build line against trtllm-build's own argument parser -----------------------------


def trtllm_build_parser() -> argparse.ArgumentParser:
    """The stand-in's copy of ``tensorrt_llm/commands/build.py``'s parser, loaded without importing the
    stand-in package into this process (other tests need ``tensorrt_llm`` to be absent here)."""
    spec = importlib.util.spec_from_file_location("_trtllm_build", FAKE / "tensorrt_llm" / "commands" / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.parse_arguments()


def rejected(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """argparse's error message for ``argv``; fails the test when the parser accepts it."""
    with pytest.raises(SystemExit) as exc:
        trtllm_build_parser().parse_args(["--checkpoint_dir", "/c", *argv])
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("path", ENGINE_EXAMPLES, ids=lambda p: p.stem)
def test_golden_build_line_is_what_trtllm_build_parses_from_the_config(path: Path) -> None:
    """Each golden plan's ``[build]`` line parses with trtllm-build's parser (parse_args: an unknown flag or
    value exits 2), and every parsed value is the build config's, so a golden cannot drift from either."""
    line = next(r for r in (GOLDEN / "build_plans" / f"{path.stem}.txt").read_text().splitlines()
                if r.startswith("[build] "))
    argv = shlex.split(line.removeprefix("[build] "))
    assert argv[0] == "trtllm-build"
    args = vars(trtllm_build_parser().parse_args(argv[1:]))
    config = load_build_config(path)
    onoff = {True: "enable", False: "disable"}
    features = config.features
    expected: dict[str, Any] = {
        "checkpoint_dir": "/work/build/trtllm_checkpoint", "output_dir": "/work/build/engine",
        **config.limits.model_dump(),
        "kv_cache_type": "PAGED" if features.paged_kv_cache else "CONTINUOUS",
        "context_fmha": onoff[features.context_fmha], "use_paged_context_fmha": onoff[features.paged_context_fmha],
        "remove_input_padding": onoff[features.remove_input_padding],
        "multiple_profiles": onoff[features.multiple_profiles], "use_fused_mlp": onoff[features.use_fused_mlp],
        "reduce_fusion": onoff[features.reduce_fusion], **config.plugins,
        "workers": config.workers, "log_level": "info",
    }  # fmt: skip
    if config.lora is not None:
        expected |= {"lora_plugin": config.lora.lora_plugin, "max_lora_rank": config.lora.max_lora_rank,
                     "lora_target_modules": list(config.lora.lora_target_modules)}
    assert {k: args[k] for k in expected} == expected
    # nothing else was set: every other option is at the parser's default
    defaults = vars(trtllm_build_parser().parse_args([]))
    assert {k: v for k, v in args.items() if k not in expected and v != defaults.get(k)} == {}


def test_every_plugin_value_a_config_accepts_trtllm_build_accepts() -> None:
    """build_config.PLUGINS (what a config may say) is within trtllm-build's plugin choices, and so are the
    feature switches (both values) and the LoRA section's defaults."""
    parser = trtllm_build_parser()
    for plugin, values in PLUGINS.items():
        for value in values:
            assert getattr(parser.parse_args([f"--{plugin}", value]), plugin) == value
    every = parse_build_config({
        "name": "x", "source": {"checkpoint": "org/m"}, "lora": {},
        "features": {name: flip for name, flip in zip(Features.model_fields, [True, False] * 4)},
    })  # fmt: skip
    for features in (every.features, Features(**{k: not v for k, v in every.features.model_dump().items()})):
        argv = trtllm_build_argv(every.model_copy(update={"features": features}), Path("/c"), Path("/e"))
        parser.parse_args(list(argv[1:]))  # exits 2 on anything trtllm-build rejects


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max_seq_length", "4096"], "unrecognized arguments: --max_seq_length"),  # misspelled
        (["--use_custom_all_reduce", "enable"], "unrecognized arguments: --use_custom_all_reduce"),  # gone in 1.x
        (["--auto_parallel", "2"], "unrecognized arguments: --auto_parallel"),  # gone in 1.x
        (["--context_fmha", "on"], "argument --context_fmha: invalid choice: 'on'"),
        (["--gemm_plugin", "fp16"], "argument --gemm_plugin: invalid choice: 'fp16'"),
        (["--kv_cache_type", "pagged"], "argument --kv_cache_type: invalid kv_cache_type value: 'pagged'"),
        (["--max_batch_size", "8.5"], "argument --max_batch_size: invalid int value: '8.5'"),
        (["--log_level", "debug"], "argument --log_level: invalid choice: 'debug'"),
        (["--lora_target_modules", "q_proj"], "argument --lora_target_modules: invalid choice: 'q_proj'"),
    ],
)
def test_trtllm_build_rejects_what_the_real_one_rejects(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in rejected(argv, capsys)


def test_a_misspelled_flag_fails_the_stand_in_build_and_records_nothing(tmp_path: Path) -> None:
    """The trtllm-build executable (what scripts/build_engine runs) exits 2 and builds nothing."""
    record = tmp_path / "calls.jsonl"
    env = base_env(FAKE_TRTLLM_RECORD=str(record))
    argv = [str(FAKE / "bin" / "trtllm-build"), "--checkpoint_dir", str(tmp_path), "--output_dir",
            str(tmp_path / "engine"), "--max_seq_lenn", "4096"]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "unrecognized arguments: --max_seq_lenn" in result.stderr
    assert not record.exists() and not (tmp_path / "engine").exists()


# --- TensorRT-LLM calls (recording stand-in) ------------------------------------------------------


@pytest.mark.parametrize("path", ENGINE_EXAMPLES, ids=lambda p: p.stem)
def test_tensorrt_llm_calls_match_golden(path: Path, tmp_path: Path, checkpoint_dir: Path) -> None:
    """The conversion step, run as build_engine runs it, makes exactly the golden TensorRT-LLM calls."""
    config = load_build_config(path)
    plan = plan_build(config, config_dir=EXAMPLES_DIR, work_dir=tmp_path, output_dir=tmp_path / "out", python=sys.executable)
    make_checkpoint(plan.checkpoint_dir, architecture_for(path.stem), checkpoint_dir)
    record = tmp_path / "calls.jsonl"
    convert = next(s for s in plan.steps if s.name == "convert")
    assert convert.argv is not None
    env = base_env(PYTHONPATH=f"{FAKE}{os.pathsep}{REPO_ROOT}", FAKE_TRTLLM_RECORD=str(record))
    result = subprocess.run(list(convert.argv), cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    calls = record.read_text()
    check_golden(GOLDEN / "trtllm_calls" / f"{path.stem}.jsonl", calls)
    rows = [json.loads(line) for line in calls.splitlines()]
    if config.needs_calibration:
        assert [r["call"] for r in rows] == ["quantize_and_export"]
    else:
        world = config.parallelism.world_size
        assert [r["call"] for r in rows] == ["from_hugging_face", "save_checkpoint"] * world
        assert [r["mapping"]["rank"] for r in rows[::2]] == list(range(world))
        assert [r["save_config"] for r in rows[1::2]] == [True] + [False] * (world - 1)


def test_conversion_refuses_an_architecture_without_model_class(tmp_path: Path, checkpoint_dir: Path) -> None:
    make_checkpoint(tmp_path / "hf", "MambaForCausalLM", checkpoint_dir)
    env = base_env(PYTHONPATH=f"{FAKE}{os.pathsep}{REPO_ROOT}", FAKE_TRTLLM_RECORD=str(tmp_path / "r"))
    result = subprocess.run(
        [sys.executable, "-m", "tensorrtllm_backend.convert", "checkpoint", "--model-dir", str(tmp_path / "hf"),
         "--output-dir", str(tmp_path / "out"), "--dtype", "float16"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "architecture MambaForCausalLM" in result.stderr
    assert "supported: GPT2LMHeadModel, GemmaForCausalLM, LlamaForCausalLM, MistralForCausalLM" in result.stderr


def test_conversion_without_tensorrt_llm_says_where_to_run(tmp_path: Path, checkpoint_dir: Path) -> None:
    make_checkpoint(tmp_path / "hf", "LlamaForCausalLM", checkpoint_dir)
    result = subprocess.run(
        [sys.executable, "-m", "tensorrtllm_backend.convert", "checkpoint", "--model-dir", str(tmp_path / "hf"),
         "--output-dir", str(tmp_path / "out"), "--dtype", "float16"],
        cwd=REPO_ROOT, env=base_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "TensorRT-LLM is not importable" in result.stderr and "image built from our Dockerfile" in result.stderr


def test_quantize_refuses_another_signature(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A quantize_and_export without the 1.1.0/1.2.1 keywords (another TensorRT-LLM) fails before calibrating."""
    from tensorrtllm_backend import convert

    called: list[Any] = []
    package = types.ModuleType("tensorrt_llm")
    quantization = types.ModuleType("tensorrt_llm.quantization")
    quantization.quantize_and_export = lambda *, model_dir, output_dir, qformat, export_format: called.append(1)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorrt_llm", package)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.quantization", quantization)
    with pytest.raises(BuildError) as info:
        convert.quantize(
            tmp_path, tmp_path / "out", dtype="bfloat16", tp_size=1, pp_size=1, qformat="fp8", kv_cache_dtype=None,
            calib_dataset="cnn_dailymail", calib_size=8, batch_size=1, calib_max_seq_length=64, awq_block_size=128, seed=1,
        )  # fmt: skip
    message = str(info.value)
    assert "unknown: device, calib_dataset" in message and "missing: export_format" in message
    assert not called


# --- preflight ------------------------------------------------------------------------------------


def test_preflight_without_gpu() -> None:
    config = load_build_config(EXAMPLES_DIR / "gpt2-medium-fp16.yaml")
    with pytest.raises(BuildError, match="needs an NVIDIA GPU, and none is visible"):
        preflight(config, [], TENSORRT_LLM_VERSION)


def test_preflight_with_too_few_gpus() -> None:
    config = load_build_config(EXAMPLES_DIR / "llama-2-7b-fp16-tp4.yaml")
    with pytest.raises(BuildError) as info:
        preflight(config, gpus(2), TENSORRT_LLM_VERSION)
    assert "tp_size 4 x pp_size 1 = 4 ranks and needs 4 GPUs, but 2 GPUs (0: NVIDIA H100" in str(info.value)
    assert "lower tp_size * pp_size to 2 or fewer" in str(info.value)


def test_preflight_compute_capability_and_mixed_gpus() -> None:
    fp8 = load_build_config(EXAMPLES_DIR / "llama-3-8b-instruct-fp8.yaml")
    with pytest.raises(BuildError, match=r"fp8 / kv_cache_quantization fp8 needs compute capability 8\.9 or newer, but GPU 0 \(NVIDIA A100-SXM4-80GB\) has 8\.0"):
        preflight(fp8, gpus(1, A100), TENSORRT_LLM_VERSION)
    mixed = gpus(1, A100) + [gpus(2, L4)[1]]
    tp2 = parse_build_config({"name": "x", "source": {"checkpoint": "o/m"}, "parallelism": {"tp_size": 2}})
    with pytest.raises(BuildError, match=r"different compute capabilities \(8\.0, 8\.9\)"):
        preflight(tp2, mixed, TENSORRT_LLM_VERSION)


def test_preflight_tensorrt_llm_version(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = load_build_config(EXAMPLES_DIR / "gpt2-medium-fp16.yaml")
    with pytest.raises(BuildError, match=f"TensorRT-LLM is not installed in this Python: .*FROM {TRITON_IMAGE}"):
        preflight(config, gpus(1), None)
    with pytest.raises(BuildError, match=f"installed TensorRT-LLM is 1.1.0 but this project serves {TENSORRT_LLM_VERSION}"):
        preflight(config, gpus(1), "1.1.0")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(BuildError, match="trtllm-build is not on PATH"):
        preflight(config, gpus(1), TENSORRT_LLM_VERSION)
    monkeypatch.setenv("PATH", path_with(FAKE / "bin"))
    assert preflight(config, gpus(2, L4), TENSORRT_LLM_VERSION) == gpus(2, L4)[0]


def test_preflight_reference_needs_nothing() -> None:
    assert preflight(load_build_config(EXAMPLES_DIR / "smollm2-135m-instruct-reference.yaml"), [], None) is None


@pytest.mark.parametrize(
    ("stem", "smi", "expected"),
    [
        ("gpt2-medium-fp16", [], "needs an NVIDIA GPU, and none is visible"),
        ("llama-2-7b-fp16-tp4", gpus(2), "needs 4 GPUs, but 2 GPUs"),
        ("llama-3-8b-instruct-fp8", gpus(1, A100), "needs compute capability 8.9 or newer"),
        ("llama-3-8b-instruct-bf16", gpus(1), "TensorRT-LLM is not installed in this Python"),
    ],
)
def test_cli_fails_early_and_clearly(stem: str, smi: list, expected: str, tmp_path: Path) -> None:
    """The real CLI, with the driver faked: it refuses before downloading or creating anything."""
    folder = fake_nvidia_smi(tmp_path / "bin", smi) if smi else tmp_path / "empty"
    folder.mkdir(exist_ok=True)
    work = tmp_path / "work"
    result = run_cli(
        [str(EXAMPLES_DIR / f"{stem}.yaml"), "--work-dir", str(work), "--output-dir", str(tmp_path / "out")],
        base_env(PATH=f"{folder}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin"),
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "[build_failed]" in result.stderr and expected in result.stderr
    assert not work.exists() and not (tmp_path / "out").exists()


def test_cli_reports_a_bad_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nsource: {checkpoint: org/m}\nlimits: {max_seq: 10}\n")
    result = run_cli([str(bad), "--dry-run"], base_env())
    assert result.returncode == 2
    assert "limits.max_seq: unknown key; allowed: max_batch_size" in result.stderr


# --- a full build with stand-ins for the GPU and TensorRT-LLM -------------------------------------


@pytest.fixture(scope="module")
def tp4_build(tmp_path_factory: pytest.TempPathFactory, checkpoint_dir: Path) -> dict[str, Any]:
    """scripts/build_engine on the TP-4 example with 4 (fake) H100s and the TensorRT-LLM stand-in."""
    tmp = tmp_path_factory.mktemp("tp4")
    source = make_checkpoint(tmp / "llama-hf", "LlamaForCausalLM", checkpoint_dir)
    smi = fake_nvidia_smi(tmp / "smi", gpus(4, H100))
    record = tmp / "calls.jsonl"
    env = base_env(
        PATH=f"{smi}{os.pathsep}{FAKE / 'bin'}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin",
        PYTHONPATH=str(FAKE),
        FAKE_TRTLLM_RECORD=str(record),
    )
    out = tmp / "out"
    result = run_cli(
        [str(EXAMPLES_DIR / "llama-2-7b-fp16-tp4.yaml"), "--checkpoint", str(source), "--work-dir", str(tmp / "work"), "--output-dir", str(out)],
        env,
    )
    assert result.returncode == 0, result.stderr
    return {"tmp": tmp, "archive": Path(result.stdout.strip()), "log": result.stderr, "calls": record, "source": source}


def test_full_build_produces_a_verified_engine_archive(tp4_build: dict[str, Any]) -> None:
    archive = tp4_build["archive"]
    assert archive.name == "llama-2-7b-chat-fp16-tp4.tar" and archive.is_file()
    digest = (archive.parent / (archive.name + ".sha256")).read_text().split()[0]
    with tarfile.open(archive) as tar:
        names = sorted(tar.getnames())
    assert names == sorted(
        ["config.json", "manifest.json", "rank0.engine", "rank1.engine", "rank2.engine", "rank3.engine", "tokenizer",
         "tokenizer/config.json", "tokenizer/xgrammar_tokenizer_info.json"] + [f"tokenizer/{name}" for name in TOKENIZER_FILES]
    )  # fmt: skip
    target = tp4_build["tmp"] / "unpacked"
    fetch_weights(str(archive), target, sha256=digest)
    manifest = read_manifest(target)
    assert manifest is not None
    assert (manifest.backend, manifest.kind, manifest.world_size, manifest.tp_size) == ("tensorrtllm", "engine", 4, 4)
    assert manifest.tensorrt_llm_version == TENSORRT_LLM_VERSION and manifest.triton_image == TRITON_IMAGE
    assert (manifest.gpu_name, manifest.compute_capability) == H100
    expected = load_build_config(EXAMPLES_DIR / "llama-2-7b-fp16-tp4.yaml").to_manifest()
    expected["source"] = {"checkpoint": str(tp4_build["source"]), "revision": None}
    assert manifest.build_config == expected
    assert verify_weights(target, gpus(4), TENSORRT_LLM_VERSION) is not None
    # each step was logged with its time; the recorded calls are the plan's
    log = tp4_build["log"]
    assert "step convert done in" in log and "step build done in" in log
    assert f"built {archive}" in log and "s: convert " in log and ", package " in log
    calls = [json.loads(line) for line in tp4_build["calls"].read_text().splitlines()]
    assert [c["call"] for c in calls] == ["from_hugging_face", "save_checkpoint"] * 4 + ["trtllm-build", "_xgrammar_tokenizer_info"]
    # the guided-decoding tokenizer info made by (the stand-in of) TensorRT-LLM's function, listed in the manifest
    info = json.loads((target / "tokenizer" / "xgrammar_tokenizer_info.json").read_text())
    assert sorted(info) == ["encoded_vocab", "stop_token_ids", "tokenizer_str"] and info["stop_token_ids"] == [2]
    assert "tokenizer/xgrammar_tokenizer_info.json" in {f.path for f in manifest.files}
    assert not (tp4_build["tmp"] / "work" / "package").exists()


def test_setup_refuses_the_tp4_engine_on_two_gpus(tp4_build: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """setup() fails naming both numbers before Triton starts (no tritonserver process appears)."""
    monkeypatch.setenv("PATH", path_with(fake_nvidia_smi(tmp_path / "smi", gpus(2, H100))))
    repo = tmp_path / "repo"
    service = LLMService(Settings(weights_dir=tmp_path / "w", model_repo_dir=repo, http_port=free_port(),
                                   prometheus_port=0))
    with pytest.raises(IncompatibleWeightsError) as info:
        service.setup(str(tp4_build["archive"]))
    assert "world size 4 (tp_size 4 x pp_size 1) and needs 4 GPUs, but 2 GPUs" in str(info.value)
    assert service.server is None and not repo.exists() and not pids_mentioning("tritonserver", str(repo))


def test_setup_refuses_the_engine_on_another_gpu_architecture(tp4_build: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", path_with(fake_nvidia_smi(tmp_path / "smi", gpus(4, A100))))
    service = LLMService(Settings(weights_dir=tmp_path / "w", model_repo_dir=tmp_path / "repo", http_port=free_port(),
                                   prometheus_port=0))
    with pytest.raises(IncompatibleWeightsError, match="compute capability 9.0, but GPU 0 \\(NVIDIA A100-SXM4-80GB\\) has compute capability 8.0"):
        service.setup(str(tp4_build["archive"]))
    assert service.server is None


def test_setup_launches_the_tp4_engine_as_four_mpirun_ranks(tp4_build: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With 4 (fake) GPUs, setup() verifies the archive, renders the C++ backend's model repository and
    launches Triton with the manifest's world size under mpirun. mpirun here is a stand-in that records
    its argv and exits (no GPUs, no TensorRT-LLM backend to run), so setup ends in a startup error."""
    monkeypatch.setenv("PATH", path_with(fake_nvidia_smi(tmp_path / "smi", gpus(4, H100))))
    record = tmp_path / "mpirun.argv"
    mpirun = tmp_path / "mpirun"
    mpirun.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {record}\necho 'mpirun stand-in: no GPUs here' >&2\nexit 3\n")
    mpirun.chmod(0o755)
    settings = _settings(tmp_path, mpirun=str(mpirun), startup_timeout_s=30)
    service = LLMService(settings)
    with pytest.raises(TritonStartupError) as info:
        service.setup(str(tp4_build["archive"]))
    assert "mpirun stand-in: no GPUs here" in str(info.value)
    argv = record.read_text().splitlines()
    assert argv.count("tritonserver") == 0  # the binary is a full path
    ranks = [i for i, a in enumerate(argv) if a.endswith("/tritonserver")]
    assert len(ranks) == 4 and argv.count(":") == 3
    config = (settings.repository.path / "tensorrt_llm" / "config.pbtxt").read_text()
    assert 'backend: "tensorrtllm"' in config
    # guided decoding on: the tokenizer info file from the archive (scripts/build_engine made it)
    info = settings.weights.path / "tokenizer" / "xgrammar_tokenizer_info.json"
    assert info.is_file()
    assert 'key: "guided_decoding_backend"\n  value {\n    string_value: "xgrammar"' in config
    assert f'string_value: "{info}"' in config
    assert 'name: "guided_decoding_guide_type"' in config and 'name: "guided_decoding_guide"' in config


# --- the real CPU path: reference backend ----------------------------------------------------------


@pytest.fixture(scope="module")
def reference_archive(tmp_path_factory: pytest.TempPathFactory, checkpoint_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("reference")
    result = run_cli(
        [str(EXAMPLES_DIR / "smollm2-135m-instruct-reference.yaml"), "--checkpoint", str(checkpoint_dir),
         "--work-dir", str(out / "work"), "--output-dir", str(out)],
        base_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}/usr/bin:/bin"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    archive = Path(result.stdout.strip())
    assert archive == out / "smollm2-135m-instruct.tar.gz"
    return archive


def _settings(tmp_path: Path, **extra: Any) -> Settings:
    return Settings(
        weights_dir=tmp_path / "weights",
        model_repo_dir=tmp_path / "model_repository",
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        prometheus_port=free_port(),
        prometheus_address="127.0.0.1",
        triton_log_file=tmp_path / "triton.log",
        stop_timeout_s=5,
        **extra,
    )


@pytest.mark.integration
def test_reference_archive_serves_end_to_end(reference_archive: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, hf_model, hf_tokenizer) -> None:
    """Package SmolLM2 with build_engine, serve the archive over HTTP, setup() verifies it, predict."""
    digest = (reference_archive.parent / (reference_archive.name + ".sha256")).read_text().split()[0]
    service = LLMService(_settings(tmp_path, weights_sha256=digest, require_manifest=True))
    try:
        with WeightsHTTPServer(reference_archive.parent) as server, caplog.at_level("INFO"):
            service.setup(f"{server.url}/{reference_archive.name}")
        assert "verified 6 files of smollm2-135m-instruct (reference backend, world size 1) against manifest.json" in caplog.text
        # the limits of the build config (configs/engines/smollm2-135m-instruct-reference.yaml) apply
        assert service.info is not None
        assert (service.info.limits.max_input_len, service.info.limits.max_seq_len) == (3072, 4096)

        async def run() -> str:
            inputs = validate_inputs(prompt="What is 2+2?", max_tokens=12, temperature=0)
            return "".join([part async for part in service.generate(inputs)])

        text = asyncio.run(run())
        from tests.test_integration import _reference_completion

        expected, _ = _reference_completion(hf_model, hf_tokenizer, "What is 2+2?", 12)
        assert text == expected and text.strip()
    finally:
        service.shutdown()


@pytest.mark.integration
def test_tampered_reference_weights_fail_setup_before_triton(reference_archive: Path, tmp_path: Path) -> None:
    unpacked = tmp_path / "unpacked"
    fetch_weights(str(reference_archive), unpacked)
    assert (unpacked / MANIFEST_NAME).is_file()
    weights = unpacked / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-100] ^= 0x01
    weights.write_bytes(bytes(blob))
    settings = _settings(tmp_path)
    service = LLMService(settings)
    with pytest.raises(ManifestError) as info:
        service.setup(str(unpacked))
    assert "model.safetensors has sha256" in str(info.value)
    assert service.server is None and not pids_mentioning("tritonserver", str(settings.repository.path))
    (unpacked / MANIFEST_NAME).unlink()
    (unpacked / "model.safetensors").unlink()
    with pytest.raises(ManifestError, match="no manifest.json in .* and COG_TRITON_REQUIRE_MANIFEST is set"):
        LLMService(_settings(tmp_path, require_manifest=True)).setup(str(unpacked))
