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
    module.write_text("import os\n\ndef f():\n    from cog_triton.service import LLMService\n")
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
