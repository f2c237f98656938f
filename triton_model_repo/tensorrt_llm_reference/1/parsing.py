"""Request parsing of the reference ``tensorrt_llm`` model: the request's tensors to a
:class:`ParsedRequest`, with the C++ backend's and the executor's checks and their texts (numpy only).

The tensors, their dtypes and shapes, and the upstream sources are in ``model.py``'s docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

import numpy as np

from . import lora as lora_support


class RequestError(ValueError):
    """A request is rejected. The message carries upstream's key phrase and what was wrong."""


class QueueFullError(RequestError):
    """The not-yet-scheduled queue is at its maximum size."""


#: The largest top_k the sampling layer runs: a larger one is clamped to it with a log warning
#: (cpp/tensorrt_llm/kernels/samplingTopKKernels.h ``TOP_K_MAX``; layers/topKSamplingLayer.cpp ``setup``).
TOP_K_MAX = 1024


def _assertion(expression: str, detail: str) -> str:
    """Text of a failed TLLM_CHECK (cpp/include/tensorrt_llm/common/assert.h: "[TensorRT-LLM][ERROR]
    Assertion failed: <expr> (<file>:<line>)"); our detail stands where upstream puts file:line."""
    return f"[TensorRT-LLM][ERROR] Assertion failed: {expression} ({detail})"


# ------------------------------------------------------------------------------------------------
# Request parsing
# ------------------------------------------------------------------------------------------------


def parse_word_list(arr: Optional[np.ndarray], name: str = "stop_words_list") -> List[List[int]]:
    """Decode a TensorRT-LLM word list into a list of token-id sequences.

    Args:
        arr: integer array of shape [2, S] or [1, 2, S] (INT32 in Triton). Row 0 holds the token ids
            of all words concatenated. Row 1 holds each word's cumulative end offset into row 0, padded
            with -1. Example: words [5, 6] and [7] are encoded as ``[[5, 6, 7], [2, 3, -1]]``.
            None or S == 0 means no words.
        name: the tensor name used in error messages.

    Returns:
        One list of token ids per word, e.g. ``[[5, 6], [7]]``.

    Raises:
        RequestError: wrong dtype or shape; offsets not strictly increasing, not positive, larger
            than S, or followed by something other than -1 padding after the first -1; or a negative
            token id inside a word. (Upstream ``utils.cc`` ``convertWordList`` fails on the same
            lists, with terser texts.)
    """
    if arr is None:
        return []
    arr = np.asarray(arr)
    if not np.issubdtype(arr.dtype, np.integer):
        raise RequestError(f"{name} must be int32, got dtype {arr.dtype}")
    if arr.ndim == 3 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 2 or arr.shape[0] != 2:
        raise RequestError(
            f"{name} must have shape [2, L] (or [1, 2, L] with the batch dimension): row 0 token ids, "
            f"row 1 cumulative end offsets padded with -1; got shape {list(arr.shape)}"
        )
    tokens = [int(x) for x in arr[0]]
    offsets = [int(x) for x in arr[1]]
    width = len(tokens)
    words: List[List[int]] = []
    start = 0
    ended = False
    for i, off in enumerate(offsets):
        if ended:
            if off != -1:
                raise RequestError(
                    f"{name} offsets must be -1 after the first -1 (padding); got {off} at position {i}"
                )
            continue
        if off == -1:
            ended = True
            continue
        if off <= start or off > width:
            raise RequestError(
                f"{name} offsets must be strictly increasing cumulative end positions in (previous offset, "
                f"{width}]; got {off} at position {i} after {start}"
            )
        word = tokens[start:off]
        if any(t < 0 for t in word):
            raise RequestError(f"{name} token ids must be >= 0; got {word}")
        words.append(word)
        start = off
    return words


