"""setup()'s last step: start what the plan says (:func:`launch`): render the model repository, start the stream
processes and Triton, watch Triton, and wait until both serve. The decisions are the plan's
(:func:`cog_triton.worker.planning.plan_serving`); only those that need the rendered repository or the started server
are made here (guided decoding, ``stream_interval_ms``, Triton's gRPC address).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Awaitable, Callable, Optional

from common.errors import TritonError
from cog_triton.stream_config import GeneratorConfig
from cog_triton.settings import Settings
from cog_triton.worker.exporter import ServiceMetrics
from cog_triton.worker.planning import ServingPlan
from cog_triton.worker.stream_pool import StreamPool
from cog_triton.worker.supervisor import Supervisor
from tensorrtllm_backend.engine import WeightsInfo
from tensorrtllm_backend.server import TritonServer, locate_tritonserver
from tensorrtllm_backend.templates import guided_decoding_of, render_model_repository, takes_stream_interval

# The setup's lines keep the logger name they have always had (what coglet's log shows).
log = logging.getLogger("cog_triton.worker.service")


@dataclass
class Serving:
    """What :func:`launch` started, running and ready.

    Attributes:
        server: the Triton process.
        pool: the stream processes.
        supervisor: the thread that watches Triton and restarts it.
        generator_config: what the stream processes built their generators from (the plan's, completed).
    """

    server: TritonServer
    pool: StreamPool
    supervisor: Supervisor
    generator_config: GeneratorConfig

    def stop(self) -> None:
        """Stop the stream processes, stop watching and stop Triton. Safe to call repeatedly."""
        self.pool.stop()
        self.supervisor.stop()
        self.server.stop()


def guided_decoding(enabled: bool, info: WeightsInfo) -> tuple[bool, str]:
    """Structured output is offered when the rendered ``tensorrt_llm`` config turns guided decoding on;
    returns (on, why it is off)."""
    if enabled:
        log.info("guided decoding (structured output) is on (xgrammar)")
        return True, ""
    reason = (
        "its weights have no xgrammar_tokenizer_info.json next to the tokenizer (archives made by "
        "scripts/build_engine include it when the tokenizer supports it)"
        if info.kind == "engine"
        else "the xgrammar package is not installed"
    )
    log.info("guided decoding (structured output) is off: %s", reason)
    return False, reason


def launch(plan: ServingPlan, settings: Settings, metrics: ServiceMetrics,
           on_transport_error: Callable[[TritonError], Awaitable[BaseException]],
           on_restart: Callable[[], None]) -> Serving:
    """Render the model repository, start the stream processes and Triton as ``plan`` says, and wait for both.

    Args:
        plan: setup's decisions.
        settings: where Triton is installed and logs, its timeouts, the timing metric.
        metrics: the service's Prometheus metrics (the pool counts what only it sees).
        on_transport_error: the pool's (a broken connection: is Triton dying?).
        on_restart: called when the supervisor restarted Triton, before the stream processes reconnect.

    Raises:
        TemplateError: a template cannot be rendered; TritonStartupError: Triton did not become ready;
        ConfigError: a stream process could not start. What was started is stopped first.
    """
    rendered = render_model_repository(plan.render, plan.info)
    guided, off_reason = guided_decoding(guided_decoding_of(rendered["tensorrt_llm"]), plan.info)
    installation = locate_tritonserver(
        settings.path(settings.triton.tritonserver) if settings.triton.tritonserver else None,
        settings.path(settings.triton.backend_dir) if settings.triton.backend_dir else None,
        work_dir=settings.path(Path("build")),
    )
    server = TritonServer(installation, plan.launch, log_file=settings.path(settings.triton.log_file),
                          stop_timeout_s=settings.triton.stop_timeout_s)
    config = dataclasses.replace(plan.generator, grpc_address=server.grpc_address, guided=guided,
                                 guided_off_reason=off_reason,
                                 sends_stream_interval=takes_stream_interval(rendered["tensorrt_llm"]))
    # The stream processes load their tokenizers while Triton loads its models.
    pool = StreamPool(
        config,
        plan.stream_processes,
        interval_ms=plan.interval_ms,
        start_timeout_s=settings.triton.startup_timeout_s,
        on_transport_error=on_transport_error,
        metrics=metrics,
        timing=settings.metrics.timing,
        interval_max_ms=plan.interval_max_ms,
        interval_streams=plan.interval_streams,
    )
    supervisor: Optional[Supervisor] = None

    def restarted() -> None:
        on_restart()
        pool.reconnect()  # the gRPC channels to the old Triton are replaced

    try:
        pool.launch()
        server.start()
        ready_s = server.wait_ready(settings.triton.startup_timeout_s)
        log.info("Triton ready in %.1f s", ready_s)
        supervisor = Supervisor(
            server,
            ["ensemble_ids", "preprocessing", "tensorrt_llm"]
            + (["ensemble"] if settings.repository.text_ensemble else []),
            startup_timeout_s=settings.triton.startup_timeout_s,
            on_restart=restarted,
        )
        supervisor.start()
        pool.set_watcher(supervisor.register, supervisor.unregister, supervisor.wait_ready)
        pool.wait_ready()
    except BaseException:
        pool.stop()
        if supervisor is not None:
            supervisor.stop()
        server.stop()
        raise
    log.info(
        "streaming: %d stream process(es), stream interval %g ms (COG_TRITON_STREAM_PROCESSES, "
        "COG_TRITON_STREAM_INTERVAL_MS)", plan.stream_processes, plan.interval_ms,
    )
    return Serving(server, pool, supervisor, config)


__all__ = ("Serving", "guided_decoding", "launch")
