"""CPU reference implementation of the ``tensorrt_llm`` model (Triton Python backend, decoupled).

It takes the same tensors as the C++ ``tensorrtllm`` backend of **TensorRT-LLM 1.1.0**, limited to
the subset a decoder-only text model uses (see ``../config.pbtxt``). Instead of a TensorRT engine it
runs a Hugging Face causal LM with ``transformers`` on the CPU, in float32. The aim is the same
observable behaviour: in-flight batching, streaming, sampling parameters, stop and bad words. It is
not the same speed.

Request tensors. Triton adds a leading batch dimension of 1 to each tensor, because the config sets
``max_batch_size > 0``. Tensors declared with ``reshape: { shape: [ ] }`` therefore arrive as shape [1].

====================== ======== ========== ===============================================
name                   dtype    shape      meaning
====================== ======== ========== ===============================================
input_ids              INT32    [1, L]     prompt token ids (required, 1 <= L <= max_input_len)
input_lengths          INT32    [1]        L (required, must equal the number of input_ids)
request_output_len     INT32    [1]        max new tokens (required, >= 1; L + it <= max_seq_len)
end_id                 INT32    [1]        end-of-sequence id (default: the checkpoint's eos id)
pad_id                 INT32    [1]        accepted and ignored (beam width 1 never pads)
stop_words_list        INT32    [1, 2, S]  row 0 token ids, row 1 cumulative end offsets (-1 pad)
bad_words_list         INT32    [1, 2, S]  same format
beam_width             INT32    [1]        only 1 is supported
temperature            FP32     [1]        >= 0, default 1.0; 0 means greedy
runtime_top_k          INT32    [1]        >= 0, default 0 (off); 1 means greedy
runtime_top_p          FP32     [1]        in [0, 1], default 1.0 (off)
len_penalty            FP32     [1]        accepted and ignored (only used by beam search)
repetition_penalty     FP32     [1]        > 0, default 1.0 (multiplicative, prompt + output)
min_tokens             INT32    [1]        >= 0, default 0; end_id is banned until reached
presence_penalty       FP32     [1]        default 0.0 (additive, output tokens only)
frequency_penalty      FP32     [1]        default 0.0 (additive, output tokens only)
seed                   UINT64   [1]        sampling seed, default 0
exclude_input_in_output BOOL    [1]        default: the model parameter of the same name
streaming              BOOL     [1]        default false
stop                   BOOL     [1]        true: stop the running request with this request id
return_log_probs       BOOL     [1]        default false
====================== ======== ========== ===============================================

Response tensors. As in the C++ backend, they carry a batch dimension of 1 and then the beam
dimension:

* ``output_ids``: INT32 [1, 1, N]
* ``sequence_length``: INT32 [1, 1], equal to N
* ``cum_log_probs``: FP32 [1, 1] (only when return_log_probs is true)
* ``output_log_probs``: FP32 [1, 1, n] (only when return_log_probs is true)

With streaming, every response carries the new token (N = 1). The last response, or an empty
response sent after it, has the FINAL flag. Without streaming, one response carries all generated
tokens, prefixed by the prompt when exclude_input_in_output is false.

The pure generation logic (:func:`parse_word_list`, :class:`SamplingParams`, :func:`parse_request`,
:class:`Generation` and :class:`Scheduler`) does not depend on Triton. Tests import it with the real
model.
"""

from __future__ import annotations

import inspect
import json
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Deque, List, Optional, Protocol, Sequence

import numpy as np
import torch

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported by tests, outside Triton
    pb_utils = None

TRTLLM_VERSION = "1.1.0"  # the TensorRT-LLM release whose tensorrtllm-backend tensor names we follow


