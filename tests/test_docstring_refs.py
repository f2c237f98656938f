"""Every ``:mod:``, ``:class:``, ``:func:``, ``:meth:``, ``:attr:``, ``:data:`` and ``:exc:`` reference in a docstring
of product code names something that exists (a reference left behind by a move or a rename fails here).

Read from the source, not imported (the Triton models need Triton's ``pb_utils``, the stream process grpc): a name
resolves, as Sphinx looks it up, against the enclosing class, the module's own names (what it defines and
imports), or a dotted path from a package root; a class's members are its methods, its class-level names and what
its methods assign to ``self``, and its bases' members. A class made at import time (``ipc.PredictInputs``, a
``make_dataclass``) is read imported: its attributes and dataclass fields. A module outside the project (the
standard library, a dependency) counts as found when Python can find it, and so do the names of ``builtins``.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import importlib
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("cog_triton", "tensorrtllm_backend", "common", "triton_model_repo", "predict.py", "train.py")
ROLE = re.compile(r":(mod|class|func|meth|attr|data|exc):`(?:[^`<]*<)?~?\.?([A-Za-z_][\w.]*)(?:\(\))?>?`")


@dataclass
class Scope:
    """The names a module or a class defines: name -> a nested Scope, an import target (str), or None (a value)."""

    module: str
    names: dict = field(default_factory=dict)
    bases: list = field(default_factory=list)


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    if rel.parts[0] == "triton_model_repo":  # a model's version folder: its files import one another relatively
        return "triton_model_repo." + ".".join(rel.parts[1:])
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _product_files() -> list[Path]:
    files = []
    for entry in PRODUCT:
        path = ROOT / entry
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return [p for p in files if "__pycache__" not in p.parts]


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _collect(body: list, scope: Scope, module: str, is_package: bool) -> None:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            scope.names[node.name] = None
        elif isinstance(node, ast.ClassDef):
            inner = Scope(module, bases=[ast.unparse(b) for b in node.bases])
            _collect(node.body, inner, module, is_package)
            for method in node.body:  # what the methods assign to self
                if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for sub in ast.walk(method):
                        if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store) and \
                                isinstance(sub.value, ast.Name) and sub.value.id == "self":
                            inner.names.setdefault(sub.attr, None)
            scope.names[node.name] = inner
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name):
                        scope.names[name.id] = None
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            scope.names[node.target.id] = None
        elif isinstance(node, ast.Import):
            for alias in node.names:
                scope.names[(alias.asname or alias.name).split(".")[0]] = alias.name if alias.asname else \
                    alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node, is_package)
            for alias in node.names:
                scope.names[alias.asname or alias.name] = f"{source}.{alias.name}"
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for part in ("body", "orelse", "finalbody"):
                _collect(getattr(node, part, []), scope, module, is_package)
            for handler in getattr(node, "handlers", []):
                _collect(handler.body, scope, module, is_package)


class Index:
    """Every product module's names, by module name."""

    def __init__(self) -> None:
        self.modules: dict[str, Scope] = {}
        self.trees: dict[str, tuple[Path, ast.Module]] = {}
        for path in _product_files():
            name = _module_name(path)
            tree = ast.parse(path.read_text())
            scope = Scope(name)
            _collect(tree.body, scope, name, path.name == "__init__.py")
            self.modules[name] = scope
            self.trees[name] = (path, tree)

    def _walk(self, scope: Optional[Scope], parts: list[str], depth: int = 0) -> bool:
        if not parts:
            return True
        if scope is None or depth > 20:
            return False
        if parts[0] in scope.names:
            value = scope.names[parts[0]]
            if isinstance(value, Scope):
                return self._walk(value, parts[1:], depth + 1)
            if isinstance(value, str):
                return self.resolve_absolute(value.split(".") + parts[1:], depth + 1)
            return len(parts) == 1 or self._imported(scope.module, parts)
        for base in scope.bases:  # inherited members
            if self.resolve_in(scope.module, None, base.split(".") + parts, depth + 1):
                return True
        return False

    @staticmethod
    def _imported(module: str, parts: list[str]) -> bool:
        """``parts`` walked in the imported ``module``: for a value made at import time."""
        if module.startswith("triton_model_repo."):
            return False
        try:
            value = importlib.import_module(module)
        except ImportError:
            return False
        for part in parts:
            if dataclasses.is_dataclass(value) and part in {f.name for f in dataclasses.fields(value)}:
                value = None
                continue
            if not hasattr(value, part):
                return False
            value = getattr(value, part)
        return True

    def resolve_absolute(self, parts: list[str], depth: int = 0) -> bool:
        for cut in range(len(parts), 0, -1):
            name = ".".join(parts[:cut])
            if name in self.modules:
                return self._walk(self.modules[name], parts[cut:], depth)
        if parts[0] in dir(builtins) and len(parts) == 1:
            return True
        if parts[0] in {m.split(".")[0] for m in self.modules}:
            return False  # a project package, but no such module or name in it
        try:
            return importlib.util.find_spec(parts[0]) is not None  # the standard library or a dependency
        except (ImportError, ValueError):
            return False

    def resolve_in(self, module: str, cls: Optional[Scope], parts: list[str], depth: int = 0) -> bool:
        if cls is not None and parts[0] in cls.names and self._walk(cls, parts, depth):
            return True
        scope = self.modules[module]
        if parts[0] in scope.names:
            return self._walk(scope, parts, depth)
        if module.startswith("triton_model_repo."):  # the files beside a model
            sibling = module.rsplit(".", 1)[0] + "." + parts[0]
            if sibling in self.modules:
                return self._walk(self.modules[sibling], parts[1:], depth)
        return self.resolve_absolute(parts, depth)


def _references(index: Index):
    for module, (path, tree) in index.trees.items():
        stack: list[tuple[ast.AST, Optional[Scope]]] = [(tree, None)]
        while stack:
            node, cls = stack.pop()
            doc = ast.get_docstring(node, clean=False) if isinstance(
                node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) else None
            for match in ROLE.finditer(doc or ""):
                yield path, module, cls, match.group(0), match.group(2)
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    names = (cls or index.modules[module]).names
                    owner = names.get(child.name)
                    stack.append((child, owner if isinstance(owner, Scope) else cls))
                elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    stack.append((child, cls))


INDEX = Index()


def test_every_docstring_reference_resolves() -> None:
    broken = [f"{path.relative_to(ROOT)}: {text}" for path, module, cls, text, target in _references(INDEX)
              if not INDEX.resolve_in(module, cls, target.split("."))]
    assert broken == []


def test_the_check_finds_references_and_refuses_a_stale_one() -> None:
    """The check is not vacuous: it reads hundreds of references, and names that do not exist fail it."""
    assert sum(1 for _ in _references(INDEX)) > 400
    for stale in ("cog_triton.worker.inputs.PredictInputs.validate", "cog_triton.streaming.client.TritonClient.stop",
                  "cog_triton.no_such_module", "tensorrtllm_backend.templates.no_such_function"):
        assert not INDEX.resolve_absolute(stale.split(".")), stale
    assert INDEX.resolve_absolute("tensorrtllm_backend.templates.copy_model_code".split("."))
    assert INDEX.resolve_absolute(["json", "loads"]) and INDEX.resolve_absolute(["ValueError"])


@pytest.mark.parametrize("role", ["mod", "class", "func", "meth", "attr", "data"])
def test_each_role_is_read(role: str) -> None:
    assert any(text.startswith(f":{role}:") for _, _, _, text, _ in _references(INDEX))
