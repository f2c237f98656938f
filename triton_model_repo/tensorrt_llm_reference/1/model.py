"""CPU reference implementation of the ``tensorrt_llm`` model (Triton Python backend, decoupled).

It takes the same tensors as the C++ ``tensorrtllm`` backend of **TensorRT-LLM 1.1.0**, limited to
the subset a decoder-only text model uses (see ``../config.pbtxt``), and aims to behave like it in
everything a client can observe: which responses are sent, their tensors and shapes, the FINAL
flag, queueing, ``stop``, and which inputs are errors (with upstream's key phrase in the message)
and which are silently adjusted. Instead of a TensorRT engine it runs a Hugging Face causal LM
with ``transformers`` on the CPU, in float32. It is not the same speed, and sampled (non-greedy)
tokens differ from the GPU kernels' (different RNG).

Upstream sources (read, not copied; "backend" = NVIDIA/TensorRT-LLM
``triton_backend/inflight_batcher_llm/src``):

* responses: backend ``model_instance_state.cc`` ``fillTritonResponse`` / ``WaitForResponse``
  (@c8c6df08); executor ``cpp/tensorrt_llm/batch_manager/llmRequest.cpp`` ``createResult``
  (@89fd9b74): streaming sends only the tokens new since the last response (the prompt never);
  non-streaming sends one final response with prompt + generated unless exclude_input_in_output.
* end token: ``cpp/tensorrt_llm/kernels/stopCriteriaKernels.cu`` (@9b931c0f) and the sampling
  kernels do not advance the sequence length on the end token, so it is never returned; a streamed
  request that ends on it gets a final response with ``output_ids`` [1, 1, 0].
* stop: backend ``ModelInstanceState::handleStopRequest`` / ``sendEnqueueResponse`` (@c8c6df08).
* queue: ``cpp/tensorrt_llm/executor/executorImpl.cpp`` ``Executor::Impl::enqueueRequests``
  (@b35ac1b6).
* validation: ``cpp/tensorrt_llm/executor/samplingConfig.cpp`` ``SamplingConfig::check*``
  (@da939094), backend ``utils.cc`` ``getSamplingConfigFromTensors`` /
  ``createRequestsFromInputTensors`` (@c8c6df08), ``llmRequest.cpp`` ``LlmRequest::validate``
  (@89fd9b74).
* sampling defaults: ``cpp/tensorrt_llm/layers/topKSamplingLayer.cpp`` ``setup`` (@03961722) with
  ``invokeSetupTopKRuntimeArgs`` and ``cpp/tensorrt_llm/layers/defaultDecodingParams.h``
  (@1020a8d7): top_k unset means 0, top_p unset means 0.0, and k == 0 with p == 0 is greedy.

Request tensors. Triton adds a leading batch dimension of 1 to each tensor, because the config sets
``max_batch_size > 0``. Tensors declared with ``reshape: { shape: [ ] } `` arrive as shape [1].

======================= ======== ========== ====================================================
name                    dtype    shape      meaning
======================= ======== ========== ====================================================
input_ids               INT32    [1, L]     prompt token ids (required unless stop; 1 <= L <= max_input_len)
input_lengths           INT32    [1]        L (required by Triton; must equal the number of input_ids)
request_output_len      INT32    [1]        max new tokens (required by Triton, >= 1); reduced to
                                            max_seq_len - L, with a server warning, when larger
end_id                  INT32    [1]        end token in [-1, vocab); absent or -1: no end token
pad_id                  INT32    [1]        accepted and ignored (beam width 1 never pads)
stop_words_list         INT32    [1, 2, S]  row 0 token ids, row 1 cumulative end offsets (-1 pad)
bad_words_list          INT32    [1, 2, S]  same format
beam_width              INT32    [1]        only 1 is supported
temperature             FP32     [1]        >= 0, default 1.0; 0 means greedy
runtime_top_k           INT32    [1]        >= 0, default 0 (off); 1 means greedy; > 1024 clamped to 1024
runtime_top_p           FP32     [1]        <= 1; <= 0 or absent means unset. top_k 0 with top_p
                                            unset is greedy (as TensorRT-LLM's sampling layer)
len_penalty             FP32     [1]        >= 0; otherwise ignored (only used by beam search)
repetition_penalty      FP32     [1]        > 0, default 1.0 (multiplicative, prompt + output)
min_tokens              INT32    [1]        >= 0, default 0; end_id is banned until reached
presence_penalty        FP32     [1]        default 0.0 (additive, output tokens only)
frequency_penalty       FP32     [1]        default 0.0 (additive, output tokens only)
seed                    UINT64   [1]        sampling seed, default 0
exclude_input_in_output BOOL     [1]        default: the model parameter of the same name (false)
streaming               BOOL     [1]        default false
stop                    BOOL     [1]        true: stop the request whose Triton request id is this one's
return_log_probs        BOOL     [1]        default false
guided_decoding_guide_type STRING [1]       json, json_schema, regex or ebnf_grammar; any other value
                                            is ignored (the request is unguided), as upstream
guided_decoding_guide   STRING   [1]        the schema / regex / grammar (not needed for json)
lora_task_id            UINT64   [1]        the LoRA task (adapter); read with lora_weights and lora_config
lora_weights            FP32     [1, N, W]  per module-layer row: in weights [r, in] then out weights
                                            [out, r], flattened, zero-padded (float32: this model's dtype)
lora_config             INT32    [1, N, 3]  per row: module id, layer, rank r
======================= ======== ========== ====================================================

Response tensors (batch dimension 1, then the beam dimension):

* ``output_ids``: INT32 [1, 1, N]
* ``sequence_length``: INT32 [1, 1], equal to N
* ``cum_log_probs``: FP32 [1, 1] (only when return_log_probs is true)
* ``output_log_probs``: FP32 [1, 1, n] (only when return_log_probs is true; generated tokens only)

Streaming: every response carries only the tokens new since the previous one (N = 1 per step);
the last one has the FINAL flag. When the request ends on the end token, or is stopped, that last
response has N = 0. Non-streaming: one FINAL response with prompt + generated tokens (generated
only when exclude_input_in_output). A ``stop`` request gets one FINAL response without tensors.
Errors are one FINAL response with an INTERNAL error, as the C++ backend sends.

Guided decoding (structured output) follows the C++ path of TensorRT-LLM 1.1: the request's guide
is parsed as backend ``utils.cc`` ``getGuidedDecodingParamsFromTensors`` does (exact type strings,
unknown types silently ignored, a guide string required unless the type is ``json``); a guided
request to a model without guided decoding fails as the executor fails it (``executorImpl.cpp``
``fetchNewRequests``: "... GuidedDecoder is not setup ..."); and each step applies xgrammar's token
bitmask to the logits before penalties and sampling, after accepting the previous token
(``batch_manager/guidedDecoder.cpp`` ``GuidedDecoder::build`` / ``execute``, @000a01de). The
model is configured as upstream's Python model is: ``guided_decoding_backend: xgrammar`` and
``tokenizer_dir``, from which the xgrammar ``TokenizerInfo`` is made with the end token as the only
stop token (what ``tensorrt_llm.llmapi.tokenizer._xgrammar_tokenizer_info`` records). A guide xgrammar
cannot compile fails that request (the predictor refuses such guides before they get here).

LoRA adapters per request (lora_task_id, lora_weights, lora_config) follow the executor's semantics and
are applied with peft: ``lora.py`` beside this file has the upstream sources and the details (the cache
miss and cache full errors, the bounded cache that evicts, different adapters in one batch).

Layers, so that another engine (e.g. a token-rate stand-in) can reuse all but the generation:

* request parsing: :func:`parse_word_list`, :class:`SamplingParams`, :class:`ModelLimits`,
  :func:`parse_request` (numpy only);
* the per-request generation: anything with the :class:`TokenGenerator` protocol; here
  :class:`Generation` (transformers);
* in-flight batching: :class:`Scheduler` with :class:`Job` (FIFO queue, max queue size, stop by
  request id, client cancellation, response assembly) talking to a :class:`ResponseSink`;
* Triton glue: :class:`TritonSink` and :class:`TritonPythonModel` (``create_generation`` is the
  one place that builds generation objects, ``create_sink`` the one that builds response sinks).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import itertools
import json
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Deque, Dict, List, Optional, Protocol, Sequence

import numpy as np
import torch

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported by tests, outside Triton
    pb_utils = None

TRTLLM_VERSION = "1.1.0"  # the TensorRT-LLM release whose tensorrtllm backend we follow
#: The C++ backend's lora_cache_host_memory_bytes default (PeftCacheManagerConfig::kDefaultHostCacheSize, 1 GiB).
DEFAULT_LORA_CACHE_BYTES = 1 << 30


def _load_sibling(name: str):
    """``<name>.py`` beside this file, as a module (Triton loads model.py from its path, not as a package)."""
    module_name = f"tensorrt_llm_reference_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


lora_support = _load_sibling("lora")


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
        temperature: 0 means greedy. Otherwise logits are divided by it before top-k/top-p sampling.
        top_k: ``runtime_top_k``; 0 is off, 1 is greedy.
        top_p: ``runtime_top_p`` in (0, 1]; None is unset (upstream resets values <= 0 to unset).
            With top_k 0 and top_p unset, decoding is greedy: TensorRT-LLM's top-k layer turns
            k == 0 and p == 0.0 (both defaults) into k = 1 (topKSamplingLayer.cpp @03961722).
        length_penalty: ``len_penalty``; checked (>= 0), otherwise unused (beam search only).
        repetition_penalty: multiplicative, over prompt and generated tokens (as HF's
            RepetitionPenaltyLogitsProcessor). 1.0 turns it off.
        presence_penalty / frequency_penalty: additive, over generated tokens:
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


def _scalar(get: Callable[[str], Optional[np.ndarray]], name: str, kind: type, default):
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
    return bool(_scalar(get, "stop", bool, False))


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
    get: Callable[[str], Optional[np.ndarray]], limits: ModelLimits, request_number: int = 0
) -> ParsedRequest:
    """Read and validate one (non-stop) request's tensors, in upstream's order: tensors and sampling
    config first (backend ``utils.cc``), then ``LlmRequest::validate`` (end_id, prompt length,
    max_seq_len reduction).

    Args:
        get: returns the numpy array of an input tensor by name, or None when it is absent (shapes
            as in the module docstring, with or without the batch dimension).
        limits: the model's limits and defaults.
        request_number: used in executor-style error texts (upstream's executor request id).

    Raises:
        RequestError: the first problem found, with upstream's key phrase.
    """
    ids = get("input_ids")
    if ids is None:
        raise RequestError("input_ids is not present in the request.")
    ids = np.asarray(ids)
    if ids.ndim == 2:
        if ids.shape[0] != 1:
            raise RequestError(
                f"input_ids has batch size {ids.shape[0]}; this reference model takes one sequence per request"
            )
        ids = ids[0]
    elif ids.ndim != 1:
        raise RequestError(f"input_ids must have shape [1, L], got {list(ids.shape)}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise RequestError(f"input_ids must be int32, got dtype {ids.dtype}")
    prompt = [int(t) for t in ids]

    if get("input_lengths") is not None:
        input_len = _scalar(get, "input_lengths", int, None)
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

    if get("request_output_len") is None:
        raise RequestError("request_output_len is not present in the request")
    output_len = _scalar(get, "request_output_len", int, None)

    beam_width = _scalar(get, "beam_width", int, 1)
    if beam_width != 1:
        raise RequestError(
            f"beam_width must be 1 (beam search is not supported by this reference model), got {beam_width}"
        )

    top_p = _scalar(get, "runtime_top_p", float, None)
    if top_p is not None and top_p <= 0.0:
        top_p = None  # backend utils.cc getSamplingConfigFromTensors: "if (topP <= 0) topP.reset()"
    end_id = _scalar(get, "end_id", int, None)
    params = SamplingParams(
        max_new_tokens=output_len,
        end_id=end_id,
        temperature=_scalar(get, "temperature", float, 1.0),
        top_k=_scalar(get, "runtime_top_k", int, 0),
        top_p=top_p,
        length_penalty=_scalar(get, "len_penalty", float, 0.0),
        repetition_penalty=_scalar(get, "repetition_penalty", float, 1.0),
        presence_penalty=_scalar(get, "presence_penalty", float, 0.0),
        frequency_penalty=_scalar(get, "frequency_penalty", float, 0.0),
        min_tokens=_scalar(get, "min_tokens", int, 0),
        seed=_scalar(get, "seed", int, 0),
        stop_words=parse_word_list(get("stop_words_list"), "stop_words_list"),
        bad_words=parse_word_list(get("bad_words_list"), "bad_words_list"),
        return_log_probs=_scalar(get, "return_log_probs", bool, False),
    )
    params.validate()
    top_k_clamped = params.top_k > TOP_K_MAX
    if top_k_clamped:
        params.top_k = TOP_K_MAX
    parsed = ParsedRequest(
        prompt_ids=prompt,
        params=params,
        streaming=_scalar(get, "streaming", bool, False),
        exclude_input_in_output=_scalar(get, "exclude_input_in_output", bool, limits.exclude_input_in_output),
        guide=parse_guide(get),
    )
    if top_k_clamped:  # the sampling layer's clamp: a server log line, the request goes on
        parsed.warnings.append(
            f"TopK ({_scalar(get, 'runtime_top_k', int, 0)}) is larger than max supported number ({TOP_K_MAX}). "
            "Clip to max supported number."
        )
    if parsed.guide is not None and not limits.guided_decoding:
        raise RequestError(
            executor_error(
                request_number,
                "Request is specified with GuidedDecodingParams, but GuidedDecoder is not setup. Please provide a "
                "valid GuidedDecodingConfig to setup GuidedDecoder.",
            )
        )

    # LlmRequest::validate (llmRequest.cpp @89fd9b74), in its order.
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
    # PeftCacheManager::addRequestPeft runs after LlmRequest::validate in fetchNewRequests (executorImpl.cpp);
    # the LoraConfig constructor's checks run in the backend, before the executor (utils.cc), but fail the
    # request the same way for a client.
    try:
        parsed.lora = lora_support.parse_lora(get, limits.lora)
    except lora_support.LoraRequestError as exc:
        raise RequestError(lora_error_text(request_number, exc)) from None
    return parsed


def lora_error_text(request_number: int, exc: "lora_support.LoraRequestError") -> str:
    """A LoRA error as the client reads it: the backend's own errors as they are, the executor's with its
    prefixes (see ``lora.STAGES``)."""
    if exc.stage == "backend":
        return str(exc)
    if exc.stage == "expected":
        return executor_response_error(request_number, str(exc))
    return executor_error(request_number, str(exc))


# ------------------------------------------------------------------------------------------------
# Generation (one request)
# ------------------------------------------------------------------------------------------------


def _ends_with(seq: Sequence[int], suffix: Sequence[int]) -> bool:
    n = len(suffix)
    return n <= len(seq) and list(seq[len(seq) - n :]) == list(suffix)


def stop_word_end(context: Sequence[int], n_new: int, stop_words: Sequence[Sequence[int]]) -> Optional[int]:
    """Where the first stop word completed by the last ``n_new`` tokens of ``context`` ends.

    As TensorRT-LLM's ``stopWordsCriterion`` (stopCriteriaKernels.cu @9b931c0f): the word is compared
    against prompt + output, ending at a newly generated token, so its earlier tokens may lie in the
    prompt but a word wholly inside the prompt never matches.

    Returns:
        The length of ``context`` up to and including the stop word (the output keeps it), or None.
    """
    first_new = len(context) - n_new
    for end in range(first_new + 1, len(context) + 1):
        head = context[:end]
        if any(word and _ends_with(head, word) for word in stop_words):
            return end
    return None


class TokenGenerator(Protocol):
    """What the :class:`Scheduler` needs from a request's generation.

    Attributes:
        prompt_ids: the prompt.
        params: its sampling parameters (``return_log_probs`` is read).
        tokens: the accepted generated tokens so far, never the end token.
        log_probs: one per token in ``tokens`` when ``params.return_log_probs``.
        finished / finish_reason: set once it ends ("end_id", "length", "stop_words", "stopped",
            "cancelled", "error").
    """

    prompt_ids: List[int]
    params: SamplingParams
    tokens: List[int]
    log_probs: List[float]
    finished: bool
    finish_reason: Optional[str]

    def step(self) -> List[int]:
        """Run one decoding step; return the tokens it accepted (possibly none)."""
        ...

    def stop(self, reason: str) -> None:
        """End now and free resources."""
        ...


def load_model(hf_model_dir: str, torch_threads: int = 0):
    """Load a causal LM in float32 for CPU inference (``eval()``, no gradients).

    ``torch_threads`` > 0 calls ``torch.set_num_threads``; 0 leaves the torch default.
    """
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    if torch_threads > 0:
        torch.set_num_threads(torch_threads)
    model = AutoModelForCausalLM.from_pretrained(hf_model_dir, dtype=torch.float32, local_files_only=True)
    model.eval()
    model.requires_grad_(False)
    return model


def vocab_size_of(model) -> int:
    """Number of rows of the input embedding (valid token ids are [0, this))."""
    return int(model.get_input_embeddings().num_embeddings)


class Generation:
    """One request's decoding with a transformers model: its own KV cache (DynamicCache) and RNG.

    ``step()`` runs one forward pass: the prefill of the whole prompt on the first call, then one
    token per call. It returns ``[token]``, or ``[]`` when the step ended the generation on the end
    token (which is not kept, as upstream). After a step, ``finished`` may be True
    (request_output_len reached, stop word completed, end token).

    Per step, the logits of the last position (float32) go through, in order: repetition_penalty;
    presence/frequency penalties; min_tokens (end_id banned); bad words. Then comes greedy argmax
    (see :attr:`SamplingParams.greedy`), or temperature -> top_k -> top_p -> multinomial sampling
    with the request's generator.
    """

    def __init__(self, model, prompt_ids: Sequence[int], params: SamplingParams, grammar=None,
                 adapter: Optional[str] = None, applier=None) -> None:
        from transformers import (  # noqa: PLC0415
            RepetitionPenaltyLogitsProcessor,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        self.model = model
        self.adapter = adapter  # the LoRA adapter each forward pass runs with (None: the base model)
        self._applier = applier  # lora.PeftApplier when the model serves LoRA
        self.prompt_ids: List[int] = [int(t) for t in prompt_ids]
        self.params = params
        self.tokens: List[int] = []
        self.log_probs: List[float] = []
        self.finished = False
        self.finish_reason: Optional[str] = None
        self._cache = None
        self._pending: Optional[int] = None  # generated token not yet fed to the model
        self._started = False
        self._generator = torch.Generator(device="cpu")
        self._generator.manual_seed(int(params.seed))
        self._counts: Optional[torch.Tensor] = None  # occurrences of each token id in self.tokens
        self._repetition = (
            RepetitionPenaltyLogitsProcessor(float(params.repetition_penalty))
            if params.repetition_penalty != 1.0
            else None
        )
        self._warpers = []
        if not params.greedy:
            if params.temperature != 1.0:
                self._warpers.append(TemperatureLogitsWarper(float(params.temperature)))
            if params.top_k > 0:
                self._warpers.append(TopKLogitsWarper(int(params.top_k)))
            if params.top_p is not None and params.top_p < 1.0:
                self._warpers.append(TopPLogitsWarper(float(params.top_p)))
        self._single_bad = sorted({w[0] for w in params.bad_words if len(w) == 1})
        self._multi_bad = [w for w in params.bad_words if len(w) > 1]
        self._keep_arg = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._matcher = None
        if grammar is not None:
            import xgrammar  # noqa: PLC0415 - only for guided requests

            self._xgr = xgrammar
            self._matcher = xgrammar.GrammarMatcher(grammar)
            self._bitmask = xgrammar.allocate_token_bitmask(1, vocab_size_of(model))

    @property
    def cum_log_prob(self) -> float:
        """Sum of the chosen tokens' log-probabilities (when return_log_probs)."""
        return float(sum(self.log_probs))

    def stop(self, reason: str) -> None:
        """End the generation now (``reason`` goes to finish_reason) and free its KV cache."""
        if not self.finished:
            self.finished = True
            self.finish_reason = reason
        self._cache = None
        self._pending = None

    def _forward(self, ids: List[int]) -> torch.Tensor:
        kwargs = {"input_ids": torch.tensor([ids], dtype=torch.long), "past_key_values": self._cache, "use_cache": True}
        if self._keep_arg:
            kwargs["logits_to_keep"] = 1
        out = self.model(**kwargs)
        self._cache = out.past_key_values
        return out.logits[0, -1, :].float().unsqueeze(0)  # [1, vocab]

    def _process(self, logits: torch.Tensor) -> torch.Tensor:
        p = self.params
        vocab = logits.shape[-1]
        if self._repetition is not None:
            context = torch.tensor([self.prompt_ids + self.tokens], dtype=torch.long)
            logits = self._repetition(context, logits)
        if self.tokens and (p.presence_penalty != 0.0 or p.frequency_penalty != 0.0):
            counts = self._counts[:vocab].to(logits.dtype).unsqueeze(0)
            logits = logits - p.presence_penalty * (counts > 0).to(logits.dtype) - p.frequency_penalty * counts
        if p.end_id is not None and len(self.tokens) < p.min_tokens and 0 <= p.end_id < vocab:
            # With a guide that allows nothing but the end token (the document is complete), the end
            # token is still chosen: TensorRT-LLM's bitmask writes -inf (logitsBitmask.cu), its min-length
            # penalty only -FLT_MAX (penaltyKernels.cu batchApplyPenalty), which stays the maximum.
            others = torch.cat([logits[0, : p.end_id], logits[0, p.end_id + 1 :]])
            if self._matcher is None or bool(torch.isfinite(others).any()):
                logits[0, p.end_id] = float("-inf")
        if self._single_bad or self._multi_bad:
            banned = [t for t in self._single_bad if 0 <= t < vocab]
            if self._multi_bad:
                context = self.prompt_ids + self.tokens
                for word in self._multi_bad:
                    if 0 <= word[-1] < vocab and _ends_with(context, word[:-1]):
                        banned.append(word[-1])
            if banned:
                logits[0, banned] = float("-inf")
        return logits

    def _choose(self, logits: torch.Tensor) -> tuple[int, torch.Tensor]:
        if self.params.greedy:
            return int(torch.argmax(logits, dim=-1)[0]), logits
        dummy_ids = torch.zeros((1, 1), dtype=torch.long)  # warpers ignore input_ids
        for warper in self._warpers:
            logits = warper(dummy_ids, logits)
        probs = torch.softmax(logits, dim=-1)
        token = int(torch.multinomial(probs, num_samples=1, generator=self._generator)[0, 0])
        return token, logits

    def step(self) -> List[int]:
        """Run one decoding step. Returns the accepted new tokens: ``[token]``, or ``[]``."""
        if self.finished:
            return []
        applier = self._applier
        with torch.inference_mode():
            with applier.lock if applier is not None else contextlib.nullcontext():
                if applier is not None:
                    applier.use(self.adapter)
                if not self._started:
                    self._started = True
                    logits = self._forward(self.prompt_ids)
                else:
                    logits = self._forward([self._pending])
            self._pending = None
            if self._matcher is not None:
                # GuidedDecoder::build fills the bitmask after accepting the last token; execute applies it
                # to the logits before the sampling layers (penalties, min length, top-k/top-p).
                self._matcher.fill_next_token_bitmask(self._bitmask)
                self._xgr.apply_token_bitmask_inplace(logits, self._bitmask)
            logits = self._process(logits)
            token, final_logits = self._choose(logits)
            log_prob = None
            if self.params.return_log_probs:
                log_prob = float(torch.log_softmax(final_logits, dim=-1)[0, token])
        p = self.params
        if p.end_id is not None and token == p.end_id:
            self.stop("end_id")  # the end token is not returned, so neither is its log-prob
            return []
        if self._matcher is not None and not self._matcher.accept_token(token):
            raise RuntimeError(f"the guide's matcher refused token {token}, which its own bitmask allowed")
        self.tokens.append(token)
        if log_prob is not None:
            self.log_probs.append(log_prob)
        if self._counts is None:
            self._counts = torch.zeros(max(logits.shape[-1], token + 1), dtype=torch.float32)
        self._counts[token] += 1
        if p.stop_words and stop_word_end(self.prompt_ids + self.tokens, 1, p.stop_words) is not None:
            self.stop("stop_words")
        elif len(self.tokens) >= p.max_new_tokens:
            self.stop("length")
        else:
            self._pending = token
        return [token]

    def run(self) -> List[int]:
        """Step until finished. Returns the generated tokens (without end_id)."""
        while not self.finished:
            self.step()
        return list(self.tokens)


# ------------------------------------------------------------------------------------------------
# In-flight batching scheduler
# ------------------------------------------------------------------------------------------------


class ResponseSink(Protocol):
    """Where a job's responses go. In Triton this is a response sender (:class:`TritonSink`)."""

    def send_tokens(self, tokens: List[int], log_probs: Optional[List[float]], cum_log_prob: Optional[float],
                    final: bool) -> None: ...

    def send_error(self, message: str) -> None: ...

    def is_cancelled(self) -> bool: ...


@dataclass
class Job:
    """A queued or running request.

    Attributes:
        generation: its decoding state (any :class:`TokenGenerator`).
        sink: where responses go.
        streaming: one response per step with the new tokens (True), or one at the end (False).
        prefix_ids: prepended to the non-streaming output (the prompt unless
            exclude_input_in_output). Never streamed.
        request_id: Triton's request id. A later request with ``stop`` true and the same id stops it.
        stop_requested: set by such a stop request; the scheduler ends the job at its next turn.
        sent: tokens already streamed.
    """

    generation: TokenGenerator
    sink: ResponseSink
    streaming: bool = False
    prefix_ids: List[int] = field(default_factory=list)
    request_id: str = ""
    stop_requested: bool = False
    sent: int = 0
    on_done: Optional[Callable[[], None]] = None  # called once when the job leaves the scheduler

    def done(self) -> None:
        callback, self.on_done = self.on_done, None
        if callback is not None:
            callback()


class Scheduler:
    """In-flight batching on one background thread, with the executor's queue and stop semantics.

    At most ``max_active`` jobs are active; the others wait in FIFO order and are never rejected,
    unless ``max_queue_size`` > 0 and the waiting (not-yet-scheduled) jobs would exceed it
    (``Executor::Impl::enqueueRequests``, executorImpl.cpp @b35ac1b6: "Maximum queue size of %d has
    been reached, please try again later"; active jobs do not count). Each loop iteration admits
    waiting jobs into free slots, then runs ONE step for each active job in turn (round robin).

    A job ends with one FINAL response that is never an error unless generation raised:
    streaming - the tokens not yet sent (possibly none); non-streaming - prefix + all tokens. That
    holds for the end token, length, stop words, a ``stop`` request and a client cancel alike
    (``terminateCancelledRequests`` then ``createResult``, executorImpl.cpp / llmRequest.cpp).

    ``request_stop(id)`` stops the latest job submitted with that request id, queued or running
    (backend ``mTritonRequestIdToRequestIds``: a later request with the same id replaces the entry,
    which is dropped when that request ends).
    """

    def __init__(self, max_active: int, max_queue_size: int = 0,
                 log: Callable[[str, str], None] = lambda level, msg: None) -> None:
        if max_active < 1:
            raise ValueError(f"max_active must be >= 1, got {max_active}")
        self.max_active = max_active
        self.max_queue_size = max_queue_size
        self._log = log
        self._cond = threading.Condition()
        self._waiting: Deque[Job] = deque()
        self._active: List[Job] = []
        self._by_id: Dict[str, Job] = {}
        self._closing = False
        self._thread: Optional[threading.Thread] = None

    # -- API used by the model (any thread) -------------------------------------------------------
    def start(self) -> None:
        """Start the scheduler thread (daemon)."""
        self._thread = threading.Thread(target=self._loop, name="reference-llm-scheduler", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job (FIFO); it becomes active at once when a slot is free and nobody waits.

        Raises:
            QueueFullError: ``max_queue_size`` > 0 and that many jobs already wait.
            RuntimeError: the scheduler is shutting down.
        """
        with self._cond:
            if self._closing:
                raise RuntimeError("the model is shutting down")
            if not self._waiting and len(self._active) < self.max_active:
                self._active.append(job)
            else:
                if self.max_queue_size > 0 and len(self._waiting) + 1 > self.max_queue_size:
                    raise QueueFullError(
                        f"Maximum queue size of {self.max_queue_size} has been reached, please try again later"
                    )
                self._waiting.append(job)
            if job.request_id:
                self._by_id[job.request_id] = job
            self._cond.notify()

    def request_stop(self, request_id: str) -> bool:
        """Ask the job last submitted with this request id to stop. Returns whether one was found."""
        with self._cond:
            job = self._by_id.get(request_id) if request_id else None
            if job is None:
                return False
            job.stop_requested = True
            self._cond.notify()
            return True

    def counts(self) -> tuple[int, int]:
        """(active, waiting) job counts."""
        with self._cond:
            return len(self._active), len(self._waiting)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop the thread. Jobs still queued or running get an error response."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._cond:
            left = list(self._active) + list(self._waiting)
            self._active.clear()
            self._waiting.clear()
            self._by_id.clear()
        for job in left:
            job.generation.stop("error")
            job.done()
            self._safe(job, lambda j=job: j.sink.send_error("the model was unloaded before the request finished"))

    # -- scheduler thread -------------------------------------------------------------------------
    def _safe(self, job: Job, fn: Callable[[], None]) -> bool:
        try:
            fn()
            return True
        except Exception as exc:  # noqa: BLE001 - a broken sender must not kill the loop
            self._log("warn", f"could not send a response for request {job.request_id!r}: {exc}")
            return False

    def _log_probs(self, job: Job, start: int, end: int):
        gen = job.generation
        if not gen.params.return_log_probs:
            return None, None
        return list(gen.log_probs[start:end]), float(sum(gen.log_probs[:end]))

    def _finish(self, job: Job) -> None:
        """Send the FINAL response of a job whose generation has ended (not for errors)."""
        gen = job.generation
        if job.streaming:
            new = list(gen.tokens[job.sent:])
            lp, cum = self._log_probs(job, job.sent, len(gen.tokens))
            job.sent = len(gen.tokens)
            self._safe(job, lambda: job.sink.send_tokens(new, lp, cum, True))
            return
        tokens = list(job.prefix_ids) + list(gen.tokens)
        lp, cum = self._log_probs(job, 0, len(gen.tokens))
        self._safe(job, lambda: job.sink.send_tokens(tokens, lp, cum, True))

    def _run_one(self, job: Job) -> bool:
        """One turn of one job. Returns True while the job stays active."""
        gen = job.generation
        try:
            if job.sink.is_cancelled():
                gen.stop("cancelled")
                self._log("info", f"request {job.request_id!r} cancelled by the client after {len(gen.tokens)} tokens")
                self._finish(job)
                return False
            if job.stop_requested:
                gen.stop("stopped")
                self._finish(job)
                return False
            gen.step()
            if gen.finished:
                self._finish(job)
                return False
            if job.streaming and len(gen.tokens) > job.sent:
                start, job.sent = job.sent, len(gen.tokens)
                new = list(gen.tokens[start:])
                lp, cum = self._log_probs(job, start, len(gen.tokens))
                if not self._safe(job, lambda: job.sink.send_tokens(new, lp, cum, False)):
                    gen.stop("cancelled")
                    return False
            return True
        except Exception as exc:  # noqa: BLE001 - one request's failure must not end the others
            gen.stop("error")
            self._log("error", f"request {job.request_id!r} failed: {traceback.format_exc()}")
            message = f"generation failed: {type(exc).__name__}: {exc}"
            self._safe(job, lambda: job.sink.send_error(message))
            return False

    def _retire(self, job: Job) -> None:
        with self._cond:
            if job in self._active:
                self._active.remove(job)
            if job.request_id and self._by_id.get(job.request_id) is job:
                del self._by_id[job.request_id]
        job.done()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closing and not self._active and not self._waiting:
                    self._cond.wait()
                if self._closing:
                    return
                while self._waiting and len(self._active) < self.max_active:
                    self._active.append(self._waiting.popleft())
                turn = list(self._active)
            for job in turn:
                try:
                    keep = self._run_one(job)
                except Exception:  # noqa: BLE001 - never let the thread die
                    keep = False
                    self._log("error", traceback.format_exc())
                if not keep:
                    self._retire(job)
                if self._closing:
                    break


# ------------------------------------------------------------------------------------------------
# Triton glue
# ------------------------------------------------------------------------------------------------


def _triton_error(message: str):
    # The C++ backend reports every request error as TRITONSERVER_ERROR_INTERNAL.
    code = getattr(pb_utils.TritonError, "INTERNAL", None)
    if code is not None:
        try:
            return pb_utils.TritonError(message, code)
        except TypeError:
            pass
    return pb_utils.TritonError(message)


def send_error(sender, message: str) -> None:
    """Send an error response with the FINAL flag on a decoupled sender."""
    response = pb_utils.InferenceResponse(output_tensors=[], error=_triton_error(message))
    sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def send_empty_final(sender) -> None:
    """A real response without output tensors, FINAL: what ``sendEnqueueResponse`` sends to a stop
    request. Through HTTP generate_stream it is one event with only id/model_name/model_version; a
    flags-only ``sender.send(flags=FINAL)`` would give no event at all."""
    sender.send(pb_utils.InferenceResponse(output_tensors=[]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


class TritonSink:
    """Turns scheduler events into responses on a Triton decoupled response sender."""

    def __init__(self, sender) -> None:
        self.sender = sender
        self._can_check_cancel = hasattr(sender, "is_cancelled")

    def send_tokens(self, tokens, log_probs, cum_log_prob, final) -> None:
        """One response with output_ids [1, 1, n] and sequence_length [[n]] (n may be 0)."""
        outputs = [
            pb_utils.Tensor("output_ids", np.asarray(tokens, dtype=np.int32).reshape(1, 1, len(tokens))),
            pb_utils.Tensor("sequence_length", np.asarray([[len(tokens)]], dtype=np.int32)),
        ]
        if log_probs is not None:
            outputs.append(pb_utils.Tensor("cum_log_probs", np.asarray([[cum_log_prob]], dtype=np.float32)))
            lp = np.asarray(log_probs, dtype=np.float32).reshape(1, 1, len(log_probs))
            outputs.append(pb_utils.Tensor("output_log_probs", lp))
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        self.sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=flags)

    def send_error(self, message: str) -> None:
        send_error(self.sender, message)

    def is_cancelled(self) -> bool:
        return bool(self._can_check_cancel and self.sender.is_cancelled())


def _param(params: dict, key: str, default, conv):
    raw = params.get(key, {}).get("string_value", "") if isinstance(params.get(key), dict) else ""
    raw = raw.strip()
    if raw == "" or raw.startswith("${"):
        return default
    if conv is bool:
        low = raw.lower()
        if low in ("true", "1", "yes", "y", "t"):
            return True
        if low in ("false", "0", "no", "n", "f"):
            return False
        raise ValueError(f"parameter {key} must be true or false, got {raw!r}")
    try:
        return conv(raw)
    except ValueError:
        raise ValueError(f"parameter {key} must be {conv.__name__}, got {raw!r}") from None


def executor_max_input_len(
    max_input_len: int, max_seq_len: int, max_num_tokens: Optional[int], enable_chunked_context: bool
) -> int:
    """The longest prompt (tokens) the executor takes, as the ``TrtGptModel`` constructor sets it
    (cpp/tensorrt_llm/batch_manager/trtGptModel.h): ``max_seq_len - 1`` with chunked context; else
    ``min(max_seq_len - 1, max_num_tokens)`` for an engine with context FMHA and packed input (what
    ``trtllm-build`` 1.1 builds by default; this model stands for one when ``max_num_tokens`` is given);
    else the engine's ``max_input_len``. A longer prompt fails ``LlmRequest::validate``."""
    if enable_chunked_context:
        return max_seq_len - 1
    if max_num_tokens is not None:
        return min(max_seq_len - 1, max_num_tokens)
    return max_input_len


def max_queue_size_of(model_config: dict) -> int:
    """``dynamic_batching.default_queue_policy.max_queue_size`` (0 = unlimited), where the C++
    backend's ``getExecutorConfigFromParams`` reads the executor's maxQueueSize from."""
    policy = (model_config.get("dynamic_batching") or {}).get("default_queue_policy") or {}
    try:
        return max(0, int(policy.get("max_queue_size", 0) or 0))
    except (TypeError, ValueError):
        return 0


class TritonPythonModel:
    """The ``tensorrt_llm`` model (decoupled): validates and queues requests for the :class:`Scheduler`.

    Model parameters (string values): hf_model_dir (required), max_input_len, max_seq_len (default:
    the checkpoint's max_position_embeddings), max_num_tokens and enable_chunked_context (which with
    them set the longest prompt as the executor does: :func:`executor_max_input_len`),
    max_active_requests (default 1),
    exclude_input_in_output (default false, as upstream), torch_threads (0 = torch default).
    ``dynamic_batching { default_queue_policy { max_queue_size: N } }`` caps the waiting requests.

    Another engine reuses this class by overriding :meth:`load_engine` and :meth:`create_generation`
    (and :meth:`create_sink` to send responses from its own threads).
    """

    def _log(self, level: str, message: str) -> None:
        logger = getattr(pb_utils, "Logger", None) if pb_utils is not None else None
        if logger is None:
            print(f"[tensorrt_llm reference] {level}: {message}", flush=True)
            return
        try:
            {"info": logger.log_info, "warn": logger.log_warn, "error": logger.log_error}.get(
                level, logger.log_info
            )(f"[tensorrt_llm reference] {message}")
        except Exception:  # noqa: BLE001
            print(f"[tensorrt_llm reference] {level}: {message}", flush=True)

    # -- engine hooks -----------------------------------------------------------------------------
    def load_engine(self, params: dict) -> tuple[int, int]:
        """Load what generates tokens. Returns (vocab_size, default max_seq_len)."""
        hf_model_dir = _param(params, "hf_model_dir", "", str)
        if not hf_model_dir:
            raise ValueError("parameter hf_model_dir is required (a Hugging Face checkpoint directory)")
        self.model = load_model(hf_model_dir, _param(params, "torch_threads", 0, int))
        torch.set_grad_enabled(False)
        self.engine_name = f"{hf_model_dir} (torch threads {torch.get_num_threads()})"
        n_pos = int(getattr(self.model.config, "max_position_embeddings", 0) or 0) or 2048
        self.load_guided_decoder(params, vocab_size_of(self.model))
        return vocab_size_of(self.model), n_pos

    def load_guided_decoder(self, params: dict, vocab_size: int) -> None:
        """xgrammar's compiler for this tokenizer when ``guided_decoding_backend`` is xgrammar (else None).

        Raises:
            ValueError: another backend name (the C++ backend's load error), or no tokenizer_dir.
        """
        self.grammar_compiler = None
        backend = _param(params, "guided_decoding_backend", "", str)
        if not backend:
            return
        if backend != "xgrammar":
            raise ValueError(
                "Guided decoding is currently supported with 'xgrammar' backend. Invalid guided_decoding_backend "
                f"parameter provided: {backend!r}"
            )
        tokenizer_dir = _param(params, "tokenizer_dir", "", str)
        if not tokenizer_dir:
            raise ValueError("guided_decoding_backend xgrammar needs the tokenizer_dir parameter (a tokenizer folder)")
        import xgrammar  # noqa: PLC0415
        from transformers import AutoTokenizer  # noqa: PLC0415

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=[int(tokenizer.eos_token_id)]
        )
        self._xgr = xgrammar
        self.grammar_compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=True)

    def compile_guide(self, guide: GuideSpec):
        """The compiled grammar for a guide, as ``GuidedDecoder::build`` compiles each type."""
        compiler, xgr = self.grammar_compiler, self._xgr
        if guide.guide_type == "json":
            return compiler.compile_builtin_json_grammar()
        if guide.guide_type == "json_schema":
            return compiler.compile_json_schema(guide.guide)
        if guide.guide_type == "regex":
            return compiler.compile_grammar(xgr.Grammar.from_regex(guide.guide))
        return compiler.compile_grammar(xgr.Grammar.from_ebnf(guide.guide))

    def create_generation(self, parsed: ParsedRequest) -> TokenGenerator:
        """The per-request generation object for a validated request."""
        return Generation(self.model, parsed.prompt_ids, parsed.params, grammar=parsed.grammar,
                          adapter=parsed.adapter, applier=getattr(self, "lora_applier", None))

    def create_lora_applier(self):
        """What applies cached LoRA tasks to the model (peft), or None to only keep the cache (a stand-in)."""
        return lora_support.PeftApplier(self.model)

    def load_lora(self, params: dict) -> None:
        """The model's LoRA build and cache, from the parameters lora_plugin (empty: no LoRA), max_lora_rank,
        lora_target_modules, lora_model_shape and lora_cache_host_memory_bytes (default 1 GiB, as upstream)."""
        self.lora_model = None
        self.lora_applier = None
        self.lora_cache = None
        if not _param(params, "lora_plugin", "", str):
            return
        self.lora_model = lora_support.LoraModel.from_parameters(
            _param(params, "lora_target_modules", "", str), _param(params, "max_lora_rank", "", str),
            _param(params, "lora_model_shape", "", str),
        )
        if self.lora_model is None:
            raise ValueError("lora_plugin is set but lora_target_modules, max_lora_rank or lora_model_shape is not")
        self.lora_applier = self.create_lora_applier()
        applier = self.lora_applier
        self.lora_cache = lora_support.LoraCache(
            self.lora_model, _param(params, "lora_cache_host_memory_bytes", DEFAULT_LORA_CACHE_BYTES, int),
            on_store=applier.store if applier is not None else (lambda task, rows: None),
            on_evict=applier.evict if applier is not None else (lambda handle: None),
        )

    def create_sink(self, sender) -> ResponseSink:
        """Where a request's responses go: its Triton response sender, called from the scheduler
        thread. (A stand-in engine may hand them to sender threads of its own, as the C++ backend
        sends from its WaitForResponse thread.)"""
        return TritonSink(sender)

    # -- Triton API -------------------------------------------------------------------------------
    def initialize(self, args) -> None:
        cfg = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(cfg):
            raise ValueError("the tensorrt_llm reference model needs model_transaction_policy { decoupled: true }")
        params = cfg.get("parameters", {})
        started = time.monotonic()
        vocab_size, n_pos = self.load_engine(params)
        max_seq_len = _param(params, "max_seq_len", n_pos, int)
        max_input_len = _param(params, "max_input_len", max_seq_len - 1, int)
        max_active = _param(params, "max_active_requests", 1, int)
        max_num_tokens = _param(params, "max_num_tokens", None, int)
        chunked = _param(params, "enable_chunked_context", False, bool)
        bad_num_tokens = max_num_tokens is not None and max_num_tokens < 1
        if max_input_len < 1 or max_seq_len < 2 or max_active < 1 or bad_num_tokens:
            raise ValueError(
                f"need max_input_len >= 1, max_seq_len >= 2, max_active_requests >= 1 and max_num_tokens >= 1 (or "
                f"empty); got {max_input_len}, {max_seq_len}, {max_active}, {max_num_tokens}"
            )
        engine_max_input_len = max_input_len
        max_input_len = executor_max_input_len(max_input_len, max_seq_len, max_num_tokens, chunked)
        if max_seq_len > n_pos:
            self._log("warn", f"max_seq_len {max_seq_len} exceeds the checkpoint's max_position_embeddings {n_pos}")
        exclude = _param(params, "exclude_input_in_output", None, bool)
        if exclude is None:
            # the constructor's wording (model_instance_state.cc)
            self._log("warn", "exclude_input_in_output is not specified, will be set to false")
            exclude = False
        self.load_lora(params)
        self.limits = ModelLimits(
            max_input_len=max_input_len, max_seq_len=max_seq_len, vocab_size=vocab_size,
            exclude_input_in_output=exclude,
            guided_decoding=getattr(self, "grammar_compiler", None) is not None,
            lora=self.lora_model,
        )
        max_queue = max_queue_size_of(cfg)
        self._request_numbers = itertools.count(1)
        self.scheduler = Scheduler(max_active, max_queue_size=max_queue, log=self._log)
        self.scheduler.start()
        self._log(
            "info",
            f"loaded {self.engine_name} in {time.monotonic() - started:.1f} s (TensorRT-LLM {TRTLLM_VERSION} "
            f"tensorrtllm backend behaviour); max_input_len={max_input_len} (engine {engine_max_input_len}, "
            f"max_num_tokens {max_num_tokens}, chunked context {chunked}) max_seq_len={max_seq_len} "
            f"max_active_requests={max_active} max_queue_size={max_queue or 'unlimited'} "
            f"exclude_input_in_output={exclude} guided_decoding={'xgrammar' if self.limits.guided_decoding else 'off'} "
            f"lora={self._lora_summary()}",
        )

    def _lora_summary(self) -> str:
        model = self.lora_model
        if model is None:
            return "off"
        return (f"max_lora_rank {model.max_rank}, modules {'/'.join(model.target_modules)}, cache "
                f"{self.lora_cache.budget_bytes} bytes")

    def execute(self, requests):
        for request in requests:
            try:
                self._enqueue(request)
            except Exception as exc:  # noqa: BLE001 - never fail the whole batch
                self._log("error", f"could not handle a request: {traceback.format_exc()}")
                try:
                    message = f"could not handle the request: {type(exc).__name__}: {exc}"
                    send_error(request.get_response_sender(), message)
                except Exception:  # noqa: BLE001
                    pass
        return None

    def _enqueue(self, request) -> None:
        sender = request.get_response_sender()
        get = lambda name, r=request: _input(r, name)  # noqa: E731
        request_id = request.request_id() if hasattr(request, "request_id") else ""
        try:
            stop = is_stop_request(get)
        except RequestError as exc:
            self._safe_send_error(sender, str(exc))
            return
        if stop:  # handleStopRequest: before any other input is read
            if not request_id:
                self._safe_send_error(sender, "Trying to stop a request but request ID is not provided")
                return
            found = self.scheduler.request_stop(request_id)
            self._log("info", f"stop request for id {request_id!r}: {int(found)} running request(s) stopped")
            try:
                send_empty_final(sender)
            except Exception as exc:  # noqa: BLE001
                self._log("warn", f"could not answer a stop request: {exc}")
            return
        requested = _requested_outputs(request)
        for name in ("output_ids", "sequence_length"):
            if requested is not None and name not in requested:
                # fillTritonResponse sends this (as the first response) when the client lists outputs
                self._safe_send_error(
                    sender, f"Error encountered while populating response: {name} tensor must be present in list "
                    "of output tensors"
                )
                return
        number = next(self._request_numbers)
        try:
            parsed = parse_request(get, self.limits, request_number=number)
        except RequestError as exc:
            self._safe_send_error(sender, str(exc))
            return
        for warning in parsed.warnings:
            self._log("warn", warning)
        if parsed.guide is not None:
            try:
                parsed.grammar = self.compile_guide(parsed.guide)
            except Exception as exc:  # noqa: BLE001 - xgrammar's RuntimeError for a bad schema/regex/grammar
                message = f"guided decoding could not compile the {parsed.guide.guide_type} guide: {exc}"
                self._safe_send_error(sender, message)
                return
        on_done = None
        if parsed.lora is not None and self.lora_cache is not None:
            user = object()
            try:
                parsed.adapter = self.lora_cache.admit(parsed.lora, user)
            except lora_support.LoraRequestError as exc:
                text = lora_error_text(number, exc)
                self._log("warn", text)
                self._safe_send_error(sender, text)
                return
            task_id = parsed.lora.task_id
            on_done = lambda cache=self.lora_cache, u=user: cache.release(task_id, u)  # noqa: E731
        job = Job(
            generation=self.create_generation(parsed),
            sink=self.create_sink(sender),
            streaming=parsed.streaming,
            prefix_ids=[] if parsed.exclude_input_in_output else list(parsed.prompt_ids),
            request_id=request_id,
            on_done=on_done,
        )
        try:
            self.scheduler.submit(job)
        except RequestError as exc:
            job.done()
            self._safe_send_error(sender, str(exc))

    def _safe_send_error(self, sender, message: str) -> None:
        try:
            send_error(sender, message)
        except Exception as exc:  # noqa: BLE001
            self._log("warn", f"could not send an error response ({message}): {exc}")

    def finalize(self) -> None:
        scheduler = getattr(self, "scheduler", None)
        if scheduler is not None:
            scheduler.shutdown()
        self._log("info", "finalized")


def _input(request, name: str) -> Optional[np.ndarray]:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _requested_outputs(request) -> Optional[set]:
    """The output names the client asked for (Triton lists all of them when the client named none)."""
    getter = getattr(request, "requested_output_names", None)
    if getter is None:
        return None
    try:
        names = getter()
    except Exception:  # noqa: BLE001
        return None
    return set(names) if names else None
