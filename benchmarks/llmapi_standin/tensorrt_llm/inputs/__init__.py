"""``tensorrt_llm.inputs`` of TensorRT-LLM 1.2.1 (stand-in): prompt inputs and input processors."""

from .data import PromptInputs, TextPrompt, TokensPrompt, prompt_inputs
from .registry import DefaultInputProcessor, create_input_processor, create_input_processor_with_hash

__all__ = ["DefaultInputProcessor", "PromptInputs", "TextPrompt", "TokensPrompt", "create_input_processor",
           "create_input_processor_with_hash", "prompt_inputs"]
