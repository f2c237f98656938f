"""Token-rate stand-in for the ``tensorrt_llm`` model (Triton Python backend, decoupled).

A benchmark engine, never served by the product image: it emits tokens at a GPU-like rate so that
``scripts/benchmark`` can measure what Triton, the ensemble and the predictor cost per token when
the engine is not the bottleneck. It generates no real model output.

What it reuses, unchanged, from the CPU reference model (``triton_model_repo/
tensorrt_llm_reference/1/model.py``, loaded from the path in the ``reference_model`` parameter):
the request parsing and validation (``parse_request``), the in-flight :class:`Scheduler` (FIFO
queue, ``max_queue_size``, ``stop`` by request id, client cancellation, FINAL responses) and the
Triton side (:class:`TritonPythonModel`, :class:`TritonSink`, and ``triton_glue.py`` beside them). It
overrides only the three engine hooks: ``load_engine`` (a tokenizer and a text instead of a network),
``create_generation`` (:class:`StandinGeneration`) and ``create_sink`` (responses go through
:class:`SenderPool`).

Behaviour:

* **Batched steps.** Every ``step_ms`` (default 10 ms) each active request gets one token: the
  reference Scheduler steps its active requests in turn on one thread, and the shared
  :class:`StepClock` sleeps once per turn (in the first request that already has this step's
  token), not once per request. A request's first token comes in the first step that begins after
  it arrived (requests arriving together share it; at an idle engine that is one step later).
  When a turn takes longer than a step (CPU overload) the clock does not sleep, and steps stretch.
* **Batch limit.** At most ``max_active_requests`` requests are active (the Scheduler's slots);
  the rest wait in FIFO order, as with the C++ executor.
* **Tokens.** A realistic text (``text_file``; scripts/benchmark passes ``benchmarks/standin/text.txt``)
  is tokenized with the model's tokenizer (no special tokens) and cycled: request with ``seed`` s
  emits ``ids[(s + k) % len(ids)]`` for k = 0, 1, ... (:func:`expected_tokens`), so the client's
  detokenizer does real work and a client can check every token.
* **Ends** as the reference/C++ backend does: ``request_output_len`` tokens ("length"); stop words
  over prompt + output; ``stop`` by request id and client cancellation (the Scheduler); and, when
  ``end_id_after`` > 0 and the request has an ``end_id``, on the end token after
  ``max(end_id_after, min_tokens)`` tokens (the end token is not returned: a final response with
  no tokens). ``bad_words_list`` and the sampling parameters are validated and otherwise ignored;
  log-probs are 0.
* **Sender threads.** The C++ backend does not send responses from Triton's execute thread nor
  from its decoding loop: one ``WaitForResponse`` thread per model instance takes the executor's
  finished responses (``awaitResponses``) and calls ``TRITONBACKEND_ResponseSend``
  (NVIDIA/TensorRT-LLM ``triton_backend/inflight_batcher_llm/src/model_instance_state.cc``
  ``ModelInstanceState`` constructor and ``WaitForResponse``, @c8c6df08). So the scheduler thread
  here only queues responses, and ``sender_threads`` threads (default 1, upstream's one thread per
  instance) send them. Each request is bound to one sender thread, so its responses leave in order
  (as from one upstream instance); different requests' responses are sent concurrently when
  ``sender_threads`` > 1.
* **LoRA** (``lora_task_id``, ``lora_weights``, ``lora_config``): parsed, checked and cached as by the
  reference model (the same errors, cache misses and evictions), and otherwise ignored: the tokens are
  the text's whatever the adapter, so the benchmark measures what carrying adapters costs the serving path.
* **Scripted mode** (tests only: the ``script_file`` parameter, :func:`load_scripts`): instead of the text, a request
  emits the token ids of the first script whose ``when`` text is in its decoded prompt, one per step, then ends as
  on the end token (at the script's end, or at an id equal to the request's ``end_id``, which is not returned), or
  at ``request_output_len`` tokens; a prompt no script matches fails with an error response. It makes a given token
  sequence (a reasoning model's markers, say) come out of the real Triton path without a model that writes it.
  A guided request (``guided_decoding_backend`` xgrammar, as the reference loads it) replays each scripted token
  through the guide's matcher, and the end of the script through its end token: where the guide refuses one, the
  request fails, naming the token, because the C++ executor's guided decoder masks every token the grammar refuses
  (``batch_manager/guidedDecoder.cpp`` ``GuidedDecoder::build``/``execute``), so no engine emits it; the PyTorch
  backend's fails a request the same way (``_torch/pyexecutor/guided_decoder.py`` "failed to accept last new
  token"). A script therefore shows that a guide lets a model's output through. Outside scripted mode no guided
  decoder is loaded (the cycled text is no document), so a guided request fails as on an engine without one.
* **Cancellation checks** are cached for ``cancellation_check_period_ms`` (default 100, upstream's
  ``cancellation_check_period_ms`` default read in the same constructor; its ``WaitForCancel``
  thread polls at that period) instead of one IPC round trip per request per step.

Model parameters (string values; the reference model's own are read as there): ``reference_model``
and ``text_file`` (required: paths of the reference model.py and of the text), ``step_ms``,
``sender_threads``, ``cancellation_check_period_ms``, ``end_id_after``, ``tokenizer_dir`` (default:
``hf_model_dir``/tokenizer if present, else ``hf_model_dir``), ``script_file`` (scripted mode; empty: off), plus
the reference's
``hf_model_dir`` (read for config.json and the tokenizer only), ``max_input_len``, ``max_seq_len``,
``max_active_requests`` and ``exclude_input_in_output``. ``torch_threads`` is accepted and unused.

This module imports nothing from Triton or torch at import time, so the benchmark harness and the
tests import :func:`text_token_ids`, :func:`expected_tokens`, :class:`StepClock`,
:class:`StandinGeneration` and :class:`SenderPool` from it directly.
"""

