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
presence_penalty        FP32     [1]        default 0.0 (additive, prompt + output)
frequency_penalty       FP32     [1]        default 0.0 (additive, prompt + output)
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

Modules beside this file, one concern each, so that another engine (e.g. a token-rate stand-in) can
reuse all but the generation. Triton's Python backend imports this file as ``<version>.model`` (``1.model``), with
the model's folder on ``sys.path`` (triton-inference-server/python_backend ``src/pb_stub.cc``
``ModelContext::StubSetup``, r24.10), so it imports the others relatively; a test or the benchmark's stand-in
loading it by its path makes it a package of its folder. The names tests and the stand-in use are re-exported here:

* ``parsing.py``, request parsing: :func:`parse_word_list`, :class:`SamplingParams`,
  :class:`ModelLimits`, :func:`parse_request` (numpy only);
* ``generation.py``, the per-request generation: anything with the :class:`TokenGenerator`
  protocol; here :class:`Generation` (transformers);
* ``scheduler.py``, in-flight batching: :class:`Scheduler` with :class:`Job` (FIFO queue, max
  queue size, stop by request id, client cancellation, response assembly) talking to a
  :class:`ResponseSink`;
* ``lora.py``, LoRA adapters with the executor's semantics;
* ``triton_glue.py``, what both Triton models do with Triton (parameters, input tensors, responses,
  errors, logging; the PyTorch-backend model's folder gets a copy when the repository is rendered), here as
  :data:`glue`;
* here, the model: :class:`TritonSink` and :class:`TritonPythonModel` (``create_generation``
  is the one place that builds generation objects, ``create_sink`` the one that builds response
  sinks).
"""

from __future__ import annotations

import itertools
import json
import time
import traceback
from typing import Optional

import torch

from . import lora as lora_support
from . import triton_glue as glue
# Re-exported besides: the tests and the benchmark's stand-in use these names from here.
from .generation import Generation, TokenGenerator, load_model, stop_word_end, vocab_size_of  # noqa: F401
from .parsing import (  # noqa: F401
    GUIDE_TYPES,
    TOP_K_MAX,
    GuideSpec,
    ModelLimits,
    ParsedRequest,
    QueueFullError,
    RequestError,
    SamplingParams,
    executor_error,
    executor_response_error,
    is_stop_request,
    lora_error_text,
    parse_guide,
    parse_request,
    parse_word_list,
)
from .scheduler import Job, ResponseSink, Scheduler

try:
    import triton_python_backend_utils as pb_utils
except ImportError:  # imported by tests, outside Triton
    pb_utils = None

TRTLLM_VERSION = "1.1.0"  # the TensorRT-LLM release whose tensorrtllm backend we follow
#: The C++ backend's lora_cache_host_memory_bytes default (PeftCacheManagerConfig::kDefaultHostCacheSize, 1 GiB).
DEFAULT_LORA_CACHE_BYTES = 1 << 30

#: How this model's log lines begin.
LOG_TAG = "tensorrt_llm reference"



# ------------------------------------------------------------------------------------------------
# The model in Triton
# ------------------------------------------------------------------------------------------------


def send_error(sender, message: str) -> None:
    """Send an error response with the FINAL flag on a decoupled sender."""
    glue.send_final(sender, glue.error_response(message))


class TritonSink:
    """Turns scheduler events into responses on a Triton decoupled response sender."""

    def __init__(self, sender) -> None:
        self.sender = sender
        self._can_check_cancel = hasattr(sender, "is_cancelled")

    def send_tokens(self, tokens, log_probs, cum_log_prob, final) -> None:
        """One response with output_ids [1, 1, n] and sequence_length [[n]] (n may be 0)."""
        flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0
        self.sender.send(glue.token_response(tokens, log_probs, cum_log_prob), flags=flags)

    def send_error(self, message: str) -> None:
        send_error(self.sender, message)

    def is_cancelled(self) -> bool:
        return bool(self._can_check_cancel and self.sender.is_cancelled())


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
        glue.log(LOG_TAG, level, message)

    # -- engine hooks -----------------------------------------------------------------------------
    def load_engine(self, params: dict) -> tuple[int, int]:
        """Load what generates tokens. Returns (vocab_size, default max_seq_len)."""
        hf_model_dir = glue.param(params, "hf_model_dir", "", str)
        if not hf_model_dir:
            raise ValueError("parameter hf_model_dir is required (a Hugging Face checkpoint directory)")
        self.model = load_model(hf_model_dir, glue.param(params, "torch_threads", 0, int))
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
        backend = glue.param(params, "guided_decoding_backend", "", str)
        if not backend:
            return
        if backend != "xgrammar":
            raise ValueError(
                "Guided decoding is currently supported with 'xgrammar' backend. Invalid guided_decoding_backend "
                f"parameter provided: {backend!r}"
            )
        tokenizer_dir = glue.param(params, "tokenizer_dir", "", str)
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
        if not glue.param(params, "lora_plugin", "", str):
            return
        self.lora_model = lora_support.LoraModel.from_parameters(
            glue.param(params, "lora_target_modules", "", str), glue.param(params, "max_lora_rank", "", str),
            glue.param(params, "lora_model_shape", "", str),
        )
        if self.lora_model is None:
            raise ValueError("lora_plugin is set but lora_target_modules, max_lora_rank or lora_model_shape is not")
        self.lora_applier = self.create_lora_applier()
        applier = self.lora_applier
        self.lora_cache = lora_support.LoraCache(
            self.lora_model, glue.param(params, "lora_cache_host_memory_bytes", DEFAULT_LORA_CACHE_BYTES, int),
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
        max_seq_len = glue.param(params, "max_seq_len", n_pos, int)
        max_input_len = glue.param(params, "max_input_len", max_seq_len - 1, int)
        max_active = glue.param(params, "max_active_requests", 1, int)
        max_num_tokens = glue.param(params, "max_num_tokens", None, int)
        chunked = glue.param(params, "enable_chunked_context", False, bool)
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
        exclude = glue.param(params, "exclude_input_in_output", None, bool)
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
        get = glue.input_arrays(request)
        request_id = request.request_id() if hasattr(request, "request_id") else ""
        try:
            is_stop = is_stop_request(get)
        except RequestError as exc:
            self._safe_send_error(sender, str(exc))
            return
        if is_stop:  # handleStopRequest: before any other input is read
            if not request_id:
                self._safe_send_error(sender, "Trying to stop a request but request ID is not provided")
                return
            found = self.scheduler.request_stop(request_id)
            self._log("info", f"stop request for id {request_id!r}: {int(found)} running request(s) stopped")
            try:
                glue.send_empty_final(sender)
            except Exception as exc:  # noqa: BLE001
                self._log("warn", f"could not answer a stop request: {exc}")
            return
        missing = glue.missing_output_error(request)
        if missing is not None:
            self._safe_send_error(sender, missing)
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
