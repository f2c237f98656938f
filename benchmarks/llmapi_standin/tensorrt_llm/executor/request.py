"""``LoRARequest`` of TensorRT-LLM 1.2.1 (stand-in).

NVIDIA/TensorRT-LLM ``tensorrt_llm/executor/request.py`` @4ce835a5: a slotted dataclass
``LoRARequest(lora_name, lora_int_id, lora_path="", lora_ckpt_source="hf")`` whose ``__post_init__``
raises ``ValueError("lora_path (<path>) does not exist.")`` for a path that does not exist and refuses a
``lora_ckpt_source`` other than "hf" or "nemo"; ``adapter_id`` is ``lora_int_id``, the key the worker caches
the adapter's weights under (``executor/base_worker.py`` @7b437aaa ``_load_lora_adapter`` /
``is_adapter_in_cpu_cache``), ``path`` is ``lora_path``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(slots=True)
class LoRARequest:
    """A request's LoRA adapter: a name, its integer id (the cache key) and its folder."""

    lora_name: str
    lora_int_id: int
    lora_path: str = ""
    lora_ckpt_source: str = "hf"

    def __post_init__(self) -> None:
        if self.lora_path is not None and not os.path.exists(self.lora_path):
            raise ValueError(f"lora_path ({self.lora_path}) does not exist.")
        if self.lora_ckpt_source not in ["hf", "nemo"]:
            raise ValueError(f"lora_ckpt_source must be 'hf' or 'nemo', got '{self.lora_ckpt_source}'")

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path

    @property
    def ckpt_source(self) -> str:
        return self.lora_ckpt_source