class RequestError(ValueError):
    """A request is invalid. The message names the tensor, the value seen and what is allowed."""


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
            token id inside a word.
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
    """How one request is decoded. The defaults are the neutral values used when a tensor is absent.

    Attributes:
        max_new_tokens: ``request_output_len``, >= 1.
        end_id: generating it ends the request. The end token is not returned or counted. None
            disables it.
        temperature: 0 means greedy. Otherwise logits are divided by it before top-k/top-p sampling.
        top_k: ``runtime_top_k``. 0 turns it off; 1 means greedy.
        top_p: ``runtime_top_p`` in [0, 1]. 1.0 turns it off.
        repetition_penalty: multiplicative, over prompt and generated tokens (as HF's
            RepetitionPenaltyLogitsProcessor). 1.0 turns it off.
        presence_penalty / frequency_penalty: additive, over generated tokens:
            ``logit -= presence * (count > 0) + frequency * count``.
        min_tokens: end_id is banned until this many tokens have been generated.
        seed: seeds the request's own ``torch.Generator``. The same seed and inputs give the same tokens.
        stop_words: token sequences. Completing one ends the request, and the sequence is included
            in the output.
        bad_words: token sequences that are never completed.
        return_log_probs: collect the log-probability of each chosen token.
    """

    max_new_tokens: int
    end_id: Optional[int] = None
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
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
        """True when decoding is greedy (argmax): temperature 0 or top_k 1."""
        return self.temperature == 0.0 or self.top_k == 1

    def validate(self) -> None:
        """Check the value ranges. Raises RequestError naming the tensor, the value and the range."""
        if self.max_new_tokens < 1:
            raise RequestError(f"request_output_len must be >= 1, got {self.max_new_tokens}")
        if not np.isfinite(self.temperature) or self.temperature < 0:
            raise RequestError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise RequestError(f"runtime_top_k must be >= 0 (0 = off), got {self.top_k}")
        if not (0.0 <= self.top_p <= 1.0):
            raise RequestError(f"runtime_top_p must be in [0, 1] (1 = off), got {self.top_p}")
        if not np.isfinite(self.repetition_penalty) or self.repetition_penalty <= 0:
            raise RequestError(f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty}")
        if not np.isfinite(self.presence_penalty):
            raise RequestError(f"presence_penalty must be a finite number, got {self.presence_penalty}")
        if not np.isfinite(self.frequency_penalty):
            raise RequestError(f"frequency_penalty must be a finite number, got {self.frequency_penalty}")
        if self.min_tokens < 0:
            raise RequestError(f"min_tokens must be >= 0, got {self.min_tokens}")
        if not (0 <= self.seed < 2**64):
            raise RequestError(f"seed must be in [0, 2**64), got {self.seed}")


@dataclass(frozen=True)
class ModelLimits:
    """Per-model limits and defaults that request parsing needs.

    Attributes:
        max_input_len: longest prompt in tokens.
        max_seq_len: the longest allowed prompt + request_output_len.
        vocab_size: token ids must lie in [0, vocab_size).
        default_end_id: end_id used when the request sends none (None: no end token).
        exclude_input_in_output: default of the per-request input of the same name.
    """

    max_input_len: int
    max_seq_len: int
    vocab_size: int
    default_end_id: Optional[int]
    exclude_input_in_output: bool = True


@dataclass
class ParsedRequest:
    """A validated request: the prompt, how to decode it and how to answer."""

    prompt_ids: List[int]
    params: SamplingParams
    streaming: bool = False
    exclude_input_in_output: bool = True
    stop: bool = False


def _scalar(get: Callable[[str], Optional[np.ndarray]], name: str, kind: type, default):
    arr = get(name)
    if arr is None:
        return default
    flat = np.asarray(arr).reshape(-1)
    if flat.size == 0:
        raise RequestError(f"{name} is empty; send one value")
    value = flat[0]
    if kind is bool:
        return bool(value)
    if kind is int:
        return int(value)
    return float(value)