@dataclass
class SamplingParams:
    """How one request is decoded. The defaults are what an absent tensor means upstream.

    Attributes:
        max_new_tokens: ``request_output_len`` (after the max_seq_len reduction), >= 1.
        end_id: generating it ends the request; it is never returned or counted. None: no end token
            (upstream decodes with ``mEndId.value_or(-1)``, createNewDecoderRequests.cpp @b35ac1b6).
        temperature: 0 means greedy. Logits are multiplied by ``1 / (temperature + 1e-6)`` (unless it
            is 1) before the penalties, greedy decoding included (penaltyKernels.cu batchApplyPenalty).
        top_k: ``runtime_top_k``; 0 is off, 1 is greedy.
        top_p: ``runtime_top_p`` in (0, 1]; None is unset (upstream resets values <= 0 to unset).
            With top_k 0 and top_p unset, decoding is greedy: TensorRT-LLM's top-k layer turns
            k == 0 and p == 0.0 (both defaults) into k = 1 (topKSamplingLayer.cpp @03961722).
        length_penalty: ``len_penalty``; checked (>= 0), otherwise unused (beam search only).
        repetition_penalty: multiplicative, over prompt and generated tokens (as HF's
            RepetitionPenaltyLogitsProcessor). 1.0 turns it off.
        presence_penalty / frequency_penalty: additive, over prompt and generated tokens, as
            TensorRT-LLM counts occurrences (penaltyKernels.cu batchApplyPenalty):
            ``logit -= presence * (count > 0) + frequency * count``.
        min_tokens: end_id is banned until this many tokens have been generated.
        seed: seeds the request's own ``torch.Generator``. The same seed and inputs give the same tokens.
        stop_words: token sequences. Completing one ends the request; it stays in the output.
        bad_words: token sequences that are never completed.
        return_log_probs: collect the log-probability of each chosen token.
    """

    max_new_tokens: int
    end_id: Optional[int] = None
    temperature: float = 1.0
    top_k: int = 0
    top_p: Optional[float] = None
    length_penalty: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    seed: int = 0
    stop_words: List[List[int]] = field(default_factory=list)
    bad_words: List[List[int]] = field(default_factory=list)
    return_log_probs: bool = False

    @property
    def greedy(self) -> bool:
        """True when decoding is greedy: temperature 0, top_k 1, or neither top_k nor top_p set."""
        return self.temperature == 0.0 or self.top_k == 1 or (self.top_k == 0 and self.top_p is None)

    def validate(self) -> None:
        """Range checks of ``SamplingConfig::check*`` (samplingConfig.cpp @da939094).

        Raises:
            RequestError: upstream's failed assertion text plus the tensor name and value.
        """
        if self.max_new_tokens < 1:
            raise RequestError(
                _assertion("mMaxNewTokens > 0", f"request_output_len is {self.max_new_tokens}; it must be >= 1")
            )
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise RequestError(
                _assertion(
                    "temperature.value() >= 0.f", f"temperature is {self.temperature}; it must be >= 0, 0 = greedy"
                )
            )
        if self.top_k < 0:
            raise RequestError(
                _assertion("topK.value() >= 0", f"runtime_top_k is {self.top_k}; it must be >= 0, 0 = off")
            )
        if self.top_p is not None and not (0.0 < self.top_p <= 1.0):
            raise RequestError(
                _assertion("topP.value() <= 1.f", f"runtime_top_p is {self.top_p}; it must be <= 1, <= 0 = unset")
            )
        if not np.isfinite(self.length_penalty) or self.length_penalty < 0:
            raise RequestError(
                _assertion("lengthPenalty.value() >= 0.f", f"len_penalty is {self.length_penalty}; it must be >= 0")
            )
        if not np.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise RequestError(
                _assertion(
                    "repetitionpenalty.value() > 0.f",
                    f"repetition_penalty is {self.repetition_penalty}; it must be > 0, 1 = off",
                )
            )
        # Upstream does not check these two; a NaN or infinity would only give garbage here.
        if not np.isfinite(self.presence_penalty):
            raise RequestError(f"presence_penalty must be a finite number, got {self.presence_penalty}")
        if not np.isfinite(self.frequency_penalty):
            raise RequestError(f"frequency_penalty must be a finite number, got {self.frequency_penalty}")
        if self.min_tokens < 0:
            raise RequestError(
                _assertion("minTokens.value() >= 0", f"min_tokens is {self.min_tokens}; it must be >= 0")
            )
        if not (0 <= self.seed < 2**64):
            raise RequestError(f"seed must be in [0, 2**64), got {self.seed}")


