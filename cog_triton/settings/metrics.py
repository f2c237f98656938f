"""Settings of the predictor's metrics: the Prometheus endpoint and the timing metric."""

from __future__ import annotations

from pydantic import Field

from cog_triton.settings.base import Group

# The Prometheus endpoint's bounds (cog_triton/worker/metrics_endpoint.py imports them), each the default of its
# setting below.

#: How long a rendering waits for Triton's own metrics, seconds (COG_TRITON_PROMETHEUS_TRITON_TIMEOUT_S).
TRITON_SCRAPE_TIMEOUT_S = 2.0
#: Seconds a connection has to deliver its whole request (request line and headers), and then to take the answer;
#: then it is closed. Prometheus sends its request at once and reads the answer within its scrape_timeout (10 s by
#: default: prometheus/prometheus ``config/config.go`` DefaultGlobalConfig). COG_TRITON_PROMETHEUS_REQUEST_TIMEOUT_S.
REQUEST_TIMEOUT_S = 10.0
#: Most connections the endpoint holds at once (COG_TRITON_PROMETHEUS_MAX_CONNECTIONS). A new one beyond it closes the
#: oldest that is still waiting for its request (an idle or half-sent one); while every one held is being answered,
#: new ones wait in the kernel's accept queue, in the order they came (``BACKLOG``).
MAX_CONNECTIONS = 64
#: Connections the kernel queues for the endpoint to accept (``listen(2)``'s backlog, capped by
#: ``net.core.somaxconn``; COG_TRITON_PROMETHEUS_BACKLOG). A connection beyond it is not refused: Linux drops its
#: handshake's last ACK and the client retransmits (a second or more later).
BACKLOG = 1024
#: Seconds a rendering of the metrics answers the scrapes that arrive after it started (COG_TRITON_PROMETHEUS_REUSE_S):
#: however many clients scrape, the metrics are rendered (and Triton's fetched) at most once per this interval.
REUSE_S = 1.0


class MetricsSettings(Group):
    """The predictor's metrics: the Prometheus endpoint (cog_triton/worker/metrics_endpoint.py; docs/operations.md,
    Metrics) and the timing metric."""

    prometheus_port: int = Field(
        default=9464,
        ge=0,
        le=65535,
        description="Port of the Prometheus endpoint: GET /metrics answers the predictor's metrics (cog_triton_*) "
        "followed by Triton's own (nv_*); 0 = off. Only port 5000 is published on Replicate; elsewhere publish "
        "this port to scrape it.",
    )
    prometheus_address: str = Field(
        default="0.0.0.0",  # noqa: S104 - scraped from outside the container
        min_length=1,
        description="Address the Prometheus endpoint listens on; 127.0.0.1 keeps it inside the container.",
    )
    prometheus_max_connections: int = Field(
        default=MAX_CONNECTIONS, ge=1, le=10000,
        description="Most connections the Prometheus endpoint holds at once. A new one beyond it closes the oldest "
        "idle one (no whole request after 0.25 s); while all are being answered, new ones wait in the accept "
        "queue, in the order they came.",
    )
    prometheus_backlog: int = Field(
        default=BACKLOG, ge=1, le=65535,
        description="Connections the kernel queues for the Prometheus endpoint to accept (listen backlog, capped by "
        "net.core.somaxconn); one beyond it is answered only when the client retries its handshake.",
    )
    prometheus_request_timeout_s: float = Field(
        default=REQUEST_TIMEOUT_S, gt=0, le=3600,
        description="Seconds a connection to the Prometheus endpoint has for its whole request, and again to take "
        "the answer; then it is closed.",
    )
    prometheus_reuse_s: float = Field(
        default=REUSE_S, ge=0, le=60,
        description="Seconds a rendering of the metrics (and Triton's, fetched once for it) answers the scrapes "
        "that arrive after it started: a scrape may show the metrics as they were up to this long before; 0: each "
        "scrape waits for a rendering that starts after it arrives (still one at a time, shared).",
    )
    prometheus_triton_timeout_s: float = Field(
        default=TRITON_SCRAPE_TIMEOUT_S, gt=0, le=60,
        description="Seconds a rendering waits for Triton's own /metrics; past it the scrape answers without them "
        "(cog_triton_triton_metrics_up 0).",
    )
    timing: bool = Field(
        default=False,
        validation_alias="timing_metrics",
        description="Record one `timing` metric per prediction: when its start passed each step (inputs checked and the "
        "Start sent, its stream process reached, its prompt tokenized and sent, its first text sent, relayed and "
        "yielded to coglet), in seconds since predict() began; for scripts/benchmark's time-to-first-token steps.",
    )
