"""Prometheus metrics an operator can scrape: the service's own, served with Triton's on a port of their own.

Cog records metrics per prediction only (:mod:`cog_triton.worker.metrics`, in each prediction's response), and
Triton serves its own metrics (``nv_inference_*``, the C++ backend's ``nv_trt_llm_*``) on a port bound to
127.0.0.1 (:mod:`tensorrtllm_backend.server`, ``--metrics-address``). vLLM, TGI and trtllm-serve expose a
Prometheus endpoint; this module gives the predictor one:

* :class:`ServiceMetrics`: the service's metrics in their own ``prometheus_client`` registry, named
  ``cog_triton_*`` (running and queued predictions, outcomes, errors by code, time to first token and time
  per output token, prompt and generated tokens, Triton and stream-process restarts, LoRA adapter cache
  counts, and for a model that thinks its reasoning and answer tokens and the reasoning levels applied). The names
  follow vLLM's (``num_requests_running``/``waiting``, ``prompt_tokens_total``,
  ``generation_tokens_total``, ``time_to_first_token_seconds``, ``time_per_output_token_seconds``:
  vllm-project/vllm ``vllm/engine/metrics.py`` @f0afa0c2).
* :class:`PredictionTracker`: one prediction's part, recorded once per prediction (never per token: the time
  per output token is (last token - first token) / (tokens - 1), observed once at its end).
* the endpoint, :class:`cog_triton.worker.metrics_endpoint.MetricsServer`: ``GET /metrics`` on
  ``COG_TRITON_PROMETHEUS_ADDRESS:COG_TRITON_PROMETHEUS_PORT`` in a thread of the Cog worker (the process where the
  metrics live; never on coglet's event loop). Each scrape returns the service's registry
  (``prometheus_client.generate_latest``) followed by the text Triton's own ``/metrics`` answered, unchanged
  (fetched with a short timeout; when Triton cannot be read, the service's metrics still come back, with
  ``cog_triton_triton_metrics_up 0``).

Both parts are in the Prometheus text format 0.0.4, which is what Triton serves (its metrics names do not
overlap ours: they start with ``nv_``), so the response is sent with that content type.

"Queued" here is what the worker can see: coglet has no queue (all slots busy answers ``409 At capacity``:
replicate/cog 6110c912 ``crates/coglet/src/transport/http/routes.rs``), so a prediction waits only inside
predict(), for a Triton restart or a stream process. The engine's own queue is Triton's metric
``nv_trt_llm_request_metrics{request_type="waiting"}`` of the C++ backend (NVIDIA/TensorRT-LLM 0d5352f5
``triton_backend/inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc``), in the same
scrape.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Mapping, Optional, Union

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from common.errors import CogTritonError
from cog_triton.worker.metrics import (
    ANSWER_TOKEN_COUNT,
    IMAGE_COUNT,
    IMAGE_TOKEN_COUNT,
    INPUT_TOKEN_COUNT,
    OUTPUT_TOKEN_COUNT,
    REASONING_EFFORT_APPLIED,
    REASONING_TOKEN_COUNT,
    THINKING_BUDGET_REACHED,
    TIME_TO_FIRST_TOKEN_NAMES,
    MetricSink,
)

log = logging.getLogger(__name__)

# No <name>_created series beside each counter and histogram (a timestamp per series, which doubles what a scrape
# carries and no query here needs); vLLM does the same (vllm/engine/metrics.py @f0afa0c2). prometheus_client's
# switch is process-wide: in the Cog worker this registry is its only user.
disable_created_metrics()

#: The text exposition format both parts of a scrape are in (Triton's /metrics is version 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: Seconds. From a few ms (a warm, idle engine) to minutes (a long queue, a LoRA download before the first token).
TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0,
                40.0, 80.0, 160.0)
#: Seconds per token: GPU decoding takes a few ms to tens of ms a token, the CPU reference model tens to hundreds.
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
                0.3, 0.5, 0.75, 1.0, 2.5)
#: The name of the time to first token this module observes (:func:`cog_triton.worker.metrics.record_time_to_first_token`
#: records one value under two names).
_TTFT_NAME = TIME_TO_FIRST_TOKEN_NAMES[-1]
#: LoRA adapter counts a stream process reports (keys of :meth:`cog_triton.streaming.lora.tasks.Adapters.take_counts`).
LORA_COUNTS = ("memory_hits", "disk_hits", "fetches", "engine_misses")

OUTCOMES = ("succeeded", "failed", "canceled")


def error_code(error: BaseException) -> str:
    """The ``code`` label of a failed prediction: our error's code (common/errors.py), else ``internal``."""
    return error.code if isinstance(error, CogTritonError) else "internal"