@dataclass(frozen=True)
class ModelLimits:
    """Per-model limits and defaults that request parsing needs.

    Attributes:
        max_input_len: longest prompt in tokens.
        max_seq_len: the longest allowed prompt + request_output_len (longer requests are reduced).
        vocab_size: token ids (and end_id) must lie in [0, vocab_size).
        exclude_input_in_output: default of the per-request input of the same name. Upstream's
            constructor default is false (model_instance_state.cc).
        guided_decoding: whether the model has a guided decoder (requests with a guide fail without).
        lora: the model's LoRA build (``lora.LoraModel``), or None: LoRA tensors are ignored.
    """

    max_input_len: int
    max_seq_len: int
    vocab_size: int
    exclude_input_in_output: bool = False
    guided_decoding: bool = False
    lora: object = None


@dataclass
class ParsedRequest:
    """A validated request: the prompt, how to decode it and how to answer.

    ``warnings`` holds server-side log lines (e.g. the request_output_len reduction); the client
    never sees them, as upstream.
    """

    prompt_ids: List[int]
    params: SamplingParams
    streaming: bool = False
    exclude_input_in_output: bool = False
    warnings: List[str] = field(default_factory=list)
    guide: Optional["GuideSpec"] = None
    grammar: object = None  # the guide compiled by the model (xgrammar CompiledGrammar), set before generation
    lora: object = None  # the request's lora.LoraRequest, or None
    adapter: Optional[str] = None  # the applier's name of its cached LoRA task, set before generation


def scalar_input(get: Callable[[str], Optional[np.ndarray]], name: str, kind: type, default):
    """The one value of the request's input tensor ``name`` as ``kind`` (bool, int or float), or ``default`` when the
    request has no such tensor.

    Raises:
        RequestError: the tensor is empty, or holds more than one value (the C++ backend's ``extractSingleton``,
            ``utils.h``).
    """
    arr = get(name)
    if arr is None:
        return default
    flat = np.asarray(arr).reshape(-1)
    if flat.size == 0:
        raise RequestError(f"{name} is empty; send one value")
    if flat.size != 1:
        # utils.h extractSingleton
        raise RequestError(f"Invalid size for tensor {name} (got {flat.size} values, expected 1)")
    value = flat[0]
    if kind is bool:
        return bool(value)
    if kind is int:
        return int(value)
    return float(value)


#: Guide types getGuidedDecodingParamsFromTensors maps (utils.cc); other strings are ignored there.
GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")


@dataclass(frozen=True)
class GuideSpec:
    """A request's guide: ``guide_type`` in :data:`GUIDE_TYPES`, ``guide`` None only for json."""

    guide_type: str
    guide: Optional[str] = None


def _string(get: Callable[[str], Optional[np.ndarray]], name: str) -> Optional[str]:
    arr = get(name)
    if arr is None:
        return None
    flat = np.asarray(arr, dtype=object).reshape(-1)
    if flat.size != 1:
        raise RequestError(f"Invalid size for tensor {name} (got {flat.size} values, expected 1)")
    value = flat[0]
    return value.decode("utf-8", "replace") if isinstance(value, (bytes, bytearray)) else str(value)


def parse_guide(get: Callable[[str], Optional[np.ndarray]]) -> Optional[GuideSpec]:
    """The guide of a request, as backend ``utils.cc`` ``getGuidedDecodingParamsFromTensors`` reads it:
    the type must be one of the four strings exactly, else the request is unguided (no error); a guide
    without a type is ignored; a type other than json without a guide fails
    (``GuidedDecodingParams`` constructor, ``executor/guidedDecodingParams.cpp``)."""
    guide_type = _string(get, "guided_decoding_guide_type")
    guide = _string(get, "guided_decoding_guide")
    if guide_type not in GUIDE_TYPES:
        return None
    if guide is None and guide_type != "json":
        raise RequestError(
            _assertion("mGuideType == GuideType::kJSON || mGuide.has_value()",
                       "The guide string must be provided unless using GuideType::kJSON.")
        )
    return GuideSpec(guide_type, guide)


def is_stop_request(get: Callable[[str], Optional[np.ndarray]]) -> bool:
    """True when the request's ``stop`` input is true. Upstream checks it before reading any other
    input (``ModelInstanceState::handleStopRequest``)."""
    return bool(scalar_input(get, "stop", bool, False))


def executor_response_error(request_number: int, message: str) -> str:
    """Text of an error the executor sends as it is (an expected LoRA exception, executorImpl.cpp
    fetchNewRequests), with the backend's prefix (model_instance_state.cc fillTritonResponse)."""
    return f"Executor failed process requestId {request_number} due to the following error: {message}"


