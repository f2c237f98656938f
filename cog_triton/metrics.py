"""The Cog metrics a prediction records, under the names clients of Replicate's LLM images read.

Replicate's own LLM predictors record ``input_token_count`` and ``output_token_count`` (tokens):
replicate/cog-triton ``predict.py`` (@1434a90) and replicate/cog-vllm ``predict.py`` (@69318df),
through ``cog.emit_metric``. Neither records the time to first token as a metric (cog-triton only logs
"Serverside time to first token" with ``log_performance_metrics``), and Replicate's API shows language
models' ``time_to_first_token`` in seconds, a name its public code does not pin. So it is recorded under
both ``time_to_first_token`` (that name) and ``time_to_first_token_s`` (this project's name since the
start, which benchmarks/loadgen.py reads), with the same value in seconds.
"""

from __future__ import annotations

from typing import Callable, Union

INPUT_TOKEN_COUNT = "input_token_count"
OUTPUT_TOKEN_COUNT = "output_token_count"
#: Both names of the time to first token (seconds, from predict() to the first token).
TIME_TO_FIRST_TOKEN_NAMES = ("time_to_first_token", "time_to_first_token_s")

MetricSink = Callable[[str, Union[int, float]], None]


def record_time_to_first_token(record: MetricSink, seconds: float) -> None:
    """Record the time to first token (seconds, rounded to 0.1 ms) under each of its names."""
    value = round(seconds, 4)
    for name in TIME_TO_FIRST_TOKEN_NAMES:
        record(name, value)


__all__ = ("INPUT_TOKEN_COUNT", "OUTPUT_TOKEN_COUNT", "TIME_TO_FIRST_TOKEN_NAMES", "record_time_to_first_token")