from __future__ import annotations

import importlib.util
import json
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence

DEFAULT_STEP_MS = 10.0
# One WaitForResponse thread per model instance (model_instance_state.cc @c8c6df08).
DEFAULT_SENDER_THREADS = 1
# model_instance_state.cc @c8c6df08: "cancellation_check_period_ms is not specified, will be set to 100 (ms)".
DEFAULT_CANCELLATION_CHECK_PERIOD_MS = 100.0
REFERENCE_MODULE_NAME = "tensorrt_llm_reference_model"


# ------------------------------------------------------------------------------------------------
# Tokens
# ------------------------------------------------------------------------------------------------


def text_token_ids(tokenizer: Any, text: str) -> List[int]:
    """The text's token ids as the stand-in cycles them: no special tokens added, and any special
    token id the text might produce removed (so an end token never appears by accident)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    out = [int(i) for i in ids if int(i) not in special]
    if not out:
        raise ValueError("the stand-in's text has no tokens")
    return out


def expected_tokens(cycle: Sequence[int], seed: int, n: int) -> List[int]:
    """The first ``n`` tokens the stand-in emits for a request with ``seed`` (no early end)."""
    length = len(cycle)
    start = int(seed) % length
    return [int(cycle[(start + k) % length]) for k in range(n)]


# ------------------------------------------------------------------------------------------------
# Batched steps
# ------------------------------------------------------------------------------------------------


class StepClock:
    """One engine step every ``step_s`` seconds for all active generations.

    Used from the scheduler thread only (the reference Scheduler steps its jobs on one thread), so
    it has no lock. :meth:`await_step` is called by each generation before it emits a token: the
    first generation of a turn that already has the current step's token sleeps until the next
    step; the others of that turn then emit at once, in the same step.
    """

    def __init__(self, step_s: float, sleep: Callable[[float], None] = time.sleep,
                 now: Callable[[], float] = time.monotonic) -> None:
        if step_s < 0:
            raise ValueError(f"step_s must be >= 0, got {step_s}")
        self.step_s = float(step_s)
        self.tick = 0
        self.running = 0  # generations that have started and not ended
        self.steps = 0
        self.late_steps = 0  # steps that began late because the previous turn took longer than a step
        self._last = now()
        self._sleep = sleep
        self._now = now

    def join(self) -> None:
        """A generation starts stepping. An idle engine starts its step schedule now."""
        if self.running == 0:
            self._last = self._now()
        self.running += 1

    def leave(self) -> None:
        """A started generation ended."""
        self.running = max(0, self.running - 1)

    def await_step(self, last_tick: int) -> int:
        """Wait, if needed, for a step after ``last_tick``; return the step's tick."""
        if last_tick >= self.tick:
            target = self._last + self.step_s
            now = self._now()
            if target > now:
                self._sleep(target - now)
                self._last = target
            else:
                self._last = now
                self.late_steps += 1
            self.tick += 1
            self.steps += 1
        return self.tick


