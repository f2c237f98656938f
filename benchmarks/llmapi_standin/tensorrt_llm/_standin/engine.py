"""The stand-in's executor: in-flight batching of LLM API requests on one thread, generating with
transformers on the CPU, or emitting a text's tokens at a fixed step (paced mode).

What it follows of the PyTorch backend (NVIDIA/TensorRT-LLM; the facts are in the package's other
docstrings, with sources):

* at most ``max_batch_size`` requests are active; the others wait in arrival order (no queue limit:
  ``TorchLlmArgs`` has no ``max_queue_size``); every active request gets one token per engine step;
* a request's tokens: the sampler adds the new token, then checks, in order, the end token (finish reason
  END_ID, reported 'stop'; the end token was already added to the request's tokens:
  ``tensorrt_llm/_torch/pyexecutor/sampler.py`` @28edbcdb ``TorchSampler``: ``add_token`` then
  ``_handle_stop_criteria``), the token limit ('length');
* streaming: a response with the new ids on a request's first step, then every ``stream_interval``-th step
  (``TorchLlmArgs.stream_interval``, 1: every step), and on its last (``_torch/pyexecutor/py_executor.py``
  ``_handle_responses``, 1.2-era index copy: ``py_decoding_iter == 1``, finished, or ``py_decoding_iter %
  stream_interval == 0``); otherwise one final response with all ids;
* ``abort_request`` (``_torch/pyexecutor/py_executor.py`` ``_handle_canceled_requests`` and
  ``executor_request_queue.py`` @007a7508 ``update_waiting_queue``; the 1.2-era executor loop): at the engine's next
  step the waiting requests are admitted to free slots first; an aborted request that is then active ends with
  finish reason 'cancelled', its final response carrying what it had not sent; an aborted request **still
  waiting is dropped without any response**, so its result never finishes (no 1.2-era path answers it; the worker
  sends nothing either: ``base_worker.py`` @7b437aaa ``abort_request``);
* LoRA (``lora_config`` set), in two places as in 1.2.1:

  - the worker's LoRA manager (:class:`LoraWorker`): the executor worker loads a request's adapter folder when it
    takes the request from the proxy, before the request is enqueued (``executor/base_worker.py`` @7b437aaa
    ``_enqueue_request`` calls ``_load_lora_adapter`` *before* its ``try``, which is what turns errors into
    ``RequestError``), once per ``lora_int_id`` for the LLM's life (``LoraManager.load_from_hf``,
    ``lora_manager.py`` @30e6fb55 and @007e181b: a uid already in ``_lora_uid_to_low_ranks`` is skipped, and no
    uid is ever removed), and every loaded adapter's device tensors are appended to ``_lora_weights``, a list
    that never shrinks (the same versions: "prevent torch free this buffer"; PR #12815, 2026-04-07 on main, added
    ``_retain_device_tensors`` after release 1.2.1 was cut, and no version of ``lora_manager.py`` at 1.2.1's
    commit 376f7e1b can be read: see docs/deploy.md). So every distinct adapter's device bytes stay for the
    LLM's life (:attr:`LoraWorker.retained_device_bytes`); with ``LLMAPI_STANDIN_LORA_DEVICE_BYTES`` (stand-in only:
    the device memory the KV cache left) a load beyond it fails as CUDA does ("CUDA out of memory");
  - a failure of that load (a missing, unreadable or incomplete folder, bad JSON, device memory) is not a
    ``RequestError``: ``worker_main`` (``executor/worker.py`` @cc4777e9) treats it as critical: it tells the
    proxy's dispatch thread to quit (no request in flight gets another response: their results never finish),
    re-raises it in the worker, and the proxy hands it to the next ``generate_async``, which raises it and shuts
    the executor down (``executor.py`` ``_handle_background_error``); later calls raise "LLM is shutting down"
    (fixed after 1.2.1: PR #13517, 2026-05, wraps it in ``RequestError``);
  - the engine's adapter cache (the C++ ``PeftCacheManager``): peft adapters by ``lora_int_id``, least recently
    used evicted beyond ``max_cpu_loras``; an evicted id that comes again is read from its folder once more, as
    1.2.1 may (``_torch/pyexecutor/resource_manager.py`` @d2a5560a ``add_request_peft`` loads
    ``py_lora_path`` when the C++ cache no longer has the task), and a failure of that read stops the worker as
    above (no kinder than the load at submission); another path under a cached id gets the cached weights;
  - without ``lora_config`` the LoRA request is ignored (the worker makes a LoRA manager only when
    ``lora_config`` is set);
* an aborted request's abort reaches the executor ``LLMAPI_STANDIN_ABORT_DELAY_MS`` after ``abort()`` (stand-in
  only; default 0): in 1.2.1 it travels from ``RequestOutput.abort()`` through the proxy's request queue to the
  worker (``CancellingRequest``, ``worker_main``), then ``PyExecutor.cancel_request`` queues it for the
  executor loop's next iteration (``executor_request_queue.py`` @007a7508), so under load it takes up to a step
  of the whole batch;
* the worker's ``_results`` (``base_worker.py`` @7b437aaa ``submit``): each request's entry is removed only when
  its final response or error is dispatched (``AwaitResponseHelper.handle_for_worker``), so an aborted request
  dropped while waiting leaves its entry for the LLM's life (:attr:`Engine.results`);
* guided decoding (``guided_decoding_backend='xgrammar'``): xgrammar's token bitmask on the logits before
  sampling, the guide compiled on the request's first step;
* images (a request with multimodal data, ``inputs/registry.py``): the prompt's first forward pass takes the pixel
  values (bfloat16 from the input processor, run in float32 here), and the prompt positions holding the model's
  image token (``image_token_index``) are marked as the image's, so that they attend to one another
  (``Gemma3VLM.forward`` @0f8dcd9d: ``mm_token_mask = torch.isin(input_ids, self.image_token_ids)`` passed as
  ``image_token_mask``; transformers' Gemma 3 reads the same mark from ``token_type_ids``).

Sampling (model mode) follows the sampler 1.2.1 instantiates (``_torch/pyexecutor/_util.py``
``instantiate_sampler``: TRTLLMSampler for ``sampler_type`` TRTLLMSampler, or ``auto`` with ``max_beam_width`` > 1;
TorchSampler otherwise), each as ``_torch/pyexecutor/sampler.py`` @00026bd1 has it (the facts, with the upstream
changes after 1.2.1, are in ``tensorrtllm_backend/samplers.py``). Both: greedy when
``SamplingParams._greedy_decoding``; else temperature (default 1), top-k (0 or unset: all), top-p (unset: 1) and
a multinomial draw; the guide's bitmask before sampling.

* **TorchSampler**: one generator for every request, seeded once with 42 (``_global_seed``; the request's
  ``seed`` is ignored); repetition, presence and frequency penalties and ``bad_token_ids`` are ignored;
  ``min_tokens`` bans the end token only while the prompt's tokens plus the generated ones are fewer
  (``_apply_min_length_penalty`` counts the prompt; with end id -1 it bans the last vocabulary id); log-probs
  are ``log_softmax`` of the raw logits (no temperature) at their arg-max, keyed by the arg-max token, taken
  before sampling.
* **TRTLLMSampler** (the C++ decoder): the request's own generator seeded with ``seed`` (unset: 0); the
  penalties over prompt and output tokens as the C++ penalty kernel counts them
  (``cpp/tensorrt_llm/kernels/penaltyKernels.cu``, as the CPU reference model applies them); ``min_tokens``
  bans the end token until that many tokens were generated; ``bad_token_ids`` banned; log-probs of the
  sampled token.

The PyTorch backend's sampler kernels are not emulated further (sampled tokens differ from a GPU's anyway).

Why one module: it is the executor, one thread's loop and the request states it advances (admission, a step,
sampling, finishing, aborts); the adapters' memory (``lora.py``) and the input processors (``inputs/``) are apart.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence

from ..executor.result import EngineResponse, GenerationResult
from ..sampling_params import SamplingParams, sampling_config_error
from .lora import LoraStore, LoraWorker, WorkerStopped

TORCH_SAMPLER = "TorchSampler"
TRTLLM_SAMPLER = "TRTLLMSampler"
#: TorchSampler's one seed for every request (sampler.py @00026bd1 ``TorchSampler._global_seed``).
TORCH_SAMPLER_SEED = 42


def instantiate_sampler(sampler_type: Any, max_beam_width: Optional[int]) -> str:
    """The sampler 1.2.1 builds (``_util.py`` ``instantiate_sampler``): TRTLLMSampler for ``sampler_type``
    TRTLLMSampler or ``auto`` with beam search; TorchSampler otherwise (any other string included)."""
    value = str(getattr(sampler_type, "value", sampler_type))
    if value == TRTLLM_SAMPLER or (value == "auto" and int(max_beam_width or 1) > 1):
        return TRTLLM_SAMPLER
    return TORCH_SAMPLER


@dataclass(eq=False)
class ActiveRequest:
    """A request inside the engine."""

    request_id: int
    prompt: List[int]
    params: SamplingParams
    streaming: bool
    result: GenerationResult
    max_new_tokens: int
    lora: Any = None  # LoRARequest when the engine serves LoRA
    multimodal: Any = None  # {"image": {"pixel_values": tensor}} of an image request
    tokens: List[int] = field(default_factory=list)
    logprobs: List[Dict[int, float]] = field(default_factory=list)  # one {token id: log-prob} per token
    sent: int = 0
    abort_requested: bool = False
    abort_at: float = 0.0  # time.monotonic() when the executor sees the abort (ABORT_DELAY_MS_ENV)
    done: bool = False
    state: Any = None  # the generation state (model or paced)

    def aborted_now(self, now: float) -> bool:
        return self.abort_requested and now >= self.abort_at


def text_token_ids(tokenizer: Any, text: str) -> List[int]:
    """The paced mode's token cycle: the text's ids without special tokens (the rule of
    ``benchmarks/standin/1/model.py`` ``text_token_ids``, so the benchmark's expectations hold for both)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    out = [int(i) for i in ids if int(i) not in special]
    if not out:
        raise ValueError("the stand-in's paced text has no tokens")
    return out


class StepClock:
    """One engine step every ``step_s`` seconds for all active requests (paced mode)."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self._last = time.monotonic()

    def idle(self) -> None:
        """The engine had nothing to do: the next step is one step from now."""
        self._last = time.monotonic()

    def await_step(self) -> None:
        target = self._last + self.step_s
        now = time.monotonic()
        if target > now:
            time.sleep(target - now)
            self._last = target
        else:
            self._last = now


class PacedState:
    """A request's tokens in paced mode: token ``(seed + k) mod n`` of the cycle."""

    def __init__(self, request: ActiveRequest, cycle: Sequence[int]) -> None:
        self.cycle = cycle
        self.start = int(request.params.seed or 0) % len(cycle)

    def next_token(self, request: ActiveRequest) -> tuple[int, Optional[Dict[int, float]]]:
        token = int(self.cycle[(self.start + len(request.tokens)) % len(self.cycle)])
        return token, ({token: 0.0} if request.params.logprobs else None)


class ScriptedState:
    """A request's tokens in scripted mode (tests only: ``LLMAPI_STANDIN_SCRIPT``): the ids of the first script whose
    ``when`` text is in its decoded prompt, then the end token (the request's ``end_id``; as any token equal to it,
    it ends the request with finish reason 'stop', as the sampler's end-token check does).

    A guided request replays each token through its guide's matcher (``guided_decoding_backend='xgrammar'``): a token
    the guide refuses fails the request, as the PyTorch backend's guided decoder fails a request whose new token its
    matcher does not accept (``_torch/pyexecutor/guided_decoder.py`` ``GuidedDecoder._build``: "failed to accept last
    new token"; a real model never gets there, its logits being masked), so a script shows that a guide lets a model's
    output through."""

    def __init__(self, request: ActiveRequest, scripts: Sequence[tuple], tokenizer: Any,
                 engine: Optional["Engine"] = None) -> None:
        text = tokenizer.decode(list(request.prompt))
        for when, ids in scripts:
            if when in text:
                self.ids = list(ids)
                break
        else:
            raise ValueError(f"stand-in scripted mode: no script's 'when' is in the prompt {text[-200:]!r}")
        self.matcher = None
        guide = request.params.guided_decoding
        if guide is not None:
            if engine is None or engine.grammar_compiler is None:
                raise ValueError("stand-in: a guided request to an LLM without guided_decoding_backend")
            import xgrammar  # noqa: PLC0415

            self.matcher = xgrammar.GrammarMatcher(engine.compile_guide(guide))

    def next_token(self, request: ActiveRequest) -> tuple[int, Optional[Dict[int, float]]]:
        n = len(request.tokens)
        end = request.params.end_id
        token = self.ids[n] if n < len(self.ids) else (end if end is not None else self.ids[-1])
        if self.matcher is not None and not self.matcher.accept_token(int(token)):
            raise ValueError(f"Request {request.request_id} failed to accept last new token: {int(token)} "
                             "(stand-in scripted mode: the guide refuses the script's token)")
        return int(token), ({int(token): 0.0} if request.params.logprobs else None)


def load_scripts(path: str) -> List[tuple]:
    """Scripted mode's scripts: a JSON file ``{"scripts": [{"when": TEXT, "ids": [TOKEN_ID, ...]}, ...]}`` (the format
    of ``benchmarks/standin``'s scripted mode), as (when, ids) pairs.

    Raises:
        ValueError: the file is not such a document.
    """
    document = json.loads(Path(path).read_text(encoding="utf-8"))
    scripts = document.get("scripts") if isinstance(document, dict) else None
    if not isinstance(scripts, list) or not all(
            isinstance(s, dict) and isinstance(s.get("when"), str) and isinstance(s.get("ids"), list) for s in scripts):
        raise ValueError(f"stand-in: {path}: expected {{\"scripts\": [{{\"when\": text, \"ids\": [ids]}}, ...]}}")
    return [(s["when"], [int(i) for i in s["ids"]]) for s in scripts]


class TorchState:
    """A request's decoding state in model mode: its KV cache, generator, token counts and guide matcher."""

    def __init__(self, engine: "Engine", request: ActiveRequest) -> None:
        import torch  # noqa: PLC0415

        self.torch = torch
        p = request.params
        self.adapter: Optional[str] = None
        if request.lora is not None and engine.lora is not None:
            self.adapter = engine.lora.load(request.lora, engine.adapters_in_use())
        self.matcher = None
        if p.guided_decoding is not None:
            if engine.grammar_compiler is None:
                raise ValueError("stand-in: a guided request to an LLM without guided_decoding_backend")
            import xgrammar  # noqa: PLC0415

            self.xgr = xgrammar
            self.matcher = xgrammar.GrammarMatcher(engine.compile_guide(p.guided_decoding))
            self.bitmask = xgrammar.allocate_token_bitmask(1, engine.vocab_size)
        self.cache = None
        self.images = (request.multimodal or {}).get("image")
        if self.images is not None and engine.image_token_id is None:
            raise ValueError("stand-in: an image request to a model without image_token_index")
        self.pending: Optional[int] = None
        self.torch_sampler = engine.sampler == TORCH_SAMPLER
        if self.torch_sampler:
            self.generator = engine.shared_generator()
        else:
            self.generator = torch.Generator(device="cpu")
            self.generator.manual_seed(int(p.seed or 0))
        self.greedy = p._greedy_decoding
        self.penalized = not self.torch_sampler and any(v is not None and abs(v - d) > 1e-9 for v, d in (
            (p.repetition_penalty, 1.0), (p.presence_penalty, 0.0), (p.frequency_penalty, 0.0)))
        self.counts = None

    def _forward(self, engine: "Engine", ids: List[int]):
        torch = self.torch
        model, adapter = (engine.lora.model, engine.lora.use(self.adapter)) if engine.lora is not None else (
            engine.model, contextlib.nullcontext())
        extra = {}
        if self.cache is None and self.images is not None:  # the prompt's pass: the pixels and the image positions
            extra = {"pixel_values": self.images["pixel_values"].to(torch.float32),
                     "token_type_ids": (torch.tensor([ids]) == engine.image_token_id).to(torch.long)}
        with adapter:
            out = model(input_ids=torch.tensor([ids]), past_key_values=self.cache, use_cache=True, **extra)
        self.cache = out.past_key_values
        return out.logits[0, -1, :].float().unsqueeze(0)

    def next_token(self, engine: "Engine", request: ActiveRequest) -> tuple[int, Optional[Dict[int, float]]]:
        torch, p = self.torch, request.params
        with torch.inference_mode():
            logits = self._forward(engine, request.prompt if self.pending is None else [self.pending])
            vocab = logits.shape[-1]
            if self.matcher is not None:
                self.matcher.fill_next_token_bitmask(self.bitmask)
                self.xgr.apply_token_bitmask_inplace(logits, self.bitmask)
            end_id = p.end_id
            if self.torch_sampler:
                return self._torch_sampler_token(request, logits, end_id)
            if self.penalized:
                if self.counts is None:
                    prompt = torch.tensor([t for t in request.prompt if 0 <= t < vocab], dtype=torch.long)
                    self.counts = torch.bincount(prompt, minlength=vocab).to(torch.float32)
                counts = self.counts[:vocab].unsqueeze(0)
                rep = p.repetition_penalty if p.repetition_penalty is not None else 1.0
                penalized = torch.where(logits < 0, logits * rep, logits / rep)
                penalized = penalized - (p.presence_penalty or 0.0) - (p.frequency_penalty or 0.0) * counts
                logits = torch.where(counts > 0, penalized, logits)
            if end_id is not None and 0 <= end_id < vocab and len(request.tokens) < (p.min_tokens or 0):
                logits[0, end_id] = float("-inf")
            if p.bad_token_ids:
                logits[0, [t for t in p.bad_token_ids if 0 <= t < vocab]] = float("-inf")
            token, final = self._sample(logits, p)
            log_prob = {token: float(torch.log_softmax(final, dim=-1)[0, token])} if p.logprobs else None
            if self.counts is not None and 0 <= token < vocab:
                self.counts[token] += 1
        return self._accept(token, end_id), log_prob

    def _torch_sampler_token(self, request: ActiveRequest, logits: Any,
                             end_id: Optional[int]) -> tuple[int, Optional[Dict[int, float]]]:
        """TorchSampler's step (see the module docstring): min_tokens counted with the prompt, no penalties and no
        bad words, the arg-max's raw log-prob before sampling, the shared generator."""
        torch, p = self.torch, request.params
        if len(request.prompt) + len(request.tokens) < (p.min_tokens or 0) and end_id is not None:
            logits[0, end_id] = float("-inf")  # end id -1 bans the last vocabulary id (fixed after 1.2.1, #12358)
        log_prob = None
        if p.logprobs:
            top = torch.topk(torch.log_softmax(logits, dim=-1), 1, dim=-1)
            log_prob = {int(top.indices[0, 0]): float(top.values[0, 0])}
        token, _ = self._sample(logits, p)
        return self._accept(token, end_id), log_prob

    def _sample(self, logits: Any, p: SamplingParams) -> tuple[int, Any]:
        """The next token (greedy, or temperature / top-k / top-p and a draw from :attr:`generator`) and the logits
        it was drawn from."""
        torch = self.torch
        if self.greedy:
            return int(torch.argmax(logits, dim=-1)[0]), logits
        vocab = logits.shape[-1]
        final = logits / float(p.temperature if p.temperature is not None else 1.0)
        k = p.top_k or 0
        if 0 < k < vocab:
            kth = torch.topk(final, k, dim=-1).values[..., -1, None]
            final = final.masked_fill(final < kth, float("-inf"))
        top_p = 1.0 if p.top_p is None else p.top_p
        if top_p < 1.0:
            ordered, index = torch.sort(final, descending=True)
            cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
            drop = cumulative - torch.softmax(ordered, dim=-1) > top_p
            final = final.scatter(1, index, ordered.masked_fill(drop, float("-inf")))
        return int(torch.multinomial(torch.softmax(final, dim=-1), 1, generator=self.generator)[0, 0]), final

    def _accept(self, token: int, end_id: Optional[int]) -> int:
        if self.matcher is not None and token != end_id and not self.matcher.accept_token(token):
            raise RuntimeError(f"stand-in: the guide's matcher refused token {token}")
        self.pending = token
        return token


class Engine:
    """The executor thread (see the module docstring). ``submit`` and ``abort_request`` from any thread."""

    def __init__(self, *, max_batch_size: int, vocab_size: int, model: Any = None, lora: Optional[LoraStore] = None,
                 grammar_compiler: Any = None, paced_step_s: Optional[float] = None,
                 cycle: Sequence[int] = (), log: Callable[[str], None] = lambda message: None,
                 sampler: str = TORCH_SAMPLER, stream_interval: int = 1, scripts: Optional[Sequence[tuple]] = None,
                 tokenizer: Any = None, lora_worker: Optional[LoraWorker] = None, abort_delay_s: float = 0.0,
                 image_token_id: Optional[int] = None) -> None:
        self.max_batch_size = max_batch_size
        self.image_token_id = image_token_id
        self.lora_worker = lora_worker
        self.abort_delay_s = abort_delay_s
        #: The worker's ``_results``: request id -> result, removed when its final response or error is dispatched.
        self.results: Dict[int, GenerationResult] = {}
        #: The exception that stopped the worker (None while it serves); the next generate_async raises it.
        self.error: Optional[BaseException] = None
        self._arrivals: Deque[ActiveRequest] = deque()  # submitted, not yet taken by the worker loop
        self.sampler = sampler
        self.stream_interval = max(1, int(stream_interval))
        self._generator = None
        self.vocab_size = vocab_size
        self.model = model
        self.lora = lora
        self.grammar_compiler = grammar_compiler
        self.clock = StepClock(paced_step_s) if paced_step_s else None
        self.cycle = list(cycle)
        self.scripts = scripts  # scripted mode (tests only), with the tokenizer that decodes prompts for it
        self.tokenizer = tokenizer
        self.log = log
        self._cond = threading.Condition()
        self._waiting: Deque[ActiveRequest] = deque()
        self._active: List[ActiveRequest] = []
        self._by_id: Dict[int, ActiveRequest] = {}
        self._closing = False
        self.steps = 0
        self._thread = threading.Thread(target=self._run, name="llmapi-standin-executor", daemon=True)
        self._thread.start()

    # -- any thread -------------------------------------------------------------------------------
    def submit(self, request: ActiveRequest) -> None:
        """The proxy's submit: the request goes to the worker loop (the engine thread), which loads its adapter and
        enqueues it."""
        with self._cond:
            if self._closing:
                raise RuntimeError("LLM is shutting down")
            self._arrivals.append(request)
            self._by_id[request.request_id] = request
            self.results[request.request_id] = request.result
            self._cond.notify()

    def abort_request(self, request_id: int) -> None:
        with self._cond:
            request = self._by_id.get(request_id)
            if request is None:
                self.log(f"Request of client_id {request_id} is finished, cannot abort it.")
                return
            request.abort_requested = True
            request.abort_at = time.monotonic() + self.abort_delay_s
            self._cond.notify()

    def is_shutdown(self) -> bool:
        return self._closing

    def shutdown(self, timeout_s: float = 30.0) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
        with self._cond:
            left = list(self._active) + list(self._waiting) + list(self._arrivals)
            self._active.clear()
            self._waiting.clear()
            self._arrivals.clear()
            self._by_id.clear()
        if self.error is not None:
            return  # the worker is dead: the proxy's abort of each request reaches nobody, nothing answers them
        self._dispatch([(r.result, EngineResponse(error="LLM is shutting down", finished=True)) for r in left])

    def shared_generator(self):
        """TorchSampler's one generator, seeded once (engine thread only)."""
        if self._generator is None:
            import torch  # noqa: PLC0415

            self._generator = torch.Generator(device="cpu")
            self._generator.manual_seed(TORCH_SAMPLER_SEED)
        return self._generator

    def adapters_in_use(self) -> set:
        with self._cond:
            return {r.state.adapter for r in self._active if isinstance(r.state, TorchState)}

    def compile_guide(self, guide: Any):
        compiler = self.grammar_compiler
        import xgrammar  # noqa: PLC0415

        if guide.json_object:
            return compiler.compile_builtin_json_grammar()
        if guide.json is not None:
            schema = guide.json if isinstance(guide.json, str) else json.dumps(guide.json)
            return compiler.compile_json_schema(schema)
        if guide.regex is not None:
            return compiler.compile_grammar(xgrammar.Grammar.from_regex(guide.regex))
        if guide.grammar is not None:
            return compiler.compile_grammar(xgrammar.Grammar.from_ebnf(guide.grammar))
        raise ValueError("stand-in: structural_tag guides are not emulated")

    # -- the engine thread ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except WorkerStopped as stopped:
            self._die(stopped.__cause__ or stopped)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closing and not self._active and not self._waiting and not self._arrivals:
                    self._cond.wait()
                    if self.clock is not None:
                        self.clock.idle()
                if self._closing:
                    return
                arrivals = list(self._arrivals)
                self._arrivals.clear()
            for request in arrivals:  # the worker's request loop: _enqueue_request, the adapter loaded first
                if request.lora is not None and self.lora_worker is not None:
                    try:
                        self.lora_worker.load(request.lora)
                    except Exception as exc:  # noqa: BLE001 - outside the RequestError path: critical
                        raise WorkerStopped(exc) from exc
            with self._cond:
                self._waiting.extend(arrivals)
                while self._waiting and len(self._active) < self.max_batch_size:
                    self._active.append(self._waiting.popleft())
                now = time.monotonic()
                if any(r.aborted_now(now) for r in self._waiting):
                    self._drop_aborted_waiting(now)
                turn = list(self._active)
                waiting_aborts = any(r.abort_requested for r in self._waiting)
            if not turn:
                if waiting_aborts:  # a slow abort of a waiting request: look again when it has arrived
                    time.sleep(min(0.01, self.abort_delay_s or 0.01))
                continue
            if self.clock is not None:
                self.clock.await_step()
            self.steps += 1
            deliveries = []
            for request in turn:
                response = self._advance(request)
                if response is not None:
                    deliveries.append((request.result, response))
            with self._cond:
                for request in turn:
                    if request.done:
                        self._active.remove(request)
                        self._by_id.pop(request.request_id, None)
            self._dispatch(deliveries)

    def _die(self, cause: BaseException) -> None:
        """``worker_main``'s critical path: the worker stops, the proxy's dispatch thread is told to quit (nothing in
        flight gets another response), and the error waits for the next ``generate_async``."""
        self.log(f"stand-in: the executor worker stopped (a failure outside the RequestError path, as TensorRT-LLM "
                 f"1.2.1's worker_main): {type(cause).__name__}: {cause}")
        with self._cond:
            self.error = cause

    def _drop_aborted_waiting(self, now: float) -> None:
        """1.2.1's ``update_waiting_queue``: aborted requests still waiting leave the queue with no response (their
        results never finish, and their ``_results`` entries stay). Holds ``_cond``."""
        for request in [r for r in self._waiting if r.aborted_now(now)]:
            self._waiting.remove(request)
            self._by_id.pop(request.request_id, None)
            self.log(f"stand-in: request {request.request_id} was aborted while waiting: dropped without a response, "
                     "as TensorRT-LLM 1.2.1's PyExecutor does")

    def _finish(self, request: ActiveRequest, reason: str, stop_reason: Any = None) -> EngineResponse:
        request.done = True
        start = request.sent if request.streaming else 0
        request.sent = len(request.tokens)
        logprobs = request.logprobs[start:] if request.params.logprobs else None
        return EngineResponse(list(request.tokens[start:]), logprobs, True, reason, stop_reason)

    def _advance(self, request: ActiveRequest) -> Optional[EngineResponse]:
        if request.aborted_now(time.monotonic()):
            return self._finish(request, "cancelled")
        try:
            if request.state is None:
                error = sampling_config_error(request.params)
                if request.max_new_tokens < 1:  # the C++ Request's own check (requestImpl.h validate)
                    error = "[TensorRT-LLM][ERROR] Assertion failed: mMaxNewTokens > 0 (requestImpl.h, stand-in)"
                if error is not None:
                    raise ValueError(error)
                if self.scripts is not None:
                    request.state = ScriptedState(request, self.scripts, self.tokenizer, self)
                elif self.clock is not None:
                    request.state = PacedState(request, self.cycle)
                else:
                    request.state = TorchState(self, request)
            if isinstance(request.state, TorchState):
                token, log_prob = request.state.next_token(self, request)
            else:
                token, log_prob = request.state.next_token(request)
        except WorkerStopped:
            raise
        except Exception as exc:  # noqa: BLE001 - one request's failure (RequestError upstream)
            self.log(f"stand-in: request {request.request_id} failed: {traceback.format_exc()}")
            request.done = True
            return EngineResponse(error=str(exc), finished=True)
        request.tokens.append(token)
        if log_prob is not None:
            request.logprobs.append(log_prob)
        if token == request.params.end_id:
            return self._finish(request, "stop")
        if len(request.tokens) >= request.max_new_tokens:
            return self._finish(request, "length")
        if not request.streaming:
            return None
        made = len(request.tokens)
        if made != 1 and made % self.stream_interval:
            return None  # stream_interval: held until its step (or the last)
        start, request.sent = request.sent, len(request.tokens)
        logprobs = request.logprobs[start:] if request.params.logprobs else None
        return EngineResponse(list(request.tokens[start:]), logprobs)

    def _dispatch(self, deliveries: list) -> None:
        """Hand responses to their results: one wake-up of each event loop for the whole step (upstream's
        ``AwaitResponseHelper.handle_for_worker``, executor/base_worker.py @7b437aaa, puts each response in its
        result's queue and notifies the loop once for all of them, ``_SyncQueue.notify_many``, and removes the
        ``_results`` entry of each final or error response)."""
        by_loop: Dict[Any, list] = {}
        with self._cond:
            for result, response in deliveries:
                if response.finished or response.error is not None:
                    self.results.pop(result.request_id, None)
        for result, response in deliveries:
            by_loop.setdefault(result._loop, []).append((result, response))
        for loop, items in by_loop.items():
            if loop is None:
                for result, response in items:
                    result._deliver(response)
                continue
            try:
                loop.call_soon_threadsafe(_deliver_all, items)
            except RuntimeError:  # the loop is closed: nobody waits for these any more
                pass


def _deliver_all(items: list) -> None:
    for result, response in items:
        result._deliver(response)