class ServiceMetrics:
    """The service's metrics, in their own registry (every name starts with ``cog_triton_``).

    Thread-safe: prometheus_client's metrics take a lock per update; everything here is called once per
    prediction (or per restart, per adapter), from any thread.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.running = Gauge(
            "cog_triton_predictions_running",
            "Predictions in predict() or streaming their output, less those queued.", registry=r)
        self.queued = Gauge(
            "cog_triton_predictions_queued",
            "Predictions in predict() waiting for Triton (being restarted) or for a stream process to run.",
            registry=r)
        self.predictions = Counter(
            "cog_triton_predictions", "Predictions that ended, by outcome.", ["outcome"], registry=r)
        self.errors = Counter(
            "cog_triton_prediction_errors",
            "Failed predictions by error code (the [code] their error starts with; internal: not one of ours).",
            ["code"], registry=r)
        self.ttft = Histogram(
            "cog_triton_time_to_first_token_seconds",
            "Time from predict() to the first generated token, seconds.", buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram(
            "cog_triton_time_per_output_token_seconds",
            "Per prediction that succeeded or failed with 2 or more tokens: (last token - first token) / "
            "(tokens - 1), seconds.",
            buckets=TPOT_BUCKETS, registry=r)
        self.prompt_tokens = Counter(
            "cog_triton_prompt_tokens", "Prompt tokens of the predictions sent to Triton.", registry=r)
        self.images = Counter(
            "cog_triton_images", "Images of the predictions sent to Triton (image_input and image parts of messages).",
            registry=r)
        self.image_tokens = Counter(
            "cog_triton_image_tokens", "Prompt tokens the images of those predictions fill (the engine's count).",
            registry=r)
        self.generation_tokens = Counter(
            "cog_triton_generation_tokens",
            "Tokens generated: each prediction's output_token_count; for a stream stopped early (a cancel, a "
            "Triton fault), the tokens it had generated.", registry=r)
        self.reasoning_tokens = Counter(
            "cog_triton_reasoning_tokens",
            "Of the generated tokens, the thinking's (through the token that ends it), for a model that thinks; also "
            "for a stream stopped early.", registry=r)
        self.answer_tokens = Counter(
            "cog_triton_answer_tokens",
            "Of the generated tokens, the answer's (after the thinking), for a model that thinks; also for a stream "
            "stopped early.", registry=r)
        self.reasoning_levels = Counter(
            "cog_triton_reasoning_effort_applied",
            "Predictions on a model that thinks (or given reasoning_effort), by the level applied: default (the chat "
            "template's), none, low, medium, high, or on (a level on a template that only turns thinking on or off, "
            "or always thinks).", ["level"], registry=r)
        self.thinking_budget_reached = Counter(
            "cog_triton_thinking_budget_reached",
            "Predictions given thinking_budget_tokens whose budget ended their thinking (the answer was then asked for "
            "with a second request to Triton).", registry=r)
        self.triton_restarts = Counter(
            "cog_triton_triton_restarts", "Times the supervisor restarted Triton after a fault.", registry=r)
        self.stream_process_restarts = Counter(
            "cog_triton_stream_process_restarts", "Times a stream process was restarted after it exited.",
            registry=r)
        self.resent_predictions = Counter(
            "cog_triton_resent_predictions",
            "Predictions sent to Triton once more after it died before their first token (they waited for the "
            "restart).", registry=r)
        self.lora_hits = Counter(
            "cog_triton_lora_cache_hits",
            "LoRA adapters served from a cache: memory (converted, in the stream process), disk (the adapter "
            "cache folder).", ["cache"], registry=r)
        self.lora_fetches = Counter(
            "cog_triton_lora_fetches", "LoRA adapters downloaded into the adapter cache.", registry=r)
        self.lora_engine_misses = Counter(
            "cog_triton_lora_engine_cache_misses",
            "Requests sent again with their adapter's weights because the engine's LoRA cache no longer held it.",
            registry=r)
        self.triton_up = Gauge(
            "cog_triton_triton_metrics_up",
            "1 when this scrape includes Triton's own metrics, 0 when Triton's /metrics could not be read.",
            registry=r)
        for outcome in OUTCOMES:  # every series exists from the start (a rate() needs its zero)
            self.predictions.labels(outcome)
        for cache in ("memory", "disk"):
            self.lora_hits.labels(cache)

    # ----------------------------------------------------------------- per prediction
    def track(self, sink: Optional[MetricSink], started: float) -> "PredictionTracker":
        """A :class:`PredictionTracker` for a prediction that began at ``started`` (``time.monotonic()``)."""
        return PredictionTracker(self, sink, started)

    def refused(self, error: BaseException) -> None:
        """A prediction refused before it started (its inputs did not validate): failed, with its code."""
        self.predictions.labels("failed").inc()
        self.errors.labels(error_code(error)).inc()

    def cancelled_stream(self, output_tokens: int, reasoning_tokens: Optional[int] = None) -> None:
        """A stream process stopped a cancelled stream after generating ``output_tokens`` (the prediction's own
        output_token_count is not recorded then), ``reasoning_tokens`` of them thinking (None: a model that does not
        think)."""
        if output_tokens > 0:
            self.generation_tokens.inc(output_tokens)
        if reasoning_tokens is not None:
            self.reasoning_tokens.inc(reasoning_tokens)
            self.answer_tokens.inc(max(output_tokens - reasoning_tokens, 0))

    def lora(self, counts: Mapping[str, int]) -> None:
        """Add LoRA adapter counts (increments since the last report; keys: :data:`LORA_COUNTS`)."""
        for key, value in counts.items():
            if value <= 0:
                continue
            if key == "memory_hits":
                self.lora_hits.labels("memory").inc(value)
            elif key == "disk_hits":
                self.lora_hits.labels("disk").inc(value)
            elif key == "fetches":
                self.lora_fetches.inc(value)
            elif key == "engine_misses":
                self.lora_engine_misses.inc(value)
            else:
                log.warning("unknown LoRA count %r ignored", key)

    def render(self) -> bytes:
        """The service's metrics in the text format."""
        return generate_latest(self.registry)