def load_scripts(path: str) -> List[tuple[str, List[int]]]:
    """Scripted mode's scripts (tests only): a JSON file ``{"scripts": [{"when": TEXT, "ids": [TOKEN_ID, ...]},
    ...]}``, as (when, ids) pairs in order.

    Raises:
        ValueError: the file is not such a document.
    """
    document = json.loads(Path(path).read_text(encoding="utf-8"))
    scripts = document.get("scripts") if isinstance(document, dict) else None
    if not isinstance(scripts, list) or not all(
            isinstance(s, dict) and isinstance(s.get("when"), str) and isinstance(s.get("ids"), list) for s in scripts):
        raise ValueError(f"script_file {path}: expected {{\"scripts\": [{{\"when\": text, \"ids\": [ids]}}, ...]}}")
    return [(s["when"], [int(i) for i in s["ids"]]) for s in scripts]


def pick_script(scripts: Sequence[tuple[str, List[int]]], prompt_text: str) -> List[int]:
    """The ids of the first script whose ``when`` is in ``prompt_text``.

    Raises:
        ValueError: none is.
    """
    for when, ids in scripts:
        if when in prompt_text:
            return ids
    raise ValueError(f"stand-in scripted mode: no script's 'when' is in the prompt {prompt_text[-200:]!r}")


class StandinGeneration:
    """One request's token stream (the reference's ``TokenGenerator`` protocol).

    ``step()`` waits for the clock's next step and accepts one token of the cycled text (or of ``script``, scripted
    mode), or ends on the end token (see the module docstring); ``finished``/``finish_reason`` as the reference.
    """

    def __init__(self, prompt_ids: Sequence[int], params: Any, clock: StepClock, cycle: Sequence[int],
                 end_id_after: int = 0, stop_word_end: Optional[Callable[..., Optional[int]]] = None,
                 script: Optional[Sequence[int]] = None, matcher: Any = None) -> None:
        self.prompt_ids: List[int] = [int(t) for t in prompt_ids]
        self.params = params
        self.tokens: List[int] = []
        self.log_probs: List[float] = []
        self.finished = False
        self.finish_reason: Optional[str] = None
        self._clock = clock
        self._cycle = cycle
        self._script = None if script is None else [int(t) for t in script]
        self._matcher = matcher  # scripted mode with a guide: xgrammar's matcher of the request's grammar
        self._start = int(params.seed) % len(cycle)
        self._end_id_after = int(end_id_after)
        self._stop_word_end = stop_word_end
        # The step current when the request arrived: its first token comes in a later one, so that
        # requests arriving together share a step, and one arriving at an idle engine waits a step.
        self._arrival_tick = clock.tick
        self._last_tick: Optional[int] = None

    @property
    def cum_log_prob(self) -> float:
        return 0.0

    def finish(self, reason: str) -> None:
        if not self.finished:
            self.finished = True
            self.finish_reason = reason
            if self._last_tick is not None:
                self._clock.leave()

    def step(self) -> List[int]:
        if self.finished:
            return []
        if self._last_tick is None:
            self._clock.join()
            self._last_tick = self._arrival_tick
        self._last_tick = self._clock.await_step(self._last_tick)
        p = self.params
        n = len(self.tokens)
        if self._script is not None:
            if n >= len(self._script) or (p.end_id is not None and self._script[n] == p.end_id):
                if self._matcher is not None and p.end_id is not None and not self._matcher.accept_token(p.end_id):
                    raise RuntimeError(f"the guide refuses the end token {p.end_id} after {n} scripted tokens: a "
                                       "guided engine would not end there")
                self.finish("end_id")  # the script's end, as the end token: never returned
                return []
            token = self._script[n]
            if self._matcher is not None and not self._matcher.accept_token(token):
                raise RuntimeError(f"the guide refuses scripted token {token} (the {n + 1}th): a guided engine "
                                   "masks it, so none emits it")
        elif p.end_id is not None and self._end_id_after > 0 and n >= max(self._end_id_after, p.min_tokens):
            self.finish("end_id")  # the end token is never returned
            return []
        else:
            token = int(self._cycle[(self._start + n) % len(self._cycle)])
        self.tokens.append(token)
        if p.return_log_probs:
            self.log_probs.append(0.0)
        if p.stop_words and self._stop_word_end is not None and \
                self._stop_word_end(self.prompt_ids + self.tokens, 1, p.stop_words) is not None:
            self.finish("stop_words")
        elif len(self.tokens) >= p.max_new_tokens:
            self.finish("length")
        return [token]


# ------------------------------------------------------------------------------------------------
# Sender threads
# ------------------------------------------------------------------------------------------------


