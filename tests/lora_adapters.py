"""Small PEFT LoRA adapters for the bundled SmolLM2-135M, made with ``peft`` for the LoRA tests, and the
outputs transformers + peft give with them (what the served model must reproduce token for token)."""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from pathlib import Path
from typing import Optional, Sequence

import torch

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


class AdapterFactory:
    """Makes adapters of a checkpoint and computes transformers + peft's greedy output with them, loading the
    base model once (peft injects adapter layers into it and ``unload`` takes them out again)."""

    def __init__(self, checkpoint: Path) -> None:
        from transformers import AutoModelForCausalLM  # noqa: PLC0415

        self.checkpoint = checkpoint
        self.base = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32, local_files_only=True)
        self.base.eval()

    def make(self, out: Path, *, r: int, alpha: float, targets: Sequence[str], seed: int,
             layers: Optional[Sequence[int]] = None, rank_pattern: Optional[dict] = None) -> Path:
        """A PEFT LoRA adapter with random A and B (``init_lora_weights=False``: both random, so that it changes
        the greedy output), saved with save_pretrained into ``out``."""
        from peft import LoraConfig, get_peft_model  # noqa: PLC0415

        torch.manual_seed(seed)
        config = LoraConfig(r=r, lora_alpha=alpha, target_modules=list(targets), init_lora_weights=False,
                            layers_to_transform=list(layers) if layers is not None else None,
                            rank_pattern=rank_pattern or {})
        model = get_peft_model(self.base, config)
        try:
            model.save_pretrained(str(out))
        finally:
            self.base = model.unload()
            self.base.__dict__.pop("peft_config", None)
        return out

    def greedy(self, adapter: Optional[Path], prompt_ids: list[int], max_new_tokens: int, eos: int) -> list[int]:
        """Greedy tokens of transformers (+ peft with ``adapter``) for ``prompt_ids``, ending before ``eos``."""
        model = self.base
        if adapter is not None:
            from peft import PeftModel  # noqa: PLC0415

            model = PeftModel.from_pretrained(self.base, str(adapter))
        try:
            ids = torch.tensor([prompt_ids])
            with torch.inference_mode():
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=max_new_tokens, pad_token_id=eos)
        finally:
            if adapter is not None:
                self.base = model.unload()
                self.base.__dict__.pop("peft_config", None)
        new = out[0, len(prompt_ids):].tolist()
        return new[: new.index(eos)] if eos in new else new


def make_adapter(checkpoint: Path, out: Path, **kwargs) -> Path:
    """:meth:`AdapterFactory.make` with a base model of its own."""
    return AdapterFactory(checkpoint).make(out, **kwargs)


def pack(adapter: Path, archive: Path, *, folder: str = "") -> Path:
    """The adapter's two files as a .tar, .tar.gz or .zip archive (optionally inside ``folder``)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    names = [(adapter / name, f"{folder}/{name}" if folder else name) for name in ADAPTER_FILES]
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
            for path, name in names:
                zf.write(path, name)
    else:
        with tarfile.open(archive, "w:gz" if archive.name.endswith(".gz") else "w") as tar:
            for path, name in names:
                tar.add(path, name)
    return archive


def pack_files(archive: Path, files: dict[str, bytes]) -> Path:
    """A .tar.gz of arbitrary files (for adapters that are not adapters)."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


def peft_greedy(checkpoint: Path, adapter: Optional[Path], prompt_ids: list[int], max_new_tokens: int,
                eos: int) -> list[int]:
    """:meth:`AdapterFactory.greedy` with a base model of its own."""
    return AdapterFactory(checkpoint).greedy(adapter, prompt_ids, max_new_tokens, eos)


def adapter_config(adapter: Path) -> dict:
    return json.loads((adapter / "adapter_config.json").read_text())
