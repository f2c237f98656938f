"""The packages layer one way: predict.py/train.py/scripts -> cog_triton -> tensorrtllm_backend -> common.

Checked on the import statements of every module (static, with ``ast``), so a function-level import
that points the wrong way fails too. Also: no module imports another module's underscored names, and
cog_triton.weights has one public face, its modules importing each other one way at module top (issue 33).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Optional

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


#: A size in a reason ("about 600 lines"), which goes stale as the code changes: the test measures the size itself.
FIGURE = re.compile(r"\d[\d,]*\s+lines\b")


def module_reason_faults(paths: list[Path], root: Path = ROOT) -> list[str]:
    """Modules over MAX_LINES_WITHOUT_REASON lines whose docstring says no ``Why one module``, or whose reason (its
    paragraph) gives a figure of lines."""
    faults = []
    for path in paths:
        text = path.read_text()
        if text.count("\n") <= MAX_LINES_WITHOUT_REASON:
            continue
        docstring = ast.get_docstring(ast.parse(text)) or ""
        if REASON not in docstring:
            faults.append(f"{path.relative_to(root)} ({text.count(chr(10))} lines): no reason")
        elif FIGURE.search(docstring[docstring.index(REASON):].split("\n\n")[0]):
            faults.append(f"{path.relative_to(root)}: a figure of lines in its reason")
    return faults


def test_long_modules_say_why_they_are_one_module() -> None:
    paths = []
    for folder in ("common", "tensorrtllm_backend", "cog_triton", "benchmarks", "triton_model_repo", "scripts"):
        paths += sorted((ROOT / folder).rglob("*.py"))
    assert module_reason_faults(paths) == []


def test_the_module_reason_check_refuses_a_figure(tmp_path: Path) -> None:
    filler = "x = 1\n" * MAX_LINES_WITHOUT_REASON
    (tmp_path / "said.py").write_text(f'"""Doc.\n\nWhy one module: one concern.\n\nAbout 9 lines here."""\n{filler}')
    (tmp_path / "sized.py").write_text(f'"""Doc.\n\nWhy one module (about 1,000 lines): one concern."""\n{filler}')
    (tmp_path / "silent.py").write_text(f'"""Doc."""\n{filler}')
    (tmp_path / "short.py").write_text('"""Doc."""\n')
    assert module_reason_faults(sorted(tmp_path.glob("*.py")), tmp_path) == [
        "silent.py (601 lines): no reason", "sized.py: a figure of lines in its reason"]


# --- cog_triton by process (issue 33): the Cog worker's package and the stream processes' never import each other ---

#: cog_triton's parts -> the other parts each may import. ``worker`` runs in the Cog worker, ``streaming`` in the
#: stream processes; they share ``ipc`` (the messages and the request they carry), ``schema`` (the Cog input schema
#: the request's fields are made from), ``reasoning`` (what a chat template says about thinking, found in a stream
#: process, and the levels mapped onto it in the worker) and ``plan`` (what setup decided);
#: both fetch (setup's weights in the worker, LoRA adapters in the stream processes) through ``fetch`` and
#: ``weights``, which import neither side; ``settings`` is read in the worker only; ``dev`` (the local stack) is a
#: development tool. docs/architecture.md says the same.
PARTS: dict[str, set[str]] = {
    "cog_triton.worker": {"cog_triton.ipc", "cog_triton.schema", "cog_triton.reasoning", "cog_triton.stream_config",
                          "cog_triton.fetch", "cog_triton.weights", "cog_triton.settings"},
    "cog_triton.streaming": {"cog_triton.ipc", "cog_triton.schema", "cog_triton.reasoning", "cog_triton.stream_config",
                             "cog_triton.fetch", "cog_triton.weights"},
    "cog_triton.ipc": {"cog_triton.fetch", "cog_triton.stream_config", "cog_triton.schema", "cog_triton.reasoning"},
    "cog_triton.schema": set(),
    "cog_triton.reasoning": set(),
    "cog_triton.stream_config": {"cog_triton.fetch"},
    "cog_triton.weights": {"cog_triton.fetch"},
    "cog_triton.fetch": set(),
    "cog_triton.settings": {"cog_triton.fetch"},
    "cog_triton.dev": {"cog_triton.settings", "cog_triton.worker"},
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


def test_the_worker_and_the_stream_processes_share_only_ipc_schema_plan_and_the_fetch_layers() -> None:
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
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    import json

    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert "cog_triton.worker.service" in loaded  # the check reads the worker's own modules
    assert sorted(m for m in loaded if forbidden_in_worker(m)) == []


#: Packages the Cog worker never loads: the stream processes' gRPC client, tokenizer, model and grammar libraries,
#: and the stream processes' own package. tritonclient's ModelConfig protobuf alone is allowed
#: (tensorrtllm_backend.templates parses the rendered configs with it).
WORKER_FORBIDDEN = ("grpc", "tritonclient", "transformers", "torch", "xgrammar", "cog_triton.streaming")
WORKER_ALLOWED = ("tritonclient", "tritonclient.grpc", "tritonclient.grpc.model_config_pb2")


def forbidden_in_worker(module: str) -> bool:
    return module not in WORKER_ALLOWED and any(module == f or module.startswith(f + ".") for f in WORKER_FORBIDDEN)


def test_the_worker_check_names_what_is_forbidden() -> None:
    assert forbidden_in_worker("torch.nn") and forbidden_in_worker("cog_triton.streaming.client")
    assert forbidden_in_worker("tritonclient.grpc.aio") and forbidden_in_worker("grpc")
    assert not forbidden_in_worker("tritonclient.grpc.model_config_pb2") and not forbidden_in_worker("cog_triton.ipc")
    assert not forbidden_in_worker("cog_triton.new_shared_module") and not forbidden_in_worker("torchvision_like")


# --- one public face per module (issue 33 item 4): no module imports another's underscored names -------------------

#: Private names of other packages a module imports anyway -> why (nothing public does the same).
FOREIGN_PRIVATE_IMPORTS = {
    ("tensorrtllm_backend/convert.py", "tensorrt_llm.llmapi.tokenizer._xgrammar_tokenizer_info"):
        "TensorRT-LLM's own writer of the xgrammar tokenizer info the C++ backend reads, what its "
        "examples/generate_xgrammar_tokenizer_info.py calls (tensorrtllm_backend/build.py); GPU image only",
}


def _module_name(path: Path, root: Path = ROOT) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def _imported_from(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The absolute name of the module ``node`` imports from, relative imports resolved against ``module``."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_imports(path: Path, root: Path = ROOT) -> list[str]:
    """``module.name`` for every underscored name ``path`` imports from another module, at any depth (a function's
    own imports too); ``import a._b`` counts as importing ``_b`` from ``a``."""
    module = _module_name(path, root)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            source = _imported_from(node, module, path.name == "__init__.py")
            found += [f"{source}.{alias.name}" for alias in node.names
                      if _is_private(alias.name) and source != module]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                found += [".".join(parts[: i + 1]) for i, part in enumerate(parts) if _is_private(part)][:1]
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    wrong = []
    for folder in ("cog_triton", "tensorrtllm_backend", "common", "triton_model_repo"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            wrong += [f"{where}: {name}" for name in private_imports(path)
                      if (where, name) not in FOREIGN_PRIVATE_IMPORTS]
    assert wrong == [], "make the name public (documented) where it belongs, or move it where both can use it"


def test_the_private_import_check_sees_each_form(tmp_path: Path) -> None:
    package = tmp_path / "cog_triton" / "weights"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from .cache import _inventory\n")
    module = package / "fetch.py"
    module.write_text("from cog_triton.weights.cache import _read_marker, target\nimport cog_triton._private.x\n"
                      "from . import _download\nfrom cog_triton.weights.fetch import _own\n"
                      "def f():\n    from ..fetch.folders import _acquire_lock\n")
    assert private_imports(module, tmp_path) == [
        "cog_triton.weights.cache._read_marker", "cog_triton._private", "cog_triton.weights._download",
        "cog_triton.fetch.folders._acquire_lock"]  # fmt: skip
    assert private_imports(package / "__init__.py", tmp_path) == ["cog_triton.weights.cache._inventory"]


# --- cog_triton.weights: one public face, modules that import each other one way, every import at the top ----------

WEIGHTS = "cog_triton.weights"


def _imports(path: Path, root: Path = ROOT) -> list[tuple[Optional[str], str]]:
    """(the function that holds it, or None at module level; the absolute module name) of every import in ``path``;
    ``from package import name`` counts as importing ``package.name`` too when that is a module under ``root``."""
    module = _module_name(path, root)
    found: list[tuple[Optional[str], str]] = []

    def visit(node: ast.AST, function: Optional[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, function or child.name)
                continue
            if isinstance(child, ast.Import):
                found.extend((function, alias.name) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                source = _imported_from(child, module, path.name == "__init__.py")
                found.append((function, source))
                for alias in child.names:
                    name = f"{source}.{alias.name}"
                    if (root / Path(*name.split("."))).with_suffix(".py").is_file():
                        found.append((function, name))
            visit(child, function)

    visit(ast.parse(path.read_text(), filename=str(path)), None)
    return found


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def late_imports(path: Path, package: str, root: Path = ROOT) -> list[str]:
    """``function: module`` for every module of ``package`` that a function of ``path`` imports (not at module top)."""
    return [f"{function}: {name}" for function, name in _imports(path, root) if function and _within(name, package)]


def test_the_weights_package_imports_itself_only_at_module_top() -> None:
    """A late import inside the package would hide a circle between its modules (issue 33: sources imported hub
    inside a function because hub imported archive, which imported sources)."""
    late = {}
    for path in sorted((ROOT / "cog_triton" / "weights").glob("*.py")):
        if found := late_imports(path, WEIGHTS):
            late[str(path.relative_to(ROOT))] = found
    assert late == {}


def weights_import_circle(root: Path = ROOT) -> list[str]:
    """A circle of module-top imports between the modules of cog_triton.weights (the package itself one of them), as
    the modules along it; [] when there is none."""
    graph = {}
    for path in sorted((root / "cog_triton" / "weights").glob("*.py")):
        graph[_module_name(path, root)] = sorted({name for function, name in _imports(path, root)
                                                  if function is None and _within(name, WEIGHTS)})
    done: set[str] = set()

    def walk(module: str, trail: list[str]) -> list[str]:
        if module in trail:
            return trail[trail.index(module):] + [module]
        if module in done:
            return []
        for imported in graph.get(module, []):
            if imported != module and (circle := walk(imported, trail + [module])):
                return circle
        done.add(module)
        return []

    for start in graph:
        if start != WEIGHTS and (circle := walk(start, [])):  # the package imports its modules: start below it
            return circle
    return []


def test_the_weights_modules_import_each_other_one_way() -> None:
    assert weights_import_circle() == []


def test_the_weights_checks_see_a_late_import_and_a_circle(tmp_path: Path) -> None:
    package = tmp_path / "cog_triton" / "weights"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from cog_triton.weights.fetch import fetch_weights\n")
    (package / "fetch.py").write_text("from cog_triton.weights.archive import extract_archive\n")
    (package / "archive.py").write_text("from cog_triton.weights.sources import SUPPORTED_KINDS\n")
    (package / "sources.py").write_text("import os\n\ndef parse_source():\n    from .hub import parse_hub_ref\n")
    (package / "hub.py").write_text("from cog_triton.weights.archive import check\n")
    assert late_imports(package / "sources.py", WEIGHTS, tmp_path) == ["parse_source: cog_triton.weights.hub"]
    assert weights_import_circle(tmp_path) == []  # the late import hides the circle from module-top imports
    (package / "sources.py").write_text("from .hub import parse_hub_ref\n")
    assert weights_import_circle(tmp_path) == [
        "cog_triton.weights.archive", "cog_triton.weights.sources", "cog_triton.weights.hub",
        "cog_triton.weights.archive"]  # fmt: skip
    (package / "sources.py").write_text("from cog_triton.weights import fetch_weights\n")  # the face, from inside
    assert weights_import_circle(tmp_path)[-3:] == ["cog_triton.weights", "cog_triton.weights.fetch",
                                                    "cog_triton.weights.archive"]


def public_face_breaches(paths: list[Path], root: Path = ROOT) -> list[str]:
    """``file: module`` for every module of cog_triton.weights (below the package) that a file outside it imports."""
    wrong = []
    for path in paths:
        if _within(_module_name(path, root), WEIGHTS):
            continue
        wrong += [f"{path.relative_to(root)}: {name}" for _, name in _imports(path, root)
                  if _within(name, WEIGHTS) and name != WEIGHTS]
    return wrong


def _code_outside_tests() -> list[Path]:
    paths = [ROOT / "predict.py", ROOT / "train.py"]
    for folder in ("cog_triton", "tensorrtllm_backend", "common", "scripts", "benchmarks"):
        paths += sorted((ROOT / folder).rglob("*.py"))
    return paths


def test_other_packages_import_only_the_weights_public_face() -> None:
    """cog_triton.weights' ``__init__`` is its one public face; only the tests may reach a module of it, where they
    test that module's internals."""
    assert public_face_breaches(_code_outside_tests()) == []


