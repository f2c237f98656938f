"""The predictor's logic: setup (fetch the weights, then gather -> plan -> launch) and the request path.

``predict.py`` only declares Cog inputs and delegates here. One :class:`LLMService` owns the
Triton process, its supervisor, the stream processes and the Prometheus endpoint for the lifetime of the
Cog worker.

Why one module: one concern, the predictor's life in the Cog worker: setup in order (the Prometheus endpoint, the
weights, :func:`cog_triton.worker.facts.gather_facts`, :func:`cog_triton.worker.planning.plan_serving`,
:func:`cog_triton.worker.launch.launch`, the self-test), each prediction's path (validate, wait for Triton, hand it
to a stream process, count it in the metrics) and shutdown. What setup decides and starts lives in those modules; the
helpers above the class are the request path's.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import threading
import time
import uuid
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator, Optional, TypeVar, Union

from common.errors import ConfigError, ImageInputError, InputError, TritonDiedError, TritonError
from cog_triton.fetch.adapter_refs import check_adapter_allowed
from cog_triton.fetch.redaction import errors_redacted, redact_error, redact_url
from cog_triton.fetch.rules import FetchRules
from cog_triton.ipc import PredictInputs
from cog_triton.stream_config import IMAGE_URLS, GeneratorConfig
from cog_triton.settings import Settings
from cog_triton.weights import fetch_weights
from cog_triton.worker.cog_bridge import on_end, then
from cog_triton.worker.exporter import ServiceMetrics
from cog_triton.worker.inputs import resolve_reasoning, validate_inputs
from cog_triton.worker.metrics import OUTPUT_TOKEN_COUNT, REASONING_EFFORT_APPLIED, MetricSink, performance_lines
from cog_triton.worker.metrics_endpoint import MetricsServer, serve_metrics
from cog_triton.worker.facts import gather_facts
from cog_triton.worker.launch import launch
from cog_triton.worker.planning import plan_serving
from cog_triton.worker.streams import PredictionStreams
from cog_triton.worker.supervisor import Health, State, Supervisor
from tensorrtllm_backend.engine import WeightsInfo
from tensorrtllm_backend.samplers import SamplingInputs, refusal, takes_seed
from tensorrtllm_backend.server import TritonServer

log = logging.getLogger(__name__)

T = TypeVar("T")
SELF_TEST_PROMPT = "Hello"
SELF_TEST_TOKENS = 4


def _run_coroutine_sync(factory: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine to completion from sync code, even if this thread already runs a loop."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(factory())  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = exc

    thread = threading.Thread(target=target, name="cog-triton-sync")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def _print_performance(seen: dict[str, Union[int, float]], started: float) -> None:
    """``log_performance_metrics``: print the prediction's performance lines (called from the thread that
    iterates its stream: coglet's, so they land in the prediction's logs)."""
    ttft = seen.get("time_to_first_token_s")
    lines = performance_lines(int(seen.get(OUTPUT_TOKEN_COUNT, 0)), time.monotonic() - started,
                              None if ttft is None else float(ttft))
    print("\n".join(lines), flush=True)


class LLMService:
    """Weights, model repository, Triton process and generation for one predictor.

    Lifecycle: :meth:`setup` (blocking, seconds to minutes) -> any number of concurrent
    :meth:`predict` / :meth:`generate` calls -> :meth:`shutdown` (also registered with ``atexit``).

    The per-token work of every prediction runs in the stream processes (``COG_TRITON_STREAM_PROCESSES``,
    :class:`cog_triton.worker.stream_pool.StreamPool`); this process validates, routes and relays text chunks.

    Prometheus metrics (:mod:`cog_triton.worker.exporter`): :attr:`metrics` counts every prediction that goes through
    :meth:`validate` and :meth:`predict`; :meth:`setup` serves them with Triton's on
    ``COG_TRITON_PROMETHEUS_PORT`` until :meth:`shutdown`.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.server: Optional[TritonServer] = None
        self.info: Optional[WeightsInfo] = None
        self.supervisor: Optional[Supervisor] = None
        self.generator_config: Optional[GeneratorConfig] = None
        self.pool: Optional[PredictionStreams] = None  # the stream processes (StreamPool, started by launch)
        self.metrics = ServiceMetrics()
        self.metrics_server: Optional[MetricsServer] = None
        atexit.register(self.shutdown)

    # ----------------------------------------------------------------- setup
    def setup(self, weights: Union[str, Path, None] = None) -> None:
        """Fetch weights, render the model repository, start Triton and the stream processes, run a self-test.

        Args:
            weights: URL (http, https, file) or local path of a .tar/.tar.gz archive or folder;
                default: COG_TRITON_WEIGHTS, else Cog's COG_WEIGHTS.

        Raises:
            ConfigError: no weights given, bad settings, unusable weights metadata, or a stream
                process that could not start.
            IncompatibleWeightsError: the engine was built by another TensorRT-LLM version, needs more
                GPUs than are visible, or targets another GPU compute capability.
            WeightsError: download, checksum or extraction failed; ManifestError: a file differs
                from manifest.json.
            TritonStartupError: Triton did not become ready (message has its log tail).
            TritonError: the self-test generation failed.
            ConfigError: the Prometheus endpoint cannot listen on COG_TRITON_PROMETHEUS_ADDRESS:PORT.
        """
        with errors_redacted():  # the caller and coglet's log get the message: no URL's secret in it
            self._setup(weights)

    def _setup(self, weights: Union[str, Path, None]) -> None:
        started = time.monotonic()
        settings = self.settings
        source = str(weights) if weights not in (None, "") else settings.weights.default_source()
        if not source:
            raise ConfigError(
                "no weights given: pass setup(weights=...), or set COG_WEIGHTS or COG_TRITON_WEIGHTS to a URL or path "
                "of a .tar/.tar.gz archive or folder holding an engine or a Hugging Face checkpoint"
            )
        self.shutdown()
        # First: a port in use fails setup before a download of many GB.
        endpoint = settings.metrics
        self.metrics_server = serve_metrics(self.metrics, endpoint.prometheus_address, endpoint.prometheus_port,
                                            triton_metrics_port=settings.triton.metrics_port,
                                            max_connections=endpoint.prometheus_max_connections,
                                            request_timeout_s=endpoint.prometheus_request_timeout_s,
                                            backlog=endpoint.prometheus_backlog,
                                            reuse_s=endpoint.prometheus_reuse_s,
                                            triton_timeout_s=endpoint.prometheus_triton_timeout_s)
        fetched = fetch_weights(
            source,
            settings.weights.path,
            sha256=settings.weights.sha256,
            timeout_s=settings.download.timeout_s,
            retries=settings.download.retries,
            deadline_s=settings.download.deadline_s,
            min_rate_bytes_s=settings.download.min_rate_bytes_s,
            rate_grace_s=settings.download.rate_grace_s,
            max_extracted_bytes=settings.weights.max_extracted_bytes,
            hub_code=settings.llm.trust_remote_code,
        )
        log.info("weights ready in %s (%s)", fetched.path, "reused" if fetched.skipped else "fetched")
        facts = gather_facts(settings, reused=fetched.skipped)
        plan = plan_serving(facts, settings)
        for warning in plan.warnings:
            log.warning("%s", warning)
        log.info("%s", plan.describe())
        self.info = plan.info
        serving = launch(plan, settings, self.metrics, self._died_or, self.metrics.triton_restarts.inc)
        self.server, self.pool, self.supervisor = serving.server, serving.pool, serving.supervisor
        self.generator_config = serving.generator_config
        if settings.predictor.self_test:
            self._self_test()
        log.info("setup finished in %.1f s", time.monotonic() - started)

    def _self_test(self) -> None:
        inputs = validate_inputs(prompt=SELF_TEST_PROMPT, max_tokens=SELF_TEST_TOKENS, temperature=0, seed=0)

        async def run() -> str:
            return "".join([part async for part in self.generate(inputs, track=False)])

        started = time.monotonic()
        text = _run_coroutine_sync(run)
        log.info("self-test generated %r in %.2f s", text, time.monotonic() - started)

    # ------------------------------------------------------------- lifecycle
    def shutdown(self) -> None:
        """Stop the stream processes, stop watching and stop Triton (SIGINT, then SIGKILL after the grace
        period); its shared memory is removed; stop the Prometheus endpoint. Safe to call repeatedly."""
        if self.metrics_server is not None:
            self.metrics_server.stop()
            self.metrics_server = None
        if self.pool is not None:
            self.pool.stop()
            self.pool = None
        if self.supervisor is not None:
            self.supervisor.stop()
        if self.server is not None:
            self.server.stop()

    def health(self) -> Health:
        """Whether the service can serve (for the predictor's healthcheck; see cog_triton.worker.supervisor)."""
        if self.supervisor is None or self.pool is None:
            return Health(False, "setup() has not completed")
        pool = self.pool.health()
        return pool if not pool.healthy else self.supervisor.health()

    # ------------------------------------------------------------ generation
    def validate(self, **inputs: Any) -> PredictInputs:
        """:func:`cog_triton.worker.inputs.validate_inputs`, then the reasoning inputs mapped onto the model's chat
        template (:func:`cog_triton.worker.inputs.resolve_reasoning`, for a model that thinks or a prediction that gave
        them), then the refusal of an input the engine's sampler would ignore
        (:func:`tensorrtllm_backend.samplers.refusal`; the PyTorch backend's TorchSampler), counting a refused
        prediction in :attr:`metrics` (predict() calls it first).

        Raises:
            InputError: as ``validate_inputs``; a reasoning level the template cannot express or a
                ``chat_template_kwargs`` key it does not take (:func:`cog_triton.reasoning.resolve`); or an input the
                sampler would ignore (naming the input and what the caller can do: leave it out, or decode greedily
                for a seed; the setting that would apply it is logged for the operator).
        """
        try:
            checked = validate_inputs(**inputs)
            template = self.pool.template if self.pool is not None else None
            if template is not None and (checked.reasoning_effort or checked.chat_template_kwargs
                                         or template.thinking is not None or template.switches):
                checked = resolve_reasoning(checked, template)
            config = self.generator_config
            sampler = config.sampler if config is not None else None
            problem = refusal(sampler, SamplingInputs(
                greedy=checked.greedy, repetition_penalty=checked.repetition_penalty,
                presence_penalty=checked.presence_penalty, frequency_penalty=checked.frequency_penalty,
                min_tokens=checked.min_tokens, seed=checked.seed if checked.seed_given else None))
            if problem is not None:
                log.warning("%s", problem.log_line())  # the operator's remedy; the caller's error says what they can do
                raise InputError(problem.message)
            self._check_images(checked)
            return checked
        except Exception as exc:
            self.metrics.refused(exc)
            safe = redact_error(exc)  # the caller and coglet's log get the message (an input may hold a URL)
            if safe is exc:
                raise
            raise safe from None

    def _check_images(self, inputs: PredictInputs) -> None:
        """Refuse a prediction's images here, before a stream process, when the model serves none (the C++ engine
        path, a text-only or CPU-served checkpoint, or COG_TRITON_IMAGES off: ``GeneratorConfig.images_off``) or when
        there are more than ``COG_TRITON_IMAGE_MAX_COUNT``. Their contents are checked in the stream process
        (:mod:`cog_triton.streaming.images`).

        Image URLs of ``messages`` are held to the fetch rules as far as that needs no connection (scheme, host list,
        an address given as the host), as ``lora_weights`` is; their addresses are checked when fetched.

        Raises:
            ImageInputError: naming the count, the reason and what is allowed, or the URL and the rule.
        """
        count = inputs.image_count
        if not count:
            return
        config = self.generator_config
        off = config.images_off if config is not None else "setup() has not completed"
        if off is not None:
            raise ImageInputError(f"{count} image(s) were given (image_input, image parts of messages), but {off}")
        limit = config.image_limits.max_count
        if count > limit:
            raise ImageInputError(f"{count} images were given; a prediction may carry at most {limit} "
                                  "(COG_TRITON_IMAGE_MAX_COUNT), counting image_input and image parts of messages")
        rules = config.image_limits.rules
        for index, message in enumerate(inputs.messages or ()):
            if isinstance(message["content"], str):
                continue
            for number, part in enumerate(message["content"]):
                url = part.get("url", "") if part.get("type") == "image" else ""
                if not url.lower().startswith(("https://", "http://")):
                    continue  # a data URI: read in the stream process
                refusal = rules.url_refusal(url, IMAGE_URLS) if rules is not None else "no fetch rules are configured"
                if refusal is not None:  # the scheme, the host list, an IP address: here, before a stream process
                    raise ImageInputError(f"messages[{index}].content[{number}] {redact_url(url)} is refused: "
                                          f"{refusal}")

    def seed_note(self, inputs: PredictInputs) -> str:
        """What the prediction's log says of its seed: the seed sent, or why none is."""
        config = self.generator_config
        if config is None or takes_seed(config.sampler):
            return f"seed {inputs.seed}"
        return (f"no seed sent: the PyTorch backend's {config.sampler} takes none (greedy decoding, or sampling from one "
                "shared generator)")

    async def predict(self, inputs: PredictInputs, metric: Optional[MetricSink] = None, *,
                      track: bool = True) -> Iterator[str]:
        """Start generating ``inputs``; return the sync generator of text chunks coglet streams.

        Returns once the request is prepared (prompt rendered and tokenized once) and sent to Triton;
        an input error is raised here, before the first output. ``metric(name, value)`` receives
        input_token_count, output_token_count (tokens) and the time to first token (seconds, from
        this call to the first token; :mod:`cog_triton.worker.metrics` names), from any thread. With
        ``log_performance_metrics`` the generator prints the prediction's performance lines at its end
        (:func:`cog_triton.worker.metrics.performance_lines`). See :mod:`cog_triton.worker.cog_bridge` for why
        predict() returns a generator rather than yielding.

        The generator's chunks concatenate to the full decode of the generated tokens, cut before the
        first stop sequence (never emitted); a chunk leaves at most every stream interval.

        Raises:
            InputError: the prompt is too long for the model, min_tokens cannot fit, the chat template
                refuses the input, or the guide does not compile; LoraAdapterError: adapters are off
                (COG_TRITON_LORA_ADAPTERS) or the fetch rules refuse ``lora_weights``, or it cannot be served.
            TritonError: setup() has not completed, or Triton could not be restarted in time.
            StreamProcessError: no stream process could take the prediction.

        The generator raises: TritonDiedError (Triton exited or faulted, detected within ~0.5 s, after the prediction
        had a token; one that had none waits for the restart and is sent once more:
        :meth:`cog_triton.worker.stream_pool.StreamPool.resend_later`),
        InferenceError (Triton rejected the request or sent nothing for COG_TRITON_REQUEST_TIMEOUT_S),
        TritonError (the connection broke), IncompleteOutputError (a guided output reached the token
        limit before its document closed), StreamProcessError (its stream process died).

        ``track``: count the prediction in :attr:`metrics` (the self-test is not counted): running from this
        call until the generator stops, then its outcome (and error code), its time to first token, time per
        output token and token counts, once each.
        """
        if inputs.lora is not None:  # adapters off, or refused by the fetch rules: here, before a stream process
            check_adapter_allowed(inputs.lora, FetchRules.from_settings(self.settings),
                                  self.settings.adapters.enabled)
        started = time.monotonic()
        tracker = self.metrics.track(metric, started) if track else None
        sink: Optional[MetricSink] = tracker if tracker is not None else metric
        if inputs.reasoning_applied and sink is not None:
            sink(REASONING_EFFORT_APPLIED, inputs.reasoning_applied)
        seen: dict[str, Union[int, float]] = {}
        if inputs.log_performance_metrics:
            outer = sink

            def capture(name: str, value: Union[int, float]) -> None:
                seen[name] = value
                if outer:
                    outer(name, value)

            sink = capture
        try:
            stream = await self._open(inputs, sink, started, tracker.queued if tracker is not None else None)
        except BaseException as exc:
            if tracker is not None:
                tracker.finish(exc)
            safe = redact_error(exc)  # the caller and coglet's log get the message (an adapter's fetch error)
            if safe is exc:
                raise
            raise safe from None
        if tracker is not None:
            on_end(stream, tracker.finish)
        if inputs.log_performance_metrics:
            return then(stream, lambda: _print_performance(seen, started))
        return stream

    async def _open(self, inputs: PredictInputs, metric: Optional[MetricSink], started: float,
                    queued: Optional[Callable[[], AbstractContextManager[None]]] = None) -> Iterator[str]:
        supervisor, pool = self.supervisor, self.pool
        if supervisor is None or pool is None:
            raise TritonError("setup() has not completed: Triton is not running")
        if supervisor.state is State.READY or queued is None:
            await supervisor.wait_ready()  # returns at once while Triton runs
        else:
            with queued():  # Triton is being restarted: the prediction waits for it
                await supervisor.wait_ready()
        request_id = f"cog-triton-{uuid.uuid4().hex}"
        try:
            return await pool.open(inputs, request_id, started, metric, queued)
        finally:
            # One line in the prediction's logs (coglet routes it by the task's context): the request id ties it to
            # Triton's log lines; the seed note says what was sent. Written once the Start has left, not before:
            # the worker's event loop runs the starts of a burst of predictions one after another, about 0.3 ms
            # each on a 16-core GPU host, a log line ~65 us of that (benchmarks/results/2026-11-29-h200-i32).
            note = f", {inputs.reasoning_note}" if inputs.reasoning_note else ""
            log.info("Triton request id %s, %s%s", request_id, self.seed_note(inputs), note)

    async def generate(self, inputs: PredictInputs, metric: Optional[MetricSink] = None, *,
                       track: bool = True) -> AsyncIterator[str]:
        """:meth:`predict` as an async iterator of text chunks (the self-test and tests use it).

        Raises:
            As :meth:`predict` and its generator.
        """
        stream = await self.predict(inputs, metric, track=track)
        end = object()
        try:
            while True:
                chunk = await asyncio.to_thread(next, stream, end)
                if chunk is end:
                    return
                yield chunk  # type: ignore[misc]
        finally:
            stream.close()

    async def _died_or(self, exc: TritonError) -> TritonError:
        """After a broken connection: TritonDiedError if Triton exits or faults within 2 s, else ``exc``."""
        server, supervisor = self.server, self.supervisor
        assert server is not None and supervisor is not None
        for _ in range(20):
            if not server.is_alive():
                return TritonDiedError(
                    f"Triton {server.exit_description()} during the prediction; it is being restarted. "
                    f"Last log lines:\n{server.log_tail(20)}"
                )
            if supervisor.state is not State.READY:
                return TritonDiedError(f"{supervisor.counters.last_fault}; the prediction was stopped")
            await asyncio.sleep(0.1)
        return exc
