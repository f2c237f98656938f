"""The LLM API stand-in (benchmarks/llmapi_standin) never reaches the product: not the image, not its code, not a
rendered model repository. In the GPU image ``import tensorrt_llm`` must be NGC's TensorRT-LLM."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

from cog_triton.settings import REPO_ROOT
from tests.llmapi_overlay import STANDIN_ROOT
from tests.test_templates import checkpoint_info, engine_info, options

#: What the image holds of the project (the Dockerfile's COPY sources) and the code that runs there.
PRODUCT = ("cog_triton", "tensorrtllm_backend", "common", "triton_model_repo", "configs", "scripts", "predict.py",
           "train.py", "cog.yaml", "Dockerfile", "requirements.txt")
MARKERS = ("llmapi_standin", "LLMAPI_STANDIN")


def _files(root: Path):
    if root.is_file():
        yield root
        return
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            yield path


def test_the_image_never_copies_the_stand_in() -> None:
    ignored = (REPO_ROOT / ".dockerignore").read_text().split()
    assert str(STANDIN_ROOT.relative_to(REPO_ROOT)) in ignored
    copies = [line.split()[1:-1] for line in (REPO_ROOT / "Dockerfile").read_text().splitlines()
              if line.startswith("COPY ")]
    sources = {source for line in copies for source in line if not source.startswith("--")}
    assert sources and not any(source == "." or source.startswith("benchmarks") for source in sources), sources


def _project_files(name: str):
    """The project's files under ``name``: tracked, or new and not ignored by git. Ignored ones are outputs, not
    the project's: the weights setup() unpacks into triton_model_repo/tensorrt_llm/1 (scripts/serve, the demo;
    half a gigabyte, 13 s to read), __pycache__. Outside a git checkout, every file."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", name],
                            cwd=REPO_ROOT, capture_output=True)
    if listed.returncode != 0:
        yield from _files(REPO_ROOT / name)
        return
    for relative in sorted(set(listed.stdout.decode().split("\0")) - {""}):
        path = REPO_ROOT / relative
        if path.is_file():
            yield path


def test_no_product_file_refers_to_the_stand_in() -> None:
    found = []
    for name in PRODUCT:
        for path in _project_files(name):
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            found += [f"{path.relative_to(REPO_ROOT)}: {m}" for m in MARKERS if m in text]
    assert found == []


def test_the_product_model_imports_tensorrt_llm_only_when_it_loads(tmp_path: Path) -> None:
    """Module-level imports of model.py and its modules (those it shares included, as the renderer copies them) name
    no tensorrt_llm (it is imported in initialize, after the MPI environment and, upstream, CUDA_VISIBLE_DEVICES are
    settled: llmapi model.py @044a90d2)."""
    from tensorrtllm_backend.templates import copy_model_code

    copy_model_code(REPO_ROOT / "triton_model_repo", "tensorrt_llm_pytorch", tmp_path)
    for path in sorted(tmp_path.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not any(re.match(r"tensorrt_llm(\.|$)", n) for n in names), (path.name, names)


def test_rendered_repositories_hold_no_stand_in(tmp_path: Path) -> None:
    from tensorrtllm_backend.templates import render_model_repository

    for kind, info, llm_args in (("engine", engine_info(tmp_path), None),
                                 ("pytorch", checkpoint_info(tmp_path), {"model": str(tmp_path / "checkpoint")})):
        opts = options(tmp_path / kind, llm_args=llm_args)
        render_model_repository(opts, info)
        for path in _files(opts.model_repo_dir):
            assert path.name != "tensorrt_llm" and "tensorrt_llm" not in path.relative_to(opts.model_repo_dir).parts[2:]
            text = path.read_text(errors="replace")
            assert not any(m in text for m in MARKERS), path
            assert str(STANDIN_ROOT) not in text, path
