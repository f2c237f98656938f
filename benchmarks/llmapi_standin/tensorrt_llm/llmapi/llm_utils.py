"""``update_llm_args_with_extra_dict`` (stand-in).

Upstream (NVIDIA/TensorRT-LLM ``tensorrt_llm/llmapi/llm_args.py``, re-exported by ``llmapi/llm_utils.py``, which
the Triton ``llmapi`` model imports it from: triton_backend/all_models/llmapi/tensorrt_llm/1/model.py @b35ac1b6)
merges a dict of extra options (a YAML file upstream) into the LLM's keyword arguments, turning the dicts of
some fields into their config classes first (``lora_config`` into ``LoraConfig(**dict)``: a 1.2-era
``LoraConfig`` is a pydantic model with the default ``extra="ignore"``, so an unknown key there is dropped
silently, ``lora_helper.py`` @585c7565); pydantic validates the other nested dicts when the LLM is built.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from .llm_args import LoraConfig


def update_llm_args_with_extra_dict(llm_args: Dict[str, Any], llm_args_dict: Dict[str, Any],
                                    extra_llm_api_options: Optional[str] = None) -> Dict[str, Any]:
    """``llm_args`` updated with ``llm_args_dict`` (whose ``lora_config`` dict becomes a ``LoraConfig``)."""
    extra = dict(llm_args_dict)
    if isinstance(extra.get("lora_config"), dict):
        extra["lora_config"] = LoraConfig(**extra["lora_config"])
    return {**llm_args, **extra}