class ThreadedSink:
    """A response sink whose sends are queued to one sender thread (in order).

    The request's response sender is only ever used from that sender thread, and never after its
    final response: ``is_cancelled()`` answers from a flag the sender thread refreshes (at most once
    per ``check_period_s``, before a send). In the Python backend the parent deletes a request's
    response factory when the final response arrives (python_backend src/python_be.cc,
    ResponseSendDecoupled), so a ``response_sender.is_cancelled()`` from another thread racing the
    final ``send`` touches freed state: seen here as lost tail tokens and as tritonserver crashing
    with SIGSEGV (benchmarks and /tmp reproductions, Triton 2.51). The C++ backend's cancellation
    thread looks requests up under a lock instead.
    """

    def __init__(self, inner: Any, pool: "SenderPool", lane: int, check_period_s: float) -> None:
        self.inner = inner
        self.broken = False
        self.closed = False  # the final response was sent: the sender must not be touched again
        self._pool = pool
        self._lane = lane
        self._check_period_s = check_period_s
        self._checked = float("-inf")
        self._cancelled = False

    def send_tokens(self, tokens, log_probs, cum_log_prob, final) -> None:
        self._pool.submit(self._lane, self, "send_tokens", (tokens, log_probs, cum_log_prob, final), final)

    def send_error(self, message: str) -> None:
        self._pool.submit(self._lane, self, "send_error", (message,), True)

    def is_cancelled(self) -> bool:
        return self._cancelled or self.broken

    def refresh_cancelled(self) -> None:
        """On the sender thread, before a send: ask Triton at most once per check period."""
        now = time.monotonic()
        if not self.closed and now - self._checked >= self._check_period_s:
            self._checked = now
            self._cancelled = bool(self.inner.is_cancelled())


class SenderPool:
    """``threads`` sender threads, each with its own FIFO queue; requests are bound to them in turn."""

    def __init__(self, threads: int, check_period_s: float = DEFAULT_CANCELLATION_CHECK_PERIOD_MS / 1e3,
                 log: Callable[[str, str], None] = lambda level, msg: None) -> None:
        if threads < 1:
            raise ValueError(f"sender_threads must be >= 1, got {threads}")
        self._log = log
        self._check_period_s = check_period_s
        self._queues: List["queue.SimpleQueue[Any]"] = [queue.SimpleQueue() for _ in range(threads)]
        self._next = 0
        self._lock = threading.Lock()
        self.sent = 0
        self.failed = 0
        self._threads = [
            threading.Thread(target=self._run, args=(q,), name=f"standin-sender-{i}", daemon=True)
            for i, q in enumerate(self._queues)
        ]
        for thread in self._threads:
            thread.start()

    def sink(self, inner: Any) -> ThreadedSink:
        """Wrap ``inner`` (a reference TritonSink) so that its sends go to the next sender thread."""
        with self._lock:
            lane = self._next
            self._next = (self._next + 1) % len(self._queues)
        return ThreadedSink(inner, self, lane, self._check_period_s)

    def submit(self, lane: int, sink: ThreadedSink, method: str, args: tuple, final: bool = False) -> None:
        self._queues[lane].put((sink, method, args, final))

    def _run(self, q: "queue.SimpleQueue[Any]") -> None:
        while True:
            item = q.get()
            if item is None:
                return
            sink, method, args, final = item
            if sink.broken or sink.closed:
                continue
            try:
                if not final:
                    sink.refresh_cancelled()
                getattr(sink.inner, method)(*args)
                self.sent += 1
                if final:
                    sink.closed = True
            except Exception as exc:  # noqa: BLE001 - a closed sender must not end the thread
                sink.broken = True
                self.failed += 1
                self._log("warn", f"stand-in sender: could not send a response ({method}): {exc}")

    def close(self, timeout_s: float = 10.0) -> None:
        """Send what is queued, then end the threads."""
        for q in self._queues:
            q.put(None)
        for thread in self._threads:
            thread.join(timeout_s)


# ------------------------------------------------------------------------------------------------
# Triton model
# ------------------------------------------------------------------------------------------------


