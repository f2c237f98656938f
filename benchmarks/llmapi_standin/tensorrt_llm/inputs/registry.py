"""Input processors of TensorRT-LLM 1.2.1's LLM API (stand-in): what turns a prompt (and its images) into the
token ids and multimodal data the engine runs.

Facts followed (NVIDIA/TensorRT-LLM; no file of the v1.2.1 commit ``376f7e1b`` is stored in the search index, so
these are the nearest 1.2-era stored versions, named by commit where the index gives one, else by its id):

* ``create_input_processor(model_path, tokenizer, checkpoint_format)`` (``tensorrt_llm/inputs/registry.py``
  @3a5845e2 and the index copies 2487683082, 3580241918): the model class registered for the checkpoint's
  architecture gets its registered input processor (``@register_input_processor``), built as
  ``cls(model_path, config, tokenizer, trust_remote_code=True)``; every other architecture gets
  ``DefaultInputProcessor(None, None, tokenizer)``;
* ``DefaultInputProcessor.__call__``: without a tokenizer ``ValueError("tokenizer is required to tokenize string
  prompt")``; otherwise ``tokenizer.encode(prompt, add_special_tokens=sampling_params.add_special_tokens)`` (with
  ``truncation`` to ``truncate_prompt_tokens`` when set), and no multimodal data: **images given to a text-only
  checkpoint are dropped**;
* ``create_input_processor_with_hash`` (the wrapper ``generate_async`` uses when the inputs carry
  ``multi_modal_data``): with one modality, image or video, it first tries multimodal hashing unless the processor
  already said it has none (``multimodal_hashing_supported`` False; ``None``, the ``InputProcessor`` protocol's
  default in 2487683082, means "try"). Hashing calls the processor, then ``find_mm_token_lengths``
  (``tensorrt_llm/inputs/multimodal.py``, index id 955816124), which raises ``AttributeError`` for a processor
  without ``get_num_tokens_per_image``: neither ``DefaultInputProcessor`` nor ``Gemma3InputProcessor`` (an
  ``InputProcessor``, not a ``BaseMultimodalInputProcessor``) has it. The wrapper then logs "Multimodal hashing
  failed: <error>." and "Falling back to basic input processor.", marks the processor, and calls it again: the
  first image request of an LLM runs its processor twice, the later ones once. A processor's own error is logged
  ("Basic input processor failed: <the hashing error>.", the variable upstream prints) and raised;
* ``Gemma3InputProcessor`` (``tensorrt_llm/_torch/models/modeling_gemma3vl.py`` @0f8dcd9d; the same
  ``_preprocess`` in the index copy 739095357): ``AutoProcessor.from_pretrained(model_path,
  trust_remote_code=..., use_fast=True)`` at construction; per request ``KeyError("Expected image data in
  multimodal data for Gemma3.")`` when ``multi_modal_data`` has no ``"image"``, then ``processor(text=prompt,
  images=images, do_rescale=..., return_tensors="pt", device="cuda")`` cast to bfloat16 (``do_rescale`` False when
  the images are tensors): the Hugging Face processor tokenizes the prompt (its tokenizer adds the special tokens
  it adds by default) and expands each ``<start_of_image>`` into the image's tokens, and its errors (a prompt whose
  placeholders do not match the images) pass as they are. It returns the ids and
  ``{"multimodal_data": {"image": {"pixel_values": ...}}}`` when there were images, else None. It is registered for
  ``Gemma3ForConditionalGeneration`` with model type ``gemma3``, placeholder ``<start_of_image>`` placed before the
  text.

Registered input processors of other architectures (Qwen2-VL and its successors, Mistral 3, Llama 4, LLaVA-NeXT,
HyperCLOVAX, Phi-4-multimodal) are not emulated: the stand-in refuses to load those checkpoints.
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

logger = logging.getLogger("tensorrt_llm")

ExtraProcessedInputs = Dict[str, Any]

#: Architectures whose model class registers an input processor, and the ones the stand-in emulates (the others
#: are refused when loaded; tensorrtllm_backend/checkpoint.py PROCESSOR_ARCHITECTURES cites each).
REGISTERED_ARCHITECTURES = (
    "Gemma3ForConditionalGeneration", "HCXVisionForCausalLM", "Llama4ForConditionalGeneration",
    "LlavaNextForConditionalGeneration", "Mistral3ForConditionalGeneration", "Phi4MMForCausalLM",
    "Qwen2VLForConditionalGeneration", "Qwen2_5_VLForConditionalGeneration", "Qwen3VLForConditionalGeneration",
    "Qwen3VLMoeForConditionalGeneration",
)


class DefaultInputProcessor:
    """The input processor of a checkpoint without a registered one: tokenization only."""

    def __init__(self, model_path: Any, config: Any, tokenizer: Any, trust_remote_code: bool = True) -> None:
        self.tokenizer = tokenizer
        self.config = config
        self.model_path = model_path
        self.multimodal_hashing_supported: Optional[bool] = None

    def __call__(self, inputs: Dict[str, Any],
                 sampling_params: Any) -> Tuple[List[int], Optional[ExtraProcessedInputs]]:
        if self.tokenizer is None:
            raise ValueError("tokenizer is required to tokenize string prompt")
        if "query" in inputs:
            raise NotImplementedError("stand-in: query inputs (star attention) are not emulated")
        kwargs: Dict[str, Any] = {}
        if sampling_params.truncate_prompt_tokens is not None:
            kwargs = dict(truncation=True, max_length=sampling_params.truncate_prompt_tokens)
        ids = self.tokenizer.encode(inputs["prompt"], add_special_tokens=sampling_params.add_special_tokens, **kwargs)
        return list(ids), None


class Gemma3InputProcessor:
    """``Gemma3InputProcessor`` (see the module docstring). Its ``tokenizer`` is the one the LLM was given."""

    #: The ``InputProcessor`` protocol's default (registry.py, index id 2487683082): try hashing once.
    multimodal_hashing_supported: Optional[bool] = None

    def __init__(self, model_path: Any, model_config: Any, tokenizer: Any, trust_remote_code: bool) -> None:
        from transformers import AutoProcessor  # noqa: PLC0415

        self.tokenizer = tokenizer
        self.processor = AutoProcessor.from_pretrained(str(model_path), trust_remote_code=trust_remote_code,
                                                       use_fast=True, local_files_only=True)
        self.model_config = model_config

    def _preprocess(self, inputs: Dict[str, Any]) -> Tuple[Any, Any]:
        import torch  # noqa: PLC0415

        text_prompt, mm_data = inputs.get("prompt"), inputs.get("multi_modal_data", {})
        if mm_data and "image" not in mm_data:
            raise KeyError("Expected image data in multimodal data for Gemma3.")
        images = mm_data.get("image")
        do_rescale = self.processor.image_processor.do_rescale
        if images is not None and isinstance(images[0], torch.Tensor):
            do_rescale = False
        # device="cuda" upstream: the stand-in runs on the CPU
        output = self.processor(text=text_prompt, images=images, do_rescale=do_rescale,
                                return_tensors="pt").to(dtype=torch.bfloat16)
        return output["input_ids"], output.get("pixel_values")

    def __call__(self, inputs: Dict[str, Any],
                 sampling_params: Any) -> Tuple[List[int], Optional[ExtraProcessedInputs]]:
        import torch  # noqa: PLC0415

        with torch.inference_mode():
            input_ids, pixel_values = self._preprocess(inputs)
        extra = None
        if pixel_values is not None:
            extra = {"multimodal_data": {"image": {"pixel_values": pixel_values}}}
        return input_ids[0].to(torch.int32).tolist(), extra


#: The stand-in's registry: architecture -> input processor class (registered upstream by the model class).
INPUT_PROCESSORS: Dict[str, Callable[..., Any]] = {"Gemma3ForConditionalGeneration": Gemma3InputProcessor}


def create_input_processor(model_path_or_dir: str, tokenizer: Any, checkpoint_format: Optional[str] = "HF") -> Any:
    """The input processor of the checkpoint in ``model_path_or_dir`` (see the module docstring).

    Raises:
        NotImplementedError: the architecture registers an input processor the stand-in does not emulate.
    """
    import json  # noqa: PLC0415

    try:
        config = json.loads((Path(str(model_path_or_dir)) / "config.json").read_text())
    except (OSError, ValueError):
        config = None
    if config is not None:
        architecture = (config.get("architectures") or [""])[0]
        cls = INPUT_PROCESSORS.get(architecture)
        if cls is not None:
            return cls(model_path_or_dir, config, tokenizer, trust_remote_code=True)
        if architecture in REGISTERED_ARCHITECTURES:
            raise NotImplementedError(f"stand-in: the input processor of {architecture} is not emulated "
                                      f"(emulated: {', '.join(INPUT_PROCESSORS)})")
    return DefaultInputProcessor(None, None, tokenizer)


def _hashing_process(input_processor: Any, inputs: Dict[str, Any], sampling_params: Any) -> Any:
    """Multimodal hashing as far as 1.2.1 gets with the emulated processors: the processor runs, then
    ``find_mm_token_lengths`` finds no ``get_num_tokens_per_image`` (see the module docstring)."""
    input_processor(inputs, sampling_params)
    for modality in inputs["multi_modal_data"]:
        if not hasattr(input_processor, f"get_num_tokens_per_{modality}"):
            raise AttributeError(f"Input processor {type(input_processor).__name__} does not have "
                                 f"'get_num_tokens_per_{modality}' method")
    raise NotImplementedError("stand-in: multimodal hashing is not emulated")


def create_input_processor_with_hash(input_processor: Any) -> Callable[..., Any]:
    """The wrapper ``generate_async`` runs inputs with ``multi_modal_data`` through (see the module docstring)."""

    def wrapper(inputs: Dict[str, Any], sampling_params: Any) -> Tuple[List[int], Optional[ExtraProcessedInputs]]:
        try_hashing = use_hashing = False
        modalities = list(set(inputs["multi_modal_data"].keys())) if "multi_modal_data" in inputs else []
        if len(modalities) == 1 and modalities[0] in ("image", "video"):
            if input_processor.multimodal_hashing_supported is not None:
                use_hashing = input_processor.multimodal_hashing_supported
            else:
                try_hashing = True
        if try_hashing or use_hashing:
            try:
                return _hashing_process(input_processor, inputs, sampling_params)
            except Exception as e:  # noqa: BLE001 - upstream's broad fallback
                logger.warning(f"Multimodal hashing failed: {e}.")
                if not try_hashing:
                    raise
                input_processor.multimodal_hashing_supported = False
                logger.warning("Falling back to basic input processor.")
                try:
                    return input_processor(inputs, sampling_params)
                except Exception as e2:
                    logger.warning(f"Basic input processor failed: {e}.")
                    logger.debug(traceback.format_exc())
                    raise e2
        try:
            return input_processor(inputs, sampling_params)
        except Exception as e:
            logger.warning(f"Basic input processor failed: {e}.")
            logger.debug(traceback.format_exc())
            raise

    return wrapper


__all__ = ["DefaultInputProcessor", "Gemma3InputProcessor", "INPUT_PROCESSORS", "REGISTERED_ARCHITECTURES",
           "create_input_processor", "create_input_processor_with_hash"]
