#!/usr/bin/env python3
"""Make a small PEFT LoRA adapter of the default model (SmolLM2-135M-Instruct), to try the ``lora_weights`` input.

Its weights are random (peft's ``init_lora_weights=False``), scaled so that they change the output: not a
useful fine-tune, but an adapter in the format fine-tunes come in (``adapter_config.json`` +
``adapter_model.safetensors`` from peft's ``save_pretrained``), packed as a ``.tar.gz`` that any HTTP
server can serve.

Usage::

    .venv/bin/python scripts/make_lora_adapter.py [--out build/lora_demo] [--rank 8] [--alpha 16] [--seed 1]

Writes ``<out>/smollm2-demo-lora.tar.gz`` (and the adapter folder beside it); prints the archive's path.
"""

from __future__ import annotations

import argparse
import sys
import tarfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT = REPO_ROOT / "build" / "default_model" / "checkpoint"
ARCHIVE_NAME = "smollm2-demo-lora.tar.gz"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "build" / "lora_demo")
    parser.add_argument("--checkpoint", type=Path, default=CHECKPOINT, help="the base model (scripts/setup makes it)")
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=16.0, help="lora_alpha (the scale is alpha / rank)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if not (args.checkpoint / "config.json").is_file():
        print(f"{args.checkpoint} is missing: run scripts/setup first", file=sys.stderr)
        return 2
    import torch  # noqa: PLC0415 - heavy
    from peft import LoraConfig, get_peft_model  # noqa: PLC0415
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    model = AutoModelForCausalLM.from_pretrained(str(args.checkpoint), dtype=torch.float32, local_files_only=True)
    torch.manual_seed(args.seed)
    config = LoraConfig(r=args.rank, lora_alpha=args.alpha, target_modules=TARGETS, init_lora_weights=False)
    folder = args.out / "adapter"
    get_peft_model(model, config).save_pretrained(str(folder))
    archive = args.out / ARCHIVE_NAME
    with tarfile.open(archive, "w:gz") as tar:
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            tar.add(folder / name, name)
    print(archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