def load_reference(path: str):
    """Import the reference model.py at ``path`` (once per process) as a module."""
    module = sys.modules.get(REFERENCE_MODULE_NAME)
    if module is not None:
        return module
    source = Path(path)
    if not source.is_file():
        raise ValueError(f"parameter reference_model: {source} is not a file (the reference model.py)")
    # a package of its folder: the reference model imports the modules beside it relatively, as in Triton (1.model)
    spec = importlib.util.spec_from_file_location(REFERENCE_MODULE_NAME, source,
                                                  submodule_search_locations=[str(source.parent)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[REFERENCE_MODULE_NAME] = module  # dataclasses look their module up here
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[REFERENCE_MODULE_NAME]
        raise
    return module


def _string_param(params: dict, key: str) -> str:
    value = params.get(key)
    raw = value.get("string_value", "") if isinstance(value, dict) else ""
    return "" if raw.strip().startswith("${") else raw.strip()


def standin_class(ref):
    """The reference ``TritonPythonModel`` with the stand-in's engine hooks."""

    class StandinModel(ref.TritonPythonModel):
        def load_engine(self, params: dict) -> tuple[int, int]:
            param = ref.glue.param
            hf_model_dir = Path(param(params, "hf_model_dir", "", str))
            if not str(hf_model_dir):
                raise ValueError("parameter hf_model_dir is required (the checkpoint folder with the tokenizer)")
            config = json.loads((hf_model_dir / "config.json").read_text())
            tokenizer_dir = param(params, "tokenizer_dir", "", str)
            if not tokenizer_dir:
                tokenizer_dir = hf_model_dir / "tokenizer" if (hf_model_dir / "tokenizer").is_dir() else hf_model_dir
            text_file = param(params, "text_file", "", str)
            if not text_file:
                raise ValueError("parameter text_file is required (the text whose tokens the stand-in cycles)")
            from transformers import AutoTokenizer  # noqa: PLC0415

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
            self.cycle = text_token_ids(tokenizer, Path(text_file).read_text(encoding="utf-8"))
            self.tokenizer = tokenizer
            script_file = param(params, "script_file", "", str)
            self.scripts = load_scripts(script_file) if script_file else None
            step_ms = param(params, "step_ms", DEFAULT_STEP_MS, float)
            threads = param(params, "sender_threads", DEFAULT_SENDER_THREADS, int)
            period_ms = param(params, "cancellation_check_period_ms", DEFAULT_CANCELLATION_CHECK_PERIOD_MS, float)
            self.end_id_after = param(params, "end_id_after", 0, int)
            self.clock = StepClock(step_ms / 1e3)
            self.senders = SenderPool(threads, period_ms / 1e3, log=self._log)
            self.stop_word_end = ref.stop_word_end
            self.engine_name = (
                f"token-rate stand-in (step {step_ms:g} ms, {threads} sender thread(s), cancellation check every "
                f"{period_ms:g} ms, {len(self.cycle)}-token text {text_file}, end_id_after {self.end_id_after})"
                + (f"; scripted from {script_file} (tests only)" if self.scripts is not None else "")
            )
            vocab = int(config.get("vocab_size") or len(tokenizer))
            n_pos = int(config.get("max_position_embeddings") or 0) or 2048
            if self.scripts is not None:  # the reference's: guided requests compile as there (tests only)
                self.load_guided_decoder(params, vocab)
            return vocab, n_pos

        def create_generation(self, parsed) -> StandinGeneration:
            script = matcher = None
            if self.scripts is not None:
                script = pick_script(self.scripts, self.tokenizer.decode(list(parsed.prompt_ids)))
                if getattr(parsed, "grammar", None) is not None:
                    matcher = self._xgr.GrammarMatcher(parsed.grammar)
            return StandinGeneration(parsed.prompt_ids, parsed.params, self.clock, self.cycle,
                                     end_id_after=self.end_id_after, stop_word_end=self.stop_word_end, script=script,
                                     matcher=matcher)

        def create_sink(self, sender) -> ThreadedSink:
            return self.senders.sink(ref.TritonSink(sender))

        def create_lora_applier(self):
            """None: LoRA requests are parsed and cached as the reference does (its checks, cache miss, cache
            full, eviction), but the stand-in's tokens do not depend on an adapter."""
            return None

        def finalize(self) -> None:
            super().finalize()  # the Scheduler's last error responses still go through the senders
            senders = getattr(self, "senders", None)
            if senders is not None:
                senders.close()
                self._log("info", f"stand-in senders: {senders.sent} responses sent, {senders.failed} failed")

    return StandinModel


class TritonPythonModel:
    """What Triton loads: the reference model with the stand-in's hooks (built in ``initialize``,
    once the ``reference_model`` parameter says where the reference lives)."""

    def initialize(self, args) -> None:
        params = json.loads(args["model_config"]).get("parameters", {})
        path = _string_param(params, "reference_model")
        if not path:
            raise ValueError("parameter reference_model is required: the path of the reference tensorrt_llm model.py")
        self._impl = standin_class(load_reference(path))()
        self._impl.initialize(args)

    def execute(self, requests):
        return self._impl.execute(requests)

    def finalize(self) -> None:
        impl = getattr(self, "_impl", None)
        if impl is not None:
            impl.finalize()
