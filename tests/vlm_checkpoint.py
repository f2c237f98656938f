"""A tiny vision-language checkpoint for the image tests, built at test time with no download: a
``Gemma3ForConditionalGeneration`` (an image architecture of TensorRT-LLM 1.2.1's PyTorch backend,
``tensorrt_llm/_torch/models/modeling_gemma3vl.py``) with random weights, from transformers' own config and
processor classes, and SmolLM2's tokenizer (the bundled checkpoint's) plus Gemma 3's three image tokens.

What it takes to be a checkpoint both transformers majors read the same (the GPU image has 4.57.1, which
TensorRT-LLM 1.2.1 pins; ``.venv`` has 5.x; ``build/hub0`` holds 4.57.1 for the tests):

* **the files are written here, not by ``save_pretrained``**: 5.x writes a tokenizer class 4.57.1 does not know
  (``TokenizersBackend``), a config in its own layout (``rope_parameters``) and the vision tower's weights without
  the ``vision_model.`` level. Written as the Hub's Gemma 3 repositories have them (``google/gemma-3-4b-it``:
  ``language_model.model.*``, ``vision_tower.vision_model.*``, ``multi_modal_projector.*``, no ``lm_head``, tied),
  both majors load them, and so does TensorRT-LLM's loader (``Gemma3VLM.load_weights`` filters those three
  prefixes);
* **the tokenizer** is SmolLM2's ``tokenizer.json`` with ``<start_of_image>``, ``<end_of_image>`` and
  ``<image_soft_token>`` added as special tokens, loaded as ``GPT2TokenizerFast`` with the three named as Gemma 3's
  ``boi_token``, ``eoi_token`` and ``image_token`` (``extra_special_tokens``, which ``Gemma3Processor`` reads);
* **the chat template** is SmolLM2's ChatML one that also takes a message's content as a list of parts, writing
  ``<start_of_image>`` for an image part (the placeholder Gemma 3's processor expands, and 1.2.1's placeholder
  registry names for ``gemma3``);
* **the image processor** resizes to 32 x 32 pixels, and the projector maps a 4 x 4 patch grid to 4 image tokens
  (``mm_tokens_per_image``), so one image is 4 ``<image_soft_token>`` between ``<start_of_image>`` and
  ``<end_of_image>``;
* **``mm_input_projection_weight`` is drawn again**: transformers initialises it to zeros, so a default random model
  ignores the pixels (every image would give the same output).

:func:`build_vlm_checkpoint` takes about 5 s on the 2-core machine and writes about 16 MB.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Optional

#: Gemma 3's image tokens, in the order of their ids (appended to SmolLM2's 49,152).
IMAGE_TOKENS = ("<start_of_image>", "<end_of_image>", "<image_soft_token>")
#: The placeholder a prompt holds per image (Gemma 3's boi token).
IMAGE_PLACEHOLDER = IMAGE_TOKENS[0]
#: Image tokens per image (``mm_tokens_per_image``, ``image_seq_length``).
TOKENS_PER_IMAGE = 4
#: The image processor's size, pixels.
IMAGE_SIZE = 32
ARCHITECTURE = "Gemma3ForConditionalGeneration"

#: SmolLM2's chat template, with list contents (text and image parts).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<start_of_image>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_LEGACY_PREFIXES = (("model.language_model.", "language_model.model."),
                    ("model.vision_tower.", "vision_tower.vision_model."),
                    ("model.multi_modal_projector.", "multi_modal_projector."))


def _config(vocab: int, ids: list[int], bos: int, eos: int) -> dict[str, Any]:
    """config.json in the Hub's Gemma 3 layout (what transformers 4.57.1 writes and both majors read)."""
    return {
        "architectures": [ARCHITECTURE], "model_type": "gemma3", "torch_dtype": "float32",
        "boi_token_index": ids[0], "eoi_token_index": ids[1], "image_token_index": ids[2],
        "mm_tokens_per_image": TOKENS_PER_IMAGE, "initializer_range": 0.02,
        "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": eos,
        "text_config": {
            "model_type": "gemma3_text", "vocab_size": vocab, "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
            "max_position_embeddings": 2048, "sliding_window": 512, "sliding_window_pattern": 2,
            "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "rope_scaling": None,
            "query_pre_attn_scalar": 32, "rms_norm_eps": 1e-6, "hidden_activation": "gelu_pytorch_tanh",
            "attention_bias": False, "attention_dropout": 0.0, "final_logit_softcapping": None,
            "attn_logit_softcapping": None, "torch_dtype": "float32",
        },
        "vision_config": {
            "model_type": "siglip_vision_model", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "image_size": IMAGE_SIZE, "patch_size": 8, "num_channels": 3,
            "layer_norm_eps": 1e-6, "hidden_act": "gelu_pytorch_tanh", "attention_dropout": 0.0,
            "vision_use_head": False, "torch_dtype": "float32",
        },
    }


