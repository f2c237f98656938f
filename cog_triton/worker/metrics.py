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

from typing import Callable, Optional, Union

INPUT_TOKEN_COUNT = "input_token_count"
OUTPUT_TOKEN_COUNT = "output_token_count"
#: Of ``output_token_count``, the thinking's tokens (through the one that ends it) and the answer's, for a model that
#: thinks (a tokenizer with a thinking format: :mod:`cog_triton.streaming.thinking`); recorded for no other model.
#: OpenAI's API reports the first as ``usage.completion_tokens_details.reasoning_tokens``.
REASONING_TOKEN_COUNT = "reasoning_token_count"
ANSWER_TOKEN_COUNT = "answer_token_count"
#: The reasoning level applied (:attr:`cog_triton.reasoning.Resolved.applied`: default, none, low, medium, high, or
#: on), a string, for a prediction on a model that thinks or that was given reasoning_effort.
REASONING_EFFORT_APPLIED = "reasoning_effort_applied"
#: For a prediction given ``thinking_budget_tokens``: whether the budget ended its thinking (a bool; its
#: ``reasoning_token_count`` is then at most the budget, the ending the budget added included).
THINKING_BUDGET_REACHED = "thinking_budget_reached"
#: A prediction with images: how many it carried, and how many of its input tokens they fill (the engine's count;
#: its input_token_count is the engine's too, the images' tokens included). Recorded only for such predictions.
IMAGE_COUNT = "image_count"
IMAGE_TOKEN_COUNT = "image_token_count"
#: Both names of the time to first token (seconds, from predict() to the first token).
TIME_TO_FIRST_TOKEN_NAMES = ("time_to_first_token", "time_to_first_token_s")

MetricSink = Callable[[str, Union[int, float, str]], None]


def record_time_to_first_token(record: MetricSink, seconds: float) -> None:
    """Record the time to first token (seconds, rounded to 0.1 ms) under each of its names."""
    value = round(seconds, 4)
    for name in TIME_TO_FIRST_TOKEN_NAMES:
        record(name, value)


def performance_lines(output_tokens: int, seconds: float, time_to_first_token: Optional[float]) -> list[str]:
    """What ``log_performance_metrics`` logs, as replicate/cog-triton ``predict.py`` (@1434a90) logs it:
    tokens processed, tokens per second and execution time (``seconds``, from predict() to the end of
    the stream), and the time to first token (seconds) when a token came."""
    rate = output_tokens / seconds if seconds > 0 else 0.0
    lines = [
        f"Tokens processed: {output_tokens}",
        f"Serverside tokens per second: {rate:.2f}",
        f"Serverside execution time: {seconds:.2f} seconds",
    ]
    if time_to_first_token is not None:
        lines.append(f"Serverside time to first token: {time_to_first_token:.2f} seconds")
    return lines


__all__ = (
    "ANSWER_TOKEN_COUNT", "IMAGE_COUNT", "IMAGE_TOKEN_COUNT", "INPUT_TOKEN_COUNT", "OUTPUT_TOKEN_COUNT",
    "REASONING_EFFORT_APPLIED", "REASONING_TOKEN_COUNT", "THINKING_BUDGET_REACHED", "TIME_TO_FIRST_TOKEN_NAMES",
    "performance_lines",
    "record_time_to_first_token",
)
