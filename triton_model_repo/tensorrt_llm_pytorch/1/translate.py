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
  bad words, a seed when sampling, and log-probs when sampling), the caller's error leading with what the caller
  can do and the operator's remedy (the setting that applies it) logged; otherwise the penalties and ``min_tokens`` (when > 0) pass as they are, and ``seed`` when
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
  than the one first served under it (:class:`AdapterFacts` digest). Every folder is checked first
  (:func:`check_adapter`: it exists, is complete and readable): 1.2.1 loads it outside its ``RequestError`` path,
  so a folder it cannot read would stop the LLM. ``lora_weights`` / ``lora_config`` (the C++ backend's converted
  tensors) are refused: the LLM API loads adapters from folders only.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from .parsing import ModelLimits, RequestError, parse_request, scalar_input
from .samplers import Refusal, SamplingInputs, refusal, takes_seed

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
        """Whether the LLM streams: always. The model matches stop words on the tokens as they come, and it must
        know whether the LLM has a request in a batch slot (its first response came) before it aborts it: 1.2.1
        drops an aborted request still waiting for a slot without any answer (the model's docstring), and a
        non-streaming request answers only when it ends. A non-streaming client still gets one response."""
        return True


class SamplerRefusal(RequestError):
    """A request refused because the LLM's sampler would not apply one of its inputs: its message is the caller's
    (``samplers.Refusal.message``), :attr:`refusal` also has the operator's remedy, which the model logs."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


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
        RequestError: the first problem found, with the C++ backend's text where it has one, or (a
            :class:`SamplerRefusal`) an input the sampler would ignore (``samplers.refusal``).
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
        raise SamplerRefusal(problem)
    sampling: Dict[str, Any] = {
        "max_tokens": p.max_new_tokens,
        "end_id": -1 if p.end_id is None else p.end_id,
        "detokenize": False,
    }
    if seed_given and takes_seed(sampler):
        sampling["seed"] = p.seed
    pad_id = scalar_input(get, "pad_id", int, None)
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
    interval_ms = scalar_input(get, "stream_interval_ms", int, 0)
    if not 0 <= interval_ms <= MAX_STREAM_INTERVAL_MS:
        raise RequestError(f"stream_interval_ms must be 0 (every step's tokens) to {MAX_STREAM_INTERVAL_MS} "
                           f"milliseconds, got {interval_ms}")
    return Submission(
        prompt_ids=parsed.prompt_ids, sampling=sampling, streaming=parsed.streaming,
        exclude_input_in_output=parsed.exclude_input_in_output, end_id=p.end_id, stop_words=p.stop_words,
        lora=lora, return_log_probs=p.return_log_probs, interval_s=interval_ms / 1e3, warnings=list(parsed.warnings),
        text=text, images=images,
    )


#: The files of an adapter folder the LLM API loads (``lora_manager.py`` @30e6fb55 ``HfLoraLoader``; ``load_from_hf``
#: opens ``adapter_config.json`` and loads ``adapter_model.safetensors``, else ``adapter_model.bin``).
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")
#: safetensors' dtypes and their bytes per value (the format's ``Dtype``; safetensors ``tensor.rs``).
SAFETENSORS_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
                           "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


@dataclass(frozen=True)
class AdapterFacts:
    """What :func:`check_adapter` found in an adapter folder.

    Attributes:
        digest: sha256 (hex) over the adapter files present (each name and its bytes, in :data:`ADAPTER_FILES`
            order): two folders holding the same adapter have the same digest.
        rank: the largest rank of the adapter (``r`` and its ``rank_pattern``).
        signature: :func:`adapter_signature` of the folder when it was read.
    """

    digest: str
    rank: int
    signature: Tuple[Tuple[str, int, int, int], ...]


def adapter_signature(path: str) -> Optional[Tuple[Tuple[str, int, int, int], ...]]:
    """(name, bytes, mtime in ns, inode) of each adapter file in folder ``path``, or None when ``path`` is not a
    folder: unchanged while nobody replaces or rewrites the files (a few ``stat`` calls, no read)."""
    if not os.path.isdir(path):
        return None
    out = []
    for name in ADAPTER_FILES:
        try:
            st = os.stat(os.path.join(path, name))
        except OSError:
            continue
        out.append((name, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)


def _positive_int(value: Any) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def check_adapter(path: str, max_rank: Optional[int] = None) -> AdapterFacts:
    """Check that folder ``path`` holds an adapter the LLM API can load, reading every byte of it once: it exists,
    is complete and is readable. TensorRT-LLM 1.2.1 loads a new adapter in the executor worker before the ``try``
    that turns errors into ``RequestError`` (``executor/base_worker.py`` @7b437aaa ``_enqueue_request``), so a
    folder it cannot read stops the worker, and the LLM with it, for every request (``executor/worker.py``
    @cc4777e9 ``worker_main``): every folder is checked here first, and a failure is the request's error.

    What ``LoraManager.load_from_hf`` reads (``lora_manager.py`` @30e6fb55): ``adapter_config.json``, a JSON object
    whose ``r`` it takes as an int and ``lora_alpha`` as a float; ``adapter_model.safetensors``, else
    ``adapter_model.bin``. A safetensors file must be whole: its header's tensors lie within the file and end
    exactly at its end (what safetensors' own validation requires), each as many bytes as its shape and dtype
    say. A ``.bin`` (a torch zip archive) must pass the archive's CRC check. ``max_rank``: the LLM's
    ``lora_config.max_lora_rank`` (a larger rank is refused here, naming both).

    Raises:
        RequestError: what is wrong, naming the folder and the file (never the LLM's error).
    """
    if not os.path.exists(path):
        raise RequestError(f"lora_path ({path}) does not exist.")
    if not os.path.isdir(path):
        raise RequestError(f"lora_path {path} is not a folder: the LLM API loads an adapter's PEFT folder "
                           "(adapter_config.json and adapter_model.safetensors)")
    signature = adapter_signature(path) or ()
    digest = hashlib.sha256()
    config_file = os.path.join(path, ADAPTER_FILES[0])
    try:
        with open(config_file, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise RequestError(f"lora_path {path}: adapter_config.json cannot be read ({exc.strerror or exc})") from None
    digest.update(ADAPTER_FILES[0].encode())
    digest.update(raw)
    try:
        config = json.loads(raw)
    except ValueError as exc:
        raise RequestError(f"lora_path {path}: adapter_config.json is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise RequestError(f"lora_path {path}: adapter_config.json must hold a JSON object")
    rank = _positive_int(config.get("r"))
    if rank is None:
        raise RequestError(f"lora_path {path}: adapter_config.json needs the adapter's rank r, a positive integer "
                           f"(got {config.get('r')!r})")
    alpha = config.get("lora_alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise RequestError(f"lora_path {path}: adapter_config.json needs lora_alpha, a number (got {alpha!r})")
    pattern = config.get("rank_pattern") or {}
    ranks = [rank] + [v for v in (pattern.values() if isinstance(pattern, dict) else []) if _positive_int(v)]
    if max_rank is not None and max(ranks) > max_rank:
        raise RequestError(f"lora_path {path}: the adapter has rank {max(ranks)}, above the LLM's max_lora_rank "
                           f"{max_rank} (lora_config)")
    weights = next((name for name in ADAPTER_FILES[1:] if os.path.isfile(os.path.join(path, name))), None)
    if weights is None:
        raise RequestError(f"lora_path {path} holds neither adapter_model.safetensors nor adapter_model.bin")
    file = os.path.join(path, weights)
    try:
        with open(file, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise RequestError(f"lora_path {path}: {weights} cannot be read ({exc.strerror or exc})") from None
    problem = _safetensors_problem(data) if weights.endswith(".safetensors") else _zip_problem(file)
    if problem:
        raise RequestError(f"lora_path {path}: {weights} is damaged or incomplete: {problem}")
    digest.update(weights.encode())
    digest.update(data)
    return AdapterFacts(digest.hexdigest(), max(ranks), signature)


def _safetensors_problem(data: bytes) -> str:
    """What makes ``data`` not a whole safetensors file, or "" (8-byte little-endian header length, a JSON header of
    ``{name: {dtype, shape, data_offsets}}``, the tensors' bytes filling the rest exactly)."""
    if len(data) < 8:
        return f"{len(data)} bytes, shorter than its 8-byte header length"
    size = int.from_bytes(data[:8], "little")
    if size > len(data) - 8:
        return f"its header says {size} bytes of header, but {len(data) - 8} bytes follow"
    try:
        header = json.loads(data[8:8 + size])
    except ValueError as exc:
        return f"its header is not valid JSON ({exc})"
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    body = len(data) - 8 - size
    end = 0
    tensors = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            start, stop = (int(v) for v in entry["data_offsets"])
            count = 1
            for dim in entry["shape"]:
                count *= int(dim)
            width = SAFETENSORS_DTYPE_BYTES[entry["dtype"]]
        except (KeyError, TypeError, ValueError):
            return f"tensor {name!r} has no valid dtype, shape and data_offsets"
        if not 0 <= start <= stop <= body or stop - start != count * width:
            return f"tensor {name!r} lies outside the file's {body} bytes of data, or its size does not match its shape"
        end = max(end, stop)
        tensors += 1
    if not tensors:
        return "it holds no tensor"
    if end != body:
        return f"its tensors end at byte {end} of the data, but the file has {body} (a truncated or padded file)"
    return ""


def _zip_problem(file: str) -> str:
    """What makes ``file`` not a whole zip archive (torch.save's format), or ""."""
    import zipfile  # noqa: PLC0415 - .bin adapters only

    try:
        with zipfile.ZipFile(file) as archive:
            bad = archive.testzip()
    except (OSError, zipfile.BadZipFile) as exc:
        return f"not a readable torch archive ({exc})"
    return f"member {bad} fails its CRC check" if bad is not None else ""


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


__all__ = ["ADAPTER_FILES", "GUIDE_KEYS", "IMAGE_FORMATS", "MAX_STREAM_INTERVAL_MS", "NO_LIMIT", "AdapterFacts",
           "SamplerRefusal", "Submission", "adapter_signature", "check_adapter", "decode_images", "stop_word_end",
           "to_submission"]