class _Queued:
    """The context in which a prediction waits (queued, not running)."""

    __slots__ = ("metrics",)

    def __init__(self, metrics: ServiceMetrics) -> None:
        self.metrics = metrics

    def __enter__(self) -> None:
        self.metrics.running.dec()
        self.metrics.queued.inc()

    def __exit__(self, *exc: object) -> None:
        self.metrics.queued.dec()
        self.metrics.running.inc()


class PredictionTracker:
    """One prediction in :class:`ServiceMetrics`: counted as running from its creation until :meth:`finish`.

    It is the prediction's metric sink (``tracker(name, value)``): it observes the time to first token, the
    prompt and output token counts, and the time per output token, then passes each metric on to ``sink``
    (Cog's scope), unchanged. :meth:`queued` is the context in which the prediction waits.
    """

    __slots__ = ("metrics", "sink", "started", "_first_at", "_tpot", "_done", "_lock")

    def __init__(self, metrics: ServiceMetrics, sink: Optional[MetricSink], started: float) -> None:
        self.metrics = metrics
        self.sink = sink
        self.started = started
        self._first_at: Optional[float] = None
        self._tpot: Optional[float] = None  # observed when the prediction ends, unless it was cancelled
        self._done = False
        self._lock = threading.Lock()
        metrics.running.inc()

    def __call__(self, name: str, value: Union[int, float, str]) -> None:
        m = self.metrics
        if name == _TTFT_NAME:
            m.ttft.observe(value)
            self._first_at = self.started + float(value)
        elif name == OUTPUT_TOKEN_COUNT:
            tokens = int(value)
            if tokens > 0:
                m.generation_tokens.inc(tokens)
            if tokens >= 2 and self._first_at is not None:
                self._tpot = max(0.0, time.monotonic() - self._first_at) / (tokens - 1)
        elif name == INPUT_TOKEN_COUNT:
            m.prompt_tokens.inc(int(value))
        elif name == REASONING_TOKEN_COUNT:
            m.reasoning_tokens.inc(int(value))
        elif name == ANSWER_TOKEN_COUNT:
            m.answer_tokens.inc(int(value))
        elif name == REASONING_EFFORT_APPLIED:
            m.reasoning_levels.labels(str(value)).inc()
        elif name == THINKING_BUDGET_REACHED:
            if value:
                m.thinking_budget_reached.inc()
        elif name == IMAGE_COUNT:
            m.images.inc(int(value))
        elif name == IMAGE_TOKEN_COUNT:
            m.image_tokens.inc(int(value))
        if self.sink is not None:
            self.sink(name, value)

    def queued(self) -> _Queued:
        """``with tracker.queued(): ...`` counts the prediction as queued, not running, meanwhile."""
        return _Queued(self.metrics)

    def finish(self, error: Optional[BaseException] = None, cancelled: bool = False) -> None:
        """The prediction ended (only the first call counts): failed with ``error``, else canceled when
        ``cancelled`` (or ``error`` is a CancelledError), else succeeded."""
        with self._lock:
            if self._done:
                return
            self._done = True
        m = self.metrics
        m.running.dec()
        if error is not None and not _is_cancel(error):
            m.predictions.labels("failed").inc()
            m.errors.labels(error_code(error)).inc()
        elif cancelled or error is not None:
            m.predictions.labels("canceled").inc()
            return
        else:
            m.predictions.labels("succeeded").inc()
        if self._tpot is not None:
            m.tpot.observe(self._tpot)


def _is_cancel(error: BaseException) -> bool:
    return isinstance(error, (asyncio.CancelledError, GeneratorExit))


__all__ = (
    "CONTENT_TYPE", "LORA_COUNTS", "OUTCOMES", "PredictionTracker", "ServiceMetrics", "TPOT_BUCKETS", "TTFT_BUCKETS",
    "error_code",
)
