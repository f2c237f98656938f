"""The per-request and per-token work of a prediction: prompt -> token ids -> Triton -> ids -> text.

:class:`Generator` holds what this work needs (tokenizer, prompt formatter, engine limits, the gRPC
client, the guide checker) and nothing about how its text reaches Cog. It runs in the stream processes
(:mod:`cog_triton.streaming.streamer`).

Per request: :meth:`Generator.prepare` renders and tokenizes the prompt once (with the chat template's keyword
arguments the worker resolved: the reasoning switches and ``chat_template_kwargs``), compiles the guide
and sizes the request (input errors are raised here, before Triton). Per token:
:meth:`Generator.text_deltas` reads the ensemble's gRPC stream, detokenizes incrementally once, cuts
stop sequences, and yields text deltas; nothing in it waits on a lock, a future or another thread.

Reasoning: for a checkpoint whose tokenizer has a thinking format (:attr:`Generator.template`, found once by
:func:`cog_triton.streaming.template_info.inspect_chat_template`), each prediction's ids are decoded by the stream
parser of :mod:`cog_triton.streaming.thinking` instead of a bare detokenizer: the thinking between ``<think>`` and
``</think>``, then the answer, whatever the model's format; it starts where the prompt leaves the thinking (the
template's generation prompt for the request's keyword arguments:
:class:`cog_triton.streaming.template_info.PromptStarts`). A checkpoint without one streams exactly as before: the
same detokenizer, the same per-token loop.

LoRA: a request with ``lora_weights`` carries its adapter's ``lora_task_id``, and its tensors unless this
process has already had that task served (:mod:`cog_triton.streaming.lora.tasks`); when the backend answers that the
task is not in its cache, :meth:`Generator.text_deltas` sends the request once more with the tensors. The
adapter itself is resolved (downloaded, converted) by :meth:`Generator.resolve_adapter`, off the event loop.
With the PyTorch backend (``GeneratorConfig.backend``) every request of an adapter carries its ``lora_task_id``
and its folder (``lora_path``), nothing converted: the LLM API loads the folder and caches it by the id.

Every stream here is watched for silence: :meth:`Generator.watchdog` fails a stream that received
nothing from Triton for ``token_timeout_s`` seconds (a sweep every half second, not a timer per token).
A running request is stopped from outside in one way, :meth:`RequestState.cancel`, with its reason: the
watchdog's error, or the worker's cancel (with or without Triton's stop request).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Optional

from common.errors import (
    IncompleteOutputError,
    InferenceError,
    InputError,
    LoraAdapterError,
    LoraCacheFullError,
    TritonError,
)
from cog_triton.stream_config import GeneratorConfig
from cog_triton.streaming.client import GenerateChunk, GenerateRequest, TritonClient
from cog_triton.reasoning import TemplateInfo
from cog_triton.streaming.detokenizer import IncrementalDetokenizer, find_noop_ids
from cog_triton.streaming.guided import GuideChecker
from cog_triton.ipc import Guide
from cog_triton.ipc import PredictInputs
from cog_triton.fetch.adapter_refs import AdapterRef
from cog_triton.streaming.lora.tasks import Adapter, Adapters, is_cache_full, is_cache_miss
from cog_triton.streaming.image_requests import ImageRequests, PredictionImages, counted
from cog_triton.streaming.prompt import PromptTokenizer
from cog_triton.streaming.stop import StopSequenceMatcher
from cog_triton.streaming.template_info import PromptStarts, inspect_chat_template
from cog_triton.streaming.thinking_generation import ThinkingBudget, plan_thinking, thinking_deltas
from cog_triton.streaming.token_budget import token_budget
from cog_triton.streaming.token_floor import TokenFloor
from tensorrtllm_backend.engine import ModelLimits
from tensorrtllm_backend.samplers import takes_seed

log = logging.getLogger(__name__)

#: How often the watchdog looks for silent streams, seconds.
WATCHDOG_PERIOD_S = 0.5


@dataclass(frozen=True)
class Prepared:
    """A request ready to send: the gRPC request, the prompt's length in tokens (None for a request with images,
    whose prompt the LLM's input processor tokenizes: the engine reports it, ``on_counts``), its LoRA adapter (or
    None), for a model that thinks, where the prompt leaves the thinking (``thinking``: True; ``thinking_start``: a
    :data:`~cog_triton.reasoning.PromptState` for tags, the channel of a message the prompt left open for harmony)
    and its thinking budget (``budget``; :mod:`cog_triton.streaming.thinking_generation`), and its images (how
    many)."""

    request: GenerateRequest
    prompt_tokens: Optional[int]
    adapter: Optional[Adapter] = None
    thinking: bool = False
    thinking_start: Any = None
    budget: Optional[ThinkingBudget] = None
    images: int = 0


@dataclass(eq=False, slots=True)  # identity: kept in a set
class RequestState:
    """One request in a stream process: what it did, filled in while it runs, and how it was stopped.

    Attributes:
        output_tokens: tokens generated so far (the end token is never counted).
        reasoning_tokens: of them, the thinking's (:mod:`cog_triton.streaming.thinking`; set when the stream ends).
        thinking_budget_reached: the prediction's thinking budget ended its thinking
            (:mod:`cog_triton.streaming.thinking_generation`).
        first_token_at: ``time.monotonic()`` when the first token arrived, or None.
        cut_by_stop_sequence: the output was cut by a stop sequence.
        finished: the engine sent its final response and the output is complete (not cancelled,
            failed or cut by a stop sequence).
        task: the asyncio task running the request (:meth:`Generator.text_deltas` sets it when None).
        error: set by :meth:`cancel`: what the stream raises instead of ``CancelledError``.
        send_stop_request: False once a :meth:`cancel` said not to send Triton the stop request.
        last_response_at: ``time.monotonic()`` of the last response from Triton (the watchdog's clock).
    """

    output_tokens: int = 0
    reasoning_tokens: int = 0
    thinking_budget_reached: bool = False
    first_token_at: Optional[float] = None
    cut_by_stop_sequence: bool = False
    finished: bool = False
    task: Optional["asyncio.Task[Any]"] = None
    error: Optional[BaseException] = None
    send_stop_request: bool = True
    last_response_at: float = field(default_factory=time.monotonic)
    prompt_tokens: Optional[int] = None  # a request with images: its prompt's length as the engine reported it

    def cancel(self, error: Optional[BaseException] = None, *, send_stop_request: bool = True) -> None:
        """Cancel the request's task with a reason (on its loop's thread): ``error`` is raised by the stream instead
        of ``CancelledError`` (the first error given wins); ``send_stop_request=False`` keeps Triton's stop request from
        being sent (Triton is being restarted). Cancelling a request before it streams (while it is prepared)
        only cancels its task."""
        if self.error is None:
            self.error = error
        if not send_stop_request:
            self.send_stop_request = False
        if self.task is not None:
            self.task.cancel()


def build_generator(config: GeneratorConfig, tokenizer: Any = None) -> "Generator":
    """A :class:`Generator` for ``config``; loads the tokenizer unless one is given (seconds: imports
    transformers, and xgrammar when guided decoding is on).

    Raises:
        ConfigError: guided decoding is on but xgrammar cannot be imported.
        OSError: the tokenizer cannot be loaded.
    """
    if tokenizer is None:
        from transformers import AutoTokenizer  # noqa: PLC0415 - heavy import

        tokenizer = AutoTokenizer.from_pretrained(str(config.tokenizer_dir), local_files_only=True)
    template = inspect_chat_template(tokenizer)
    prompts = PromptTokenizer(
        tokenizer,
        add_special_tokens=config.add_special_tokens,
        special_tokens_in_user_text=config.special_tokens_in_user_text,
        reasoning_key=template.message_reasoning_key,
    )
    return Generator(
        tokenizer,
        prompts,
        config.limits,
        TritonClient(config.grpc_address, token_timeout_s=config.token_timeout_s),
        guides=GuideChecker(tokenizer) if config.guided else None,
        guided_off_reason=config.guided_off_reason,
        token_timeout_s=config.token_timeout_s,
        adapters=(Adapters(config.lora, config.adapter_limits, backend=config.backend)
                  if config.lora and config.adapter_limits else None),
        lora_off_reason=config.lora.off_reason if config.lora else "no LoRA support was configured",
        send_seed=takes_seed(config.sampler),
        sends_stream_interval=config.sends_stream_interval,
        template=template,
        images=ImageRequests.of(config, tokenizer, prompts),
    )


class Generator:
    """Prepares requests and streams their text (see the module docstring).

    Args:
        tokenizer: the model's Hugging Face tokenizer (decoding).
        prompts: the prompt formatter/tokenizer built on it.
        limits: the engine's limits (tokens; prompts are held to ``executor_max_input_len()``).
        client: the gRPC client of the ensemble.
        guides: the guide checker when guided decoding is on, else None.
        guided_off_reason: why guided decoding is off (for the error a guided request gets).
        token_timeout_s: a stream that receives nothing from Triton for this long fails, seconds.
        adapters: resolves LoRA adapters (None: requests with lora_weights are refused, ``lora_off_reason``).
        send_seed: send each request's seed (False: the engine's sampler takes none, so none is sent; the worker
            refused a prediction whose given seed would have mattered).
        sends_stream_interval: each request carries the ``stream_interval_ms`` :meth:`prepare` is given (False: none is
            sent; :class:`cog_triton.stream_config.GeneratorConfig`).
        template: what the tokenizer's chat template says about reasoning
            (:func:`cog_triton.streaming.template_info.inspect_chat_template`); None: a model that does not think.
        images: prepares predictions with images (:mod:`cog_triton.streaming.image_requests`); None: refused.
    """

    def __init__(
        self,
        tokenizer: Any,
        prompts: PromptTokenizer,
        limits: ModelLimits,
        client: TritonClient,
        *,
        guides: Optional[GuideChecker] = None,
        guided_off_reason: str = "",
        token_timeout_s: float = 120.0,
        adapters: Optional[Adapters] = None,
        lora_off_reason: str = "",
        send_seed: bool = True,
        sends_stream_interval: bool = False,
        template: Optional[TemplateInfo] = None,
        images: Optional[ImageRequests] = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.prompts = prompts
        self.limits = limits
        self.client = client
        self.guides = guides
        self.guided_off_reason = guided_off_reason
        self.token_timeout_s = token_timeout_s
        self.adapters = adapters
        self.lora_off_reason = lora_off_reason
        self.send_seed = send_seed
        self.sends_stream_interval = sends_stream_interval
        self.template = template if template is not None else TemplateInfo()
        self.starts = PromptStarts(tokenizer, prompts, self.template.thinking)
        self.images = images if images is not None else ImageRequests(tokenizer, None)
        self._running: set[RequestState] = set()
        self._background: set[asyncio.Task[None]] = set()
        self.floor = TokenFloor.of(tokenizer)
        # Found once: a detokenizer finding them itself decodes every special token, per prediction (about 0.2 ms
        # of this process for SmolLM2's 17 on the 2-core development machine; more for larger special vocabularies).
        self.noop_ids = find_noop_ids(tokenizer)
        if not self.floor.max_token_chars:
            log.info("every prompt is tokenized before its length is checked: the tokenizer gives no floor (%s)",
                     self.floor.reason)

    # ------------------------------------------------------------------ per request
    def resolve_adapter(self, ref: AdapterRef) -> Adapter:
        """The LoRA adapter ``ref`` names, fetched and converted (blocking: up to the adapter download deadline).

        Raises:
            LoraAdapterError: the model serves no LoRA, or the adapter cannot be fetched or served (see
                :meth:`cog_triton.streaming.lora.tasks.Adapters.resolve`).
        """
        if self.adapters is None:
            raise LoraAdapterError(
                f"lora_weights {ref.display} was given, but this model cannot serve LoRA adapters: "
                f"{self.lora_off_reason}"
            )
        return self.adapters.resolve(ref)

    def triton_restarted(self) -> None:
        """Triton was restarted: use a new gRPC channel, and forget the LoRA tasks it held."""
        self.client.reset()
        if self.adapters is not None:
            self.adapters.held.clear()

    def prepare(self, inputs: PredictInputs, request_id: str, adapter: Optional[Adapter] = None,
                images: Optional[PredictionImages] = None, stream_interval_ms: Optional[int] = None) -> Prepared:
        """Render and tokenize the prompt (once; :mod:`cog_triton.streaming.prompt`) and build the request.

        ``stream_interval_ms``: the request's stream interval, milliseconds (the one due when it starts,
        :attr:`cog_triton.streaming.coalesce.StreamLoad.ms`), sent when the model takes it (``sends_stream_interval``).

        With ``inputs.lora``, ``adapter`` is its resolved adapter (resolved here when not given): the request
        carries its ``lora_task_id``, and its tensors unless this process has had the task served already. With
        images, ``images`` are its prompt and images (``self.images.load``, here when not given): a request with the
        prompt as text, untokenized, ``max_tokens`` as given (:mod:`cog_triton.streaming.image_requests`).

        Blocking (tokenizer, chat template, guide compilation, adapter download): call it off the event loop.

        Raises:
            InputError: the prompt is too long for the model, min_tokens cannot fit, the chat
                template refuses the input, or the guide does not compile / guided decoding is off.
            LoraAdapterError: see :meth:`resolve_adapter`.
        """
        loaded = (images or self.images.load(inputs)) if inputs.image_count else None
        if loaded is None:
            limits = self.limits
            self._refuse_far_too_long(inputs, limits)
            kwargs = inputs.template_kwargs
            if inputs.messages is not None:
                prompt = self.prompts.encode_messages(inputs.messages, inputs.system_prompt, kwargs)
            else:
                prompt = self.prompts.encode(inputs.prompt, inputs.system_prompt, inputs.prompt_template, kwargs)
            prompt_tokens, extra = len(prompt.ids), {}
            budget = token_budget(
                inputs, prompt_tokens, limits.executor_max_input_len(), limits.max_seq_len, limits.input_limit_reason()
            )
        else:  # rendered by the chat template (image_prompt), not tokenized: no prompt_template, no ids
            if inputs.thinking_budget_tokens:
                # the budget's answer request continues the first one's prompt in token ids, and a request with
                # images carries its prompt as text for the LLM's input processor (image_requests): not combined
                raise InputError(f"thinking_budget_tokens={inputs.thinking_budget_tokens} is not applied to a "
                                 f"prediction with images ({len(loaded.images)} given): give 0 (max_tokens bounds "
                                 "the thinking and the answer together), or leave image_input and image parts out")
            prompt, prompt_tokens, budget, extra = loaded.prompt, None, inputs.max_tokens, self.images.fields(loaded)
        thinking = self.template.thinking is not None
        start: Any = None
        plan: Optional[ThinkingBudget] = None
        if thinking:
            chat = inputs.prompt_template is None and self.prompts.has_chat_template
            start = self.starts.start(prompt, inputs.template_kwargs, chat=chat)
            guided, plan = plan_thinking(self, inputs, start, prompt_tokens, budget)
        else:
            if inputs.thinking_budget_tokens:
                raise InputError(f"thinking_budget_tokens={inputs.thinking_budget_tokens} bounds a model's thinking, "
                                 f"and this model does not think ({self.template.why()}); give 0")
            guided = self._guide_fields(inputs.guide)
        lora: dict[str, object] = {}
        if inputs.lora is not None:
            adapter = adapter or self.resolve_adapter(inputs.lora)
            assert self.adapters is not None
            if adapter.path is not None:  # the PyTorch backend: the folder with every request
                lora = {"lora_task_id": adapter.task_id, "lora_path": str(adapter.path)}
            else:
                held = adapter.task_id in self.adapters.held
                lora = {"lora_task_id": adapter.task_id, "lora": None if held else adapter.tensors}
        else:
            adapter = None
        greedy = inputs.greedy
        request = GenerateRequest(
            input_ids=prompt.ids,
            max_tokens=budget,
            min_tokens=inputs.min_tokens,
            # TensorRT-LLM decodes greedily with top_k=1; temperature 0 and top_p 0 are mapped to that (the
            # C++ backend would treat runtime_top_p <= 0 as "no top-p", utils.cc getSamplingConfigFromTensors).
            temperature=1.0 if greedy else inputs.temperature,
            top_k=1 if greedy else inputs.top_k,
            top_p=1.0 if greedy else inputs.top_p,
            repetition_penalty=inputs.repetition_penalty,
            presence_penalty=inputs.presence_penalty,
            frequency_penalty=inputs.frequency_penalty,
            length_penalty=inputs.length_penalty,
            seed=inputs.seed if self.send_seed else None,
            stream_interval_ms=stream_interval_ms if self.sends_stream_interval else None,
            request_id=request_id,
            **extra,
            **guided,
            **lora,  # type: ignore[arg-type]
        )
        count = len(loaded.images) if loaded is not None else 0
        if not thinking:
            return Prepared(request, prompt_tokens, adapter, images=count)
        return Prepared(request, prompt_tokens, adapter, thinking=True, thinking_start=start, budget=plan,
                        images=count)

    def _refuse_far_too_long(self, inputs: PredictInputs, limits: ModelLimits) -> None:
        """Refuse, before rendering and tokenizing it, a prompt whose text alone is more tokens than the
        model takes (:class:`cog_triton.streaming.token_floor.TokenFloor`): a 1,000,000-character prompt costs no
        tokenizer time. Prompts under the floor are tokenized and checked exactly, as before.

        Raises:
            InputError: the text's token floor exceeds ``executor_max_input_len()``.
        """
        # Content only: an earlier turn's thinking is left out by most templates, and the floor must stay a floor.
        texts = [message["content"] for message in inputs.messages] if inputs.messages is not None else [inputs.prompt]
        floor = self.floor.at_least(inputs.system_prompt, *texts)
        limit = limits.executor_max_input_len()
        if floor > limit:
            what = "conversation" if inputs.messages is not None else "prompt"
            chars = len(inputs.system_prompt) + sum(len(text) for text in texts)
            reason = limits.input_limit_reason()
            raise InputError(
                f"the {what} is too long: its {chars} characters are at least {floor} tokens (no token of this "
                f"model's tokenizer stands for more than {self.floor.max_token_chars} characters), and the model's "
                f"maximum input length is {limit} tokens{f' ({reason})' if reason else ''}; shorten the {what}"
            )

    def _guide_fields(self, guide: Optional[Guide]) -> dict[str, str]:
        """GenerateRequest fields for ``guide``, compiled first so that a bad one fails here, not in Triton.

        Raises:
            InputError: the guide does not compile, or the model has guided decoding off.
        """
        if guide is None:
            return {}
        if self.guides is None:
            raise InputError(
                f"{guide.source} asks for structured output, but guided decoding is off for this model: "
                f"{self.guided_off_reason}"
            )
        self.guides.compile(guide)
        return {"guide_type": guide.guide_type, "guide": guide.guide}

    def check_guided_output(self, inputs: PredictInputs, request: GenerateRequest, token_ids: list[int]) -> None:
        """Fail a guided prediction whose output stopped at the token limit before its document closed.

        Raises:
            IncompleteOutputError: names the limit, the tokens generated and the fix.
        """
        guide = inputs.guide
        if guide is None or self.guides is None or self.guides.is_complete(guide, token_ids):
            return
        limit = f"max_tokens={inputs.max_tokens}"
        if request.max_tokens < inputs.max_tokens:
            limit += f", capped to {request.max_tokens} by the model's maximum sequence length"
        raise IncompleteOutputError(
            f"the output is not a complete {guide.document} (asked for by {guide.source}): generation stopped "
            f"after {len(token_ids)} tokens at the token limit ({limit}) before it was complete; raise max_tokens "
            "or ask for a shorter answer"
        )

    # -------------------------------------------------------------------- per token
    def text_deltas(
        self,
        inputs: PredictInputs,
        prepared: Prepared,
        state: RequestState,
        on_first_token: Optional[Callable[[float], None]] = None,
        on_counts: Optional[Callable[[int, int], None]] = None,
    ) -> AsyncIterator[str]:
        """Stream the completion as text deltas, filling ``state`` as it goes.

        ``on_first_token(t)`` is called once, with ``time.monotonic()``, when the first token arrives
        (whether or not it makes text yet). ``on_counts(prompt_tokens, image_tokens)`` is called once for a
        request with images, with the counts of its first response (the prompt as the LLM's input processor made
        it, and how many of those tokens the images fill).

        The deltas concatenate to the full decode of the generated tokens, cut before the first
        stop sequence (which is never emitted). Must run in ``state.task`` (set to the running task when
        None), which :meth:`RequestState.cancel` cancels: the watchdog does when the stream falls silent. When
        the stream does not finish (cancelled, cut by a stop sequence, failed) Triton is told to stop the
        request, unless a cancel said not to.

        Raises:
            InferenceError: Triton rejected the request, reported an error, or sent nothing for
                ``token_timeout_s`` seconds.
            TritonError: the connection failed or the stream ended without its final response
                (the caller decides whether Triton died).
            IncompleteOutputError: a guided output reached the token limit before its document closed.
        """
        if prepared.thinking:  # a model that thinks: the one stream convention, the answer apart (its own module)
            return thinking_deltas(self, inputs, prepared, state, on_first_token, on_counts)
        return self._plain_deltas(inputs, prepared, state, on_first_token, on_counts)

    async def _plain_deltas(self, inputs: PredictInputs, prepared: Prepared, state: RequestState,
                            on_first_token: Optional[Callable[[float], None]],
                            on_counts: Optional[Callable[[int, int], None]]) -> AsyncIterator[str]:
        """:meth:`text_deltas` for a model that does not think: the detokenizer, the stop sequences, the guide."""
        request = prepared.request
        task = asyncio.current_task()
        assert task is not None
        if state.task is None:
            state.task = task
        state.last_response_at = time.monotonic()
        self._running.add(state)
        detok = IncrementalDetokenizer(self.tokenizer, skip_special_tokens=True, noop_ids=self.noop_ids)
        stops = StopSequenceMatcher(inputs.stop_sequences)
        guided_ids: Optional[list[int]] = [] if inputs.guide is not None else None  # to check the document
        engine_done = False  # the engine sent its final response: nothing to stop
        try:
            # Without an adapter the client's stream is read directly: no extra generator layer per token.
            responses = (
                self.client.generate_stream(request) if prepared.adapter is None else self._responses(prepared)
            )
            if prepared.images:  # only a request with images reads the counts (a layer of its own)
                responses = counted(responses, on_counts)
            async for chunk in responses:
                state.last_response_at = now = time.monotonic()
                ids = chunk.output_ids
                if not ids:
                    continue  # the last response of a request that ended on the end token
                if guided_ids is not None:
                    guided_ids.extend(ids)
                if state.first_token_at is None:
                    state.first_token_at = now
                    if on_first_token is not None:
                        on_first_token(now)
                text, stopped = stops.push(detok.push(ids))
                state.output_tokens = detok.num_tokens
                if text:
                    yield text
                if stopped:
                    state.cut_by_stop_sequence = True
                    return
            engine_done = True
            text, stopped = stops.push(detok.finish())
            if text:
                yield text
            if stopped:
                state.cut_by_stop_sequence = True
                return
            rest = stops.finish()
            if rest:
                yield rest
            if guided_ids is not None:
                await asyncio.to_thread(self.check_guided_output, inputs, request, guided_ids)
            state.finished = True
        except asyncio.CancelledError:
            if state.error is None:
                raise  # cancelled by the caller
            task.uncancel()
            raise state.error from None
        finally:
            self._running.discard(state)
            state.output_tokens = detok.num_tokens
            if not engine_done and state.send_stop_request:
                # Cancelled, cut by a stop sequence, or failed: make Triton stop generating too.
                self.send_stop_request_in_background(request.request_id)

    async def _responses(self, prepared: Prepared) -> AsyncIterator[GenerateChunk]:
        """The request's responses; for an adapter the backend no longer holds, the request is sent once more
        with its weights (the cache-miss error comes before any token, so nothing was streamed yet).

        Raises:
            LoraCacheFullError: the backend's LoRA cache has no room for the adapter ("PEFT Cache is full").
            As :meth:`cog_triton.streaming.client.TritonClient.generate_stream` otherwise.
        """
        request, adapter = prepared.request, prepared.adapter
        resent = False
        while True:
            answered = False
            try:
                async for chunk in self.client.generate_stream(request):
                    if not answered and adapter is not None and self.adapters is not None:
                        self.adapters.held.add(adapter.task_id)  # the backend holds the task now
                    answered = True
                    yield chunk
                return
            except InferenceError as exc:
                if adapter is None or answered:
                    raise
                if (is_cache_miss(exc.message, adapter.task_id) and request.lora is None and adapter.tensors is not None
                        and not resent):
                    if self.adapters is not None:
                        self.adapters.held.discard(adapter.task_id)
                        self.adapters.count("engine_misses")
                    log.info("LoRA task %d (%s) is not in Triton's cache: sending the request again with its "
                             "weights", adapter.task_id, adapter.display)
                    request, resent = dataclasses.replace(request, lora=adapter.tensors), True
                    continue
                if is_cache_full(exc.message):
                    raise LoraCacheFullError(
                        f"the engine's LoRA cache has no room for adapter {adapter.display} (lora_task_id "
                        f"{adapter.task_id}): every adapter in it is in use by running requests. Retry in a moment; "
                        "to serve more adapters at once raise COG_TRITON_LORA_CACHE_HOST_MEMORY_BYTES (or the "
                        f"engine's lora.max_loras). Triton said: {exc.message}"
                    ) from None
                raise

    # ------------------------------------------------------------------- housekeeping
    async def watchdog(self, period_s: float = WATCHDOG_PERIOD_S) -> None:
        """Run forever on the streams' loop: fail every stream silent for ``token_timeout_s`` seconds."""
        while True:
            await asyncio.sleep(period_s)
            self.expire_silent_streams()

    def expire_silent_streams(self) -> int:
        """Fail the streams that received nothing for ``token_timeout_s`` seconds; return how many."""
        deadline = time.monotonic() - self.token_timeout_s
        silent = [state for state in self._running if state.last_response_at < deadline and state.error is None]
        for state in silent:
            state.cancel(InferenceError(
                f"no token from Triton for {self.token_timeout_s:g} s (COG_TRITON_REQUEST_TIMEOUT_S)"
            ))
        return len(silent)

    def send_stop_request_in_background(self, request_id: str) -> None:
        """Send TensorRT-LLM's stop signal for ``request_id`` without waiting (best effort).

        Cancelling the gRPC stream (which :meth:`text_deltas` also does) cancels the ensemble
        request; Triton's ensemble scheduler passes a cancellation on to a composing model only when
        it schedules that step (triton-inference-server/core ensemble_scheduler.cc ``ScheduleSteps``;
        server issue #6739), so it reaches ``tensorrt_llm`` only if it comes before generation
        starts. For a generation already running, this explicit stop is what ends it (see
        :meth:`cog_triton.streaming.client.TritonClient.send_stop_request`); for the other case it is the backup.
        """
        client = self.client

        async def send() -> None:
            try:
                await client.send_stop_request(request_id)
                log.info("Triton request %s: stop request sent", request_id)  # tests tie it to the request
            except TritonError as exc:
                log.warning("could not stop request %s in Triton: %s", request_id, exc)

        try:
            task = asyncio.get_running_loop().create_task(send())
        except RuntimeError:  # no running loop (shutting down)
            return
        self._background.add(task)
        task.add_done_callback(self._background.discard)


__all__ = ("Generator", "GeneratorConfig", "Prepared", "RequestState", "WATCHDOG_PERIOD_S", "build_generator")