def executor_error(request_number: int, message: str) -> str:
    """Text of an error found by the executor after enqueueing (``LlmRequest::validate``): the
    executor prefixes it in ``fetchNewRequests`` (executorImpl.cpp @b35ac1b6), the backend in
    ``fillTritonResponse``."""
    return (
        f"Executor failed process requestId {request_number} due to the following error: "
        f"Encountered an error when fetching new request: {message}"
    )


def parse_request(
    get: Callable[[str], Optional[np.ndarray]], limits: ModelLimits, request_number: int = 0,
    prompt_ids: Optional[List[int]] = None,
) -> ParsedRequest:
    """Read and validate one (non-stop) request's tensors, in upstream's order: tensors and sampling
    config first (backend ``utils.cc``), then ``LlmRequest::validate`` (end_id, prompt length,
    max_seq_len reduction), then the LoRA tensors.

    Args:
        get: returns the numpy array of an input tensor by name, or None when it is absent (shapes
            as in the module docstring, with or without the batch dimension).
        limits: the model's limits and defaults.
        request_number: used in executor-style error texts (upstream's executor request id).
        prompt_ids: the prompt when it is not ``input_ids`` (the PyTorch-backend model's text prompt with images,
            whose ids the LLM's input processor makes: ``[]``); None reads and checks ``input_ids``.

    Raises:
        RequestError: the first problem found, with upstream's key phrase.
    """
    prompt = _prompt_ids(get, limits) if prompt_ids is None else prompt_ids
    params, warnings = _sampling_params(get)
    parsed = ParsedRequest(
        prompt_ids=prompt,
        params=params,
        streaming=scalar_input(get, "streaming", bool, False),
        exclude_input_in_output=scalar_input(get, "exclude_input_in_output", bool, limits.exclude_input_in_output),
        guide=parse_guide(get),
        warnings=warnings,
    )
    if parsed.guide is not None and not limits.guided_decoding:
        raise RequestError(
            executor_error(
                request_number,
                "Request is specified with GuidedDecodingParams, but GuidedDecoder is not setup. Please provide a "
                "valid GuidedDecodingConfig to setup GuidedDecoder.",
            )
        )
    _validate_as_llm_request(parsed, limits, request_number)
    # PeftCacheManager::addRequestPeft runs after LlmRequest::validate in fetchNewRequests (executorImpl.cpp);
    # the LoraConfig constructor's checks run in the backend, before the executor (utils.cc), but fail the
    # request the same way for a client.
    try:
        parsed.lora = lora_support.parse_lora(get, limits.lora)
    except lora_support.LoraRequestError as exc:
        raise RequestError(lora_error_text(request_number, exc)) from None
    return parsed


