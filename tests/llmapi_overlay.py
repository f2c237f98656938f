"""Serving the PyTorch-backend ``tensorrt_llm`` model in a real Triton over the LLM API stand-in (tests only).

Triton's Python backend stub takes its packages from the virtualenv found first on ``PATH`` and ignores
``PYTHONPATH`` (docs/architecture.md; ../shared/DESIGN.md), so the stand-in package
(``benchmarks/llmapi_standin``) reaches the stub through an **overlay virtualenv**: made with
``python -m venv --without-pip`` from the project's interpreter (so it has the system libpython the stub
embeds), its site-packages holding one ``.pth`` file that names the stand-in's folder and then the project's
``.venv`` site-packages. Triton is started with the overlay's ``bin`` first on ``PATH``
(:func:`standin_installation`); nothing in the product changes.

:func:`render_pytorch_repository` renders the product's model repository for the default checkpoint with the
PyTorch-backend model (``RenderOptions.llm_args``), as setup() will once it chooses that backend.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator, Mapping, Optional

from cog_triton.settings import REPO_ROOT
from tensorrtllm_backend.server import TritonInstallation

STANDIN_ROOT = REPO_ROOT / "benchmarks" / "llmapi_standin"
PYTORCH_TEMPLATE = REPO_ROOT / "triton_model_repo" / "tensorrt_llm_pytorch"
PTH_NAME = "llmapi_standin.pth"


def overlay_venv(target: Path, extra_paths: tuple[Path, ...] = ()) -> Path:
    """A virtualenv at ``target`` whose interpreter sees the stand-in, then ``extra_paths``, then the project's
    .venv packages; returns ``target`` (made once: an existing overlay is reused)."""
    site = Path(sysconfig.get_paths()["purelib"])  # the running (project) venv's site-packages
    if not (target / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    overlay_site = target / "lib" / version / "site-packages"
    overlay_site.mkdir(parents=True, exist_ok=True)
    lines = [str(STANDIN_ROOT), *(str(p) for p in extra_paths), str(site)]
    (overlay_site / PTH_NAME).write_text("\n".join(lines) + "\n")
    return target


def standin_installation(installation: TritonInstallation, overlay: Path) -> TritonInstallation:
    """``installation`` with the overlay's ``bin`` first on the stub's ``PATH``."""
    return dataclasses.replace(installation, env={**installation.env, "PATH": str(overlay / "bin")})


def render_pytorch_repository(target: Path, checkpoint: Path, *, llm_args: Optional[Mapping[str, Any]] = None,
                              max_batch_size: int = 4, guided_decoding: bool = False, images: bool = False) -> dict:
    """The product's model repository in ``target`` for ``checkpoint`` with the PyTorch-backend model; returns the
    rendered configs. ``llm_args`` defaults to ``{"model": checkpoint, "max_batch_size": max_batch_size}``."""
    from tensorrtllm_backend.engine import inspect_weights  # noqa: PLC0415
    from tensorrtllm_backend.templates import RenderOptions, render_model_repository  # noqa: PLC0415

    info = inspect_weights(checkpoint, reference_max_batch_size=max_batch_size, reference_max_seq_len=512)
    args = dict(llm_args) if llm_args is not None else {"model": str(checkpoint), "max_batch_size": max_batch_size}
    options = RenderOptions(template_dir=REPO_ROOT / "triton_model_repo", model_repo_dir=target,
                            guided_decoding=guided_decoding, llm_args=args, images=images)
    return render_model_repository(options, info)


@contextlib.contextmanager
def standin_imported() -> Iterator[ModuleType]:
    """The stand-in package imported in this process as ``tensorrt_llm``; on exit the modules and the path entry
    are removed again (another ``tensorrt_llm``, tests/fake_tensorrt_llm, serves other tests)."""
    def ours() -> list[str]:
        return [k for k in sys.modules if k == "tensorrt_llm" or k.startswith("tensorrt_llm.")]

    saved = {k: sys.modules.pop(k) for k in ours()}
    sys.path.insert(0, str(STANDIN_ROOT))
    try:
        module = importlib.import_module("tensorrt_llm")
        assert getattr(module, "STANDIN", False), module
        yield module
    finally:
        sys.path.remove(str(STANDIN_ROOT))
        for key in ours():
            del sys.modules[key]
        sys.modules.update(saved)
