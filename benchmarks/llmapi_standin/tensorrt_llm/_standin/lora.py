"""The stand-in's LoRA adapters, in the two places TensorRT-LLM 1.2.1 keeps them (the facts and their sources are in
:mod:`.engine`'s docstring): the executor worker's LoRA manager (:class:`LoraWorker`: each new id's folder read once
when the request is enqueued, its device tensors kept for the LLM's life, a failed read stopping the worker), and the
engine's adapter cache (:class:`LoraStore`: peft adapters by id, least recently used evicted beyond ``max_cpu_loras``,
an evicted id read again from its folder)."""

from __future__ import annotations

import contextlib
import json
from collections import OrderedDict
from pathlib import Path
from typing import Any, Dict, Optional

#: Stand-in only: the device bytes the worker's LoRA manager may retain (the memory the KV cache left); unset: no
#: limit. A load beyond it raises :class:`DeviceOutOfMemory`.
LORA_DEVICE_BYTES_ENV = "LLMAPI_STANDIN_LORA_DEVICE_BYTES"
#: Stand-in only: milliseconds between ``abort()`` and the executor seeing the abort (default 0).
ABORT_DELAY_MS_ENV = "LLMAPI_STANDIN_ABORT_DELAY_MS"


class DeviceOutOfMemory(RuntimeError):
    """What ``tensor.cuda()`` raises when the device has no room (``torch.OutOfMemoryError``, a RuntimeError)."""


class WorkerStopped(Exception):
    """Stand-in bookkeeping: the worker died of ``cause`` (a load outside the ``RequestError`` path)."""


def dtype_bytes(dtype: Any) -> int:
    """Bytes per value of a model dtype (float32: 4; the half types: 2)."""
    text = str(dtype).replace("torch.", "")
    return 4 if text in ("float32", "float") else 2


class LoraWorker:
    """The executor worker's LoRA manager (see the module docstring): each new ``lora_int_id``'s folder read once,
    its device bytes retained for the LLM's life. Used on the engine thread only.

    Args:
        dtype_bytes: bytes per value of the model's dtype (the adapter's tensors are cast to it on the device).
        device_bytes: the device memory the retained tensors may take (None: unlimited).
    """

    def __init__(self, dtype_bytes: int, device_bytes: Optional[int]) -> None:
        self.dtype_bytes = dtype_bytes
        self.device_bytes = device_bytes
        self.loaded: Dict[int, int] = {}  # lora_int_id -> device bytes retained
        self.retained_device_bytes = 0

    def load(self, lora: Any) -> None:
        """``_load_lora_adapter``: read ``lora``'s folder unless its id was loaded before, and retain its tensors.

        Raises:
            OSError, ValueError, KeyError, RuntimeError: what reading the folder raises (the JSON, the weights file,
                ``int(config["r"])``, ``float(config["lora_alpha"])``), or :class:`DeviceOutOfMemory`.
        """
        key = int(lora.lora_int_id)
        if key in self.loaded:
            return
        values = read_adapter_values(Path(lora.lora_path))
        nbytes = values * self.dtype_bytes
        if self.device_bytes is not None and self.retained_device_bytes + nbytes > self.device_bytes:
            raise DeviceOutOfMemory(
                f"CUDA out of memory. Tried to allocate {nbytes / 2**20:.2f} MiB (stand-in: "
                f"{self.retained_device_bytes} of {self.device_bytes} bytes ({LORA_DEVICE_BYTES_ENV}) already held by "
                f"{len(self.loaded)} adapters)")
        self.loaded[key] = nbytes
        self.retained_device_bytes += nbytes