def test_the_public_face_check_sees_a_module_reached_into(tmp_path: Path) -> None:
    for name in ("cog_triton/weights/__init__.py", "cog_triton/weights/hub.py", "cog_triton/streaming/store.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    store = tmp_path / "cog_triton" / "streaming" / "store.py"
    store.write_text("from cog_triton.weights import fetch_weights\nfrom cog_triton.weights import hub\n"
                     "def f():\n    import cog_triton.weights.hub\n")
    assert public_face_breaches([store], tmp_path) == [
        "cog_triton/streaming/store.py: cog_triton.weights.hub", "cog_triton/streaming/store.py: cog_triton.weights.hub"]


#: Issue 33: no function over about 80 lines in product code without a reason written beside it.
LONG_FUNCTION_LINES = 80
LONG_FUNCTION_REASON = "# Why one function"


def long_functions_without_a_reason(paths: list[Path], root: Path = ROOT) -> list[str]:
    """Functions whose lines, from ``def`` to the end (the docstring aside), number over LONG_FUNCTION_LINES and
    which have no ``# Why one function ...`` comment in the lines just above their ``def`` (or decorators)."""
    wrong = []
    for path in paths:
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines), filename=str(path))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            body = node.end_lineno - node.lineno + 1
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) \
                    and isinstance(first.value.value, str):
                body -= first.end_lineno - first.lineno + 1
            if body <= LONG_FUNCTION_LINES:
                continue
            top = min([node.lineno, *(d.lineno for d in node.decorator_list)]) - 1  # 0-based: decorator or def
            above = []
            for line in reversed(lines[:top]):
                if not line.strip().startswith("#"):
                    break
                above.append(line.strip())
            if not any(line.startswith(LONG_FUNCTION_REASON) for line in above):
                wrong.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({body} lines)")
            elif FIGURE.search(" ".join(above)):
                wrong.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: a figure of lines in its reason")
    return wrong