def parse_request(get: Callable[[str], Optional[np.ndarray]], limits: ModelLimits) -> ParsedRequest:
    """Read and validate one request's tensors.

    Args:
        get: returns the numpy array of an input tensor by name, or None when it is absent (shapes
            as in the module docstring, with or without the batch dimension).
        limits: the model's limits and defaults.

    Raises:
        RequestError: the first problem found, naming the tensor, the value and the allowed range.
    """
    stop = _scalar(get, "stop", bool, False)
    if stop:
        return ParsedRequest(prompt_ids=[], params=SamplingParams(max_new_tokens=1), stop=True)

    ids = get("input_ids")
    if ids is None:
        raise RequestError("input_ids is required (INT32 [1, L] token ids)")
    ids = np.asarray(ids)
    if ids.ndim == 2:
        if ids.shape[0] != 1:
            raise RequestError(
                f"input_ids has batch size {ids.shape[0]}; this model takes one sequence per request (batch size 1)"
            )
        ids = ids[0]
    elif ids.ndim != 1:
        raise RequestError(f"input_ids must have shape [1, L], got {list(ids.shape)}")
    if not np.issubdtype(ids.dtype, np.integer):
        raise RequestError(f"input_ids must be int32, got dtype {ids.dtype}")
    prompt = [int(t) for t in ids]

    lengths = get("input_lengths")
    if lengths is None:
        raise RequestError("input_lengths is required (INT32, the number of input_ids)")
    input_len = _scalar(get, "input_lengths", int, None)
    if input_len != len(prompt):
        raise RequestError(f"input_lengths is {input_len} but input_ids has {len(prompt)} tokens; they must match")
    if not prompt:
        raise RequestError("input_ids is empty; the prompt needs at least 1 token")
    if len(prompt) > limits.max_input_len:
        raise RequestError(
            f"input_ids: prompt has {len(prompt)} tokens, max_input_len is {limits.max_input_len}"
        )
    bad_ids = [t for t in prompt if not 0 <= t < limits.vocab_size]
    if bad_ids:
        raise RequestError(
            f"input_ids must be in [0, {limits.vocab_size}) (the vocabulary size); got {bad_ids[:5]}"
        )

    if get("request_output_len") is None:
        raise RequestError("request_output_len is required (INT32, the number of tokens to generate)")
    output_len = _scalar(get, "request_output_len", int, None)
    if output_len < 1:
        raise RequestError(f"request_output_len must be >= 1, got {output_len}")
    if len(prompt) + output_len > limits.max_seq_len:
        raise RequestError(
            f"input_lengths ({len(prompt)}) + request_output_len ({output_len}) = {len(prompt) + output_len} "
            f"exceeds max_seq_len {limits.max_seq_len}"
        )

    beam_width = _scalar(get, "beam_width", int, 1)
    if beam_width != 1:
        raise RequestError(
            f"beam_width must be 1 (beam search is not supported by this reference model), got {beam_width}"
        )

    end_id = _scalar(get, "end_id", int, limits.default_end_id)
    params = SamplingParams(
        max_new_tokens=output_len,
        end_id=end_id,
        temperature=_scalar(get, "temperature", float, 1.0),
        top_k=_scalar(get, "runtime_top_k", int, 0),
        top_p=_scalar(get, "runtime_top_p", float, 1.0),
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
    return ParsedRequest(
        prompt_ids=prompt,
        params=params,
        streaming=_scalar(get, "streaming", bool, False),
        exclude_input_in_output=_scalar(get, "exclude_input_in_output", bool, limits.exclude_input_in_output),
    )


# ------------------------------------------------------------------------------------------------
# Model and generation
# ------------------------------------------------------------------------------------------------


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


def default_end_id(model) -> Optional[int]:
    """The checkpoint's eos id from generation_config, then config. The first is taken when it is a list."""
    for cfg in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = getattr(cfg, "eos_token_id", None) if cfg is not None else None
        if isinstance(eos, (list, tuple)):
            eos = eos[0] if eos else None
        if eos is not None:
            return int(eos)
    return None


def vocab_size_of(model) -> int:
    """Number of rows of the input embedding (valid token ids are [0, this))."""
    return int(model.get_input_embeddings().num_embeddings)


def _ends_with(seq: Sequence[int], suffix: Sequence[int]) -> bool:
    n = len(suffix)
    return n <= len(seq) and list(seq[len(seq) - n :]) == list(suffix)


class Generation:
    """One request's decoding state: its own KV cache (a transformers DynamicCache) and its own RNG.

    ``step()`` runs one forward pass: the prefill of the whole prompt on the first call, then one
    token per call. It returns the next token id, or None when the generation ends without a token
    (end_id generated, or already finished). After a returned token, ``finished`` may already be
    True (request_output_len reached, or a stop word completed). ``finish_reason`` is then one of
    "end_id", "length", "stop_words", "stopped", "cancelled" or "error".

    Per step, the logits of the last position (float32) go through, in order: repetition_penalty;
    presence/frequency penalties; min_tokens (end_id banned); bad words. Then comes greedy argmax,
    or temperature -> top_k -> top_p -> multinomial sampling with the request's generator.
    """

    def __init__(self, model, prompt_ids: Sequence[int], params: SamplingParams) -> None:
        from transformers import (  # noqa: PLC0415
            RepetitionPenaltyLogitsProcessor,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        self.model = model
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
            if params.top_p < 1.0:
                self._warpers.append(TopPLogitsWarper(float(params.top_p)))
        self._single_bad = sorted({w[0] for w in params.bad_words if len(w) == 1})
        self._multi_bad = [w for w in params.bad_words if len(w) > 1]
        self._keep_arg = "logits_to_keep" in inspect.signature(model.forward).parameters

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

    def step(self) -> Optional[int]:
        """Run one decoding step. Returns the new token id, or None if the generation ended without one."""
        if self.finished:
            return None
        with torch.inference_mode():
            if not self._started:
                self._started = True
                logits = self._forward(self.prompt_ids)
            else:
                logits = self._forward([self._pending])
            self._pending = None
            logits = self._process(logits)
            token, final_logits = self._choose(logits)
            if self.params.return_log_probs:
                self.log_probs.append(float(torch.log_softmax(final_logits, dim=-1)[0, token]))
        p = self.params
        if p.end_id is not None and token == p.end_id:
            if self.params.return_log_probs:
                self.log_probs.pop()  # the end token is not returned, so neither is its log-prob
            self.stop("end_id")
            return None
        self.tokens.append(token)
        if self._counts is None:
            self._counts = torch.zeros(max(logits.shape[-1], token + 1), dtype=torch.float32)
        self._counts[token] += 1
        if p.stop_words and any(_ends_with(self.prompt_ids + self.tokens, w) for w in p.stop_words):
            self.stop("stop_words")
        elif len(self.tokens) >= p.max_new_tokens:
            self.stop("length")
        else:
            self._pending = token
        return token

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

    def send_final(self) -> None: ...

    def send_error(self, message: str, cancelled: bool = False) -> None: ...

    def is_cancelled(self) -> bool: ...


@dataclass
class Job:
    """A queued or running request.

    Attributes:
        generation: its decoding state.
        sink: where responses go.
        streaming: one response per token (True), or one response at the end (False).
        prefix_ids: prepended to the final non-streaming output (the prompt when
            exclude_input_in_output is false).
        request_id: Triton's request id. A later request with ``stop`` true and the same id stops it.
        stop_requested: set by such a stop request; the scheduler ends the job at its next turn.
    """

    generation: Generation
    sink: ResponseSink
    streaming: bool = False
    prefix_ids: List[int] = field(default_factory=list)
    request_id: str = ""
    stop_requested: bool = False
    sent: int = 0  # tokens already streamed


class Scheduler:
    """In-flight batching on one background thread.

    At most ``max_active`` jobs are active; the others wait in FIFO order. Each loop iteration
    admits waiting jobs into free slots, then runs ONE step for each active job in turn (round
    robin). Every running request therefore makes progress, and none waits for another to finish.
    A new job's first step is its prefill (the whole prompt, in its own KV cache). An exception in
    one job ends that job with an error response; the thread goes on.
    """

    def __init__(self, max_active: int, log: Callable[[str, str], None] = lambda level, msg: None) -> None:
        if max_active < 1:
            raise ValueError(f"max_active must be >= 1, got {max_active}")
        self.max_active = max_active
        self._log = log
        self._cond = threading.Condition()
        self._waiting: Deque[Job] = deque()
        self._active: List[Job] = []
        self._closing = False
        self._thread: Optional[threading.Thread] = None

    # -- API used by the model (any thread) -------------------------------------------------------
    def start(self) -> None:
        """Start the scheduler thread (daemon)."""
        self._thread = threading.Thread(target=self._loop, name="reference-llm-scheduler", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job (FIFO)."""
        with self._cond:
            if self._closing:
                raise RuntimeError("the model is shutting down")
            self._waiting.append(job)
            self._cond.notify()

    def request_stop(self, request_id: str) -> int:
        """Ask the jobs with this request id to stop. Returns how many were found."""
        found = 0
        with self._cond:
            for job in list(self._waiting) + self._active:
                if request_id and job.request_id == request_id:
                    job.stop_requested = True
                    found += 1
            self._cond.notify()
        return found

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
        for job in left:
            job.generation.stop("error")
            self._safe(job, lambda j=job: j.sink.send_error("the model was unloaded before the request finished"))

    # -- scheduler thread -------------------------------------------------------------------------
    def _safe(self, job: Job, fn: Callable[[], None]) -> bool:
        try:
            fn()
            return True
        except Exception as exc:  # noqa: BLE001 - a broken sender must not kill the loop
            self._log("warn", f"could not send a response for request {job.request_id!r}: {exc}")
            return False

    def _finish(self, job: Job) -> None:
        """Send what ends a job whose generation has finished (not for errors/cancellation)."""
        gen = job.generation
        if job.streaming:
            self._safe(job, job.sink.send_final)
            return
        tokens = job.prefix_ids + gen.tokens
        lp = list(gen.log_probs) if gen.params.return_log_probs else None
        cum = gen.cum_log_prob if gen.params.return_log_probs else None
        self._safe(job, lambda: job.sink.send_tokens(tokens, lp, cum, True))

    def _run_one(self, job: Job) -> bool:
        """One turn of one job. Returns True while the job stays active."""
        gen = job.generation
        try:
            if job.sink.is_cancelled():
                gen.stop("cancelled")
                self._log("info", f"request {job.request_id!r} cancelled by the client after {len(gen.tokens)} tokens")
                self._safe(job, lambda: job.sink.send_error("request cancelled by the client", cancelled=True))
                return False
            if job.stop_requested:
                gen.stop("stopped")
                self._finish(job)
                return False
            token = gen.step()
            if job.streaming and token is not None:
                params = gen.params
                lp = [gen.log_probs[-1]] if params.return_log_probs else None
                cum = gen.cum_log_prob if params.return_log_probs else None
                ok = self._safe(job, lambda: job.sink.send_tokens([token], lp, cum, gen.finished))
                job.sent += 1
                if not ok:
                    gen.stop("cancelled")
                    return False
                if gen.finished:
                    return False  # the FINAL flag went with the last token
            if gen.finished:
                self._finish(job)
                return False
            return True
        except Exception as exc:  # noqa: BLE001 - one request's failure must not end the others
            gen.stop("error")
            self._log("error", f"request {job.request_id!r} failed: {traceback.format_exc()}")
            message = f"generation failed: {type(exc).__name__}: {exc}"
            self._safe(job, lambda: job.sink.send_error(message))
            return False

    def _loop(self) -> None:
        with torch.inference_mode():
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
                        with self._cond:
                            if job in self._active:
                                self._active.remove(job)
                    if self._closing:
                        break


# ------------------------------------------------------------------------------------------------
# Triton glue
# ------------------------------------------------------------------------------------------------


class TritonSink:
    """Turns scheduler events into responses on a Triton decoupled response sender."""

    def __init__(self, sender) -> None:
        self.sender = sender
        self._can_check_cancel = hasattr(sender, "is_cancelled")

    def send_tokens(self, tokens, log_probs, cum_log_prob, final) -> None:
        outputs = [
            pb_utils.Tensor("output_ids", np.asarray(tokens, dtype=np.int32).reshape(1, 1, -1)),
            pb_utils.Tensor("sequence_length", np.asarray([[len(tokens)]], dtype=np.int32)),
        ]
        if log_probs is not None:
            outputs.append(pb_utils.Tensor("cum_log_probs", np.asarray([[cum_log_prob]], dtype=np.float32)))
            outputs.append(
                pb_utils.Tensor("output_log_probs", np.asarray(log_probs, dtype=np.float32).reshape(1, 1, -1))
            )
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        self.sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=flags)

    def send_final(self) -> None:
        self.sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def send_error(self, message: str, cancelled: bool = False) -> None:
        send_error(self.sender, message, cancelled=cancelled)

    def is_cancelled(self) -> bool:
        return bool(self._can_check_cancel and self.sender.is_cancelled())


def _triton_error(message: str, code_name: str):
    code = getattr(pb_utils.TritonError, code_name, None)
    if code is not None:
        try:
            return pb_utils.TritonError(message, code)
        except TypeError:
            pass
    return pb_utils.TritonError(message)


def send_error(sender, message: str, cancelled: bool = False, invalid: bool = False) -> None:
    """Send an error response with the FINAL flag on a decoupled sender."""
    code = "CANCELLED" if cancelled else ("INVALID_ARG" if invalid else "INTERNAL")
    response = pb_utils.InferenceResponse(output_tensors=[], error=_triton_error(message, code))
    sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


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


class TritonPythonModel:
    """The ``tensorrt_llm`` model (decoupled): validates and queues requests for the :class:`Scheduler`.

    Model parameters (string values): hf_model_dir (required), max_input_len, max_seq_len (default:
    the checkpoint's max_position_embeddings), max_active_requests (default 1),
    exclude_input_in_output (default true), torch_threads (0 = torch default).
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

    def initialize(self, args) -> None:
        cfg = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(cfg):
            raise ValueError("the tensorrt_llm reference model needs model_transaction_policy { decoupled: true }")
        params = cfg.get("parameters", {})
        hf_model_dir = _param(params, "hf_model_dir", "", str)
        if not hf_model_dir:
            raise ValueError("parameter hf_model_dir is required (a Hugging Face checkpoint directory)")
        torch_threads = _param(params, "torch_threads", 0, int)
        started = time.monotonic()
        self.model = load_model(hf_model_dir, torch_threads)
        torch.set_grad_enabled(False)
        n_pos = int(getattr(self.model.config, "max_position_embeddings", 0) or 0) or 2048
        max_seq_len = _param(params, "max_seq_len", n_pos, int)
        max_input_len = _param(params, "max_input_len", max_seq_len - 1, int)
        max_active = _param(params, "max_active_requests", 1, int)
        if max_input_len < 1 or max_seq_len < 2 or max_active < 1:
            raise ValueError(
                f"need max_input_len >= 1, max_seq_len >= 2 and max_active_requests >= 1; got {max_input_len}, "
                f"{max_seq_len}, {max_active}"
            )
        if max_seq_len > n_pos:
            self._log("warn", f"max_seq_len {max_seq_len} exceeds the checkpoint's max_position_embeddings {n_pos}")
        self.limits = ModelLimits(
            max_input_len=max_input_len,
            max_seq_len=max_seq_len,
            vocab_size=vocab_size_of(self.model),
            default_end_id=default_end_id(self.model),
            exclude_input_in_output=_param(params, "exclude_input_in_output", True, bool),
        )
        self.scheduler = Scheduler(max_active, log=self._log)
        self.scheduler.start()
        self._log(
            "info",
            f"loaded {hf_model_dir} in {time.monotonic() - started:.1f} s (TensorRT-LLM {TRTLLM_VERSION} tensor "
            f"names; torch threads {torch.get_num_threads()}); max_input_len={max_input_len} "
            f"max_seq_len={max_seq_len} max_active_requests={max_active} end_id={self.limits.default_end_id}",
        )

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                parsed = parse_request(lambda name, r=request: _input(r, name), self.limits)
            except RequestError as exc:
                self._safe_send_error(sender, str(exc), invalid=True)
                continue
            except Exception as exc:  # noqa: BLE001
                self._safe_send_error(sender, f"could not read the request: {type(exc).__name__}: {exc}")
                continue
            request_id = request.request_id() if hasattr(request, "request_id") else ""
            if parsed.stop:
                found = self.scheduler.request_stop(request_id)
                self._log("info", f"stop request for id {request_id!r}: {found} running request(s) stopped")
                try:
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                except Exception as exc:  # noqa: BLE001
                    self._log("warn", f"could not answer a stop request: {exc}")
                continue
            try:
                job = Job(
                    generation=Generation(self.model, parsed.prompt_ids, parsed.params),
                    sink=TritonSink(sender),
                    streaming=parsed.streaming,
                    prefix_ids=[] if parsed.exclude_input_in_output else list(parsed.prompt_ids),
                    request_id=request_id,
                )
                self.scheduler.submit(job)
            except Exception as exc:  # noqa: BLE001
                self._safe_send_error(sender, f"could not queue the request: {type(exc).__name__}: {exc}")
        return None

    def _safe_send_error(self, sender, message: str, invalid: bool = False) -> None:
        try:
            send_error(sender, message, invalid=invalid)
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