def read_adapter_values(folder: Path) -> int:
    """Read an HF PEFT adapter folder as ``LoraManager.load_from_hf`` does (``adapter_config.json`` with ``r`` and
    ``lora_alpha``; ``adapter_model.safetensors``, else ``adapter_model.bin``, loaded whole) and return how many
    values its LoRA tensors hold.

    Raises:
        OSError (a missing or unreadable file), ValueError (bad JSON, no weights file), KeyError (no ``r`` or
        ``lora_alpha``), or what safetensors / torch raise for a damaged weights file.
    """
    with open(folder / "adapter_config.json", encoding="utf-8") as handle:
        config = json.load(handle)
    int(config["r"])
    float(config["lora_alpha"])
    weights = folder / "adapter_model.safetensors"
    if weights.is_file():
        from safetensors.torch import load_file  # noqa: PLC0415

        tensors = load_file(str(weights))
    elif (folder / "adapter_model.bin").is_file():
        import torch  # noqa: PLC0415

        tensors = torch.load(str(folder / "adapter_model.bin"), map_location="cpu", weights_only=True)
    else:
        raise ValueError(f"Failed to load adapter_model from {folder}")
    return sum(int(t.numel()) for name, t in tensors.items() if "lora_" in name)


class LoraStore:
    """Adapters loaded with peft into the model, by ``lora_int_id`` (least recently used evicted beyond
    ``max_cpu_loras``); used on the engine thread only. An evicted id is read from its folder again when it comes
    back (``on_reread`` is called first: the worker's read, whose failure stops the worker)."""

    def __init__(self, model: Any, max_lora_rank: int, max_cpu_loras: Optional[int]) -> None:
        self.base = model
        self.peft = None
        self.max_lora_rank = max_lora_rank
        self.max_cpu_loras = max_cpu_loras
        self._names: "OrderedDict[int, str]" = OrderedDict()
        self._evicted: set = set()  # ids evicted from this cache: read from their folder again when they come back

    @property
    def model(self) -> Any:
        return self.peft if self.peft is not None else self.base

    def load(self, lora: Any, in_use: set) -> str:
        """The adapter name of ``lora`` (loaded from its folder unless cached). Raises ValueError for a folder
        that is not a PEFT LoRA adapter or a rank above max_lora_rank (stand-in texts)."""
        key = int(lora.lora_int_id)
        if key in self._names:
            self._names.move_to_end(key)
            return self._names[key]
        folder = Path(lora.lora_path)
        if key in self._evicted:
            try:  # add_request_peft's read of py_lora_path: outside any RequestError path
                read_adapter_values(folder)
            except Exception as exc:  # noqa: BLE001 - what the read raises stops the worker
                raise WorkerStopped(exc) from exc
        config_path = folder / "adapter_config.json"
        if not config_path.is_file():
            raise ValueError(f"stand-in: {folder} has no adapter_config.json (not a PEFT LoRA adapter)")
        config = json.loads(config_path.read_text())
        ranks = [int(config.get("r", 0))] + [int(r) for r in (config.get("rank_pattern") or {}).values()]
        if max(ranks) > self.max_lora_rank:
            raise ValueError(f"stand-in: adapter {folder} has rank {max(ranks)}, above lora_config.max_lora_rank "
                             f"{self.max_lora_rank}")
        name = f"lora_{key}"
        from peft import PeftModel  # noqa: PLC0415 - LoRA only

        if self.peft is None:
            self.peft = PeftModel.from_pretrained(self.base, str(folder), adapter_name=name)
            self.peft.eval()
        else:
            self.peft.load_adapter(str(folder), adapter_name=name)
        self._names[key] = name
        while self.max_cpu_loras is not None and len(self._names) > max(1, self.max_cpu_loras):
            victim = next((k for k in self._names if self._names[k] not in in_use and k != key), None)
            if victim is None:
                break
            self.peft.delete_adapter(self._names.pop(victim))
            self._evicted.add(victim)
        self._evicted.discard(key)
        return name

    def use(self, name: Optional[str]):
        """A context in which a forward pass runs with adapter ``name`` (None: the base model)."""
        if self.peft is None:
            return contextlib.nullcontext()
        if name is None:
            return self.peft.disable_adapter()
        self.peft.set_adapter(name)
        return contextlib.nullcontext()


__all__ = ["ABORT_DELAY_MS_ENV", "DeviceOutOfMemory", "LORA_DEVICE_BYTES_ENV", "LoraStore", "LoraWorker",
           "WorkerStopped", "dtype_bytes", "read_adapter_values"]