def build_vlm_checkpoint(out: Path, smollm2: Path, seed: int = 0) -> Path:
    """Write the tiny Gemma 3 checkpoint into ``out`` (replaced) from the SmolLM2 checkpoint folder ``smollm2``
    (its ``tokenizer.json``); the weights are drawn with ``torch.manual_seed(seed)``. Returns ``out``.

    Raises:
        OSError: ``smollm2`` has no tokenizer.json, or ``out`` cannot be written.
    """
    import torch  # noqa: PLC0415 - heavy
    from safetensors.torch import save_file  # noqa: PLC0415
    from tokenizers import AddedToken, Tokenizer  # noqa: PLC0415
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration  # noqa: PLC0415

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    tokenizer = Tokenizer.from_file(str(smollm2 / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in IMAGE_TOKENS])
    tokenizer.save(str(out / "tokenizer.json"))
    ids = [tokenizer.token_to_id(t) for t in IMAGE_TOKENS]
    bos, eos = tokenizer.token_to_id("<|im_start|>"), tokenizer.token_to_id("<|im_end|>")
    special = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
               "unk_token": "<|endoftext|>"}
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GPT2TokenizerFast", **special, "model_max_length": 8192, "add_bos_token": False,
        "add_eos_token": False, "clean_up_tokenization_spaces": False, "chat_template": CHAT_TEMPLATE,
        "extra_special_tokens": {"boi_token": IMAGE_TOKENS[0], "eoi_token": IMAGE_TOKENS[1],
                                 "image_token": IMAGE_TOKENS[2]},
    }, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    (out / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor", "do_resize": True,
        "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE}, "resample": 2, "do_rescale": True,
        "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "do_convert_rgb": None, "do_pan_and_scan": None, "pan_and_scan_max_num_crops": None,
        "pan_and_scan_min_crop_size": None, "pan_and_scan_min_ratio_to_activate": None,
    }, indent=2) + "\n")
    (out / "processor_config.json").write_text(json.dumps(
        {"processor_class": "Gemma3Processor", "image_seq_length": TOKENS_PER_IMAGE}, indent=2) + "\n")
    config = _config(tokenizer.get_vocab_size(), ids, bos, eos)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": eos}, indent=2) + "\n")

    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(Gemma3Config.from_dict(config)).eval()
    with torch.no_grad():  # transformers initialises it to zeros: the pixels would not matter
        projection = model.model.multi_modal_projector.mm_input_projection_weight
        projection.normal_(0.0, 1.0)
    weights = {}
    for key, value in model.state_dict().items():
        if key == "lm_head.weight":
            continue  # tied to the embeddings, as in the Hub's files
        for ours, hubs in _LEGACY_PREFIXES:
            if key.startswith(ours):
                weights[hubs + key[len(ours):]] = value.detach().contiguous()
                break
        else:
            raise KeyError(f"unexpected weight {key} of transformers' Gemma3ForConditionalGeneration")
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


class VlmReference:
    """transformers' own greedy output of the checkpoint with images: what the served model must reproduce.

    The prompt is rendered with the tokenizer's chat template and processed by the checkpoint's processor as
    TensorRT-LLM 1.2.1's ``Gemma3InputProcessor`` does (``processor(text=prompt, images=images)``; pixel values cast
    to bfloat16); the image tokens attend to one another as ``Gemma3VLM`` marks them (ids equal to
    ``image_token_index``).
    """

    def __init__(self, folder: Path) -> None:
        import torch  # noqa: PLC0415
        from transformers import AutoProcessor, AutoTokenizer, Gemma3ForConditionalGeneration  # noqa: PLC0415

        self.torch = torch
        self.folder = folder
        self.tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        self.processor = AutoProcessor.from_pretrained(str(folder), local_files_only=True)
        self.model = Gemma3ForConditionalGeneration.from_pretrained(str(folder), dtype=torch.float32,
                                                                    local_files_only=True).eval()
        self.image_token = int(json.loads((folder / "config.json").read_text())["image_token_index"])

    def prompt(self, text: str, images: int, system_prompt: str = "") -> str:
        """The rendered prompt of one user turn with ``images`` image parts before ``text``."""
        content: list[dict[str, Any]] = [{"type": "image"} for _ in range(images)] + [{"type": "text", "text": text}]
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + \
            [{"role": "user", "content": content}]
        return str(self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))

    def generate(self, prompt: str, images: list, max_new_tokens: int) -> tuple[str, list[int], int]:
        """(text, new ids, prompt length in tokens) of greedy decoding ``prompt`` with ``images`` (PIL RGB)."""
        torch = self.torch
        batch = self.processor(text=prompt, images=images or None, return_tensors="pt")
        ids = batch["input_ids"]
        kwargs: dict[str, Any] = {"attention_mask": torch.ones_like(ids)}
        if images:
            kwargs["pixel_values"] = batch["pixel_values"].to(torch.bfloat16).to(torch.float32)
            kwargs["token_type_ids"] = (ids == self.image_token).to(torch.long)
        with torch.inference_mode():
            out = self.model.generate(ids, do_sample=False, max_new_tokens=max_new_tokens, **kwargs)
        new = out[0, ids.shape[1]:].tolist()
        eos = self.tokenizer.eos_token_id
        if eos in new:
            new = new[: new.index(eos)]
        return self.tokenizer.decode(new, skip_special_tokens=True), new, int(ids.shape[1])


def solid_png(color: tuple[int, int, int], size: tuple[int, int] = (48, 40), path: Optional[Path] = None) -> bytes:
    """A PNG of one ``color`` (``size``: width, height); written to ``path`` when given."""
    import io  # noqa: PLC0415

    from PIL import Image  # noqa: PLC0415

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    data = buffer.getvalue()
    if path is not None:
        path.write_bytes(data)
    return data


__all__ = ["ARCHITECTURE", "CHAT_TEMPLATE", "IMAGE_PLACEHOLDER", "IMAGE_TOKENS", "TOKENS_PER_IMAGE", "VlmReference",
           "build_vlm_checkpoint", "solid_png"]
