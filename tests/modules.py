"""Loading a Python file as a module (Triton model.py files are not importable packages)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_file(name: str, path: Path) -> ModuleType:
    """The module ``name`` made from ``path``, loaded once per test session (kept in sys.modules).

    It is a package of its folder, so its relative imports (``from .parsing import ...``) load the files beside it,
    as Triton's Python backend imports a model.py as ``1.model`` (python_backend ``src/pb_stub.cc``); two models
    loaded under two names share no module."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path, submodule_search_locations=[str(Path(path).parent)])
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
