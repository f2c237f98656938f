"""The C++ backend's request tensors to one LLM API request, for the PyTorch-backend ``tensorrt_llm`` model.

The tensors are read and checked by the same code as the CPU reference model's (``parsing.py`` beside this
file, a link to ``tensorrt_llm_reference/1/parsing.py``), so a client gets the C++ backend's texts for the
same mistakes (``SamplingConfig::check*``, ``extractSingleton``, the guide and word-list checks, the end id
range). The executor's own limits (prompt length, ``max_seq_len``) are the LLM's here and are not applied
(:data:`NO_LIMIT`): the LLM checks and reports them itself.

How the C++ semantics become ``SamplingParams`` (TensorRT-LLM 1.2.1's LLM API; sources:
``tensorrt_llm/sampling_params.py`` @b35ac1b6 and ``executor/base_worker.py`` @7b437aaa):

* greedy (temperature 0, top_k 1, or top_k 0 with top_p unset, the C++ sampling layer's rule) becomes
  ``top_k=1`` (the LLM API's greedy, ``params_imply_greedy_decoding``); otherwise temperature, ``top_k``
  (0 = all logits in both) and ``top_p`` (unset when the request's is <= 0, as ``utils.cc`` resets it) pass;
* no ``end_id`` (or -1) means no end token, as in the C++ executor: ``end_id=-1``, which is what the worker
  itself sends for ``ignore_eos`` (``end_id=-1 if ignore_eos else end_id``), and which keeps the LLM from
  filling the tokenizer's end token in (``_prepare_sampling_params`` calls ``_setup`` only when end_id is None);
  ``pad_id`` is the request's when it has one (the ensemble's preprocessing always sends the tokenizer's),
  else the LLM API's default, ``end_id`` (``SamplingParams.__post_init__``);
* the LLM's sampler (``samplers.py`` beside this file, a link to ``tensorrtllm_backend/samplers.py``, has the
  facts and sources) decides what else can pass: a request whose input that sampler would ignore is refused
  (``samplers.refusal``: under TorchSampler, the default of ``sampler_type`` auto, any penalty, ``min_tokens``,
  bad words, a seed when sampling, and log-probs when sampling), naming the input, the sampler and the setting
  that applies it; otherwise the penalties and ``min_tokens`` (when > 0) pass as they are, and ``seed`` when
  the request gives one (unset, the C++ decoder uses 0, as the C++ backend); ``len_penalty`` is checked and not
  sent (beam search only);
* stop words are matched by the model itself, over prompt and output as ``stopWordsCriterion`` does (the
  LLM API takes stop strings or single stop ids only, and cuts matched words from its output); single-token
  bad words become ``bad_token_ids`` (TRTLLMSampler), longer ones are refused (the LLM API has no
  token-sequence bad words);
* the guide types: ``json`` -> ``json_object=True``, ``json_schema`` -> ``json``, ``regex`` -> ``regex``,
  ``ebnf_grammar`` -> ``grammar``;
* ``return_log_probs`` -> ``logprobs=1``; ``detokenize=False`` (the predictor detokenizes);
* ``stream_interval_ms`` (this model's own optional input, not the C++ backend's): a streaming request's new
  tokens are sent at most every that many milliseconds, the first at once and the last with the final response
  (:attr:`Submission.interval_s`); absent or 0, each step's tokens as they come (the C++ backend's responses);
* images (this model's own optional inputs, not the C++ backend's): ``text_input`` (the prompt as text, one
  placeholder per image where the model's chat template writes it) with ``image_bytes`` (one encoded image file per
  element), in place of ``input_ids``. TensorRT-LLM 1.2.1's LLM API takes images only with a text prompt
  (``{"prompt": ..., "multi_modal_data": {"image": [...]}}``): the model's input processor tokenizes the text and
  expands each placeholder into the image's tokens (``inputs/registry.py``, e.g. ``Gemma3InputProcessor`` in
  ``_torch/models/modeling_gemma3vl.py`` @0f8dcd9d); token ids with images are decoded back into text for a model
  with its own input processor, and their images dropped for one without (``llmapi/llm.py`` ``generate_async``,
  the 1.2-era index copy 323158958). So an image request carries no ids (:attr:`Submission.text`,
  :attr:`Submission.images`); the images are decoded here (:func:`decode_images`) as trtllm-serve's loader decodes
  them (RGB, an alpha channel over white: ``tensorrt_llm/inputs/utils.py`` ``convert_image_mode``, index id
  51982902165), with their EXIF orientation applied. A model that serves no images (its ``images`` parameter false:
  a text-only architecture, whose default input processor would drop them, or images switched off) refuses them;
* LoRA: ``lora_path`` (the adapter's PEFT folder) with ``lora_task_id`` -> ``LoRARequest(name, id, path)``;
  the id is the LLM's adapter cache key (``base_worker.py`` @7b437aaa ``_load_lora_adapter`` returns False for
  a loaded id, ``lora_manager.py`` @30e6fb55 keeps the weights first loaded), so a known id sent with another
  folder would silently get the cached adapter: the model refuses an id whose folder holds another adapter
  than the one first served under it (:func:`adapter_digest`). ``lora_weights`` / ``lora_config`` (the C++
  backend's converted tensors) are refused: the LLM API loads adapters from folders only.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .parsing import ModelLimits, RequestError, _scalar, parse_request
from .samplers import SamplingInputs, refusal, takes_seed

#: Limits the C++ executor would apply and the LLM applies instead (never reached here).
NO_LIMIT = 2**62
#: The longest ``stream_interval_ms`` a request may ask for, milliseconds.
MAX_STREAM_INTERVAL_MS = 10_000

#: The image formats the model decodes (the stream process refuses any other: cog_triton/streaming/images.py).
IMAGE_FORMATS = ("JPEG", "PNG", "WEBP", "GIF")

GUIDE_KEYS = {"json": ("json_object", True), "json_schema": ("json", None), "regex": ("regex", None),
              "ebnf_grammar": ("grammar", None)}


@dataclass
class Submission:
    """One request for the LLM, and how its responses are shaped.

    Attributes:
        prompt_ids: the prompt (``input_ids``).
        sampling: keyword arguments of ``SamplingParams``.
        streaming: the client's ``streaming`` (one response per step with the new ids).
        exclude_input_in_output: non-streaming responses carry the prompt unless this is set.
        end_id: the end token (never returned), or None.
        stop_words: token sequences matched by the model over prompt + output.
        lora: ``(lora_task_id, lora_path)`` or None.
        return_log_probs: send cum_log_probs / output_log_probs.
        interval_s: ``stream_interval_ms`` in seconds (0: every step's tokens as they come).
        warnings: server log lines (the client never sees them).
        text: an image request's prompt (``text_input``), None for a request of token ids; its ``prompt_ids`` are
            the LLM's (set once the LLM has the request).
        images: an image request's encoded image files (``image_bytes``), None otherwise.
    """

    prompt_ids: List[int]
    sampling: Dict[str, Any]
    streaming: bool = False
    exclude_input_in_output: bool = False
    end_id: Optional[int] = None
    stop_words: List[List[int]] = field(default_factory=list)
    lora: Optional[Tuple[int, str]] = None
    return_log_probs: bool = False
    interval_s: float = 0.0
    warnings: List[str] = field(default_factory=list)
    text: Optional[str] = None
    images: Optional[List[bytes]] = None

    @property
    def llm_streaming(self) -> bool:
        """Whether the LLM streams: as the client asked, or always when the model matches stop words."""
        return self.streaming or bool(self.stop_words)


def _string(get: Callable[[str], Optional[np.ndarray]], name: str) -> Optional[str]:
    arr = get(name)
    if arr is None:
        return None
    flat = np.asarray(arr, dtype=object).reshape(-1)
    if flat.size != 1:
        raise RequestError(f"Invalid size for tensor {name} (got {flat.size} values, expected 1)")
    value = flat[0]
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def _lora(get: Callable[[str], Optional[np.ndarray]], lora_enabled: bool,
          known_paths: Dict[int, str]) -> Optional[Tuple[int, str]]:
    """The request's adapter (id, folder), or None. ``known_paths``: folders of ids served before."""
    task = get("lora_task_id")
    path = _string(get, "lora_path")
    if task is None:
        if path is not None:
            raise RequestError("lora_path was given without lora_task_id: send the adapter's id too (the LLM API "
                               "caches an adapter under its id, LoRARequest.lora_int_id)")
        return None  # lora_weights / lora_config are read only with a task id, as the C++ backend does
    flat = np.asarray(task).reshape(-1)
    if flat.size != 1:
        raise RequestError(f"Invalid size for tensor lora_task_id (got {flat.size} values, expected 1)")
    task_id = int(flat[0])
    if get("lora_weights") is not None or get("lora_config") is not None:
        raise RequestError(
            "lora_weights and lora_config are not supported by the PyTorch backend's tensorrt_llm model: send the "
            "adapter's PEFT folder as lora_path with lora_task_id (the LLM API loads adapters from folders)")
    if not lora_enabled:
        raise RequestError(f"lora_task_id {task_id} was given, but this model serves no LoRA adapters (its LLM "
                           "arguments have no lora_config)")
    if path is None:
        path = known_paths.get(task_id)
        if path is None:
            raise RequestError(f"LoRA task {task_id} not found in cache. Please send lora_path with the request")
    if not path:
        raise RequestError(f"lora_path is empty for lora_task_id {task_id}")
    return task_id, path


def _image_request(get: Callable[[str], Optional[np.ndarray]],
                   images_off: Optional[str]) -> Tuple[Optional[str], Optional[List[bytes]]]:
    """(text, encoded images) of an image request, or (None, None) for a request of token ids.

    Raises:
        RequestError: one of text_input / image_bytes without the other, either with input_ids, no image, or images
            to a model that serves none (``images_off``: why, None when it serves them).
    """
    arr = get("image_bytes")
    text = _string(get, "text_input")
    if text is None and arr is None:
        return None, None
    if text is None:
        raise RequestError("image_bytes was given without text_input: send the prompt as text_input, with one "
                           "placeholder per image where the model's chat template writes it")
    if arr is None:
        raise RequestError("text_input is taken with image_bytes only (an image request); send a text prompt as "
                           "input_ids")
    if get("input_ids") is not None:
        raise RequestError("an image request sends its prompt as text_input (the LLM's input processor tokenizes it "
                           "with the images), not input_ids: send one of them")
    images = [bytes(v) if isinstance(v, (bytes, bytearray)) else str(v).encode("latin-1")
              for v in np.asarray(arr, dtype=object).reshape(-1)]
    if not images:
        raise RequestError("image_bytes holds no image")
    if images_off is not None:
        raise RequestError(f"{len(images)} image(s) were given, but this model serves none: {images_off}")
    return text, images


def decode_images(blobs: List[bytes]) -> List[Any]:
    """The PIL images (RGB) the LLM gets for ``image_bytes`` (see the module docstring). Blocking (decoding).

    Raises:
        RequestError: an image that does not decode, naming it.
    """
    import io  # noqa: PLC0415

    from PIL import Image, ImageOps  # noqa: PLC0415 - image requests only

    pictures = []
    for index, data in enumerate(blobs):
        try:
            image = Image.open(io.BytesIO(data), formats=IMAGE_FORMATS)
            image = ImageOps.exif_transpose(image)
            if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
                image = image.convert("RGBA")
                rgb = Image.new("RGB", image.size, (255, 255, 255))
                rgb.paste(image, mask=image.getchannel("A"))
                image = rgb
            elif image.mode != "RGB":
                image = image.convert("RGB")
            image.load()
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            raise RequestError(f"image_bytes[{index}] could not be decoded: {exc}") from None
        pictures.append(image)
    return pictures


def to_submission(get: Callable[[str], Optional[np.ndarray]], *, vocab_size: int, exclude_input_in_output: bool,
                  guided_decoding: bool, lora_enabled: bool, known_paths: Dict[int, str], sampler: str,
                  request_number: int = 0, images_off: Optional[str] = "images are off") -> Submission:
    """Read one (non-stop) request's tensors into a :class:`Submission` (see the module docstring).

    Args:
        get: the request's tensors by name (None when absent; shapes as Triton delivers them).
        vocab_size: token ids and the end id must lie in [0, vocab_size) (the end id also -1).
        exclude_input_in_output: the model parameter's default for the request's input of the same name.
        guided_decoding: the LLM has a guided decoding backend (else a guide fails as the C++ executor fails it).
        lora_enabled: the LLM has a ``lora_config``.
        known_paths: adapter folders by id, of requests served before (a request may send only the id).
        sampler: the LLM's sampler (``samplers.effective_sampler``).
        request_number: used in executor-style error texts.
        images_off: why the model serves no images (an image request is refused with it); None: it serves them.

    Raises:
        RequestError: the first problem found, with the C++ backend's text where it has one, or an input the
            sampler would ignore (``samplers.refusal``).
    """
    limits = ModelLimits(max_input_len=NO_LIMIT, max_seq_len=NO_LIMIT, vocab_size=vocab_size,
                         exclude_input_in_output=exclude_input_in_output, guided_decoding=guided_decoding, lora=None)
    text, images = _image_request(get, images_off)
    parsed = parse_request(get, limits, request_number=request_number, prompt_ids=None if text is None else [])
    lora = _lora(get, lora_enabled, known_paths)
    p = parsed.params
    seed_given = get("seed") is not None
    problem = refusal(sampler, SamplingInputs(
        greedy=p.greedy, repetition_penalty=p.repetition_penalty, presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty, min_tokens=p.min_tokens, seed=p.seed if seed_given else None,
        bad_words=bool(p.bad_words), return_log_probs=p.return_log_probs))
    if problem is not None:
        raise RequestError(problem)
    sampling: Dict[str, Any] = {
        "max_tokens": p.max_new_tokens,
        "end_id": -1 if p.end_id is None else p.end_id,
        "detokenize": False,
    }
    if seed_given and takes_seed(sampler):
        sampling["seed"] = p.seed
    pad_id = _scalar(get, "pad_id", int, None)
    if pad_id is not None:
        sampling["pad_id"] = pad_id
    if p.greedy:
        sampling["top_k"] = 1
    else:
        sampling.update(temperature=p.temperature, top_k=p.top_k, top_p=p.top_p)
    if p.repetition_penalty != 1.0:
        sampling["repetition_penalty"] = p.repetition_penalty
    if p.presence_penalty != 0.0:
        sampling["presence_penalty"] = p.presence_penalty
    if p.frequency_penalty != 0.0:
        sampling["frequency_penalty"] = p.frequency_penalty
    if p.min_tokens > 0:
        sampling["min_tokens"] = p.min_tokens
    if p.return_log_probs:
        sampling["logprobs"] = 1
    if p.bad_words:
        long_words = [w for w in p.bad_words if len(w) > 1]
        if long_words:
            raise RequestError(
                f"bad_words_list holds words of more than one token ({long_words[:3]}); the PyTorch backend's LLM "
                "API takes single-token bad words only (SamplingParams.bad_token_ids)")
        sampling["bad_token_ids"] = [w[0] for w in p.bad_words]
    guide = parsed.guide
    if guide is not None:
        key, value = GUIDE_KEYS[guide.guide_type]
        sampling["guided_decoding"] = {key: guide.guide if value is None else value}
    interval_ms = _scalar(get, "stream_interval_ms", int, 0)
    if not 0 <= interval_ms <= MAX_STREAM_INTERVAL_MS:
        raise RequestError(f"stream_interval_ms must be 0 (every step's tokens) to {MAX_STREAM_INTERVAL_MS} "
                           f"milliseconds, got {interval_ms}")
    return Submission(
        prompt_ids=parsed.prompt_ids, sampling=sampling, streaming=parsed.streaming,
        exclude_input_in_output=parsed.exclude_input_in_output, end_id=p.end_id, stop_words=p.stop_words,
        lora=lora, return_log_probs=p.return_log_probs, interval_s=interval_ms / 1e3, warnings=list(parsed.warnings),
        text=text, images=images,
    )


#: The files of an adapter folder the LLM API loads (``lora_manager.py`` @30e6fb55 ``HfLoraLoader``).
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")


def adapter_digest(path: str) -> Optional[str]:
    """sha256 (hex) over the adapter files of folder ``path`` (:data:`ADAPTER_FILES`, each name and bytes, in that
    order), or None when ``path`` is not a folder (``LoRARequest`` then refuses it with upstream's text). Reads
    the files (blocking; adapters are MB to a few hundred MB)."""
    if not os.path.isdir(path):
        return None
    digest = hashlib.sha256()
    for name in ADAPTER_FILES:
        file = os.path.join(path, name)
        if os.path.isfile(file):
            digest.update(name.encode())
            with open(file, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def stop_word_end(context: List[int], n_new: int, stop_words: List[List[int]]) -> Optional[int]:
    """Where the first stop word completed by the last ``n_new`` tokens of ``context`` ends, or None: a word is
    compared with prompt + output ending at a new token, so it may begin in the prompt but never lies wholly in
    it (``stopWordsCriterion``, cpp/tensorrt_llm/kernels/stopCriteriaKernels.cu @9b931c0f; the PyTorch sampler
    compares the request's tokens, prompt included, the same way: ``TorchSampler._meet_stop_token_criteria``)."""
    first_new = len(context) - n_new
    for end in range(first_new + 1, len(context) + 1):
        for word in stop_words:
            if word and end >= len(word) and context[end - len(word):end] == list(word):
                return end
    return None


__all__ = ["ADAPTER_FILES", "GUIDE_KEYS", "IMAGE_FORMATS", "MAX_STREAM_INTERVAL_MS", "NO_LIMIT", "Submission",
           "adapter_digest", "decode_images", "stop_word_end", "to_submission"]
