"""Prompt inputs of TensorRT-LLM 1.2.1's LLM API (stand-in).

Facts followed (NVIDIA/TensorRT-LLM ``tensorrt_llm/inputs/data.py``, the 1.2-era index copy of id 11345874; the
same function at the later stored version @2a9abd95):

* ``TextPrompt``: ``prompt`` and, not required, ``multi_modal_data`` ("optional multi-modal data to pass to the
  model, if the model supports it"), ``mm_processor_kwargs``, ``query``; ``TokensPrompt``: ``prompt_token_ids`` and
  the same optional keys (``query_token_ids`` for the query); both are ``TypedDict``s, so plain dicts;
* ``prompt_inputs``: a ``str`` becomes ``TextPrompt(prompt=...)``, a list (``assert isinstance(inputs[0], int)``)
  ``TokensPrompt(prompt_token_ids=...)``, a dict is returned as it is after
  ``assert inputs.get("prompt") is not None or inputs.get("prompt_token_ids") is not None`` (a bare
  ``AssertionError``); anything else raises ``TypeError("Invalid type of inputs for llm.generate: <type>")``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Union

TextPrompt = dict
TokensPrompt = dict
PromptInputs = Union[str, List[int], Dict[str, Any]]


def prompt_inputs(inputs: PromptInputs) -> Dict[str, Any]:
    """``inputs`` as a ``TextPrompt`` or ``TokensPrompt`` dict (see the module docstring)."""
    if isinstance(inputs, str):
        return {"prompt": inputs}
    if isinstance(inputs, list):
        assert isinstance(inputs[0], int)
        return {"prompt_token_ids": inputs}
    if isinstance(inputs, dict):
        assert inputs.get("prompt") is not None or inputs.get("prompt_token_ids") is not None
        return inputs
    raise TypeError(f"Invalid type of inputs for llm.generate: {type(inputs)}")


__all__ = ["PromptInputs", "TextPrompt", "TokensPrompt", "prompt_inputs"]