def _product_code() -> list[Path]:
    """What ships in the image and runs: the entry points, the three packages and the Triton models."""
    paths = [ROOT / "predict.py", ROOT / "train.py"]
    for folder in ("cog_triton", "tensorrtllm_backend", "common", "triton_model_repo"):
        paths += sorted((ROOT / folder).rglob("*.py"))
    return paths


def test_long_functions_in_product_code_say_why_they_are_one_function() -> None:
    assert long_functions_without_a_reason(_product_code()) == [], (
        f"split these, or write {LONG_FUNCTION_REASON!r} and the reason in a comment just above the def")


def test_the_long_function_check_counts_the_body_and_reads_the_comment(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(LONG_FUNCTION_LINES - 1))  # with its def: the limit
    doc = '    """' + "\n" * 30 + '    """\n'
    source = (f"def short_with_a_long_docstring():\n{doc}{body}"
              f"@property\ndef too_long():\n{body}    return 1\n"
              f"# Why one function: a reason.\n@property\ndef said_why():\n{body}    return 1\n"
              f"# Why one function: for the one below only.\nx = 1\ndef not_said():\n{body}    return 1\n"
              f"# Why one function (about 81 lines): a reason.\ndef sized():\n{body}    return 1\n")
    path = tmp_path / "m.py"
    path.write_text(source)
    assert long_functions_without_a_reason([path], tmp_path) == [
        f"m.py:{source.splitlines().index('def too_long():') + 1} too_long (81 lines)",
        f"m.py:{source.splitlines().index('def not_said():') + 1} not_said (81 lines)",
        f"m.py:{source.splitlines().index('def sized():') + 1} sized: a figure of lines in its reason"]


def test_the_request_path_talks_to_one_stream_interface() -> None:
    """Issue 53: LLMService knows the stream processes only through PredictionStreams (open, reconnect, health,
    stop); StreamPool, its implementation, has each of those members with the interface's signature."""
    import inspect

    from cog_triton.worker.stream_pool import StreamPool
    from cog_triton.worker.streams import PredictionStreams

    for name in ("open", "reconnect", "health", "stop"):
        assert inspect.signature(getattr(StreamPool, name)) == inspect.signature(getattr(PredictionStreams, name)), name
    assert "template" in PredictionStreams.__annotations__
    service = ROOT / "cog_triton" / "worker" / "service.py"
    assert "cog_triton.worker.stream_pool" not in imported_modules(service)
    assert "cog_triton.worker.streams" in imported_modules(service)
