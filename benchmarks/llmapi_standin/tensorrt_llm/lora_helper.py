"""``LoraConfig`` lives in ``tensorrt_llm/lora_helper.py`` upstream (@037d4ba1); see :mod:`.llmapi.llm_args`."""

from .llmapi.llm_args import LoraConfig

__all__ = ["LoraConfig"]
