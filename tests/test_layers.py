"""The packages layer one way: predict.py/train.py/scripts -> cog_triton -> tensorrtllm_backend -> common.

Checked on the import statements of every module (static, with ``ast``), so a function-level import
that points the wrong way fails too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package -> the project packages it may import (besides itself)
ALLOWED = {
    "common": set(),
    "tensorrtllm_backend": {"common"},
    "cog_triton": {"common", "tensorrtllm_backend"},
}


def imported_packages(path: Path) -> set[str]:
    """Top-level names of every module ``path`` imports (absolute imports only)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_lower_layers(package: str) -> None:
    project = set(ALLOWED)
    wrong = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = (imported_packages(path) & project) - ALLOWED[package] - {package}
        if bad:
            wrong[str(path.relative_to(ROOT))] = sorted(bad)
    assert not wrong, f"{package} may import only {sorted(ALLOWED[package])}; found {wrong}"


def test_imported_packages_sees_function_level_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from cog_triton.worker.service import LLMService\n")
    assert imported_packages(module) == {"os", "cog_triton"}


#: A module longer than this says at its top why it is one module (issue 19: one concern per module).
MAX_LINES_WITHOUT_REASON = 600
REASON = "Why one module"


def test_long_modules_say_why_they_are_one_module() -> None:
    unexplained = []
    for folder in ("common", "tensorrtllm_backend", "cog_triton", "benchmarks", "triton_model_repo", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text()
            if text.count("\n") > MAX_LINES_WITHOUT_REASON:
                docstring = ast.get_docstring(ast.parse(text)) or ""
                if REASON not in docstring:
                    unexplained.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert unexplained == []


# --- cog_triton by process (issue 33): the Cog worker's package and the stream processes' never import each other ---

#: cog_triton's parts -> the other parts each may import. ``worker`` runs in the Cog worker, ``streaming`` in the
#: stream processes; they share ``ipc`` (the messages and the request they carry) and ``plan`` (what setup decided);
#: both fetch (setup's weights in the worker, LoRA adapters in the stream processes) through ``fetch`` and
#: ``weights``, which import neither side; ``settings`` is read in the worker only; ``local`` is a development tool.
PARTS: dict[str, set[str]] = {
    "cog_triton.worker": {"cog_triton.ipc", "cog_triton.plan", "cog_triton.fetch", "cog_triton.weights",
                          "cog_triton.settings"},
    "cog_triton.streaming": {"cog_triton.ipc", "cog_triton.plan", "cog_triton.fetch", "cog_triton.weights"},
    "cog_triton.ipc": {"cog_triton.fetch", "cog_triton.plan"},
    "cog_triton.plan": {"cog_triton.fetch"},
    "cog_triton.weights": {"cog_triton.fetch"},
    "cog_triton.fetch": set(),
    "cog_triton.settings": {"cog_triton.fetch"},
    "cog_triton.local": {"cog_triton.settings", "cog_triton.worker"},
}


def _part(module: str) -> str:
    return max((p for p in PARTS if module == p or module.startswith(p + ".")), key=len)


def imported_modules(path: Path) -> set[str]:
    """Dotted names of every cog_triton module ``path`` imports (``from cog_triton import x`` as cog_triton.x)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name.startswith("cog_triton."))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "cog_triton":
                names.update(f"cog_triton.{alias.name}" for alias in node.names)
            elif node.module.startswith("cog_triton."):
                names.add(node.module)
    return names


def test_the_worker_and_the_stream_processes_share_only_ipc_plan_and_the_fetch_layers() -> None:
    wrong = {}
    for path in sorted((ROOT / "cog_triton").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        if module == "cog_triton":
            continue
        part = _part(module)
        bad = sorted(m for m in imported_modules(path) if _part(m) != part and _part(m) not in PARTS[part])
        if bad:
            wrong[module] = bad
    assert not wrong, f"imports across the process boundary (allowed: {PARTS}): {wrong}"


def test_the_layer_check_sees_a_worker_module_importing_the_streaming_side(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from cog_triton.streaming.generation import Generator\n")
    assert _part("cog_triton.streaming.generation") not in PARTS["cog_triton.worker"]
    assert imported_modules(module) == {"cog_triton.streaming.generation"}


def test_the_worker_loads_no_grpc_tritonclient_tokenizer_or_model_libraries() -> None:
    """The Cog worker's modules (predict.py and the service it builds) leave gRPC, tritonclient's client, transformers,
    torch and xgrammar to the stream processes: a fresh interpreter that imports them has none of these loaded (the
    running worker's loaded modules are checked in tests/test_integration.py)."""
    import subprocess
    import sys

    code = ("import sys, json; import predict; import cog_triton.worker.service, cog_triton.worker.stream_pool; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('grpc', 'tritonclient', 'transformers', 'torch', 'xgrammar', 'cog_triton') and "
            "not m.startswith(('cog_triton.worker', 'cog_triton.fetch', 'cog_triton.weights')))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    import json

    assert json.loads(out.stdout.strip().splitlines()[-1]) == [
        "cog_triton", "cog_triton.ipc", "cog_triton.plan", "cog_triton.settings",
        "tritonclient.grpc.model_config_pb2"]  # the ModelConfig protobuf alone (tensorrtllm_backend.templates)