def _prompt_ids(get: Callable[[str], Optional[np.ndarray]], limits: ModelLimits) -> List[int]:
    """The prompt: ``input_ids`` (shape [1, L] or [L], integers in the vocabulary, at least one), matching
    ``input_lengths`` when it is sent."""
    ids = get("input_ids")
    if ids is None:
        raise RequestError("input_ids is not present in the request.")
    ids = np.asarray(ids)
    if ids.ndim == 2:
        if ids.shape[0] != 1:
            raise RequestError(
                f"input_ids has batch size {ids.shape[0]}; this model takes one sequence per request"
            )
        ids = ids[0]
    elif ids.ndim != 1:
        raise RequestError(f"input_ids must have shape [1, L], got {list(ids.shape)}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise RequestError(f"input_ids must be int32, got dtype {ids.dtype}")
    prompt = [int(t) for t in ids]

    if get("input_lengths") is not None:
        input_len = scalar_input(get, "input_lengths", int, None)
        if input_len != len(prompt):
            raise RequestError(f"input_lengths is {input_len} but input_ids has {len(prompt)} tokens; they must match")
    if not prompt:
        raise RequestError(
            _assertion("!mInputTokenIds.empty()", "input_ids is empty; the prompt needs at least 1 token")
        )
    bad_ids = [t for t in prompt if not 0 <= t < limits.vocab_size]
    if bad_ids:
        # Upstream does not check prompt ids; out-of-range ids would index past the embedding.
        raise RequestError(f"input_ids must be in [0, {limits.vocab_size}) (the vocabulary size); got {bad_ids[:5]}")
    return prompt


def _sampling_params(get: Callable[[str], Optional[np.ndarray]]) -> Tuple[SamplingParams, List[str]]:
    """The request's :class:`SamplingParams`, checked as ``SamplingConfig::check*`` checks them, with top_k clamped
    to :data:`TOP_K_MAX`; and the server log line of that clamp (or no line)."""
    if get("request_output_len") is None:
        raise RequestError("request_output_len is not present in the request")
    output_len = scalar_input(get, "request_output_len", int, None)

    beam_width = scalar_input(get, "beam_width", int, 1)
    if beam_width != 1:
        raise RequestError(
            f"beam_width must be 1 (beam search is not supported by this model), got {beam_width}"
        )

    top_p = scalar_input(get, "runtime_top_p", float, None)
    if top_p is not None and top_p <= 0.0:
        top_p = None  # backend utils.cc getSamplingConfigFromTensors: "if (topP <= 0) topP.reset()"
    params = SamplingParams(
        max_new_tokens=output_len,
        end_id=scalar_input(get, "end_id", int, None),
        temperature=scalar_input(get, "temperature", float, 1.0),
        top_k=scalar_input(get, "runtime_top_k", int, 0),
        top_p=top_p,
        length_penalty=scalar_input(get, "len_penalty", float, 0.0),
        repetition_penalty=scalar_input(get, "repetition_penalty", float, 1.0),
        presence_penalty=scalar_input(get, "presence_penalty", float, 0.0),
        frequency_penalty=scalar_input(get, "frequency_penalty", float, 0.0),
        min_tokens=scalar_input(get, "min_tokens", int, 0),
        seed=scalar_input(get, "seed", int, 0),
        stop_words=parse_word_list(get("stop_words_list"), "stop_words_list"),
        bad_words=parse_word_list(get("bad_words_list"), "bad_words_list"),
        return_log_probs=scalar_input(get, "return_log_probs", bool, False),
    )
    params.validate()
    warnings = []
    if params.top_k > TOP_K_MAX:  # the sampling layer's clamp: a server log line, the request goes on
        warnings.append(
            f"TopK ({params.top_k}) is larger than max supported number ({TOP_K_MAX}). Clip to max supported number."
        )
        params.top_k = TOP_K_MAX
    return params, warnings


def _validate_as_llm_request(parsed: ParsedRequest, limits: ModelLimits, request_number: int) -> None:
    """``LlmRequest::validate`` (llmRequest.cpp @89fd9b74), in its order: the end id's range (-1: no end token),
    the prompt length, and ``max_new_tokens`` reduced to what ``max_seq_len`` leaves (with a server log line)."""
    params, prompt = parsed.params, parsed.prompt_ids
    end_id = params.end_id
    if end_id is not None:
        if not -1 <= end_id < limits.vocab_size:
            raise RequestError(
                executor_error(
                    request_number, f"EndId ({end_id}) is not within acceptable range [-1, {limits.vocab_size})."
                )
            )
        if end_id == -1:
            params.end_id = None  # -1 never matches a sampled token: no end token
    if len(prompt) > limits.max_input_len:
        raise RequestError(
            executor_error(
                request_number,
                f"Prompt length ({len(prompt)}) exceeds maximum input length ({limits.max_input_len}). Set log "
                "level to info and check TRTGptModel logs for how maximum input length is set",
            )
        )
    output_len = params.max_new_tokens
    if len(prompt) + output_len > limits.max_seq_len:
        reduced = limits.max_seq_len - len(prompt)
        parsed.warnings.append(
            f"Prompt length + number of requested output tokens + draft tokens per step ({len(prompt)} + "
            f"{output_len} + 0) exceeds maximum sequence length ({limits.max_seq_len}). Number of requested "
            f"output tokens is changed to ({reduced})."
        )
        if reduced < 1:  # only when max_input_len >= max_seq_len; upstream would then run 0 steps
            raise RequestError(
                executor_error(
                    request_number,
                    f"Prompt length ({len(prompt)}) leaves no room for output tokens in the maximum sequence "
                    f"length ({limits.max_seq_len})",
                )
            )
        params.max_new_tokens = reduced


def lora_error_text(request_number: int, exc: "lora_support.LoraRequestError") -> str:
    """A LoRA error as the client reads it: the backend's own errors as they are, the executor's with its
    prefixes (see ``lora.STAGES``)."""
    if exc.stage == "backend":
        return str(exc)
    if exc.stage == "expected":
        return executor_response_error(request_number, str(exc))
    return executor_error(request_number, str(exc))
